//go:build unix

package deploy

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
)

// TestDatabaseRoles applies deploy/postgres/roles.sql with psql to a fresh
// database of a private cluster (roles belong to a whole cluster), with
// passwords required for its roles, then: migrates as the owner role; runs
// the sluice binary as the runtime role and uses decisions and every admin
// endpoint through it; runs the janitor's cleanup and the key events'
// pruning as the runtime role; and shows that every attempt of the runtime
// role to change the schema is refused.
func TestDatabaseRoles(t *testing.T) {
	t.Parallel()
	psql := pgtest.Tool(t, "psql")
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	c.Exec(t, "CREATE DATABASE app")

	// Not the defaults, to show the variables are used.
	const (
		schema     = "ratelimit"
		owner      = "gw_owner"
		runtime    = "gw_runtime"
		ownerPW    = "owner-pw-Zq3!'quote"
		runtimePW  = "runtime-pw-K8$ \"dq"
		adminToken = "admin-token-for-the-roles-test"
	)
	// Password authentication for the two roles; the cluster trusts the
	// postgres superuser, as the tests need.
	hba := filepath.Join(c.Dir, "data", "pg_hba.conf")
	old, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	rules := fmt.Sprintf("host all %s,%s 127.0.0.1/32 scram-sha-256\n", owner, runtime)
	if err := os.WriteFile(hba, append([]byte(rules), old...), 0o600); err != nil {
		t.Fatal(err)
	}
	c.Exec(t, "SELECT pg_reload_conf()")

	superURL := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/app?sslmode=disable", c.Port)
	roleURL := func(role, password string) string {
		u := url.URL{Scheme: "postgres", User: url.UserPassword(role, password),
			Host: fmt.Sprintf("127.0.0.1:%d", c.Port), Path: "/app", RawQuery: "sslmode=disable"}
		return u.String()
	}
	apply := func() {
		t.Helper()
		out, err := proctest.Run("", nil, psql, superURL, "--no-psqlrc", "-v", "ON_ERROR_STOP=1",
			"-v", "schema="+schema, "-v", "owner_role="+owner, "-v", "runtime_role="+runtime,
			"-v", "owner_password="+ownerPW, "-v", "runtime_password="+runtimePW,
			"-f", filepath.Join(root, "deploy", "postgres", "roles.sql"))
		if err != nil {
			t.Fatalf("psql -f roles.sql: %v\n%s", err, out)
		}
		if strings.Contains(out, "pw-") {
			t.Fatalf("psql's output shows a password:\n%s", out)
		}
	}
	apply()
	apply() // again: harmless

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if conn, err := pgx.Connect(ctx, roleURL(runtime, "wrong")); err == nil {
		conn.Close(ctx)
		t.Fatal("the runtime role logs in with a wrong password: the test's pg_hba.conf is not in force")
	}

	bin := sluiceBinary(t)
	migrate := func(role, password string) string {
		t.Helper()
		out, err := proctest.Run("", []string{"SLUICE_DATABASE_URL=" + roleURL(role, password), "SLUICE_DB_SCHEMA=" + schema}, bin, "migrate")
		if err != nil {
			t.Fatalf("sluice migrate as %s: %v\n%s", role, err, out)
		}
		return out
	}
	if out := migrate(owner, ownerPW); !strings.HasPrefix(out, "schema "+schema+": ") || strings.Contains(out, ": 0 migrations") {
		t.Fatalf("sluice migrate as the owner: %s", out)
	}
	// On a current schema the runtime role's migrate needs no privilege
	// to change anything.
	if out := migrate(runtime, runtimePW); !strings.Contains(out, ": 0 migrations applied") {
		t.Fatalf("sluice migrate as the runtime role: %s", out)
	}

	// The gateway as the runtime role.
	upstream := proctest.NewUpstream(t, nil)
	g := startSluice(t, map[string]string{
		"SLUICE_UPSTREAM":     upstream.URL,
		"SLUICE_DATABASE_URL": roleURL(runtime, runtimePW),
		"SLUICE_DB_SCHEMA":    schema,
		"SLUICE_AUTO_MIGRATE": "false",
		"SLUICE_HASH_KEY":     "roles-test-hash-key-0123456789",
		"SLUICE_ADMIN_TOKEN":  adminToken,
		"SLUICE_DB_TIMEOUT":   "5s", // privileges, not latency, are under test
		"SLUICE_FAIL_MODE":    "closed",
		"SLUICE_RULES":        "login: POST /api/login by ip 2/1h; query: GET /api/query by tenant 2/1h",
	})
	expect := func(what string, gotCode int, body string, want int) {
		t.Helper()
		if gotCode != want {
			t.Fatalf("%s: %d %s; want %d\n%s", what, gotCode, body, want, g.out)
		}
	}
	code, body := httpGet(g.admin + "/readyz")
	expect("GET /readyz", code, body, 200)
	pgtest.ClearOf(t, time.Hour, 20*time.Second)
	for i, want := range []int{200, 200, 429} {
		code, body := do("POST", g.url+"/api/login", "", "")
		expect(fmt.Sprintf("login %d", i+1), code, body, want)
	}
	key := g.admin + "/v1/keys?rule=login&ip=127.0.0.1"
	code, body = do("GET", key, adminToken, "")
	expect("GET /v1/keys", code, body, 200)
	if !strings.Contains(body, `"count":2`) {
		t.Errorf("GET /v1/keys: %s; want a count of 2", body)
	}
	code, body = do("DELETE", key, adminToken, "")
	expect("DELETE /v1/keys", code, body, 204)
	code, body = do("POST", g.url+"/api/login", "", "")
	expect("login after the reset", code, body, 200)

	override := g.admin + "/v1/overrides?rule=query&tenant=acme"
	code, body = do("PUT", override, adminToken, `{"limit":5,"window":"1h"}`)
	expect("PUT /v1/overrides", code, body, 200)
	query := func() int {
		res, _ := proctest.Send(t, "GET", g.url+"/api/query", "X-Tenant-ID", "acme")
		return res.StatusCode
	}
	for i := range 5 {
		if code := query(); code != 200 {
			t.Fatalf("query %d under the override of 5: %d\n%s", i+1, code, g.out)
		}
	}
	code, body = do("DELETE", override, adminToken, "")
	expect("DELETE /v1/overrides", code, body, 204)
	if code := query(); code != 429 {
		t.Errorf("query after the override was deleted: %d; want 429 (the rule's limit of 2 is used up)", code)
	}
	if m := scrape(t, g.admin+"/metrics"); m[`sluice_store_errors_total{kind="insufficient_privilege"}`] != 0 {
		t.Errorf("the store reported permission errors:\n%s", g.out)
	}
	if strings.Contains(g.out.String(), "permission denied") {
		t.Errorf("sluice logged a permission error:\n%s", g.out)
	}

	// The janitor and the key events' pruning, in process, as the runtime
	// role: they run on timers too slow for a test in the binary.
	pool, err := pgxpool.New(ctx, roleURL(runtime, runtimePW))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// A long decision deadline: the probe below is the pool's first
	// connection (connect, warm, plan), which missed the default 50 ms on a
	// loaded CI machine; what it checks is the role's privileges.
	store, err := postgres.New(pool, postgres.Options{Schema: schema, PollInterval: 10 * time.Millisecond, CleanupInterval: limiter.Off, DecisionTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Probe(ctx); err != nil {
		t.Fatalf("probe as the runtime role: %v", err)
	}
	q := pgx.Identifier{schema}.Sanitize()
	exec1 := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("as the runtime role: %s: %v", sql, err)
		}
	}
	exec1("INSERT INTO " + q + ".counters (rule, key, alg, expires_at) VALUES ('expired', 'k', 0, now() - interval '1 hour')")
	if n, err := store.Cleanup(ctx); err != nil || n != 1 {
		t.Errorf("cleanup as the runtime role deleted %d rows (%v); want the 1 expired", n, err)
	}
	exec1("INSERT INTO " + q + ".key_events (rule, key, at) VALUES ('old', 'k', now() - interval '2 hours')")
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); store.Run(watchCtx) }()
	for deadline := time.Now().Add(10 * time.Second); ; {
		var old int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+q+".key_events WHERE rule = 'old'").Scan(&old); err != nil {
			t.Fatal(err)
		}
		if old == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the key events' pruning did not delete an old event as the runtime role")
		}
		time.Sleep(20 * time.Millisecond) // the poll's first prune: poll for its effect
	}
	stopWatch()
	<-watched

	// No change to the schema.
	for _, ddl := range []string{
		"CREATE TABLE " + q + ".intruder (x int)",
		"CREATE FUNCTION " + q + ".intruder() RETURNS int LANGUAGE sql AS 'SELECT 1'",
		"CREATE INDEX ON " + q + ".counters (expires_at)",
		"CREATE TRIGGER intruder AFTER INSERT ON " + q + ".overrides FOR EACH ROW EXECUTE FUNCTION " + q + ".override_key_event()",
		"ALTER TABLE " + q + ".counters ADD COLUMN intruder int",
		"ALTER TABLE " + q + ".counters SET (fillfactor = 100)",
		"ALTER FUNCTION " + q + ".bump_override_epoch() RENAME TO intruder",
		"DROP TABLE " + q + ".key_events",
		"DROP FUNCTION " + q + ".bump_override_epoch()",
		"DROP SCHEMA " + q + " CASCADE",
		"TRUNCATE " + q + ".counters",
		"TRUNCATE " + q + ".overrides",
		"CREATE SCHEMA intruder",
	} {
		_, err := pool.Exec(ctx, ddl)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("as the runtime role, %s: %v; want a permission error (SQLSTATE 42501)", ddl, err)
		}
	}

	// The passwords were set, and hashed.
	su, err := pgx.Connect(ctx, superURL)
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(ctx)
	var scram int
	if err := su.QueryRow(ctx, "SELECT count(*) FROM pg_authid WHERE rolname IN ($1, $2) AND rolpassword LIKE 'SCRAM-SHA-256$%'", owner, runtime).Scan(&scram); err != nil || scram != 2 {
		t.Errorf("%d of the 2 roles have a SCRAM password (%v)", scram, err)
	}
}
