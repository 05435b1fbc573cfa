package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ConfigurePool adapts cfg to a Store's use before the pool is created:
//
//   - MinConns, unless the connection string set pool_min_conns, becomes
//     DefaultMaxInFlight+1 (within MaxConns): the batcher's connections and
//     one for the background work and the admin API stay open while the
//     gateway is idle, so the first requests after a quiet spell do not
//     wait for a connection to be made.
//   - Every new connection first runs sql/warm_backend.sql, which stops the
//     server process from handing freed memory back to the kernel after
//     every transaction (see the file); an AfterConnect already in cfg
//     runs after it.
func ConfigurePool(cfg *pgxpool.Config) {
	if cfg.MinConns == 0 {
		cfg.MinConns = min(DefaultMaxInFlight+1, cfg.MaxConns)
	}
	next := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		// Simple protocol: a statement run once is not worth preparing.
		if _, err := c.Exec(ctx, warmBackendSQL, pgx.QueryExecModeSimpleProtocol); err != nil {
			return fmt.Errorf("postgres store: set up connection: %w", err)
		}
		if next != nil {
			return next(ctx, c)
		}
		return nil
	}
}

var warmBackendSQL = func() string {
	b, err := queryFiles.ReadFile("sql/warm_backend.sql")
	if err != nil {
		panic(err) // embedded: cannot happen
	}
	return string(b)
}()
