package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/internal/proctest"
)

// TestProblemListener sends, on raw TCP, every kind of request net/http
// answers by itself before a handler runs, and checks that each answer is
// problem+json with the same status; a well-formed request still reaches
// the handler untouched.
func TestProblemListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []int
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Connection", "close")
		// A handler's plain-text 400 is its own business, and passes.
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, "400 Bad Request")
	}), DefaultTimeouts())
	go srv.Serve(ProblemListener(ln, func(code int) { mu.Lock(); seen = append(seen, code); mu.Unlock() }))
	defer srv.Close()

	huge := strings.Repeat("a", 80<<10)
	for _, tc := range []struct {
		name, request string
		status        int
		detail        string
	}{
		{"malformed request line", "GET /a b c\r\nHost: x\r\n\r\n", 400, "malformed request: the request line, its URI or a header could not be parsed"},
		{"no request line", "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", 400, "malformed request: the request line, its URI or a header could not be parsed"},
		{"bad escape in the path", "GET /api/%zz HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request: the request line, its URI or a header could not be parsed"},
		{"control character in the path", "GET /api/\x01 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request: the request line, its URI or a header could not be parsed"},
		{"relative URI", "GET api HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request: the request line, its URI or a header could not be parsed"},
		{"missing Host", "GET / HTTP/1.1\r\n\r\n", 400, "malformed request: missing required Host header"},
		{"two Host headers", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "malformed request: the request line, its URI or a header could not be parsed"},
		{"bad header name", "GET / HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n", 400, "malformed request: invalid header name"},
		{"bad header value", "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400, "malformed request: the request line, its URI or a header could not be parsed"},
		{"headers too large", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + huge + "\r\n\r\n", 431, "the request's headers are too large"},
		{"unknown transfer coding", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked2\r\n\r\n", 501, "the request's Transfer-Encoding is not supported"},
		{"unsupported version", "GET / HTTP/3.0\r\nHost: x\r\n\r\n", 505, "malformed request: unsupported protocol version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, body := proctest.Raw(t, ln.Addr().String(), tc.request, false)
			if res.StatusCode != tc.status || res.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%d %q, want %d application/problem+json: %s", res.StatusCode, res.Header.Get("Content-Type"), tc.status, body)
			}
			var p Problem
			if err := json.Unmarshal([]byte(body), &p); err != nil || p.Status != tc.status || p.Title != statusTitle(tc.status) || p.Type != "about:blank" || p.Detail != tc.detail {
				t.Fatalf("body %s (%v), want status %d and detail %q", body, err, tc.status, tc.detail)
			}
		})
	}
	mu.Lock()
	if len(seen) != 12 {
		t.Errorf("onStatus saw %v, want the 12 statuses", seen)
	}
	mu.Unlock()

	res, body := proctest.Raw(t, ln.Addr().String(), "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n", false)
	if res.StatusCode != 400 || res.Header.Get("Content-Type") != "text/plain; charset=utf-8" || body != "400 Bad Request" {
		t.Fatalf("the handler's own response was changed: %d %q %q", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
}

// TestParseServerErrorShapes: only net/http's exact shape is rewritten.
func TestParseServerErrorShapes(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"HTTP/1.1 400 Bad Request" + serverErrorHeaders + "400 Bad Request", true},
		{"HTTP/1.1 400 Bad Request" + serverErrorHeaders + "something else", false},
		{"HTTP/1.1 200 OK" + serverErrorHeaders + "200 OK", false},
		{"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n400 Bad Request", false},
		{"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nDate: x\r\n\r\n400 Bad Request", false},
		{"\x81\x05hello", false},
	} {
		if _, _, ok := parseServerError([]byte(tc.in)); ok != tc.ok {
			t.Errorf("parseServerError(%q) = %v, want %v", tc.in, ok, tc.ok)
		}
	}
}

// FuzzParseServerError: whatever a connection is written, the recogniser
// never panics, and what it rewrites becomes a well-formed problem+json
// response of an error status.
func FuzzParseServerError(f *testing.F) {
	f.Add([]byte("HTTP/1.1 400 Bad Request" + serverErrorHeaders + "400 Bad Request"))
	f.Add([]byte("HTTP/1.1 400 Bad Request: invalid header name" + serverErrorHeaders + "400 Bad Request: invalid header name"))
	f.Add([]byte("HTTP/1.1 501 Not Implemented" + serverErrorHeaders + "Unsupported transfer encoding"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, p []byte) {
		code, detail, ok := parseServerError(p)
		if !ok {
			return
		}
		if code < 400 || code > 599 {
			t.Fatalf("rewrote a status %d", code)
		}
		res, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(problemResponse(code, detail)))), nil)
		if err != nil {
			t.Fatal(err)
		}
		var pb Problem
		if err := json.NewDecoder(res.Body).Decode(&pb); err != nil || res.StatusCode != code || pb.Status != code {
			t.Fatalf("response %d, body %+v, %v", res.StatusCode, pb, err)
		}
	})
}
