// Package pgtest gives tests a fresh, migrated sluice schema on a real
// PostgreSQL server.
//
// The server comes from SLUICE_TEST_DATABASE_URL, or else
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable. A test that
// cannot reach it fails with instructions; it is never skipped, so a missing
// database cannot pass for a green run.
//
// It is for tests only, and imports only internal/proctest and
// limiter/postgres of sluice (for the migrations).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/limiter/postgres"
)

// EnvURL names the environment variable that points tests at a database.
const EnvURL = "SLUICE_TEST_DATABASE_URL"

// DefaultURL is the database tests use when EnvURL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// DB is one test's database: a schema of its own, migrated, dropped with
// everything in it when the test ends.
type DB struct {
	// URL is the connection string of the server, as a gateway would get
	// it in SLUICE_DATABASE_URL (the schema is not part of it).
	URL string
	// Schema is the test's schema, a fresh name like t_0123456789abcdef.
	Schema string
	// Pool is a pool on URL, closed when the test ends.
	Pool *pgxpool.Pool
}

// URL returns the connection string tests use: EnvURL, or DefaultURL.
func URL() string {
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	return DefaultURL
}

// New creates a fresh schema, migrates it and registers its removal (DROP
// SCHEMA … CASCADE) with t.Cleanup. It fails t when the database cannot be
// reached.
func New(t testing.TB) *DB {
	t.Helper()
	url := URL()
	pool := NewPool(t, url, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	schema := NewSchema(t, pool, "t_")
	if _, err := postgres.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("pgtest: migrate schema %s: %v", schema, err)
	}
	return &DB{URL: url, Schema: schema, Pool: pool}
}

// NewSchema returns a fresh schema name, prefix and 16 hex digits, and
// registers its removal (DROP SCHEMA IF EXISTS … CASCADE, on pool) with
// t.Cleanup. It creates nothing: the test makes the schema its own way.
func NewSchema(t testing.TB, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("pgtest: random schema name: %v", err)
	}
	schema := prefix + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// Table returns the name of the table name in the test's schema, quoted
// for SQL.
func (db *DB) Table(name string) string {
	return pgx.Identifier{db.Schema, name}.Sanitize()
}

// NewPool opens a pool on url, pings it and closes it when the test ends.
// maxConns of 0 keeps pgxpool's default. Tests use it for extra gateway
// instances on the same database.
func NewPool(t testing.TB, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", EnvURL, err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		t.Fatalf("pgtest: cannot reach PostgreSQL at %s: %v\n"+
			"These tests need a real PostgreSQL server. Start one locally (trust auth for user postgres on "+
			"127.0.0.1:5432), or set %s to a connection string of a database the tests may create and drop "+
			"schemas in, e.g. %s=postgres://user:pass@host:5432/db?sslmode=disable",
			redact(cfg), err, EnvURL, EnvURL)
	}
	t.Cleanup(pool.Close)
	return pool
}

// redact names the server without its password.
func redact(cfg *pgxpool.Config) string {
	c := cfg.ConnConfig
	return c.User + "@" + c.Host + ":" + strconv.Itoa(int(c.Port)) + "/" + c.Database
}

// ClearOf waits, when less than need is left of the current window of
// length w, until the next one has begun. sluice's fixed windows are
// aligned to the epoch on the database clock (in the tests, this
// machine's): a test that counts requests in one window and crosses into
// the next sees the count start again. TestLeasePeekWhileRenewing failed
// so in a CI run from 10:59:58 (hour windows), TestChargesAcrossGateways
// in one from 17:25:59 (minute windows).
func ClearOf(t testing.TB, w, need time.Duration) {
	t.Helper()
	left := time.Until(time.Now().Truncate(w).Add(w))
	if left < need {
		t.Logf("waiting %v for the next window of %v: the test's would end while it runs", left.Round(time.Millisecond), w)
		time.Sleep(left + 50*time.Millisecond)
	}
}
