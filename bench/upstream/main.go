// Command upstream is the trivial upstream of the load harness (see
// bench/README.md): it answers every request with 200 and a three-byte
// body, so that what the harness measures is the cost of the proxy in
// front of it.
//
// It runs as its own process rather than inside the harness so that no
// target shares a Go runtime (scheduler, garbage collector) with anything
// but itself: every hop of the measured chain is a separate process, as in
// production.
//
// Of sluice it imports only internal/httpserve.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/httpserve"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8081", "address to listen on (loopback)")
	lifetime := flag.Duration("lifetime", 30*time.Minute, "exit after this long even if nobody stops us")
	flag.Parse()
	if err := run(*listen, *lifetime); err != nil {
		fmt.Fprintln(os.Stderr, "upstream:", err)
		os.Exit(1)
	}
}

func run(listen string, lifetime time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, lifetime)
	defer cancel()

	body := []byte("ok\n")
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header()["Content-Type"] = []string{"text/plain"}
			w.Write(body) //nolint:errcheck // the proxy may have gone away
		}),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       120 * time.Second,
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	return httpserve.Serve(ctx, srv, ln, 5*time.Second)
}
