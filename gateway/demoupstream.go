package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/internal/httpserve"
)

// demoUpstreamAddr is where `sluice demo-upstream` listens unless told
// otherwise: the upstream of the README's quickstart.
const demoUpstreamAddr = "127.0.0.1:3000"

// DemoUpstream is `sluice demo-upstream [host:port]`: it serves a
// stand-in API on addr (demoUpstreamAddr when empty) until ctx ends, so
// that the quickstart needs nothing but the sluice binary: every request
// gets 200 and one line naming its method and path. It logs nothing per
// request: the point of the demo is what sluice does in front of it.
func DemoUpstream(ctx context.Context, addr string, stdout io.Writer) error {
	if addr == "" {
		addr = demoUpstreamAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("demo-upstream: %w", err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "demo upstream: %s %s\n", r.Method, r.URL.Path)
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	fmt.Fprintf(stdout, "demo upstream listening on http://%s\n", ln.Addr())
	if err := httpserve.Serve(ctx, srv, ln, 5*time.Second); err != nil {
		return fmt.Errorf("demo-upstream: %w", err)
	}
	return nil
}
