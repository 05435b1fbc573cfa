// Package migrations holds sluice's database schema as numbered SQL files
// embedded in the binary, and applies them.
//
// Every object lives in one schema chosen at run time (SLUICE_DB_SCHEMA,
// default "sluice"), never in public. The SQL files name it through the
// {{schema}} placeholder, which Load replaces with the quoted identifier:
// objects are schema-qualified in the SQL text itself rather than found
// through search_path, so that the statements work unchanged through a
// connection pooler in transaction mode, where session settings do not
// follow a client from one transaction to the next.
//
// Up is safe to run from many processes at once: it serialises them with
// a session-level advisory lock whose key is derived from the schema name,
// so two schemas in one database migrate independently.
//
// Besides the numbered files, Up installs Definitions: objects that are
// replaced whole rather than changed step by step (a function), each kept
// as one versioned file beside the code that uses it, so that changing the
// object means editing that file and raising its version, not copying it
// into a new migration.
//
// It imports nothing of sluice: limiter/postgres runs it, and nothing
// else touches the schema.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed *.sql
var files embed.FS

// Placeholder is the text in the SQL files that Load replaces with the
// quoted schema name.
const Placeholder = "{{schema}}"

// Migration is one numbered SQL file, ready to run against one schema.
type Migration struct {
	Version int    // the file's number, from 1
	Name    string // the file's name without number and suffix
	SQL     string // the file's text with Placeholder replaced
}

var (
	schemaPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
	filePattern   = regexp.MustCompile(`^([0-9]{4})_([a-z0-9_]+)\.up\.sql$`)
)

// ValidateSchema reports whether name can be used as sluice's schema: a
// lower-case SQL identifier ([a-z_][a-z0-9_]*) of at most 63 bytes, the
// longest name Postgres keeps without truncating it. Names starting with
// "pg_" are reserved by Postgres and refused.
func ValidateSchema(name string) error {
	switch {
	case name == "":
		return errors.New("schema name is empty")
	case len(name) > 63:
		return fmt.Errorf("schema name %q is longer than 63 bytes", name)
	case !schemaPattern.MatchString(name):
		return fmt.Errorf("schema name %q must match [a-z_][a-z0-9_]*", name)
	case strings.HasPrefix(name, "pg_"):
		return fmt.Errorf("schema name %q uses the reserved prefix pg_", name)
	}
	return nil
}

// Load returns every embedded migration in version order with its SQL
// written for schema. It fails on an invalid schema name and on files
// whose numbers are not 1, 2, 3… without gaps.
func Load(schema string) ([]Migration, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("list migrations: %w", err)
	}
	quoted := pgx.Identifier{schema}.Sanitize()
	var ms []Migration
	for _, name := range names {
		if strings.HasSuffix(name, ".down.sql") {
			continue
		}
		m := filePattern.FindStringSubmatch(name)
		if m == nil {
			return nil, fmt.Errorf("migration file %q: name must look like 0001_name.up.sql", name)
		}
		version, _ := strconv.Atoi(m[1])
		text, err := files.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", name, err)
		}
		ms = append(ms, Migration{
			Version: version,
			Name:    m[2],
			SQL:     strings.ReplaceAll(string(text), Placeholder, quoted),
		})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %04d_%s: expected version %d (versions must be 1, 2, 3… without gaps)", m.Version, m.Name, i+1)
		}
	}
	return ms, nil
}

// Definition is an object that Up installs with CREATE OR REPLACE after
// the numbered migrations, when the schema holds an older version of it or
// none; the version installed is recorded in the schema's
// schema_definitions table.
type Definition struct {
	// Name identifies the object, e.g. "decide".
	Name string
	// Version increases with every change of SQL.
	Version int
	// SQL creates or replaces the object, naming the schema with
	// Placeholder. It may hold several statements.
	SQL string
}

// versionLine is the header that gives a definition file's version.
var versionLine = regexp.MustCompile(`(?m)^-- version: ([0-9]+)$`)

// ParseDefinition returns the Definition name whose SQL is text, with the
// version its "-- version: N" line gives.
func ParseDefinition(name, text string) (Definition, error) {
	m := versionLine.FindStringSubmatch(text)
	if m == nil {
		return Definition{}, fmt.Errorf("definition %s: no \"-- version: N\" line", name)
	}
	v, err := strconv.Atoi(m[1])
	if err != nil || v < 1 {
		return Definition{}, fmt.Errorf("definition %s: version %q: must be a whole number from 1", name, m[1])
	}
	return Definition{Name: name, Version: v, SQL: text}, nil
}

// DefinitionVersion returns the version of the definition name that
// schema holds, 0 when none.
func DefinitionVersion(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema, name string) (int, error) {
	var v int
	err := q.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+pgx.Identifier{schema, "schema_definitions"}.Sanitize()+" WHERE name = $1", name).Scan(&v)
	return v, err
}

// Latest returns the version of the newest embedded migration: the
// version a schema must have reached for this binary to use it.
func Latest() int {
	names, _ := fs.Glob(files, "*.up.sql")
	return len(names) // Load refuses gaps, so the count is the newest version
}

// AdvisoryLockKey derives the 64-bit advisory lock key that sluice uses for
// purpose ("migrate", "cleanup", …) in schema, so that every sluice lock
// comes from one place and locks of different schemas do not collide.
func AdvisoryLockKey(purpose, schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("sluice/" + purpose + "/" + schema))
	return int64(h.Sum64())
}

// Up brings schema up to the newest embedded migration and returns how many
// migrations it applied (0 when the schema was already current).
//
// It takes a session-level advisory lock on one connection that it holds
// for the whole run, so instances that start together wait for each other
// and each migration is applied exactly once; then it creates the schema
// and its schema_migrations table if either is missing. Each pending
// migration runs in its own transaction together with its row in
// schema_migrations. On a current schema it changes nothing and needs no
// privilege beyond reading schema_migrations. The lock is released
// before Up returns; if releasing fails, the connection is closed instead
// of being returned to the pool, which releases the lock too.
//
// Then, in the same session and under the same lock, it installs each of
// defs whose version the schema does not hold yet (never an older one over
// a newer), each in its own transaction with its row in
// schema_definitions, and counts those too.
//
// Up needs a real session: point it at Postgres directly (or at a pooler in
// session mode), not through a transaction-mode pooler.
func Up(ctx context.Context, pool *pgxpool.Pool, schema string, defs ...Definition) (applied int, err error) {
	ms, err := Load(schema)
	if err != nil {
		return 0, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrate %s: acquire connection: %w", schema, err)
	}
	key := AdvisoryLockKey("migrate", schema)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		conn.Release()
		return 0, fmt.Errorf("migrate %s: take advisory lock: %w", schema, err)
	}
	defer func() {
		// Unlock even when ctx is already cancelled: the lock belongs to the
		// session, and a pooled session must not keep it.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		var ok bool
		if uerr := conn.QueryRow(uctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); uerr != nil || !ok {
			// Closing the session is the other way to drop a session lock.
			_ = conn.Hijack().Close(uctx)
			if err == nil {
				if uerr == nil {
					uerr = errors.New("lock was not held")
				}
				err = fmt.Errorf("migrate %s: release advisory lock: %w", schema, uerr)
			}
			return
		}
		conn.Release()
	}()

	quoted := pgx.Identifier{schema}.Sanitize()
	// Only what is missing is created: Postgres checks the privilege to
	// create before it looks whether the object exists, so CREATE … IF NOT
	// EXISTS alone would need CREATE on the database even when the schema is
	// there. An owner role given the schema by a database administrator
	// (deploy/postgres/roles.sql) then needs no more, and a role that may
	// not change the schema at all can still run Up on a current one.
	var schemaExists, tableExists bool
	if err := conn.QueryRow(ctx,
		"SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1), "+
			"EXISTS (SELECT FROM pg_catalog.pg_tables WHERE schemaname = $1 AND tablename = 'schema_migrations')",
		schema).Scan(&schemaExists, &tableExists); err != nil {
		return 0, fmt.Errorf("migrate %s: look for the schema: %w", schema, err)
	}
	// Created under the lock: CREATE ... IF NOT EXISTS is not safe against a
	// concurrent creation of the same name (it can fail on the catalog's
	// unique index), but nobody else runs this for schema while we hold it.
	if !schemaExists {
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+quoted); err != nil {
			return 0, fmt.Errorf("migrate %s: create schema: %w", schema, err)
		}
	}
	if !tableExists {
		if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+quoted+`.schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
			return 0, fmt.Errorf("migrate %s: create schema_migrations: %w", schema, err)
		}
	}
	var current int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+quoted+".schema_migrations").Scan(&current); err != nil {
		return 0, fmt.Errorf("migrate %s: read applied versions: %w", schema, err)
	}
	if current > len(ms) {
		return 0, fmt.Errorf("migrate %s: database is at version %d, newer than this binary's %d", schema, current, len(ms))
	}
	for _, m := range ms[current:] {
		if err := apply(ctx, conn.Conn(), quoted, m); err != nil {
			return applied, fmt.Errorf("migrate %s: %04d_%s: %w", schema, m.Version, m.Name, err)
		}
		applied++
	}
	for _, d := range defs {
		have, err := DefinitionVersion(ctx, conn, schema, d.Name)
		if err != nil {
			return applied, fmt.Errorf("migrate %s: read the version of %s: %w", schema, d.Name, err)
		}
		if have >= d.Version {
			continue
		}
		if err := install(ctx, conn.Conn(), quoted, d); err != nil {
			return applied, fmt.Errorf("migrate %s: install %s version %d: %w", schema, d.Name, d.Version, err)
		}
		applied++
	}
	return applied, nil
}

// install runs one definition and records its version, in one transaction.
func install(ctx context.Context, conn *pgx.Conn, quotedSchema string, d Definition) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, strings.ReplaceAll(d.SQL, Placeholder, quotedSchema)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+quotedSchema+".schema_definitions (name, version) VALUES ($1, $2) "+
			"ON CONFLICT (name) DO UPDATE SET version = excluded.version, applied_at = now()", d.Name, d.Version)
		return err
	})
}

// apply runs one migration and records it, in one transaction.
func apply(ctx context.Context, conn *pgx.Conn, quotedSchema string, m Migration) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// No arguments: pgx sends the text with the simple protocol, which
		// allows several statements in one file.
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+quotedSchema+".schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
		return err
	})
}
