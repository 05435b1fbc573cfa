package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/policy"
)

// Settle passes settlements on to the store under the recording.
func (s *recordingStore) Settle(ctx context.Context, ss []limiter.Settlement) error {
	return s.Store.(limiter.Settler).Settle(ctx, ss)
}

// fakeUpstream serves h as the upstream.
func fakeUpstream(t testing.TB, h http.HandlerFunc) *upstream {
	return &upstream{Upstream: proctest.NewUpstream(t, h)}
}

// remaining sends a request that the upstream answers with an empty JSON
// object, and returns the RateLimit remaining of rule after it.
func remaining(t *testing.T, g *testGateway, path string) int64 {
	t.Helper()
	res, _ := g.do(t, "POST", path, "", map[string]string{"X-Tenant-ID": "acme", "X-Probe": "1"})
	v, err := strconv.ParseInt(res.Header.Get("X-RateLimit-Remaining"), 10, 64)
	if err != nil {
		t.Fatalf("status %d, X-RateLimit-Remaining %q", res.StatusCode, res.Header.Get("X-RateLimit-Remaining"))
	}
	return v
}

// chatUpstream answers like an OpenAI-compatible chat completion endpoint:
// a JSON body whose usage comes after padding bytes of content, or an SSE
// stream with a usage chunk last; X-Probe requests get "{}".
func chatUpstream(t *testing.T, tokens int, padding int) (*upstream, *[]byte) {
	sent := new([]byte)
	return fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Probe") != "" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, "{}")
			return
		}
		if got := r.Header.Get("Accept-Encoding"); got != "identity" {
			t.Errorf("upstream asked for Accept-Encoding %q, want identity", got)
		}
		body := []byte(`{"id":"chatcmpl-1","choices":[{"message":{"role":"assistant","content":"` +
			strings.Repeat("é", padding/2) + `"}}],"usage":{"prompt_tokens":3,"completion_tokens":` +
			strconv.Itoa(tokens-3) + `,"total_tokens":` + strconv.Itoa(tokens) + `}}`)
		*sent = body
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Write(body)
	}), sent
}

func TestChargeFromJSON(t *testing.T) {
	up, sent := chatUpstream(t, 60, 1<<20)
	g := newGateway(t, up, "tpm: POST /v1/* by tenant 100/1m charge=json(usage.total_tokens)", gatewayOpts{})
	res, body := g.do(t, "POST", "/v1/chat", `{}`, map[string]string{"X-Tenant-ID": "acme"})
	if res.StatusCode != 200 || !bytes.Equal(body, *sent) {
		t.Fatalf("status %d, %d bytes; want 200 and the upstream's %d bytes unchanged", res.StatusCode, len(body), len(*sent))
	}
	// The headers show the standing after the reservation of 1.
	if got := res.Header.Get("X-RateLimit-Remaining"); got != "99" {
		t.Errorf("X-RateLimit-Remaining %s, want 99 (after the reservation)", got)
	}
	// 60 charged, and the probe's reservation: 39 left.
	if got := remaining(t, g, "/v1/chat"); got != 39 {
		t.Errorf("after a response of 60 tokens, %d left; want 39", got)
	}
	// The next one takes the key past its limit: it is admitted (39 left
	// at admission), then denied afterwards until the window ends.
	g.do(t, "POST", "/v1/chat", `{}`, map[string]string{"X-Tenant-ID": "acme"})
	res, _ = g.do(t, "POST", "/v1/chat", `{}`, map[string]string{"X-Tenant-ID": "acme"})
	if res.StatusCode != 429 || res.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("past the limit: status %d, remaining %s; want 429 and 0", res.StatusCode, res.Header.Get("X-RateLimit-Remaining"))
	}
	g.clock.Advance(time.Minute)
	if got := remaining(t, g, "/v1/chat"); got != 99 {
		t.Errorf("in the next window, %d left; want 99", got)
	}
}

func TestChargeFromHeader(t *testing.T) {
	credits := "7"
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Probe") == "" {
			w.Header()["X-Credits-Used"] = strings.Split(credits, ",")
		}
		w.WriteHeader(http.StatusAccepted)
	})
	g := newGateway(t, up, "credits: * /api/* by tenant 100/1mo anchor=15 charge=header(X-Credits-Used)", gatewayOpts{})
	left := int64(100)
	for _, tc := range []struct {
		header string
		cost   int64
	}{{"7", 7}, {"0", 0}, {"", 1}, {"-3", 1}, {"2.5", 1}, {"4,5", 1}, {"12", 12}} {
		credits = tc.header
		res, _ := g.do(t, "POST", "/api/x", "", map[string]string{"X-Tenant-ID": "acme"})
		if res.StatusCode != http.StatusAccepted || (tc.header != "" && res.Header.Get("X-Credits-Used") == "") {
			t.Fatalf("status %d, X-Credits-Used %q: the response must pass as it is", res.StatusCode, res.Header.Get("X-Credits-Used"))
		}
		left -= tc.cost
		if got := remaining(t, g, "/api/x"); got != left-1 {
			t.Errorf("X-Credits-Used %q: %d left, want %d", tc.header, got, left-1)
		}
		left--
	}
}

// TestChargeFromSSE streams events one at a time: the client has each
// event before the upstream sends the next, and the stream is charged
// its last usage.
func TestChargeFromSSE(t *testing.T) {
	for _, tc := range []struct {
		name, rule string
		events     []string
		cut        bool // the upstream cuts the stream before its end
		want       int64
	}{
		{"OpenAI include_usage", "charge=json(usage.total_tokens)", []string{
			`{"choices":[{"delta":{"content":"Hel"}}],"usage":null}`,
			`{"choices":[{"delta":{"content":"lo"}}],"usage":null}`,
			`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":17}}`,
			`[DONE]`}, false, 17},
		{"OpenAI without include_usage: the reservation", "charge=json(usage.total_tokens)", []string{
			`{"choices":[{"delta":{"content":"Hel"}}]}`, `[DONE]`}, false, 1},
		{"Anthropic", "charge=json(message.usage.input_tokens+usage.output_tokens)", []string{
			`{"type":"message_start","message":{"usage":{"input_tokens":25,"output_tokens":1}}}`,
			`{"type":"content_block_delta","delta":{"text":"Hi"}}`,
			`{"type":"message_delta","usage":{"output_tokens":15}}`,
			`{"type":"message_stop"}`}, false, 40},
		{"Anthropic cut short: what it had reported", "charge=json(message.usage.input_tokens+usage.output_tokens)", []string{
			`{"type":"message_start","message":{"usage":{"input_tokens":25,"output_tokens":1}}}`,
			`{"type":"content_block_delta","delta":{"text":"Hi"}}`}, true, 25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := make(chan bool)
			up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Probe") != "" {
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(200)
				w.(http.Flusher).Flush()
				for _, e := range tc.events {
					if !<-next {
						return
					}
					io.WriteString(w, "data: "+e+"\n\n")
					w.(http.Flusher).Flush()
				}
				if tc.cut {
					<-next
					conn, _, _ := w.(http.Hijacker).Hijack()
					conn.Close()
				}
			})
			g := newGateway(t, up, "tpm: POST /v1/* by tenant 1000/1m "+tc.rule, gatewayOpts{})
			req, _ := http.NewRequest("POST", g.URL+"/v1/chat", nil)
			req.Header.Set("X-Tenant-ID", "acme")
			res, err := g.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			rd := bufio.NewReader(res.Body)
			for i, e := range tc.events {
				next <- true
				// The event arrives while the upstream waits to send the
				// next one: nothing is held back.
				line, err := rd.ReadString('\n')
				blank, err2 := rd.ReadString('\n')
				if err != nil || err2 != nil || line != "data: "+e+"\n" || blank != "\n" {
					t.Fatalf("event %d: %q %q (%v %v), want %q", i, line, blank, err, err2, e)
				}
			}
			if tc.cut {
				next <- true
			} else {
				close(next)
			}
			io.Copy(io.Discard, rd)
			if got := remaining(t, g, "/v1/chat"); got != 1000-tc.want-1 {
				t.Errorf("%d left after the stream, want %d (charged %d)", got, 1000-tc.want-1, tc.want)
			}
		})
	}
}

// TestChargeClientAbandons: a client that leaves mid-stream is charged
// what the stream had reported by then.
func TestChargeClientAbandons(t *testing.T) {
	gone := make(chan struct{})
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Probe") != "" {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"message\":{\"usage\":{\"input_tokens\":30}}}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	})
	g := newGateway(t, up, "tpm: POST /v1/* by tenant 1000/1m charge=json(message.usage.input_tokens+usage.output_tokens)", gatewayOpts{})
	conn, err := net.Dial("tcp", g.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, "POST /v1/chat HTTP/1.1\r\nHost: x\r\nX-Tenant-ID: acme\r\nContent-Length: 0\r\n\r\n")
	rd := bufio.NewReader(conn)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "input_tokens") {
			break
		}
	}
	conn.Close()
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream never saw the client leave")
	}
	rule, _ := g.proxy.Policy().Lookup("tpm")
	chk := limiter.Check{Rule: rule, Key: g.hasher.Key("tenant", "acme")}
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err := g.memory.Peek(context.Background(), chk)
		if err != nil {
			t.Fatal(err)
		}
		if res.Remaining == 1000-30 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d left after an abandoned stream that reported 30, want %d", res.Remaining, 1000-30)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestChargeErrorPage: an error page says nothing; the reservation
// stands.
func TestChargeErrorPage(t *testing.T) {
	up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Probe") != "" {
			return
		}
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, "<html>upstream down</html>")
	})
	g := newGateway(t, up, "tpm: POST /v1/* by tenant 1000/1m cost=10 charge=json(usage.total_tokens)", gatewayOpts{})
	res, body := g.do(t, "POST", "/v1/chat", "", map[string]string{"X-Tenant-ID": "acme"})
	if res.StatusCode != http.StatusBadGateway || string(body) != "<html>upstream down</html>" {
		t.Fatalf("status %d body %q: the error page must pass as it is", res.StatusCode, body)
	}
	if got := remaining(t, g, "/v1/chat"); got != 1000-10-10 {
		t.Errorf("%d left, want %d: the reservation of 10 stands, and the probe's", got, 1000-20)
	}
}

// blockingSettler holds every settlement until release is closed.
type blockingSettler struct {
	limiter.Store
	release chan struct{}
}

func (b *blockingSettler) Settle(ctx context.Context, ss []limiter.Settlement) error {
	<-b.release
	return b.Store.(limiter.Settler).Settle(ctx, ss)
}

// TestChargeCommittedBeforeLastBytes: a client never holds a complete
// response whose charge is not committed, whether the body has a length
// or not.
func TestChargeCommittedBeforeLastBytes(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			body := `{"usage":{"total_tokens":5}}`
			w.Header().Set("Content-Type", "application/json")
			if !chunked {
				w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			}
			io.WriteString(w, body)
		})
		release := make(chan struct{})
		g := newGateway(t, up, "tpm: POST /v1/* by tenant 1000/1m charge=json(usage.total_tokens)", gatewayOpts{})
		g.store.Store = &blockingSettler{Store: g.store.Store, release: release}
		done := make(chan []byte)
		go func() {
			_, body := g.do(t, "POST", "/v1/chat", "", map[string]string{"X-Tenant-ID": "acme"})
			done <- body
		}()
		select {
		case body := <-done:
			t.Fatalf("chunked %v: the client had the whole response %q before the charge was committed", chunked, body)
		case <-time.After(300 * time.Millisecond):
		}
		close(release)
		if body := <-done; string(body) != `{"usage":{"total_tokens":5}}` {
			t.Errorf("chunked %v: body %q", chunked, body)
		}
	}
}

// FuzzChargedBody reads any body, of any media type, in any pieces,
// through what reads its charges: the bytes that come out are the bytes
// that went in, and it never panics.
func FuzzChargedBody(f *testing.F) {
	f.Add([]byte(`{"usage":{"total_tokens":12}}`), "application/json", uint8(3))
	f.Add([]byte("data: {\"usage\":{\"total_tokens\":7}}\n\ndata: [DONE]\n\n"), "text/event-stream", uint8(1))
	f.Add([]byte("<html>oops</html>"), "text/html", uint8(200))
	store := memory.New(memory.Options{})
	lim, err := limiter.New(limiter.Config{Store: store, Local: memory.New(memory.Options{})})
	if err != nil {
		f.Fatal(err)
	}
	rule := &policy.Rule{Name: "tpm", Limit: 1 << 40, Window: time.Minute, Cost: 1,
		Charge: &policy.Charge{Paths: [][]string{{"usage", "total_tokens"}}}}
	f.Fuzz(func(t *testing.T, body []byte, contentType string, piece uint8) {
		c := &charges{lim: lim, rules: []*policy.Charge{rule.Charge},
			ss: []limiter.Settlement{{Check: limiter.Check{Rule: rule, Key: "k"}, Reserved: 1}}}
		res := &http.Response{Header: http.Header{"Content-Type": {contentType}}, ContentLength: int64(len(body)),
			Body: io.NopCloser(iotest.OneByteReader(bytes.NewReader(body)))}
		if piece%2 == 0 {
			res.ContentLength = -1
			res.Body = io.NopCloser(bytes.NewReader(body))
		}
		c.watch(res)
		var got bytes.Buffer
		buf := make([]byte, int(piece)+1)
		for {
			n, err := res.Body.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				break
			}
		}
		res.Body.Close()
		if !bytes.Equal(got.Bytes(), body) {
			t.Fatalf("read %q through the charge reader, want %q", got.Bytes(), body)
		}
		if s := c.ss[0]; s.Charge < 0 || s.Read == "" {
			t.Fatalf("settled %+v", s)
		}
	})
}
