package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgStatIdleFlush is how long a PostgreSQL 15+ backend may keep its
// transaction counts to itself: while busy it publishes them at most once
// a second, and once idle it publishes the rest after 10 s (a backend that
// exits publishes at once). A snapshot of pg_stat_database taken sooner
// after load would miss up to a second of it.
const pgStatIdleFlush = 11 * time.Second

// benchDB is a database of its own for one run. Its pg_stat_database row
// then counts the transactions of sluice alone: the harness queries from
// the database it was given, and nothing else connects to this one.
type benchDB struct {
	admin *pgx.Conn // to the database of -database-url, never to name
	name  string
	url   string // connection string for sluice, to name
}

// createBenchDB creates a fresh, uniquely named database next to the one
// adminURL names.
func createBenchDB(ctx context.Context, adminURL string) (*benchDB, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, fmt.Errorf("connect to -database-url: %w", err)
	}
	suffix := make([]byte, 4)
	rand.Read(suffix)
	name := "sluice_bench_" + hex.EncodeToString(suffix)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	return &benchDB{admin: conn, name: name, url: withDatabase(adminURL, name)}, nil
}

// withDatabase returns the connection string s pointing at database db
// instead, in URL or keyword/value form.
func withDatabase(s, db string) string {
	if u, err := url.Parse(s); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path, u.RawPath = "/"+db, ""
		return u.String()
	}
	return strings.TrimSpace(s) + " dbname=" + db // the last dbname wins
}

// xacts returns the database's committed plus rolled-back transactions as
// published so far.
func (b *benchDB) xacts(ctx context.Context) (int64, error) {
	var n int64
	err := b.admin.QueryRow(ctx,
		"SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", b.name).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("read pg_stat_database: %w", err)
	}
	return n, nil
}

// settledXacts waits until no backend is connected to the database (so all
// have published their counts on exit) and the count stops moving, then
// returns it. Call it after stopping the sluice that used the database.
func (b *benchDB) settledXacts(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	last := int64(-1)
	for {
		var backends int
		err := b.admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", b.name).Scan(&backends)
		if err != nil {
			return 0, fmt.Errorf("wait for backends to exit: %w", err)
		}
		if backends == 0 {
			n, err := b.xacts(ctx)
			if err != nil || n == last {
				return n, err
			}
			last = n
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("wait for backends to exit: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// version returns the server's version string.
func (b *benchDB) version(ctx context.Context) string {
	var v string
	if err := b.admin.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "?"
	}
	return v
}

// drop removes the database, disconnecting whatever is still connected,
// and closes the harness's connection.
func (b *benchDB) drop(ctx context.Context) error {
	defer b.admin.Close(ctx)
	if _, err := b.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{b.name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", b.name, err)
	}
	return nil
}

// openBenchDB creates the run's database next to the one url names, and
// returns a function that stops ps's processes (none may still use the
// database) and drops it.
func openBenchDB(ctx context.Context, url string, ps *procs) (*benchDB, func() error, error) {
	db, err := createBenchDB(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	return db, func() error {
		ps.stopAll()
		// The run's context may be what ended it: drop with a fresh one.
		dropCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return db.drop(dropCtx)
	}, nil
}

// defaultDatabaseURL is the -database-url of every command:
// $SLUICE_TEST_DATABASE_URL, else the development machine's Postgres, as
// the product's tests use it.
func defaultDatabaseURL() string {
	if u := os.Getenv("SLUICE_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}
