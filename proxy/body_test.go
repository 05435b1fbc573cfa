package proxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

func TestBodyClass(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want int
	}{
		{0, 0}, {1, 0}, {1024, 0}, {1025, 1}, {4096, 1}, {4097, 2}, {16 << 10, 2}, {16<<10 + 1, 3},
		{64 << 10, 3}, {64<<10 + 1, 4}, {1 << 20, 5},
	} {
		if got := bodyClass(tc.n); got != tc.want {
			t.Errorf("bodyClass(%d) = %d, want %d", tc.n, got, tc.want)
		}
		if size := int64(minBodyClass) << (2 * bodyClass(tc.n)); size < tc.n {
			t.Errorf("class of %d holds %d bytes", tc.n, size)
		}
	}
}

// TestBodyBuffersNeverMix: concurrent requests with bodies of every size
// class, to an upstream that sometimes answers without reading the body
// (so the transport may still hold it after the handler returned): every
// request that the upstream reads arrives with its own body, never with
// bytes of a recycled buffer. Run with -race.
func TestBodyBuffersNeverMix(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("early") != "" {
			w.WriteHeader(http.StatusAccepted) // answer before the body is read
			return
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		sum := sha256.Sum256(b)
		io.WriteString(w, hex.EncodeToString(sum[:]))
	}))
	defer up.Close()
	g := newGatewayTo(t, up.URL, "login: POST /api/* by ip 1000000/1h", gatewayOpts{maxBody: 200 << 10})
	client := g.Client()
	var wg sync.WaitGroup
	sizes := []int{0, 1, 900, 3000, 15000, 60000, 150000, 300000}
	for i := range 400 {
		wg.Go(func() {
			size := sizes[i%len(sizes)]
			if i >= 80 {
				size = sizes[2+i%2] // then many in two classes, so buffers are reused
			}
			body := bytes.Repeat([]byte{byte('a' + i%26)}, size)
			path := "/api/x"
			if i%3 == 0 {
				path = "/api/x?early=1"
			}
			req, _ := http.NewRequest("POST", g.URL+path, bytes.NewReader(body))
			if i%2 == 0 {
				req.ContentLength = -1 // chunked
				req.Body = io.NopCloser(bytes.NewReader(body))
			}
			res, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			got, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if strings.Contains(path, "early") {
				if res.StatusCode != http.StatusAccepted {
					t.Errorf("request %d: status %d", i, res.StatusCode)
				}
				return
			}
			sum := sha256.Sum256(body)
			if res.StatusCode != 200 || string(got) != hex.EncodeToString(sum[:]) {
				t.Errorf("request %d (%d bytes): status %d, the upstream read another body (%s)", i, size, res.StatusCode, fmt.Sprintf("%.40s", got))
			}
		})
	}
	wg.Wait()
}
