// Command baseline is the load harness's reference point (see
// bench/README.md): a bare httputil.ReverseProxy in front of the upstream,
// configured like sluice's own forwarding — the same transport
// (proxy.NewTransport), the same server timeouts (proxy.NewServer), the
// same flushing — but with no rules, no identity extraction and no store.
// The ratio of sluice's throughput to this one is then the cost of rate
// limiting alone.
//
// Of sluice it imports only proxy and internal/httpserve.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http/httputil"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/httpserve"
	"github.com/sluicehq/sluice/proxy"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8082", "address to listen on (loopback)")
	upstream := flag.String("upstream", "http://127.0.0.1:8081", "upstream base URL")
	lifetime := flag.Duration("lifetime", 30*time.Minute, "exit after this long even if nobody stops us")
	flag.Parse()
	if err := run(*listen, *upstream, *lifetime); err != nil {
		fmt.Fprintln(os.Stderr, "baseline:", err)
		os.Exit(1)
	}
}

func run(listen, upstream string, lifetime time.Duration) error {
	target, err := proxy.ParseUpstream(upstream)
	if err != nil {
		return fmt.Errorf("-upstream: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, lifetime)
	defer cancel()

	rp := &httputil.ReverseProxy{
		// SetXForwarded writes X-Forwarded-For/-Host/-Proto, as sluice
		// does, so both send the upstream the same headers.
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
		},
		Transport:     proxy.NewTransport(proxy.DefaultTimeouts().Upstream),
		FlushInterval: -1, // as sluice: flush after every write
	}
	srv := proxy.NewServer(rp, proxy.DefaultTimeouts())
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	return httpserve.Serve(ctx, srv, ln, 5*time.Second)
}
