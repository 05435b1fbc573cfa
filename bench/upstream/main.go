// Command upstream is the trivial upstream of the load harness (see
// bench/README.md): it answers every request with 200 and a three-byte
// body, so that what the harness measures is the cost of the proxy in
// front of it.
//
// It runs as its own process rather than inside the harness so that no
// target shares a Go runtime (scheduler, garbage collector) with anything
// but itself: every hop of the measured chain is a separate process, as in
// production.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
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
		Addr: listen,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header()["Content-Type"] = []string{"text/plain"}
			w.Write(body) //nolint:errcheck // the proxy may have gone away
		}),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       120 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancelShutdown := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelShutdown()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
