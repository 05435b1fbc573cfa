package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/caarlos0/env/v11"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrateSettings are the only settings `sluice migrate` reads, with the
// same names and defaults as in settings (a test keeps them equal): a
// migration job or a deploy step has the database and the schema, not the
// gateway's upstream, rules or hash key.
type migrateSettings struct {
	DatabaseURL    string `env:"SLUICE_DATABASE_URL"`
	DatabaseURLAlt string `env:"DATABASE_URL"`
	DBSchema       string `env:"SLUICE_DB_SCHEMA" envDefault:"sluice"`
}

// loadMigrate reads and validates the settings of `sluice migrate`,
// reporting every problem at once as load does.
func loadMigrate(environ map[string]string) (*config, error) {
	var s migrateSettings
	if err := env.ParseWithOptions(&s, env.Options{Environment: environ}); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	c := &config{settings: settings{DatabaseURL: s.DatabaseURL, DatabaseURLAlt: s.DatabaseURLAlt, DBSchema: s.DBSchema}}
	c.databaseURL = s.DatabaseURL
	if c.databaseURL == "" {
		c.databaseURL = s.DatabaseURLAlt
	}
	if c.databaseURL == "" {
		return nil, errors.New("migrate: no database configured: set SLUICE_DATABASE_URL")
	}
	var problems []string
	if _, err := pgxpool.ParseConfig(c.databaseURL); err != nil {
		// pgx's message may echo the connection string; name the problem
		// without repeating a password.
		problems = append(problems, "SLUICE_DATABASE_URL: not a valid Postgres connection string")
	}
	if !schemaName.MatchString(s.DBSchema) || s.DBSchema == "public" {
		problems = append(problems, fmt.Sprintf("SLUICE_DB_SCHEMA: expected a lower-case identifier other than public ([a-z_][a-z0-9_]*, at most 63 characters), got %q", s.DBSchema))
	}
	if len(problems) > 0 {
		return nil, &configError{problems: problems}
	}
	return c, nil
}

// migrateCmd applies the migrations and reports how many were new.
func migrateCmd(ctx context.Context, environ map[string]string, stdout io.Writer) error {
	cfg, err := loadMigrate(environ)
	if err != nil {
		return err
	}
	return migrate(ctx, cfg, stdout)
}
