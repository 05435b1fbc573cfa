package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/limiter/storetest"
	"github.com/sluicehq/sluice/policy"
)

// base is a round instant: windows of a second to a day start at it.
var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newClock is the conformance suite's settable clock, for Options.Now.
func newClock(t time.Time) *storetest.Clock { return storetest.NewClock(t) }

// open returns a ready Store on pool and db's schema (New, then Probe);
// now nil means the database clock.
func open(t testing.TB, db *pgtest.DB, pool *pgxpool.Pool, now func() time.Time, opts ...func(*postgres.Options)) *postgres.Store {
	t.Helper()
	if pool == nil {
		pool = db.Pool
	}
	o := postgres.Options{Schema: db.Schema, Now: now}
	for _, f := range opts {
		f(&o)
	}
	if o.Logger == nil {
		o.Logger = failureLog(t)
	}
	if now == nil {
		// The longest test on the database clock
		// (TestLeasesExactAcrossInstances) has taken 27 s in CI; its
		// windows are an hour long.
		pgtest.ClearOf(t, time.Hour, 90*time.Second)
	}
	s, err := postgres.New(pool, o)
	if err != nil {
		t.Fatal(err)
	}
	// As Run would, probe until the store is ready: on a loaded machine a
	// probe decision can miss its deadline.
	for deadline := time.Now().Add(15 * time.Second); ; {
		err := s.Probe(context.Background())
		if err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// gatewayPool opens a pool of at most maxConns connections on url,
// configured as the gateway configures its pool for a store of opts
// (ConfigurePool), and closes it when the test ends. Each of edits changes
// the configuration before ConfigurePool does.
func gatewayPool(t testing.TB, url string, maxConns int32, opts postgres.Options, edits ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	for _, edit := range edits {
		edit(cfg)
	}
	if err := postgres.ConfigurePool(cfg, opts); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// failureLog is a logger whose entries t prints if it fails: why the store
// judged a statement late, a pool dropped, a breaker's change of state.
func failureLog(t testing.TB) *zap.Logger {
	log, _ := observedLog(t, zapcore.InfoLevel)
	return log
}

// observedLog is a logger of the entries at level and above, which it
// returns for the test to read and which t prints if it fails.
func observedLog(t testing.TB, level zapcore.Level) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(level)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, e := range logs.All() {
			t.Logf("store log: %s %s %s %v", e.Time.Format("15:04:05.000"), e.Level, e.Message, e.ContextMap())
		}
	})
	return zap.New(core), logs
}

// unleased is an option of open: every decision goes to the database, as
// the tests of the batcher and of the statements count them.
func unleased(o *postgres.Options) { o.Leasing = postgres.Unleased }

// instance opens a store on db's schema and clk with a pool of its own, as
// one of several gateways that share a database.
func instance(t *testing.T, db *pgtest.DB, clk *storetest.Clock, opts ...func(*postgres.Options)) *postgres.Store {
	t.Helper()
	return open(t, db, pgtest.NewPool(t, db.URL, 2), clk.Now, opts...)
}

// gateways opens n stores on db, on the database clock, each with a pool
// of four connections of its own and its background work running until
// the test ends: n gateways that share a database and lease from it.
func gateways(t *testing.T, db *pgtest.DB, n int) []*postgres.Store {
	t.Helper()
	var gws []*postgres.Store
	for range n {
		s := open(t, db, pgtest.NewPool(t, db.URL, 4), nil)
		runStore(t, s)
		gws = append(gws, s)
	}
	return gws
}

// runStore runs s's background work until the test ends.
func runStore(t *testing.T, s *postgres.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// patient gives a store a long decision deadline, for the tests in which
// a decision waits for a row lock the test holds (counterTx) until it has
// seen the decision wait: a lock held by a session that is not sluice's
// fails the decision at its deadline (progress.go), and on a loaded
// machine the test's own steps took longer than the default 50 ms. What
// those tests check is the lock wait, not the deadline.
func patient(o *postgres.Options) { o.DecisionTimeout = 10 * time.Second }

// oneConnStore opens a store on a fresh schema and a pool of one
// connection, on the database clock, and decides key k of rule (fixed,
// 10/1h) once, so that the connection is made and warm.
func oneConnStore(t *testing.T, rule string) (*postgres.Store, *pgxpool.Pool, *policy.Rule) {
	t.Helper()
	db := pgtest.New(t)
	pool := pgtest.NewPool(t, db.URL, 1)
	s := open(t, db, pool, nil, unleased) // its decisions are the faults' subject
	r := fixed(rule, 10, time.Hour)
	decide(t, s, chk(r, "k"))
	return s, pool, r
}

// The rule builders are the conformance suite's, so that every test of a
// store builds its rules one way.
var (
	fixed     = storetest.Fixed
	resetRule = storetest.ResetRule
	sliding   = storetest.Sliding
)

// token is a token rule whose burst is its limit.
func token(name string, limit int64, window time.Duration) *policy.Rule {
	return storetest.Token(name, limit, window, limit)
}

// algos makes one rule of each algorithm.
var algos = storetest.Algos

func chk(r *policy.Rule, key string) limiter.Check { return limiter.Check{Rule: r, Key: key} }

// decide is storetest.Decide.
var decide = storetest.Decide

// untilDenied decides c on s, into res, until a decision is denied, and
// returns how many were allowed before it; an error fails t.
func untilDenied(t *testing.T, s *postgres.Store, c limiter.Check, res []limiter.Result) int {
	t.Helper()
	allowed := 0
	for {
		ok, err := s.Decide(context.Background(), []limiter.Check{c}, res)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return allowed
		}
		allowed++
	}
}

// keys returns the counters in db's schema as rule/key, the probes' aside.
func keys(t testing.TB, db *pgtest.DB) map[string]bool {
	t.Helper()
	// Not the probes' own counter: a probe commits one decision of it.
	rows, err := db.Pool.Query(context.Background(), "SELECT rule || '/' || key FROM "+db.Table("counters")+
		" WHERE rule <> $1", postgres.ProbeRule)
	if err != nil {
		t.Fatal(err)
	}
	ks, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, k := range ks {
		m[k] = true
	}
	return m
}

// rowCount returns the number of counter rows in db's schema, the probes' aside.
func rowCount(t testing.TB, db *pgtest.DB) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+db.Table("counters")+" WHERE rule <> $1", postgres.ProbeRule).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// wait waits for wg, failing t after d (a deadlock would hang otherwise).
func wait(t *testing.T, wg *sync.WaitGroup, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("decisions did not finish within %v", d)
	}
}

// counterTx begins a transaction on db's pool that runs stmt, in which %s
// stands for db's counters table: typically a row lock (FOR UPDATE) or an
// uncommitted insert that decisions will wait for. The test commits it to
// let them go; it is rolled back when the test ends otherwise.
func counterTx(t *testing.T, db *pgtest.DB, stmt string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) }) //nolint:errcheck // committed already, or rolled back
	if _, err := tx.Exec(ctx, fmt.Sprintf(stmt, db.Table("counters"))); err != nil {
		t.Fatal(err)
	}
	return tx
}

// waitLockWaits waits until n decide statements of db's schema wait for a
// lock, failing t after ten seconds.
func waitLockWaits(t *testing.T, db *pgtest.DB, n int) {
	t.Helper()
	var waiting int
	for deadline := time.Now().Add(10 * time.Second); ; {
		// Only this test's schema: other packages' tests may share the server.
		if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%.decide(%'`, db.Schema).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d decisions wait for a lock after 10s, want %d", waiting, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// statements returns how many decide statements stores have sent.
func statements(stores ...*postgres.Store) uint64 {
	var n uint64
	for _, s := range stores {
		n += s.BatchStats().Statements
	}
	return n
}

// answer is what a decision returned: its verdict, its results and its
// error.
type answer struct {
	ok  bool
	res []limiter.Result
	err error
}

// decideAsync starts a decision and returns where its answer will arrive.
func decideAsync(ctx context.Context, s *postgres.Store, cs ...limiter.Check) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		res := make([]limiter.Result, len(cs))
		ok, err := s.Decide(ctx, cs, res)
		ch <- answer{ok, res, err}
	}()
	return ch
}

// receive returns the answer from ch, failing t if none comes within ten
// seconds.
func receive(t *testing.T, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10s")
		return answer{}
	}
}
