// Package httpserve runs an http.Server for as long as a context lasts:
// the one way the small servers of sluice's commands and of the load
// harness (the demo upstream, the harness's upstream and baseline proxy)
// serve and stop.
//
// It imports nothing of sluice.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Serve serves srv on ln until ctx ends, then shuts srv down, leaving the
// requests in flight up to grace to finish. It returns the error that
// ended serving before ctx did, or that of the shutdown.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
