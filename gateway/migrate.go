package gateway

import (
	"context"
	"fmt"
	"io"

	"github.com/sluicehq/sluice/limiter/postgres"
)

// Migrate is `sluice migrate`: it applies the migrations to
// SLUICE_DB_SCHEMA and reports how many were new. It reads only
// SLUICE_DATABASE_URL (or DATABASE_URL) and SLUICE_DB_SCHEMA: a migration
// job has nothing else of the gateway's configuration.
func Migrate(ctx context.Context, environ map[string]string, stdout io.Writer) error {
	cfg, err := loadMigrate(environ)
	if err != nil {
		return err
	}
	pool, err := openPool(cfg, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := postgres.Migrate(ctx, pool, cfg.DBSchema)
	if err != nil {
		return fmt.Errorf("migrate schema %s: %w", cfg.DBSchema, err)
	}
	fmt.Fprintf(stdout, "schema %s: %d migrations applied\n", cfg.DBSchema, n)
	return nil
}
