package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/migrations"
)

// definitions are the database objects this store brings with it, each in
// one embedded file beside the code that calls it: migrations.Up installs
// them after the numbered migrations (see migrations.Definition).
var definitions = func() []migrations.Definition {
	var defs []migrations.Definition
	for _, f := range []struct{ name, file string }{
		{"decide", "sql/decide_function.sql"},
		{"leases", "sql/lease_functions.sql"},
	} {
		b, err := queryFiles.ReadFile(f.file)
		if err != nil {
			panic(err) // embedded: cannot happen
		}
		d, err := migrations.ParseDefinition(f.name, string(b))
		if err != nil {
			panic(err) // a test loads it: cannot happen in a built binary
		}
		defs = append(defs, d)
	}
	return defs
}()

// Migrate brings schema up to date for this store: the numbered
// migrations, then the store's own definitions (the decide function). It
// returns how many it applied. It is what `sluice migrate` and a store
// with Options.Migrate run.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) (int, error) {
	return migrations.Up(ctx, pool, schema, definitions...)
}

// checkSchema reports whether schema is migrated far enough for this store:
// every numbered migration and every definition at least at this build's
// version (a newer one, installed by a newer sluice during a rolling
// deploy, is fine).
func (s *Store) checkSchema(ctx context.Context, pool *pgxpool.Pool) error {
	var version int
	if err := pool.QueryRow(ctx, s.q.schemaVersion).Scan(&version); err != nil {
		return err
	}
	if want := migrations.Latest(); version < want {
		return fmt.Errorf("schema %q is at migration %d, this sluice needs %d: run sluice migrate", s.schema, version, want)
	}
	for _, d := range definitions {
		have, err := migrations.DefinitionVersion(ctx, pool, s.schema, d.Name)
		if err != nil {
			return err
		}
		if have < d.Version {
			return fmt.Errorf("schema %q holds version %d of %s, this sluice needs %d: run sluice migrate", s.schema, have, d.Name, d.Version)
		}
	}
	return nil
}
