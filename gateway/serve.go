package gateway

import (
	"context"
	"fmt"
	"net"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/telemetry"
)

// Serve is `sluice` (or `sluice serve`): it assembles the gateway that the
// settings in environ describe, listens on SLUICE_ADMIN_LISTEN and, once
// the store is ready, on SLUICE_LISTEN, and serves until ctx ends (see
// Gateway.Run).
func Serve(ctx context.Context, environ map[string]string, opts Options) error {
	g, err := New(environ, opts)
	if err != nil {
		return err
	}
	defer g.log.Sync() //nolint:errcheck // nothing useful to do at exit
	if g.tracing != nil {
		tlog := g.log.Named("tracing")
		telemetry.HandleErrors(func(err error) { tlog.Warn("tracing: spans could not be sent", zap.Error(err)) })
	}
	admin, err := net.Listen("tcp", g.cfg.AdminListen)
	if err != nil {
		g.backend.close()
		return fmt.Errorf("listen on SLUICE_ADMIN_LISTEN: %w", err)
	}
	return g.Run(ctx, admin, func() (net.Listener, error) { return net.Listen("tcp", g.cfg.Listen) })
}
