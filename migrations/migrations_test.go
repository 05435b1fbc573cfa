package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/migrations"
)

func TestValidateSchema(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"sluice", true},
		{"_x", true},
		{"t_0123abcd", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 64), false},
		{"", false},
		{"Sluice", false},
		{"1abc", false},
		{"a-b", false},
		{"a b", false},
		{`a"; DROP TABLE x; --`, false},
		{"pg_temp", false},
	}
	for _, tt := range tests {
		err := migrations.ValidateSchema(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateSchema(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

func FuzzValidateSchema(f *testing.F) {
	for _, s := range []string{"sluice", "a\"b", "", "x_1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if migrations.ValidateSchema(name) != nil {
			return
		}
		// An accepted name needs no quoting, so it cannot carry SQL.
		if q := (pgx.Identifier{name}).Sanitize(); q != `"`+name+`"` {
			t.Fatalf("accepted %q quotes as %s", name, q)
		}
	})
}

func TestLoad(t *testing.T) {
	ms, err := migrations.Load("my_schema")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != migrations.Latest() || len(ms) < 5 {
		t.Fatalf("got %d migrations, Latest %d; want the same, at least 5", len(ms), migrations.Latest())
	}
	for i, m := range ms {
		if m.Version != i+1 {
			t.Errorf("migration %d has version %d", i, m.Version)
		}
		if strings.Contains(m.SQL, migrations.Placeholder) {
			t.Errorf("%04d_%s: placeholder left in SQL", m.Version, m.Name)
		}
		if strings.Contains(strings.ToUpper(stripComments(m.SQL)), "CREATE ") && !strings.Contains(m.SQL, `"my_schema".`) {
			t.Errorf("%04d_%s: objects not qualified with the schema", m.Version, m.Name)
		}
		if strings.Contains(strings.ToLower(m.SQL), "public.") {
			t.Errorf("%04d_%s: mentions the public schema", m.Version, m.Name)
		}
	}
	if _, err := migrations.Load("Bad-Name"); err == nil {
		t.Error("Load accepted an invalid schema name")
	}
}

// stripComments drops the "--" comment lines of sql.
func stripComments(sql string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(sql, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func TestAdvisoryLockKey(t *testing.T) {
	if migrations.AdvisoryLockKey("migrate", "a") == migrations.AdvisoryLockKey("migrate", "b") {
		t.Error("two schemas share a lock key")
	}
	if migrations.AdvisoryLockKey("migrate", "a") == migrations.AdvisoryLockKey("cleanup", "a") {
		t.Error("two purposes share a lock key")
	}
}

// freshSchema returns an unused schema name that is dropped after the test.
func freshSchema(t *testing.T) string {
	t.Helper()
	return pgtest.NewSchema(t, pgtest.NewPool(t, pgtest.URL(), 1), "m_")
}

// TestUpConcurrent starts 20 instances, each with its own pool, on one empty
// schema at once: all must succeed and each migration must be applied once.
func TestUpConcurrent(t *testing.T) {
	schema := freshSchema(t)
	want, err := migrations.Load(schema)
	if err != nil {
		t.Fatal(err)
	}
	const instances = 20
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	pools := make([]*pgxpool.Pool, instances)
	for i := range pools {
		pools[i] = pgtest.NewPool(t, pgtest.URL(), 1)
	}
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		applied = make([]int, instances)
		errs    = make([]error, instances)
	)
	for i := range instances {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			applied[i], errs[i] = migrations.Up(ctx, pools[i], schema)
		}()
	}
	close(start)
	wg.Wait()

	total := 0
	for i := range instances {
		if errs[i] != nil {
			t.Errorf("instance %d: %v", i, errs[i])
		}
		total += applied[i]
	}
	if total != len(want) {
		t.Errorf("instances applied %d migrations in total, want %d (each once)", total, len(want))
	}

	pool := pools[0]
	rows, err := pool.Query(ctx, "SELECT version, count(*) OVER (PARTITION BY version) FROM "+
		pgx.Identifier{schema, "schema_migrations"}.Sanitize()+" ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	var versions []int
	for rows.Next() {
		var v, n int
		if err := rows.Scan(&v, &n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("version %d recorded %d times", v, n)
		}
		versions = append(versions, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(versions) != len(want) {
		t.Errorf("recorded versions %v, want 1..%d", versions, len(want))
	}

	// Everything sluice created is in the schema, nothing in public.
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
		WHERE s.nspname = $1 AND c.relname IN ('counters', 'overrides', 'override_epoch', 'schema_migrations')`, schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Errorf("found %d of sluice's 4 tables in schema %s", n, schema)
	}

	// A second run finds nothing to do, and the advisory lock was released.
	again, err := migrations.Up(ctx, pool, schema)
	if err != nil || again != 0 {
		t.Errorf("second Up = %d, %v; want 0, nil", again, err)
	}
	var held int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1",
		migrations.AdvisoryLockKey("migrate", schema)).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Errorf("migration lock still held by %d sessions", held)
	}
}

// TestUpSchemasIndependent shows that a migration holding one schema's lock
// does not block another schema's.
func TestUpSchemasIndependent(t *testing.T) {
	a, b := freshSchema(t), freshSchema(t)
	pool := pgtest.NewPool(t, pgtest.URL(), 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrations.AdvisoryLockKey("migrate", a)); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", migrations.AdvisoryLockKey("migrate", a))

	bctx, bcancel := context.WithTimeout(ctx, 10*time.Second)
	defer bcancel()
	if n, err := migrations.Up(bctx, pool, b); err != nil || n == 0 {
		t.Fatalf("Up(%s) while %s is locked = %d, %v", b, a, n, err)
	}

	// And the locked schema does wait: Up gives up when its context ends.
	actx, acancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer acancel()
	if _, err := migrations.Up(actx, pool, a); err == nil {
		t.Fatalf("Up(%s) succeeded while another session held its lock", a)
	}
}

func TestUpRejectsBadSchema(t *testing.T) {
	pool := pgtest.NewPool(t, pgtest.URL(), 1)
	if _, err := migrations.Up(context.Background(), pool, "public; DROP"); err == nil {
		t.Fatal("Up accepted an invalid schema name")
	}
}

// TestUpLeastPrivilege: Up creates only what is missing, so a role that
// owns a schema given to it by an administrator migrates it without
// CREATE on the database, and a role that may only read schema_migrations
// runs Up on a current schema without error.
func TestUpLeastPrivilege(t *testing.T) {
	schema := freshSchema(t)
	owner, reader := schema+"_owner", schema+"_reader"
	admin := pgtest.NewPool(t, pgtest.URL(), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	for _, stmt := range []string{
		"CREATE ROLE " + q(owner) + " NOLOGIN",
		"CREATE ROLE " + q(reader) + " NOLOGIN",
		"CREATE SCHEMA " + q(schema) + " AUTHORIZATION " + q(owner),
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		// The schema first: a role that owns objects cannot be dropped.
		for _, stmt := range []string{
			"DROP SCHEMA IF EXISTS " + q(schema) + " CASCADE",
			"DROP ROLE IF EXISTS " + q(owner),
			"DROP ROLE IF EXISTS " + q(reader),
		} {
			if _, err := admin.Exec(context.Background(), stmt); err != nil {
				t.Errorf("%s: %v", stmt, err)
			}
		}
	})
	as := func(role string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(pgtest.URL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "SET ROLE "+q(role))
			return err
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}

	ms, err := migrations.Load(schema)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := migrations.Up(ctx, as(owner), schema); err != nil || n != len(ms) {
		t.Fatalf("Up as the schema's owner = %d, %v; want %d applied", n, err, len(ms))
	}
	for _, stmt := range []string{
		"GRANT USAGE ON SCHEMA " + q(schema) + " TO " + q(reader),
		"GRANT SELECT ON " + q(schema) + ".schema_migrations TO " + q(reader),
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if n, err := migrations.Up(ctx, as(reader), schema); err != nil || n != 0 {
		t.Fatalf("Up on a current schema as a role that may only read = %d, %v; want 0, nil", n, err)
	}
}

// TestDefinitions: Up installs a definition the schema does not hold,
// records its version, leaves it alone at the same version, replaces it
// with a newer one and never with an older one.
func TestDefinitions(t *testing.T) {
	schema := freshSchema(t)
	pool := pgtest.NewPool(t, pgtest.URL(), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	def := func(version int, answer string) migrations.Definition {
		d, err := migrations.ParseDefinition("answer", fmt.Sprintf(
			"-- version: %d\nCREATE OR REPLACE FUNCTION {{schema}}.answer() RETURNS text LANGUAGE sql AS $$ SELECT '%s' $$;\n", version, answer))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	answer := func() string {
		t.Helper()
		var s string
		if err := pool.QueryRow(ctx, "SELECT "+pgx.Identifier{schema}.Sanitize()+".answer()").Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	ms, err := migrations.Load(schema)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		def     migrations.Definition
		applied int
		answer  string
		version int
	}{
		{def(1, "one"), len(ms) + 1, "one", 1},
		{def(1, "one again"), 0, "one", 1}, // same version: left alone
		{def(3, "three"), 1, "three", 3},
		{def(2, "two"), 0, "three", 3}, // older: never over a newer one
	}
	for i, s := range steps {
		n, err := migrations.Up(ctx, pool, schema, s.def)
		if err != nil || n != s.applied {
			t.Fatalf("step %d: Up = %d, %v; want %d applied", i, n, err, s.applied)
		}
		if got := answer(); got != s.answer {
			t.Errorf("step %d: the function answers %q, want %q", i, got, s.answer)
		}
		if v, err := migrations.DefinitionVersion(ctx, pool, schema, "answer"); err != nil || v != s.version {
			t.Errorf("step %d: recorded version %d, %v; want %d", i, v, err, s.version)
		}
	}
	for _, text := range []string{"SELECT 1", "-- version: 0\nSELECT 1", "-- version: x\nSELECT 1"} {
		if _, err := migrations.ParseDefinition("bad", text); err == nil {
			t.Errorf("ParseDefinition accepted %q", text)
		}
	}
}
