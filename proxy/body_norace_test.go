//go:build !race

package proxy

import (
	"bytes"
	"net/http/httptest"
	"runtime"
	"testing"
)

// TestBodyBuffersRecycled: a buffered body's buffer goes back to the pool
// when the handler is done with it, even though nobody closes the body
// reader (httputil.ReverseProxy hands the transport a wrapper and never
// closes the reader under it), so proxying bodies does not allocate a
// buffer per request. The race detector makes sync.Pool drop items on
// purpose, hence the build tag.
func TestBodyBuffersRecycled(t *testing.T) {
	g := newGatewayTo(t, "http://127.0.0.1:1", "", gatewayOpts{})
	p := g.Config.Handler.(*Proxy)
	body := bytes.Repeat([]byte("x"), 16<<10)
	for _, chunked := range []bool{false, true} {
		cycle := func() {
			req := httptest.NewRequest("POST", "/upload", bytes.NewReader(body))
			if chunked {
				req.ContentLength = -1
			}
			bb, err := p.bufferBody(req, false)
			if err != nil || bb == nil || len(bb.buf) != len(body) {
				t.Fatalf("bufferBody: %v", err)
			}
			bb.done()
		}
		cycle()
		const n = 100
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range n {
			cycle()
		}
		runtime.ReadMemStats(&after)
		// httptest.NewRequest costs about 5 KiB (its bufio.Reader); a
		// buffer per body would be 16 KiB more.
		if per := (after.TotalAlloc - before.TotalAlloc) / n; per > 10<<10 {
			t.Errorf("chunked %v: %d bytes allocated per 16 KiB body: the buffer is not recycled", chunked, per)
		}
	}
}
