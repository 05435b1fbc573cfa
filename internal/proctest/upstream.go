package proctest

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// Upstream is an HTTP server on loopback for a gateway or a proxy to send
// requests to, which counts the requests that reach it. It is closed when
// the test ends.
type Upstream struct {
	*httptest.Server
	hits atomic.Int64
}

// NewUpstream starts an Upstream that answers with h, or with 200 and no
// body when h is nil.
func NewUpstream(t testing.TB, h http.HandlerFunc) *Upstream {
	t.Helper()
	u := &Upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		if h != nil {
			h(w, r)
		}
	}))
	t.Cleanup(u.Close)
	return u
}

// Hits returns how many requests have reached u.
func (u *Upstream) Hits() int64 { return u.hits.Load() }
