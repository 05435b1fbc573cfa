package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/policy"
)

// batchModes are the ways a Store may send decisions: through the batcher
// with its default slot, through the batcher with more statements in
// flight than cores (with and without synchronous commits), and one
// statement per decision.
var batchModes = []struct {
	name string
	set  func(*postgres.Options)
}{
	{"batched", func(*postgres.Options) {}},
	{"batched4", func(o *postgres.Options) { o.MaxInFlight = 4 }},
	{"batched4async", func(o *postgres.Options) { o.MaxInFlight, o.AsynchronousCommit = 4, true }},
	{"unbatched", func(o *postgres.Options) { o.Batching = postgres.Unbatched }},
}

// TestExactAcrossInstances: 200 concurrent decisions on one key with limit
// 5, spread over three instances with pools of their own, let exactly 5
// through, for each algorithm, on the test clock and on the database clock,
// batched or not.
func TestExactAcrossInstances(t *testing.T) {
	t.Parallel()
	const goroutines, limit, instances = 200, 5, 3
	for _, mode := range batchModes {
		for _, dbClock := range []bool{false, true} {
			for _, a := range algos {
				if dbClock && a.Name == "fixed" {
					continue // a day-aligned window could roll over mid-test on the real clock
				}
				if dbClock && mode.name != "batched" {
					continue // the clock is the database's business, whatever the mode
				}
				name := mode.name + "/" + a.Name
				if dbClock {
					name += "/dbclock"
				}
				t.Run(name, func(t *testing.T) {
					testExact(t, goroutines, limit, instances, a.Make, dbClock, mode.set)
				})
			}
		}
	}
}

// testExact makes goroutines concurrent decisions of rule mk("hot", limit)
// on one key over instances stores, and expects exactly limit allowed.
func testExact(t *testing.T, goroutines, limit, instances int, mk func(string, int64, time.Duration) *policy.Rule, dbClock bool, mode func(*postgres.Options)) {
	db := pgtest.New(t)
	var now func() time.Time
	if !dbClock {
		now = newClock(base).Now
	}
	// patient: what is tested is exactness; the decision deadline under
	// load is the fault tests' (on a CI machine running the store's tests
	// eight at a time, every readiness probe of an instance missed 50 ms
	// for 15 s, each costing its connection and the next one's warm-up).
	stores := make([]*postgres.Store, instances)
	for i := range stores {
		stores[i] = open(t, db, pgtest.NewPool(t, db.URL, 6), now, mode, patient)
	}
	r := mk("hot", int64(limit), 24*time.Hour)
	var (
		allowed, failed atomic.Int64
		wg              sync.WaitGroup
		start           = make(chan struct{})
	)
	for g := range goroutines {
		wg.Go(func() {
			<-start
			res := make([]limiter.Result, 1)
			ok, err := stores[g%instances].Decide(context.Background(), []limiter.Check{chk(r, "k")}, res)
			if err != nil {
				failed.Add(1)
				t.Errorf("Decide: %v", err)
			} else if ok {
				allowed.Add(1)
			}
		})
	}
	close(start)
	wait(t, &wg, 60*time.Second)
	if failed.Load() > 0 || allowed.Load() != int64(limit) {
		t.Errorf("allowed %d with %d errors, want exactly %d allowed", allowed.Load(), failed.Load(), limit)
	}
	logStats(t, stores)
}

// logStats logs how many statements the stores sent for their decisions.
func logStats(t *testing.T, stores []*postgres.Store) (decisions, statements uint64) {
	t.Helper()
	for _, s := range stores {
		st := s.BatchStats()
		decisions += st.Decisions
		statements += st.Statements
	}
	t.Logf("%d decisions in %d statements", decisions, statements)
	return decisions, statements
}

// TestOppositeOrders makes 1,000 decisions in parallel over three
// instances whose checks name the same counters in every order (all six
// permutations of three rules), some on hot keys and some on keys that do
// not exist yet, so rows are inserted and locked concurrently in
// conflicting orders. There must be no error at all (a deadlock would be
// one) and every count must be exact, batched (where concurrent statements
// each lock many counters) or not.
//
// The modes run in parallel, each in a schema of its own, and their
// statements wait as long as a deadlock would take to show (see patient),
// so a loaded machine slows them without failing them. The instances run
// (as every gateway does): the hot key's limit binds with units leased to
// the others, and a denial is final only once they have given them back.
// An instance that did not run would never answer the recall, and on the
// test clock, which does not move, every denial would wait out recallWait
// (2 s); 400 of them took a mode 37 s alone and over 60 s on CI.
func TestOppositeOrders(t *testing.T) {
	for _, mode := range batchModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			testOppositeOrders(t, mode.name != "unbatched", mode.set)
		})
	}
}

func testOppositeOrders(t *testing.T, batched bool, mode func(*postgres.Options)) {
	const decisions, workers, instances = 1000, 24, 3
	db := pgtest.New(t)
	now := newClock(base.Add(time.Hour)).Now
	stores := make([]*postgres.Store, instances)
	// What this test looks for is a deadlock or a wrong count, which no
	// deadline hides (Postgres reports a deadlock after deadlock_timeout,
	// 1 s). A 50 ms deadline only made it fail on a busy CI machine, where
	// a statement that waits for its rows behind 24 others can take longer
	// than the progress question's budget; that is the fault tests' ground.
	patient := func(o *postgres.Options) { o.DecisionTimeout = 10 * time.Second }
	for i := range stores {
		stores[i] = open(t, db, pgtest.NewPool(t, db.URL, 8), now, mode, patient)
		runStore(t, stores[i])
	}
	a := fixed("a", 600, 24*time.Hour) // binds: 600 of 1,000
	b := token("b", 10_000, 24*time.Hour)
	c := sliding("c", 10_000, time.Hour, time.Minute)
	perms := [][3]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}
	sets := make([][]limiter.Check, decisions)
	for i := range sets {
		// a and b on hot keys; c on a key shared by a handful of decisions,
		// created by whichever of them comes first.
		cs := [3]limiter.Check{chk(a, "hot"), chk(b, fmt.Sprintf("b%d", i%2)), chk(c, fmt.Sprintf("c%d", i/4))}
		p := perms[i%len(perms)]
		sets[i] = []limiter.Check{cs[p[0]], cs[p[1]], cs[p[2]]}
	}
	var (
		allowed = make([]bool, decisions)
		errs    atomic.Int64
		next    atomic.Int64
		wg      sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			res := make([]limiter.Result, 3)
			for {
				i := int(next.Add(1)) - 1
				if i >= decisions {
					return
				}
				ok, err := stores[w%instances].Decide(context.Background(), sets[i], res)
				if err != nil {
					if errs.Add(1) <= 3 {
						t.Errorf("decision %d: %v", i, err)
					}
					continue
				}
				allowed[i] = ok
			}
		})
	}
	wait(t, &wg, 60*time.Second)
	if errs.Load() > 0 {
		t.Fatalf("%d decisions failed", errs.Load())
	}
	// 24 workers on 3 instances of at most 4 slots each: batches form.
	if d, n := logStats(t, stores); batched && n >= d {
		t.Errorf("%d decisions in %d statements: the batcher never batched", d, n)
	}
	want := map[string]int64{}
	total := 0
	for i, ok := range allowed {
		if !ok {
			continue
		}
		total++
		for _, c := range sets[i] {
			want[c.Rule.Name+"/"+c.Key]++
		}
	}
	if total != 600 {
		t.Errorf("allowed %d decisions, want exactly 600", total)
	}
	// Every counter holds exactly the decisions it was allowed in.
	for _, s := range stores[:1] {
		for id, n := range want {
			var rule *policy.Rule
			var key string
			switch id[0] {
			case 'a':
				rule, key = a, id[2:]
			case 'b':
				rule, key = b, id[2:]
			default:
				rule, key = c, id[2:]
			}
			res, err := s.Peek(context.Background(), chk(rule, key))
			if err != nil {
				t.Fatal(err)
			}
			used := rule.Limit - res.Remaining
			if rule == a || rule == c {
				if used != n {
					t.Errorf("counter %s used %d, want %d", id, used, n)
				}
			} else if used != n { // token: burst = limit, no refill within a day's slice of a test
				t.Errorf("counter %s used %d, want %d", id, used, n)
			}
		}
	}
}

// TestDurability: the limit holds after every instance restarts (new pool,
// new Store, same schema).
func TestDurability(t *testing.T) {
	for _, a := range algos {
		t.Run(a.Name, func(t *testing.T) {
			db := pgtest.New(t)
			clk := newClock(base.Add(time.Minute))
			r := a.Make("login", 3, 15*time.Minute)

			pool := pgtest.NewPool(t, db.URL, 2)
			s := open(t, db, pool, clk.Now)
			for i := range 3 {
				if ok, _ := decide(t, s, chk(r, "k")); !ok {
					t.Fatalf("decision %d denied", i+1)
				}
			}
			pool.Close() // the instance goes away

			s2 := open(t, db, pgtest.NewPool(t, db.URL, 2), clk.Now)
			clk.Advance(time.Second)
			ok, res := decide(t, s2, chk(r, "k"))
			if ok || res[0].RetryAfter <= 0 {
				t.Fatalf("after restart: allowed=%v RetryAfter=%v, want denied with a wait", ok, res[0].RetryAfter)
			}
		})
	}
}

// TestRetryAfterWholeSeconds: a retry at the Retry-After a client sees (the
// wait rounded up to whole seconds) is allowed, one second earlier it is
// not; the database's clock is moved through Options.Now.
func TestRetryAfterWholeSeconds(t *testing.T) {
	for _, a := range algos {
		t.Run(a.Name, func(t *testing.T) {
			db := pgtest.New(t)
			clk := newClock(base.Add(10*time.Second + 300*time.Millisecond))
			s := open(t, db, nil, clk.Now)
			r := a.Make("login", 2, time.Minute)
			decide(t, s, chk(r, "k"))
			decide(t, s, chk(r, "k"))
			ok, res := decide(t, s, chk(r, "k"))
			if ok {
				t.Fatal("third decision allowed")
			}
			header := (res[0].RetryAfter + time.Second - 1) / time.Second * time.Second // what Retry-After says
			denied := clk.Now()

			// One second before: denied. Decisions that are denied consume
			// nothing, so probing does not move the answer.
			clk.Set(denied.Add(header - time.Second))
			if ok, _ := decide(t, s, chk(r, "k")); ok {
				t.Errorf("retry %v after the denial (Retry-After %v) was allowed", header-time.Second, header)
			}
			clk.Set(denied.Add(header))
			if ok, _ := decide(t, s, chk(r, "k")); !ok {
				t.Errorf("retry at Retry-After (%v) was denied", header)
			}
		})
	}
}

// TestDatabaseClock: with Options.Now nil the store counts on the
// database's clock, so a gateway whose own clock is 30 s off decides
// exactly like one whose clock is right. A store that were handed the
// skewed clock would report instants 30 s off, which this test detects.
func TestDatabaseClock(t *testing.T) {
	db := pgtest.New(t)
	skew := 30 * time.Second
	gatewayNow := func() time.Time { return time.Now().Add(skew) } // the skewed gateway's clock
	r := resetRule("r", 5, time.Minute)
	ctx := context.Background()

	dbNow := func() time.Time {
		var ts time.Time
		if err := db.Pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&ts); err != nil {
			t.Fatal(err)
		}
		return ts
	}
	// The skewed gateway: every clock it has in Go (the limiter's, for its
	// fast path and fail modes, and the batcher's) is 30 s ahead; only the
	// store's is the database's.
	skewedStore := open(t, db, nil, nil)
	postgres.SetBatchClock(skewedStore, skewedClock{gatewayNow})
	skewed, err := limiter.New(limiter.Config{Store: skewedStore, Local: memory.New(memory.Options{}), Now: gatewayNow, Timeout: 5 * time.Second, CacheSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	right := open(t, db, nil, nil)
	decideVia := func(key string) limiter.Result {
		o := skewed.Decide(ctx, []limiter.Check{chk(r, key)})
		if o.Err != nil || o.Sources[0] != limiter.SourceStore {
			t.Fatalf("skewed gateway's decision: %+v", o)
		}
		return o.Results[0]
	}
	// instant returns the clock a decision used: a reset window starts at
	// the first request, so Reset - W is the decision's instant.
	instant := func(res limiter.Result) time.Time { return res.Reset.Add(-r.Window) }
	within := func(at, lo, hi time.Time) bool { return !at.Before(lo) && !at.After(hi) }

	before := dbNow()
	_, res := decide(t, right, chk(r, "a"))
	a, b := instant(res[0]), instant(decideVia("b"))
	after := dbNow()
	if !within(a, before, after) || !within(b, before, after) {
		t.Errorf("decisions at %v and %v, want both within the database's [%v, %v]", a, b, before, after)
	}
	// The two gateways share one count on one key.
	for i := range 5 {
		if i%2 == 1 {
			decideVia("shared")
		} else {
			decide(t, right, chk(r, "shared"))
		}
	}
	if ok, _ := decide(t, right, chk(r, "shared")); ok {
		t.Error("sixth decision over two gateways was allowed")
	}

	// Control: a store told to use the gateway's clock is visibly off.
	wrong := open(t, db, nil, gatewayNow)
	_, res = decide(t, wrong, chk(r, "c"))
	if c := instant(res[0]); within(c, before, dbNow()) {
		t.Errorf("a store on a clock %v ahead decided at %v, inside the database's time: the test cannot tell clocks apart", skew, c)
	}
}

// skewedClock is a batcher clock that reads now.
type skewedClock struct{ now func() time.Time }

func (c skewedClock) Now() time.Time                         { return c.now() }
func (c skewedClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// TestNoRowsForDenials: decisions that consume nothing leave no rows, so a
// flood of denied requests from new keys does not grow the table.
func TestNoRowsForDenials(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db, nil, newClock(base).Now)
	ip := fixed("ip", 1, time.Minute)
	email := sliding("email", 3, time.Hour, time.Minute)
	decide(t, s, chk(ip, "1.2.3.4"))
	for i := range 50 {
		if ok, _ := decide(t, s, chk(ip, "1.2.3.4"), chk(email, fmt.Sprintf("e%d", i))); ok {
			t.Fatal("over-limit ip allowed")
		}
	}
	big := &policy.Rule{Name: "big", Limit: 2, Window: time.Minute, Algorithm: policy.Token, Burst: 2, Cost: 3}
	for i := range 20 {
		decide(t, s, chk(big, fmt.Sprintf("n%d", i)))
	}
	if n := rowCount(t, db); n != 1 {
		t.Errorf("%d rows after denials from new keys, want 1", n)
	}
}

// TestBatchSequential: decisions of one batch are applied in order, the
// same counter may appear in several, and each sees the previous state.
func TestBatchSequential(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db, nil, newClock(base).Now)
	a := fixed("a", 3, time.Minute)
	b := fixed("b", 10, time.Minute)
	var ds []postgres.Decision
	for i := range 5 {
		cs := []limiter.Check{chk(a, "k"), chk(b, fmt.Sprint(i%2))}
		if i%2 == 1 {
			cs[0], cs[1] = cs[1], cs[0]
		}
		ds = append(ds, postgres.Decision{Checks: cs, Results: make([]limiter.Result, 2)})
	}
	if err := s.DecideBatch(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	for i, d := range ds {
		want := i < 3
		if d.Allowed != want {
			t.Errorf("decision %d allowed=%v, want %v", i, d.Allowed, want)
		}
		ra := d.Results[0]
		if i%2 == 1 {
			ra = d.Results[1]
		}
		if wantRem := max(0, int64(2-i)); ra.Remaining != wantRem {
			t.Errorf("decision %d: a remaining %d, want %d", i, ra.Remaining, wantRem)
		}
	}
	// b:0 took decisions 0 and 2; b:1 took decision 1.
	for key, want := range map[string]int64{"0": 8, "1": 9} {
		res, err := s.Peek(context.Background(), chk(b, key))
		if err != nil {
			t.Fatal(err)
		}
		if res.Remaining != want {
			t.Errorf("b:%s remaining %d, want %d", key, res.Remaining, want)
		}
	}
}

// TestRowDeletedUnderDecision: a counter row deleted (by cleanup or Reset)
// while a decision waits for its lock is created anew by the decision,
// which then counts from a fresh counter.
func TestRowDeletedUnderDecision(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db, nil, newClock(base).Now, patient, unleased)
	r := fixed("r", 5, time.Minute)
	decide(t, s, chk(r, "k"))
	ctx := context.Background()

	tx := counterTx(t, db, "SELECT 1 FROM %s WHERE rule = 'r' AND key = 'k' FOR UPDATE")
	done := decideAsync(ctx, s, chk(r, "k"))
	// Wait until the decision waits for our row lock, then delete the row.
	waitLockWaits(t, db, 1)
	if _, err := tx.Exec(ctx, "DELETE FROM "+db.Table("counters")+" WHERE rule = 'r' AND key = 'k'"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := receive(t, done)
	if a.err != nil {
		t.Fatalf("Decide after the row vanished: %v", a.err)
	}
	if !a.ok || a.res[0].Remaining != 4 {
		t.Errorf("Decide after the row vanished: allowed=%v remaining=%d, want a fresh counter (4)", a.ok, a.res[0].Remaining)
	}
}

// TestResetUnderLoad: resets racing with decisions cause no errors.
func TestResetUnderLoad(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db, pgtest.NewPool(t, db.URL, 8), newClock(base).Now)
	r := token("r", 1_000_000, time.Hour)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	for range 6 {
		wg.Go(func() {
			res := make([]limiter.Result, 1)
			for ctx.Err() == nil {
				if _, err := s.Decide(context.Background(), []limiter.Check{chk(r, "k")}, res); err != nil {
					t.Errorf("Decide: %v", err)
					return
				}
			}
		})
	}
	for range 200 {
		if err := s.Reset(context.Background(), chk(fixed("r", 1, time.Minute), "k")); err != nil {
			t.Error(err)
		}
	}
	cancel()
	wait(t, &wg, 30*time.Second)
}

// TestExecModes: the store works in every pgx query exec mode, including
// those a transaction-mode pooler needs, chosen in the connection string.
func TestExecModes(t *testing.T) {
	db := pgtest.New(t)
	// default_query_exec_mode in the connection string, and the mode it
	// chooses.
	modes := map[string]pgx.QueryExecMode{
		"cache_statement": pgx.QueryExecModeCacheStatement,
		"cache_describe":  pgx.QueryExecModeCacheDescribe,
		"describe_exec":   pgx.QueryExecModeDescribeExec,
		"exec":            pgx.QueryExecModeExec,
		"simple_protocol": pgx.QueryExecModeSimpleProtocol,
	}
	for mode, want := range modes {
		t.Run(mode, func(t *testing.T) {
			sep := "?"
			if strings.Contains(db.URL, "?") {
				sep = "&"
			}
			pool := pgtest.NewPool(t, db.URL+sep+"default_query_exec_mode="+mode, 2)
			if got := pool.Config().ConnConfig.DefaultQueryExecMode; got != want {
				t.Fatalf("pool runs in mode %v, want %v", got, want)
			}
			clk := newClock(base)
			// What is under test is that every statement works in the mode,
			// not how fast: a probe on a loaded CI machine missed 50 ms.
			s := open(t, db, pool, clk.Now, func(o *postgres.Options) {
				o.CleanupPause, o.DecisionTimeout = limiter.Off, 10*time.Second
			})
			ctx := context.Background()
			rules := []*policy.Rule{fixed(mode+"-f", 3, time.Minute), sliding(mode+"-s", 3, time.Minute, time.Second),
				resetRule(mode+"-r", 3, time.Minute), token(mode+"-t", 3, time.Minute)}
			cs := make([]limiter.Check, len(rules))
			for i, r := range rules {
				cs[i] = chk(r, `k"{},\ é`) // array-literal metacharacters in a key
			}
			for i := range 4 {
				ok, _ := decide(t, s, cs...)
				if ok != (i < 3) {
					t.Errorf("decision %d allowed=%v", i+1, ok)
				}
			}
			if err := s.SetOverride(ctx, chk(rules[0], "o"), 1, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := s.DeleteOverride(ctx, chk(rules[0], "o")); err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Hour)
			if _, err := s.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.Reset(ctx, chk(rules[1], `k"{},\ é`)); err != nil {
				t.Fatal(err)
			}
			if _, err := postgres.Poll(ctx, s, 0); err != nil {
				t.Fatal(err)
			}
			if err := s.Probe(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestProbeFailsWhileAStatementIsUnanswered: a probe fails while a decide
// statement sent before it is still unanswered (here, waiting for a row
// lock), and passes once it is answered, whether or not the drain that
// sent it has given its slot up yet.
func TestProbeFailsWhileAStatementIsUnanswered(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db, pgtest.NewPool(t, db.URL, 4), newClock(base).Now, patient, unleased)
	r := fixed("probe-busy", 5, time.Minute)
	decide(t, s, chk(r, "k"))
	ctx := context.Background()
	tx := counterTx(t, db, "SELECT 1 FROM %s WHERE rule = 'probe-busy' AND key = 'k' FOR UPDATE")
	done := decideAsync(ctx, s, chk(r, "k"))
	waitLockWaits(t, db, 1)
	if err := s.Probe(ctx); err == nil || !strings.Contains(err.Error(), "still in flight") {
		t.Errorf("probe with a statement waiting for a lock: %v, want it to fail", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if a := receive(t, done); a.err != nil || !a.ok {
		t.Fatalf("the decision that waited: %v, %v", a.ok, a.err)
	}
	if err := s.Probe(ctx); err != nil {
		t.Errorf("probe once the statement was answered: %v", err)
	}
}

// TestProbeWarmsThePool: once a probe has passed, on a pool configured as
// the gateway configures it, the pool holds at least the batcher's
// connections plus one, and every one of them has the decide statement
// prepared and has run it (its server process has compiled and planned
// the function): the first decisions after readiness pay for none of it.
// The end-to-end test (TestFaultColdStartUnderLoad in package faults)
// sees a cold pool only as latency, which a loaded machine blurs; this
// sees it directly.
func TestProbeWarmsThePool(t *testing.T) {
	db := pgtest.New(t)
	pool := gatewayPool(t, db.URL, 4, postgres.Options{Schema: db.Schema})
	open(t, db, pool, nil)
	ctx := context.Background()

	conns := pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	if want := postgres.DefaultMaxInFlight + 1; len(conns) < want {
		t.Fatalf("%d idle connections after the probe, want at least %d", len(conns), want)
	}
	for i, c := range conns {
		var runs int64
		if err := c.QueryRow(ctx, `SELECT coalesce(sum(generic_plans + custom_plans), 0) FROM pg_prepared_statements
			WHERE statement LIKE '%.decide(%' AND statement NOT LIKE '%pg_prepared_statements%'`,
			pgx.QueryExecModeSimpleProtocol).Scan(&runs); err != nil {
			t.Fatal(err)
		}
		if runs == 0 {
			t.Errorf("connection %d of %d: the decide statement is not prepared or has never run", i+1, len(conns))
		}
	}
}

// TestLateProbeKeepsItsConnections: a probe whose decisions, or whose
// commit, answer after the decision deadline fails, and leaves its
// connections in the pool: the next probe, once the database answers in
// time again, passes on the same warm connections instead of making new,
// cold ones (which, on a loaded machine, were late in their turn and kept
// the store unready). A CI run under load saw a late commit in the loop
// that probes until it passes cost a connection.
func TestLateProbeKeepsItsConnections(t *testing.T) {
	db := pgtest.New(t)
	pool := pgtest.NewPool(t, db.URL, 4)
	s := open(t, db, pool, nil)
	ctx := context.Background()
	made := pool.Stat().NewConnsCount()

	// Every write of a counter takes 100 ms: longer than the 50 ms
	// deadline, shorter than the bound of a connection's first decision.
	slow := db.Table("slow_write")
	for _, q := range []string{
		"CREATE FUNCTION " + slow + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.1); RETURN NEW; END $$",
		"CREATE TRIGGER slow_write BEFORE INSERT OR UPDATE ON " + db.Table("counters") + " FOR EACH ROW EXECUTE FUNCTION " + slow + "()",
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	err := s.Probe(ctx)
	if err == nil || !strings.Contains(err.Error(), "longer than the 50ms deadline") || limiter.ErrorKind(err) != limiter.ErrorTimeout {
		t.Fatalf("probe while every decision takes 100 ms: %v (kind %s), want a late decision, a timeout", err, limiter.ErrorKind(err))
	}
	if _, err := db.Pool.Exec(ctx, "DROP TRIGGER slow_write ON "+db.Table("counters")); err != nil {
		t.Fatal(err)
	}
	// As open does, probe until it passes: on a loaded machine a probe
	// decision can miss its deadline without the trigger (a CI run saw one
	// take 81 ms), and a late one keeps its connection too.
	probeUntilPassed := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			err := s.Probe(ctx)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("probe once %s: %v", what, err)
			}
		}
	}
	probeUntilPassed("writes are quick again")
	if now := pool.Stat().NewConnsCount(); now != made {
		t.Errorf("the pool made %d new connections across the late probe: a late probe decision cost its connection", now-made)
	}

	// The same for a late commit: a trigger deferred to the commit, which
	// the probe's decisions (rolled back) never reach, and its commit does.
	if _, err := db.Pool.Exec(ctx, "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON "+db.Table("counters")+
		" DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "+slow+"()"); err != nil {
		t.Fatal(err)
	}
	// On a loaded machine a probe decision can be late first (a CI run saw
	// 51 ms): probe until the commit is what fails.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err = s.Probe(ctx)
		if err == nil || strings.Contains(err.Error(), "a probe commit took") || time.Now().After(deadline) {
			break
		}
	}
	if err == nil || !strings.Contains(err.Error(), "a probe commit took") || limiter.ErrorKind(err) != limiter.ErrorTimeout {
		t.Fatalf("probe while every commit takes 100 ms: %v (kind %s), want a late commit, a timeout", err, limiter.ErrorKind(err))
	}
	if _, err := db.Pool.Exec(ctx, "DROP TRIGGER slow_commit ON "+db.Table("counters")); err != nil {
		t.Fatal(err)
	}
	probeUntilPassed("commits are quick again")
	if now := pool.Stat().NewConnsCount(); now != made {
		t.Errorf("the pool made %d new connections across the late commit: a late probe commit cost its connection", now-made)
	}
}

// TestProbeUnmigrated: a probe on a schema without sluice's tables says
// so and names the command to run; New refuses an invalid schema name.
func TestProbeUnmigrated(t *testing.T) {
	db := pgtest.New(t)
	s, err := postgres.New(db.Pool, postgres.Options{Schema: "no_such_schema_here"})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Probe(context.Background())
	if err == nil || !strings.Contains(err.Error(), "not migrated (run sluice migrate") {
		t.Fatalf("Probe on a schema that is not migrated: %v", err)
	}
	if _, err := postgres.New(db.Pool, postgres.Options{Schema: "Bad"}); err == nil {
		t.Fatal("New accepted an invalid schema name")
	}
}

// TestNewOptions: New takes limiter.Off where an option can be off, and
// refuses any other negative value of those options and an unknown
// Batching.
func TestNewOptions(t *testing.T) {
	db := pgtest.New(t)
	off := postgres.Options{CleanupInterval: limiter.Off, CleanupPause: limiter.Off, BatchWait: limiter.Off, Batching: postgres.Unbatched}
	if _, err := postgres.New(db.Pool, off); err != nil {
		t.Fatalf("New with every option off: %v", err)
	}
	for _, tc := range []struct {
		opts postgres.Options
		want string
	}{
		{postgres.Options{CleanupInterval: -2}, "CleanupInterval -2ns"},
		{postgres.Options{CleanupPause: -time.Second}, "CleanupPause -1s"},
		{postgres.Options{BatchWait: -2}, "BatchWait -2ns"},
		{postgres.Options{Batching: 2}, "Batching 2"},
	} {
		if _, err := postgres.New(db.Pool, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v, want an error naming %q", tc.opts, err, tc.want)
		}
	}
}

// TestProbeOldDefinition: a schema whose decide function is older than
// this build's is not ready; the probe names the command to run, and a
// store allowed to migrate brings the function up to date itself.
func TestProbeOldDefinition(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, "UPDATE "+db.Table("schema_definitions")+" SET version = 1 WHERE name = 'decide'"); err != nil {
		t.Fatal(err)
	}
	// Probes that answer, with time for a loaded machine: what is under
	// test is what they say.
	s, err := postgres.New(db.Pool, postgres.Options{Schema: db.Schema, DecisionTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Probe(ctx); err == nil || !strings.Contains(err.Error(), "holds version 1 of decide") || !strings.Contains(err.Error(), "run sluice migrate") {
		t.Fatalf("Probe with an old decide function: %v", err)
	}
	m, err := postgres.New(db.Pool, postgres.Options{Schema: db.Schema, Migrate: true, DecisionTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Probe(ctx); err != nil {
		t.Fatalf("Probe of a store that may migrate: %v", err)
	}
	if err := s.Probe(ctx); err != nil {
		t.Fatalf("Probe after the migration: %v", err)
	}
}

// TestRandomAgainstSequential compares random batches with the same
// decisions made one by one on another schema.
func TestRandomAgainstSequential(t *testing.T) {
	dbA, dbB := pgtest.New(t), pgtest.New(t)
	clk := newClock(base)
	batched, single := open(t, dbA, nil, clk.Now), open(t, dbB, nil, clk.Now)
	rules := []*policy.Rule{
		fixed("f", 4, 10*time.Second), resetRule("r", 3, 7*time.Second),
		sliding("s", 5, 10*time.Second, 2*time.Second), token("t", 4, 8*time.Second),
		{Name: "ca", Limit: 3, Window: 10 * time.Second, Algorithm: policy.Fixed, Cost: 2, CountAll: true},
		{Name: "sh", Limit: 2, Window: 10 * time.Second, Algorithm: policy.Sliding, Bucket: time.Second, Cost: 1, Shadow: true},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	for round := range 60 {
		clk.Advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
		var ds []postgres.Decision
		for range 1 + rng.IntN(6) {
			var cs []limiter.Check
			for _, i := range rng.Perm(len(rules))[:1+rng.IntN(3)] {
				cs = append(cs, chk(rules[i], fmt.Sprint(rng.IntN(2))))
			}
			ds = append(ds, postgres.Decision{Checks: cs, Results: make([]limiter.Result, len(cs))})
		}
		if err := batched.DecideBatch(ctx, ds); err != nil {
			t.Fatal(err)
		}
		for i, d := range ds {
			res := make([]limiter.Result, len(d.Checks))
			ok, err := single.Decide(ctx, d.Checks, res)
			if err != nil {
				t.Fatal(err)
			}
			if ok != d.Allowed {
				t.Fatalf("round %d decision %d: batched allowed=%v, one by one %v", round, i, d.Allowed, ok)
			}
			for j := range res {
				if res[j] != d.Results[j] {
					t.Fatalf("round %d decision %d check %d:\n batched %+v\n single  %+v", round, i, j, d.Results[j], res[j])
				}
			}
		}
	}
}

// TestNewKeyRace: two decisions that both find a counter missing and both
// create it: the second one's insert waits for the first, finds its row,
// and locks it without waiting (nobody else holds it), so both decide in
// one attempt each, with exact counts.
func TestNewKeyRace(t *testing.T) {
	db := pgtest.New(t)
	clk := newClock(base)
	ctx := context.Background()
	x := fixed("x", 10, time.Minute)
	k := fixed("k", 10, time.Minute)
	stores := []*postgres.Store{instance(t, db, clk, patient, unleased), instance(t, db, clk, patient, unleased)}
	decide(t, stores[0], chk(x, "x")) // x exists, k does not

	// Hold x, so that both decisions find k missing, then wait for x.
	tx := counterTx(t, db, "SELECT 1 FROM %s WHERE rule = 'x' FOR UPDATE")
	var done []<-chan answer
	for _, s := range stores {
		done = append(done, decideAsync(ctx, s, chk(k, "new"), chk(x, "x")))
	}
	waitLockWaits(t, db, 2)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ch := range done {
		if a := receive(t, ch); a.err != nil || !a.ok {
			t.Fatalf("decision = %+v", a)
		}
	}
	if n := statements(stores...); n != 1+2 { // the set-up and the two decisions
		t.Errorf("%d statements, want 3: no decision needed a second attempt", n)
	}
	for _, c := range []struct {
		r    *policy.Rule
		key  string
		want int64
	}{{x, "x", 3}, {k, "new", 2}} {
		res, err := stores[0].Peek(ctx, chk(c.r, c.key))
		if err != nil {
			t.Fatal(err)
		}
		if used := c.r.Limit - res.Remaining; used != c.want {
			t.Errorf("%s used %d, want %d", c.r.Name, used, c.want)
		}
	}
}

// TestNewHotKeyWaits: decisions that each meet a new key another
// transaction is creating, and hold no other counter, wait for its lock in
// the canonical order instead of failing and being sent again: when
// several gateways meet on a new hot key, each decides in one statement.
func TestNewHotKeyWaits(t *testing.T) {
	db := pgtest.New(t)
	clk := newClock(base)
	ctx := context.Background()
	hot := fixed("hot", 10, time.Minute)
	// The decisions wait for the creator's commit, which comes once all
	// three are seen waiting (see patient).
	var stores []*postgres.Store
	for range 3 {
		stores = append(stores, instance(t, db, clk, patient, unleased))
	}
	// Another gateway is creating the counter: its insert is not committed.
	tx := counterTx(t, db, "INSERT INTO %s (rule, key, alg, expires_at) VALUES ('hot', 'k', 0, now() + interval '1 hour')")
	before := statements(stores...)
	var done []<-chan answer
	for _, s := range stores {
		done = append(done, decideAsync(ctx, s, chk(hot, "k")))
	}
	waitLockWaits(t, db, len(stores)) // all wait for the new key's creator
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ch := range done {
		if a := receive(t, ch); a.err != nil {
			t.Fatal(a.err)
		}
	}
	if n := statements(stores...) - before; n != uint64(len(stores)) {
		t.Errorf("%d statements for %d decisions: some failed on the new key's lock and were sent again", n, len(stores))
	}
	res, err := stores[0].Peek(ctx, chk(hot, "k"))
	if err != nil {
		t.Fatal(err)
	}
	if used := hot.Limit - res.Remaining; used != int64(len(stores)) {
		t.Errorf("the hot key used %d, want %d", used, len(stores))
	}
}
