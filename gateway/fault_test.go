//go:build unix

package gateway

// Fault tests: real faults on real PostgreSQL servers, each test on
// private clusters of its own (pgtest.NewCluster) on loopback, so that
// stopping, locking, filling or failing one over touches nobody else.
// When initdb, pg_basebackup or pgbouncer is missing they skip, or fail
// when CI is set; .ci/run installs them.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter/postgres"
)

// TestFaultPostgresStopped: Postgres stops in the middle of traffic. Every
// request is answered; once the breaker is open, decisions take well under
// a millisecond; open rules pass, closed rules get 503, local rules hold
// their limit per instance. Postgres starts again: exact shared decisions
// resume within seconds, without a restart.
func TestFaultPostgresStopped(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	up := newUpstream(t)
	env := faultEnv(up.URL, c.URL())
	gws := []*faultGateway{startFault(t, env), startFault(t, env)}
	expectExact(t, gws, "before")

	bg := startTraffic(gws, 2)
	c.Stop(t)
	stopped := time.Now()
	for i, g := range gws {
		waitFor(t, 10*time.Second, fmt.Sprintf("gateway %d's breaker opens", i), func() bool { return g.breakerState(t) == 2 })
	}
	openedAfter := time.Since(stopped)

	// With the breaker open: measure whole decisions inside each gateway
	// (the decision histogram) and requests from outside.
	const perRule = 300
	var took []time.Duration
	for i, g := range gws {
		before := g.metrics(t)
		for j := range perRule {
			r := g.mustPost(t, "/open", fmt.Sprintf("o-%d-%d", i, j))
			if r.status != 200 {
				t.Fatalf("fail=open while down: status %d", r.status)
			}
			took = append(took, r.took)
			r = g.mustPost(t, "/closed", fmt.Sprintf("c-%d-%d", i, j))
			if r.status != 503 || r.retryAfter != "1" || r.ctype != "application/problem+json" {
				t.Fatalf("fail=closed while down: %+v, want 503 problem+json with Retry-After: 1", r)
			}
			took = append(took, r.took)
			// One key for every local request: the per-instance limit holds.
			r = g.mustPost(t, "/local", "local-key")
			if want := map[bool]int{true: 200, false: 429}[j < 5]; r.status != want {
				t.Fatalf("fail=local request %d on gateway %d while down: status %d, want %d", j+1, i, r.status, want)
			}
			took = append(took, r.took)
		}
		after := g.metrics(t)
		bound, n := p99Bound(before, after)
		if n < 3*perRule || bound > 0.001 {
			t.Errorf("gateway %d: p99 of %v decisions with the breaker open is under %vs, want under 1ms", i, n, bound)
		}
		t.Logf("gateway %d, breaker open: %v decisions, p99 <= %vs (histogram bound); %.2f%% under 100µs, %.2f%% under 250µs, %.2f%% under 1ms",
			i, n, bound, 100*fractionUnder(before, after, 0.0001), 100*fractionUnder(before, after, 0.00025), 100*fractionUnder(before, after, 0.001))
	}
	t.Logf("breaker open: HTTP round trip through the gateway p50 %v, p99 %v, max %v (%d requests)",
		percentile(took, 50), percentile(took, 99), percentile(took, 100), len(took))

	c.Start(t)
	for i, g := range gws {
		recovered := g.waitDecides(t, 15*time.Second, fmt.Sprintf("gateway %d decides with the store again", i))
		t.Logf("gateway %d: store decisions again %v after Postgres accepted connections (breaker opened %v after the stop)",
			i, recovered, openedAfter)
	}
	expectExact(t, gws, "after")
	// The counts from before the outage are still there.
	for _, g := range gws {
		if r := g.mustPost(t, "/closed", "before"); r.status != 429 {
			t.Errorf("key used up before the outage: status %d after it, want 429", r.status)
		}
	}
	n := bg.stop(t)
	t.Logf("%d background requests, every one answered", n)

	for i, g := range gws {
		m := g.metrics(t)
		for _, s := range []string{
			`sluice_decisions_total{outcome="failed_open",rule="open"}`,
			`sluice_decisions_total{outcome="failed_closed",rule="closed"}`,
			`sluice_decisions_total{outcome="local",rule="local"}`,
			`sluice_store_errors_total{kind="connection"}`,
			`sluice_store_breaker_transitions_total{to="open"}`,
			`sluice_store_breaker_transitions_total{to="closed"}`,
		} {
			if m[s] == 0 {
				t.Errorf("gateway %d: %s is 0", i, s)
			}
		}
		if m["sluice_store_breaker_state"] != 0 {
			t.Errorf("gateway %d: breaker state %v after recovery", i, m["sluice_store_breaker_state"])
		}
		if w := logged(g.logs, zapcore.WarnLevel, "circuit breaker opened", ""); len(w) != 1 {
			t.Errorf("gateway %d: %d breaker-opened lines, want 1", i, len(w))
		}
		if c := logged(g.logs, zapcore.InfoLevel, "circuit breaker closed", ""); len(c) != 1 {
			t.Errorf("gateway %d: %d breaker-closed lines, want 1", i, len(c))
		}
		// The background work logs changes of state, not every tick of an
		// outage that lasted seconds.
		seen := map[string]int{}
		for _, e := range logged(g.logs, zapcore.WarnLevel, "", "") {
			if e.Message != "rate-limit store could not decide; applying fail modes" {
				seen[e.Message]++
			}
		}
		for msg, n := range seen {
			if n > 1 {
				t.Errorf("gateway %d: %q logged %d times in one outage, want once", i, msg, n)
			}
		}
	}
}

// TestFaultPostgresSlow: a session holds an exclusive lock on the counters
// table. Requests are answered within SLUICE_DB_TIMEOUT plus a small
// margin; goroutines, pooled connections and server sessions stay bounded;
// decisions resume when the lock goes.
func TestFaultPostgresSlow(t *testing.T) {
	const (
		timeout = 250 * time.Millisecond
		margin  = 100 * time.Millisecond
		workers = 8
	)
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	up := newUpstream(t)
	env := faultEnv(up.URL, c.URL()+"&pool_max_conns=4")
	env["SLUICE_DB_TIMEOUT"] = timeout.String()
	g := startFault(t, env)
	expectExact(t, []*faultGateway{g}, "before")

	ctx := context.Background()
	locker, err := c.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	watcher, err := c.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close(ctx)
	if _, err := locker.Exec(ctx, "BEGIN; LOCK TABLE sluice.counters IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	baseline := runtime.NumGoroutine()
	g.served.take()

	// Sample goroutines, the pool and the server's sessions while the
	// load runs.
	var (
		mu                                  sync.Mutex
		maxGoroutines, maxConns, maxBackend int
	)
	sampleStop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampleStop:
				return
			case <-tick.C:
			}
			var backends int
			if err := watcher.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sluice'").Scan(&backends); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			maxGoroutines = max(maxGoroutines, runtime.NumGoroutine())
			maxConns = max(maxConns, int(g.g.backend.pool.Stat().TotalConns()))
			maxBackend = max(maxBackend, backends)
			mu.Unlock()
		}
	}()

	var (
		lmu   sync.Mutex
		took  []time.Duration
		codes = map[string]map[int]int{"/open": {}, "/closed": {}}
		wg    sync.WaitGroup
	)
	end := time.Now().Add(2 * time.Second)
	for w := range workers {
		wg.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				path := []string{"/open", "/closed"}[(w+i)%2]
				r, err := g.post(path, fmt.Sprintf("slow-%d-%d", w, i))
				if err != nil {
					t.Error(err)
					return
				}
				lmu.Lock()
				took = append(took, r.took)
				codes[path][r.status]++
				lmu.Unlock()
			}
		})
	}
	wg.Wait()
	close(sampleStop)
	<-sampled
	state := g.breakerState(t)
	if _, err := locker.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}

	served := g.served.take()
	worst := percentile(served, 100)
	t.Logf("lock held: %d requests by %d clients; inside the gateway: p50 %v, p99 %v, max %v; round trips: p50 %v, p99 %v, max %v; statuses %v",
		len(took), workers, percentile(served, 50), percentile(served, 99), worst,
		percentile(took, 50), percentile(took, 99), percentile(took, 100), codes)
	t.Logf("bounded: goroutines %d at the start, at most %d; pool connections at most %d (max 4); server sessions at most %d",
		baseline, maxGoroutines, maxConns, maxBackend)
	if worst > timeout+margin {
		t.Errorf("the gateway took up to %v to answer, want under SLUICE_DB_TIMEOUT %v + %v", worst, timeout, margin)
	}
	// Seen from the client, on a busy machine, the round trip adds
	// scheduling noise; still nobody waits for the lock (2 s).
	if rt := percentile(took, 100); rt > time.Second {
		t.Errorf("a round trip took %v: requests wait for the lock", rt)
	}
	if len(codes["/open"]) != 1 || codes["/open"][200] == 0 || len(codes["/closed"]) != 1 || codes["/closed"][503] == 0 {
		t.Errorf("statuses %v: want only 200 for fail=open and only 503 for fail=closed", codes)
	}
	if state == 0 {
		t.Errorf("breaker state %v under a held lock, want open (2), or half-open (1) while its probe waits", state)
	}
	if g.metric(t, `sluice_store_errors_total{kind="timeout"}`) == 0 {
		t.Error("no timeout counted")
	}
	// No pile-up: a fixed allowance per client, not growing with time.
	if maxGoroutines > baseline+8*workers {
		t.Errorf("goroutines reached %d from %d with %d clients", maxGoroutines, baseline, workers)
	}
	if maxConns > 4 {
		t.Errorf("pool reached %d connections, more than pool_max_conns=4", maxConns)
	}
	if maxBackend > 8 {
		t.Errorf("the server had up to %d sessions of sluice: timed-out statements pile up", maxBackend)
	}

	recovered := g.waitDecides(t, 10*time.Second, "decisions resume after the lock")
	t.Logf("store decisions again %v after the lock was released", recovered)
	expectExact(t, []*faultGateway{g}, "after")
	// Once the clients' idle keep-alive connections are closed, nothing of
	// the load is left behind.
	waitFor(t, 20*time.Second, "goroutines back to their number before the load", func() bool {
		faultClient.CloseIdleConnections()
		return runtime.NumGoroutine() <= baseline+10
	})
}

// TestFaultSchemaBroken: the privileges on the counters table are revoked,
// then given back, then the table is dropped, all mid-traffic. The logs
// say clearly what is wrong, the fail modes apply, nothing crashes, and
// decisions resume once the privileges are back.
func TestFaultSchemaBroken(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	c.Exec(t, "CREATE ROLE sluice_app LOGIN")
	c.Exec(t, "GRANT CREATE ON DATABASE postgres TO sluice_app")
	up := newUpstream(t)
	g := startFault(t, faultEnv(up.URL, fmt.Sprintf("postgres://sluice_app@127.0.0.1:%d/postgres?sslmode=disable", c.Port)))
	gws := []*faultGateway{g}
	expectExact(t, gws, "before")

	broken := func(step string) {
		t.Helper()
		for i := range 20 {
			if r := g.mustPost(t, "/open", fmt.Sprintf("%s-o-%d", step, i)); r.status != 200 {
				t.Fatalf("%s: fail=open got %d", step, r.status)
			}
			if r := g.mustPost(t, "/closed", fmt.Sprintf("%s-c-%d", step, i)); r.status != 503 {
				t.Fatalf("%s: fail=closed got %d", step, r.status)
			}
			if r, want := g.mustPost(t, "/local", step+"-l"), map[bool]int{true: 200, false: 429}[i < 5]; r.status != want {
				t.Fatalf("%s: fail=local request %d got %d, want %d", step, i+1, r.status, want)
			}
		}
		if g.breakerState(t) != 2 {
			t.Fatalf("%s: breaker not open", step)
		}
	}

	c.Exec(t, "REVOKE ALL ON sluice.counters FROM sluice_app")
	broken("revoked")
	if e := logged(g.logs, zapcore.WarnLevel, "could not decide", "insufficient_privilege"); len(e) == 0 ||
		!strings.Contains(e[0].ContextMap()["error"].(string), "permission denied for table counters") {
		t.Errorf("no clear log line for the revoked privileges: %v", e)
	}
	if e := logged(g.logs, zapcore.WarnLevel, "circuit breaker opened", "insufficient_privilege"); len(e) != 1 {
		t.Errorf("%d breaker-opened lines of kind insufficient_privilege, want 1", len(e))
	}
	g.expectErrorsCounted(t, "insufficient_privilege")

	c.Exec(t, "GRANT ALL ON sluice.counters TO sluice_app")
	g.waitDecides(t, 10*time.Second, "decisions resume after the grant")
	expectExact(t, gws, "granted")

	c.Exec(t, "DROP TABLE sluice.counters")
	broken("dropped")
	if e := logged(g.logs, zapcore.WarnLevel, "could not decide", "undefined_table"); len(e) == 0 ||
		!strings.Contains(e[0].ContextMap()["error"].(string), "does not exist") {
		t.Errorf("no clear log line for the dropped table: %v", e)
	}
	g.expectErrorsCounted(t, "undefined_table")
	if code, _ := get(t, g.admin+"/healthz"); code != 200 {
		t.Errorf("/healthz %d", code)
	}
	if err := g.stop(); err != nil {
		t.Errorf("serve: %v", err)
	}
}

// TestFaultTooManyClients: the server has no connection slot left for the
// gateway, whose own connections were terminated. Requests wait no longer
// than the decision timeout, then the fail modes apply; decisions resume
// when slots free up.
func TestFaultTooManyClients(t *testing.T) {
	const timeout = 250 * time.Millisecond
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{Settings: map[string]string{
		"max_connections": "12", "superuser_reserved_connections": "0",
	}})
	up := newUpstream(t)
	env := faultEnv(up.URL, c.URL()+"&pool_max_conns=4")
	env["SLUICE_DB_TIMEOUT"] = timeout.String()
	g := startFault(t, env)
	gws := []*faultGateway{g}
	expectExact(t, gws, "before")

	ctx := context.Background()
	var fillers []*pgx.Conn
	defer func() {
		for _, f := range fillers {
			f.Close(ctx)
		}
	}()
	fill := func() {
		t.Helper()
		for {
			conn, err := c.Connect(ctx)
			if err != nil {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "53300" {
					t.Fatalf("filling the server: %v, want SQLSTATE 53300", err)
				}
				return
			}
			fillers = append(fillers, conn)
		}
	}
	fill()
	if len(fillers) == 0 {
		t.Fatal("no slot to fill")
	}
	// Terminate the gateway's sessions and take their slots too.
	if _, err := fillers[0].Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'sluice'"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the gateway's sessions end", func() bool {
		var n int
		if err := fillers[0].QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sluice'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	fill()
	t.Logf("%d connections hold every slot", len(fillers))

	g.served.take()
	var took []time.Duration
	for i := range 30 {
		for _, path := range []string{"/open", "/closed", "/local"} {
			r := g.mustPost(t, path, fmt.Sprintf("full-%d", i))
			want := map[string]int{"/open": 200, "/closed": 503, "/local": 200}[path]
			if r.status != want {
				t.Fatalf("%s with the server full: status %d, want %d", path, r.status, want)
			}
			took = append(took, r.took)
		}
	}
	served := g.served.take()
	worst := percentile(served, 100)
	t.Logf("server full: inside the gateway p50 %v, p99 %v, max %v; round trips p50 %v, p99 %v, max %v",
		percentile(served, 50), percentile(served, 99), worst, percentile(took, 50), percentile(took, 99), percentile(took, 100))
	if worst > timeout+100*time.Millisecond {
		t.Errorf("the gateway took up to %v with the server full, want under %v + 100ms", worst, timeout)
	}
	g.expectErrorsCounted(t, "too_many_connections")
	if e := logged(g.logs, zapcore.WarnLevel, "circuit breaker opened", ""); len(e) != 1 {
		t.Errorf("%d breaker-opened lines, want 1", len(e))
	}

	for _, f := range fillers {
		f.Close(ctx)
	}
	fillers = nil
	recovered := g.waitDecides(t, 10*time.Second, "decisions resume once slots free up")
	t.Logf("store decisions again %v after the slots freed up", recovered)
	expectExact(t, gws, "after")
}

// TestFaultFailover: a primary and a streaming standby; the primary stops,
// the standby is promoted, and two gateways (one busy, one idle), on a
// multi-host connection string with target_session_attrs=read-write, are
// ready again within seconds and exact from their first decision after
// /readyz said 200, with the counts made before the failover.
func TestFaultFailover(t *testing.T) {
	primary := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	standby := primary.NewStandby(t)
	up := newUpstream(t)
	url := fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write",
		primary.Port, standby.Port)
	busy, idle := startFault(t, faultEnv(up.URL, url)), startFault(t, faultEnv(up.URL, url))
	gws := []*faultGateway{busy, idle}
	for range 3 {
		if r := busy.mustPost(t, "/closed", "kept"); r.status != 200 {
			t.Fatalf("status %d before the failover", r.status)
		}
	}
	primary.WaitForStandby(t, standby)

	bg := startTraffic([]*faultGateway{busy}, 2)
	primary.Stop(t)
	stopped := time.Now()
	waitFor(t, 10*time.Second, "both breakers open", func() bool {
		return busy.breakerState(t) != 0 && idle.breakerState(t) != 0
	})
	standby.Promote(t)
	promoted := time.Now()
	took := waitReady(t, gws, 20*time.Second)
	t.Logf("failover: every /readyz 200 %v after the promotion, %v after the primary stopped (promotion took %v)",
		took, time.Since(stopped), promoted.Sub(stopped))
	bg.stop(t)

	// Ready means exact at once: the three requests made on the old
	// primary count, and a fresh key gets exactly its limit, from the
	// first decision after /readyz said 200, on both gateways.
	codes := burst(t, gws, "/closed", "kept", 5)
	if codes[200] != 2 || codes[429] != 3 {
		m := busy.metrics(t)
		errs := map[string]float64{}
		for k, v := range m {
			if strings.HasPrefix(k, "sluice_store_errors_total") {
				errs[k] = v
			}
		}
		t.Errorf("key with 3 of 5 used before the failover: %v after it, want 2×200 and 3×429 (breaker state %v, store errors %v)",
			codes, m["sluice_store_breaker_state"], errs)
	}
	expectExactNow(t, gws, "after")
}

// TestFaultDemotedPrimary: the server turns read-only under the pool's
// connections (as a demoted primary does). Their first error drops every
// pooled connection, new connections refuse the read-only server
// (target_session_attrs=read-write), the fail modes apply, and decisions
// resume by themselves when it takes writes again.
func TestFaultDemotedPrimary(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	up := newUpstream(t)
	g := startFault(t, faultEnv(up.URL, c.URL()+"&target_session_attrs=read-write"))
	gws := []*faultGateway{g}
	expectExact(t, gws, "before")

	c.Exec(t, "ALTER SYSTEM SET default_transaction_read_only = on")
	c.Exec(t, "SELECT pg_reload_conf()")
	waitFor(t, 10*time.Second, "fail=closed answers 503 on the read-only server", func() bool {
		return g.mustPost(t, "/closed", "probe").status == 503
	})
	for i := range 10 {
		if r := g.mustPost(t, "/open", fmt.Sprintf("ro-%d", i)); r.status != 200 {
			t.Fatalf("fail=open on a read-only server: %d", r.status)
		}
	}
	if e := logged(g.logs, zapcore.WarnLevel, "dropped every pooled connection", "read_only"); len(e) == 0 {
		t.Error("the read-only connections were not dropped (no log line)")
	}
	g.expectErrorsCounted(t, "read_only")

	c.Exec(t, "ALTER SYSTEM RESET default_transaction_read_only")
	c.Exec(t, "SELECT pg_reload_conf()")
	recovered := g.waitDecides(t, 10*time.Second, "decisions resume on the writable server")
	t.Logf("store decisions again %v after the server took writes again", recovered)
	expectExact(t, gws, "after")
}

// TestFaultPgBouncer: 10,000 decisions through PgBouncer in transaction
// pooling mode, with the connection string the README gives: no error,
// exact counts. Migrations run directly against Postgres, since their
// advisory lock needs a session of its own.
func TestFaultPgBouncer(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	bouncer := c.NewPgBouncer(t, map[string]string{"pool_mode": "transaction", "default_pool_size": "8"})
	ctx := context.Background()
	pool := pgtest.NewPool(t, c.URL(), 2)
	if _, err := postgres.Migrate(ctx, pool, "sluice"); err != nil {
		t.Fatal(err)
	}

	up := newUpstream(t)
	env := faultEnv(up.URL, bouncer.URL("default_query_exec_mode=exec"))
	env["SLUICE_RULES"] = "bulk: POST /bulk by header(X-Key) 60/1h fail=closed"
	env["SLUICE_AUTO_MIGRATE"] = "false"
	env["SLUICE_LOCAL_CACHE_SIZE"] = "0" // every decision goes to the database
	env["SLUICE_DB_TIMEOUT"] = "5s"      // exactness, not latency, is under test
	g := startFault(t, env)

	const keys, perKey, workers = 100, 100, 16
	var (
		mu    sync.Mutex
		codes = map[int]int{}
		wg    sync.WaitGroup
		next  = make(chan int)
	)
	for range workers {
		wg.Go(func() {
			for i := range next {
				r, err := g.post("/bulk", fmt.Sprintf("key-%d", i%keys))
				mu.Lock()
				if err != nil {
					codes[-1]++
				} else {
					codes[r.status]++
				}
				mu.Unlock()
			}
		})
	}
	began := time.Now()
	for i := range keys * perKey {
		next <- i
	}
	close(next)
	wg.Wait()
	t.Logf("%d decisions through PgBouncer (transaction pooling) in %v: %v", keys*perKey, time.Since(began), codes)

	if codes[200] != keys*60 || codes[429] != keys*(perKey-60) || len(codes) != 2 {
		t.Errorf("statuses %v, want exactly %d×200 and %d×429", codes, keys*60, keys*(perKey-60))
	}
	if n := up.count("/bulk"); n != keys*60 {
		t.Errorf("upstream saw %d requests, want %d", n, keys*60)
	}
	m := g.metrics(t)
	for k, v := range m {
		if strings.HasPrefix(k, "sluice_store_errors_total") && v != 0 {
			t.Errorf("%s = %v, want no store error", k, v)
		}
	}
	if e := logged(g.logs, zapcore.WarnLevel, "", ""); len(e) != 0 {
		t.Errorf("%d log lines at Warn or above, first: %s %v", len(e), e[0].Message, e[0].ContextMap())
	}
	var rows, sum int64
	if err := pool.QueryRow(ctx, "SELECT count(*), coalesce(sum(n), 0) FROM sluice.counters WHERE rule = 'bulk'").Scan(&rows, &sum); err != nil {
		t.Fatal(err)
	}
	if rows != keys || sum != keys*60 {
		t.Errorf("counters: %d rows summing to %d, want %d rows summing to %d", rows, sum, keys, keys*60)
	}
	if t.Failed() {
		t.Logf("pgbouncer log:\n%s", bouncer.Log())
	}
}

// TestFaultGracefulShutdown: a decision waiting on the database when the
// gateway is told to stop completes, decided by the store, and is counted;
// the pool closes only after it.
func TestFaultGracefulShutdown(t *testing.T) {
	db := pgtest.New(t)
	up := newUpstream(t)
	env := faultEnv(up.URL, db.URL)
	env["SLUICE_DB_SCHEMA"] = db.Schema
	env["SLUICE_DB_TIMEOUT"] = "30s" // the decision waits for the lock, whatever it takes
	g := startFault(t, env)
	if r := g.mustPost(t, "/closed", "inflight"); r.status != 200 {
		t.Fatalf("warm-up: %d", r.status)
	}

	ctx := context.Background()
	locker, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Release()
	counters := pgx.Identifier{db.Schema, "counters"}.Sanitize()
	if _, err := locker.Exec(ctx, "BEGIN; LOCK TABLE "+counters+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	replied := make(chan reply, 1)
	go func() {
		r, err := g.post("/closed", "inflight")
		if err != nil {
			t.Error(err)
		}
		replied <- r
	}()
	waitFor(t, 10*time.Second, "the decision waits on the lock", func() bool {
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sluice' AND wait_event_type = 'Lock'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})

	stopped := make(chan error, 1)
	go func() { stopped <- g.stop() }()
	waitFor(t, 10*time.Second, "the public listener closes", func() bool {
		conn, err := net.Dial("tcp", strings.TrimPrefix(g.url, "http://"))
		if err == nil {
			conn.Close()
		}
		return err != nil
	})
	select {
	case err := <-stopped:
		t.Fatalf("the gateway stopped (%v) with a decision in flight", err)
	default:
	}
	if _, err := locker.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if r := <-replied; r.status != 200 {
		t.Errorf("in-flight decision answered %d, want 200 from the store", r.status)
	}
	if err := <-stopped; err != nil {
		t.Errorf("serve: %v", err)
	}
	var n int64
	if err := db.Pool.QueryRow(ctx, "SELECT n FROM "+counters+" WHERE rule = 'closed'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("counter %d after the shutdown, want 2: the in-flight decision was not committed", n)
	}
}
