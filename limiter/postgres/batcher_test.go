package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/limiter/storetest"
	"github.com/sluicehq/sluice/policy"
)

// tracer watches the decide statements of a pool: it counts them and their
// prepares, and hands each one's context to onDecide (set before the pool
// is used), which may hold the statement. The probes' decisions (see
// Store.Probe) are not decisions of the test's: it lets them pass.
type tracer struct {
	decides, prepares atomic.Int64
	onDecide          func(ctx context.Context)
}

func isDecide(sql string) bool { return strings.Contains(sql, ".decide(") }

// isProbe reports whether the arguments of a decide statement are a
// probe's: its rule names are the third argument.
func isProbe(args []any) bool {
	if len(args) < 3 {
		return false
	}
	rules, ok := args[2].([]string)
	return ok && len(rules) == 1 && rules[0] == postgres.ProbeRule
}

func (tr *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if isDecide(d.SQL) && !isProbe(d.Args) {
		tr.decides.Add(1)
		if tr.onDecide != nil {
			tr.onDecide(ctx)
		}
	}
	return ctx
}

func (tr *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *tracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	if isDecide(d.SQL) {
		tr.prepares.Add(1)
	}
	return ctx
}

func (tr *tracer) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// tracedPool opens a pool on db whose decide statements tr sees.
func tracedPool(t testing.TB, db *pgtest.DB, maxConns int32, tr *tracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// gate holds every decide statement until the test lets it go, one
// release per statement; a statement whose context ends is let go at once.
type gate struct {
	entered   atomic.Int64
	release   chan struct{}
	cancelled chan struct{} // one token per statement let go by its context
}

func newGate() *gate {
	return &gate{release: make(chan struct{}, 1000), cancelled: make(chan struct{}, 1000)}
}

func (g *gate) hold(ctx context.Context) {
	g.entered.Add(1)
	select {
	case <-g.release:
	case <-ctx.Done():
		g.cancelled <- struct{}{}
	}
}

// passOn lets the held statement go, receives the answer of its decision
// held, and waits until the statement of the decisions queued behind it is
// held in its place.
func (g *gate) passOn(t *testing.T, held <-chan answer) {
	t.Helper()
	n := g.entered.Load() + 1
	g.let(1)
	receive(t, held)
	eventually(t, "the batch is in flight", func() bool { return g.entered.Load() == n })
}

// noneCancelled fails t if a statement was let go because its context
// ended.
func (g *gate) noneCancelled(t *testing.T, why string) {
	t.Helper()
	select {
	case <-g.cancelled:
		t.Fatal("a statement was cancelled " + why)
	default:
	}
}

// expectCanceled fails t unless the decision of ch was refused with
// context.Canceled.
func expectCanceled(t *testing.T, ch <-chan answer) {
	t.Helper()
	if a := receive(t, ch); !errors.Is(a.err, context.Canceled) || a.ok {
		t.Fatalf("cancelled decision = %+v, want context.Canceled", a)
	}
}

func (g *gate) let(n int) {
	for range n {
		g.release <- struct{}{}
	}
}

// eventually waits until cond holds, failing t after ten seconds. It polls
// for goroutines to reach a state, not for time to pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitIdle waits until s's batcher has no statement in flight and nothing
// queued: every drain gave its slot up.
func waitIdle(t *testing.T, s *postgres.Store, what string) {
	t.Helper()
	eventually(t, what, func() bool {
		st := s.BatchStats()
		return st.InFlight == 0 && st.Queued == 0
	})
}

// used returns how much of r's limit key has used, as s sees it (a store
// on a pool without a gate).
func used(t *testing.T, s *postgres.Store, r *policy.Rule, key string) int64 {
	t.Helper()
	res, err := s.Peek(context.Background(), chk(r, key))
	if err != nil {
		t.Fatal(err)
	}
	return r.Limit - res.Remaining
}

// TestIdleDecisionGoesAtOnce: on an idle store a lone decision is sent at
// once, alone, as one statement: it reaches the database while it is the
// only decision there is, with no other decision to wait for and no clock
// to move (the batcher has none).
func TestIdleDecisionGoesAtOnce(t *testing.T) {
	db := pgtest.New(t)
	g := newGate()
	tr := &tracer{onDecide: g.hold}
	s := open(t, db, tracedPool(t, db, 4, tr), newClock(base).Now, unleased)
	r := fixed("r", 10, time.Minute)
	for i := range 3 {
		before := s.BatchStats()
		ch := decideAsync(context.Background(), s, chk(r, "k"))
		eventually(t, "the decision is in a statement", func() bool { return g.entered.Load() == int64(i+1) })
		if st := s.BatchStats(); st.Queued != 0 || st.InFlight != 1 || st.Decisions-before.Decisions != 1 {
			t.Errorf("decision %d, held in the database: %+v, want it alone in the one statement in flight", i, st)
		}
		g.let(1)
		if a := receive(t, ch); a.err != nil || !a.ok {
			t.Fatalf("decision %d = %+v", i, a)
		}
		after := s.BatchStats()
		if d, n := after.Decisions-before.Decisions, after.Statements-before.Statements; d != 1 || n != 1 {
			t.Errorf("decision %d: %d decisions in %d statements, want 1 in 1", i, d, n)
		}
		waitIdle(t, s, "the slot is given up")
	}
	if got := tr.decides.Load(); got != 3 {
		t.Errorf("%d statements reached the pool, want 3", got)
	}
}

// TestBurstSharesStatements: while both slots are held, 198 more
// concurrent decisions on one hot key queue up; they then go in a single
// statement, and exactly the limit is allowed, for each algorithm.
func TestBurstSharesStatements(t *testing.T) {
	const decisions, limit, slots = 200, 5, 2
	for _, a := range algos {
		t.Run(a.Name, func(t *testing.T) {
			db := pgtest.New(t)
			g := newGate()
			tr := &tracer{onDecide: g.hold}
			s := open(t, db, tracedPool(t, db, 4, tr), newClock(base).Now, unleased,
				func(o *postgres.Options) { o.MaxInFlight = slots })
			r := a.Make("hot", limit+1, time.Hour)
			// The key exists already: two statements that both create a
			// key make one of them retry (see TestNewKeyRace).
			obs := open(t, db, nil, newClock(base).Now, unleased)
			decide(t, obs, chk(r, "k"))
			answers := make([]<-chan answer, decisions)
			for i := range answers {
				answers[i] = decideAsync(context.Background(), s, chk(r, "k"))
			}
			// The slots hold statements with the decisions that had queued
			// when each started, and the rest queue behind them (a slot
			// whose drain found the queue empty is free again).
			eventually(t, "the slots hold statements and the rest queue", func() bool {
				st := s.BatchStats()
				entered := g.entered.Load()
				return st.Decisions+uint64(st.Queued) == decisions && entered == int64(st.Statements) &&
					(st.Queued == 0 || entered == slots)
			})
			held := s.BatchStats()
			g.let(decisions) // more than enough
			allowed := 0
			for _, ch := range answers {
				a := receive(t, ch)
				if a.err != nil {
					t.Fatal(a.err)
				}
				if a.ok {
					allowed++
				}
			}
			if allowed != limit {
				t.Errorf("allowed %d, want exactly %d", allowed, limit)
			}
			st := s.BatchStats()
			// The held statements, then one for all that queued.
			want := held.Statements
			if held.Queued > 0 {
				want++
			}
			if st.Decisions != decisions || st.Statements != want {
				t.Errorf("%d decisions in %d statements, want %d in %d", st.Decisions, st.Statements, decisions, want)
			}
			if got := tr.decides.Load(); got != int64(want) {
				t.Errorf("%d statements reached the pool, want %d", got, want)
			}
			waitIdle(t, s, "the slots are given up")
		})
	}
}

// heldStore opens a store with one slot (MaxInFlight 1) on a fresh
// schema, with opts, whose decide statements g holds; and an observer
// store on the same schema, whose statements nobody holds.
func heldStore(t *testing.T, g *gate, opts ...func(*postgres.Options)) (s, obs *postgres.Store) {
	t.Helper()
	db := pgtest.New(t)
	tr := &tracer{onDecide: g.hold}
	opts = append([]func(*postgres.Options){unleased, func(o *postgres.Options) { o.MaxInFlight = 1 }}, opts...)
	s = open(t, db, tracedPool(t, db, 2, tr), newClock(base).Now, opts...)
	return s, open(t, db, nil, newClock(base).Now, unleased)
}

// holdSlot starts a decision of c on s, and returns where its answer will
// arrive once g holds its statement in the database, in s's one slot.
func holdSlot(t *testing.T, s *postgres.Store, g *gate, c limiter.Check) <-chan answer {
	t.Helper()
	n := g.entered.Load() + 1
	ch := decideAsync(context.Background(), s, c)
	eventually(t, "the slot holds a statement", func() bool { return g.entered.Load() == n })
	return ch
}

// queue starts n decisions of c on s whose slot is held, and returns where
// their answers will arrive once all n are queued.
func queue(t *testing.T, s *postgres.Store, n int, c limiter.Check) []<-chan answer {
	t.Helper()
	queued := s.BatchStats().Queued + n
	var answers []<-chan answer
	for range n {
		answers = append(answers, decideAsync(context.Background(), s, c))
	}
	eventually(t, fmt.Sprintf("%d decisions queue", n), func() bool { return s.BatchStats().Queued == queued })
	return answers
}

// TestMaxBatch: a queue longer than MaxBatch goes in several statements,
// each at most MaxBatch decisions, in arrival order.
func TestMaxBatch(t *testing.T) {
	g := newGate()
	s, obs := heldStore(t, g, func(o *postgres.Options) { o.MaxBatch = 4 })
	r := fixed("r", 100, time.Hour)
	first := holdSlot(t, s, g, chk(r, "k"))
	answers := queue(t, s, 10, chk(r, "k"))
	g.let(100)
	receive(t, first)
	for _, ch := range answers {
		if a := receive(t, ch); a.err != nil || !a.ok {
			t.Fatalf("answer %+v", a)
		}
	}
	// 1 + ceil(10/4) statements.
	if st := s.BatchStats(); st.Statements != 4 || st.Decisions != 11 {
		t.Errorf("%d decisions in %d statements, want 11 in 4", st.Decisions, st.Statements)
	}
	if n := used(t, obs, r, "k"); n != 11 {
		t.Errorf("counter used %d, want 11", n)
	}
}

// busyStore opens a store with one slot whose decide statements g holds,
// gathering on clock, and makes its drain busy: a held lone decision, then
// ten decisions that queue behind it and go in the drain's next statement,
// which is held too. It returns once that statement of ten is in the
// database; the test lets it go.
func busyStore(t *testing.T, g *gate, clock *storetest.Clock, maxBatch int, wait time.Duration) (*postgres.Store, *policy.Rule) {
	t.Helper()
	s, _ := heldStore(t, g, func(o *postgres.Options) { o.MaxBatch, o.BatchWait = maxBatch, wait })
	postgres.SetBatchClock(s, clock)
	r := fixed("r", 1000, time.Hour)
	first := holdSlot(t, s, g, chk(r, "k"))
	ten := queue(t, s, 10, chk(r, "k"))
	g.let(1)
	receive(t, first)
	eventually(t, "the ten are in one statement", func() bool {
		st := s.BatchStats()
		return g.entered.Load() == 2 && st.Queued == 0 && st.Decisions == 11
	})
	t.Cleanup(func() {
		for _, ch := range ten {
			receive(t, ch)
		}
	})
	return s, r
}

// TestBusyDrainGathers: after a statement of ten decisions (a busy drain),
// the decisions that queued meanwhile wait until the oldest has waited
// BatchWait on the batcher's clock, and then go in one statement together
// with those that joined them during the wait. The clock is the test's:
// nothing sleeps.
func TestBusyDrainGathers(t *testing.T) {
	const wait = time.Second
	g := newGate()
	clock := newClock(base)
	s, r := busyStore(t, g, clock, 64, wait)
	early := decideAsync(context.Background(), s, chk(r, "k"))
	eventually(t, "a decision queues", func() bool { return s.BatchStats().Queued == 1 })
	clock.Advance(wait / 2) // the early one has waited half of BatchWait
	g.let(100)              // the statement of ten returns; the next ones pass
	eventually(t, "the drain gathers", func() bool { return s.BatchStats().Gathering == 1 && clock.Waiting() == 1 })
	late := decideAsync(context.Background(), s, chk(r, "k"))
	eventually(t, "the late one queues", func() bool { return s.BatchStats().Queued == 2 })
	// BatchWait counts from when the oldest queued, not from when the
	// gathering began nor once more per decision: the rest of the half.
	clock.Advance(wait/2 - time.Nanosecond)
	if st := s.BatchStats(); st.Gathering != 1 || st.Queued != 2 || st.Statements != 2 {
		t.Fatalf("before BatchWait has passed: %+v, want the drain still gathering two decisions", st)
	}
	clock.Advance(time.Nanosecond)
	for _, ch := range []<-chan answer{early, late} {
		if a := receive(t, ch); a.err != nil || !a.ok {
			t.Fatalf("answer %+v", a)
		}
	}
	if st := s.BatchStats(); st.Statements != 3 || st.Decisions != 13 {
		t.Errorf("%d decisions in %d statements, want 13 in 3", st.Decisions, st.Statements)
	}
}

// TestGatherEndsWhenFull: a gathering drain sends its statement as soon as
// MaxBatch decisions are queued, without waiting out BatchWait (the clock
// never moves); and once the queue is empty, a lone decision goes at once
// again.
func TestGatherEndsWhenFull(t *testing.T) {
	const maxBatch = 12
	g := newGate()
	s, r := busyStore(t, g, newClock(base), maxBatch, time.Hour)
	var answers []<-chan answer
	answers = append(answers, decideAsync(context.Background(), s, chk(r, "k")))
	eventually(t, "a decision queues", func() bool { return s.BatchStats().Queued == 1 })
	g.let(100)
	eventually(t, "the drain gathers", func() bool { return s.BatchStats().Gathering == 1 })
	for range maxBatch - 1 {
		answers = append(answers, decideAsync(context.Background(), s, chk(r, "k")))
	}
	for _, ch := range answers {
		if a := receive(t, ch); a.err != nil || !a.ok {
			t.Fatalf("answer %+v", a)
		}
	}
	if st := s.BatchStats(); st.Statements != 3 || st.Decisions != 11+maxBatch {
		t.Errorf("%d decisions in %d statements, want %d in 3", st.Decisions, st.Statements, 11+maxBatch)
	}
	eventually(t, "the slot is given up", func() bool { return s.BatchStats().InFlight == 0 })
	if a := receive(t, decideAsync(context.Background(), s, chk(r, "k"))); a.err != nil || !a.ok {
		t.Fatalf("lone decision after the busy spell: %+v", a)
	}
}

// TestQueuedDecisionCancelled: a queued decision whose context ends
// returns the context's error at once, and is never sent: it counts
// nothing.
func TestQueuedDecisionCancelled(t *testing.T) {
	g := newGate()
	s, obs := heldStore(t, g)
	r := fixed("r", 100, time.Hour)
	first := holdSlot(t, s, g, chk(r, "first"))

	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := decideAsync(ctx, s, chk(r, "k"))
	eventually(t, "the decision queues", func() bool { return s.BatchStats().Queued == 1 })
	cancel()
	// The statement in flight is still held: the answer cannot wait for it.
	expectCanceled(t, gaveUp)
	later := decideAsync(context.Background(), s, chk(r, "k"))
	eventually(t, "the next decision queues", func() bool { return s.BatchStats().Queued == 2 })
	g.let(10)
	receive(t, first)
	if a := receive(t, later); a.err != nil || !a.ok {
		t.Fatalf("later decision = %+v", a)
	}
	if n := used(t, obs, r, "k"); n != 1 {
		t.Errorf("counter used %d, want 1: the cancelled decision must not count", n)
	}
	if st := s.BatchStats(); st.Statements != 2 || st.Decisions != 2 {
		t.Errorf("stats %+v, want 2 decisions in 2 statements", st)
	}
	waitIdle(t, s, "the batcher is idle")
}

// TestSentDecisionCancelled: a decision whose statement is in flight when
// its context ends returns at once; the statement goes on, for the others
// in it and even when nobody waits for it any more (it may count the
// decisions that gave up, as documented), and its connection survives.
func TestSentDecisionCancelled(t *testing.T) {
	db := pgtest.New(t)
	g := newGate()
	tr := &tracer{onDecide: g.hold}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = 1, 1
	cfg.ConnConfig.Tracer = tr
	var connects atomic.Int64
	cfg.AfterConnect = func(context.Context, *pgx.Conn) error { connects.Add(1); return nil }
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := open(t, db, pool, newClock(base).Now, unleased, func(o *postgres.Options) { o.MaxInFlight = 1 })
	// open probes until the store is ready; on a loaded machine a probe
	// that missed its deadline has cost its connection and a new one was
	// made. What counts is that none is made from here on.
	ready := connects.Load()
	obs := open(t, db, nil, newClock(base).Now, unleased)
	r := fixed("r", 100, time.Hour)
	first := holdSlot(t, s, g, chk(r, "first"))

	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := decideAsync(ctx, s, chk(r, "k"))
	eventually(t, "the first decision queues", func() bool { return s.BatchStats().Queued == 1 })
	stays := decideAsync(context.Background(), s, chk(r, "k"))
	eventually(t, "the second decision queues", func() bool { return s.BatchStats().Queued == 2 })
	g.passOn(t, first)
	cancel()
	expectCanceled(t, gaveUp)
	g.noneCancelled(t, "although a decision still waits for it")
	g.let(1)
	if a := receive(t, stays); a.err != nil || !a.ok {
		t.Fatalf("the other decision of the batch = %+v", a)
	}
	if n := used(t, obs, r, "k"); n != 2 {
		t.Errorf("counter used %d, want 2 (the batch was sent with both)", n)
	}

	// A batch whose only decision gives up is not cancelled either: it
	// finishes on its connection, which stays open and warm.
	head := holdSlot(t, s, g, chk(r, "first")) // the third statement
	ctx, cancel = context.WithCancel(context.Background())
	alone := decideAsync(ctx, s, chk(r, "k"))
	eventually(t, "the decision queues", func() bool { return s.BatchStats().Queued == 1 })
	g.passOn(t, head)
	cancel()
	expectCanceled(t, alone)
	g.let(1)
	eventually(t, "the slot is free again", func() bool { return s.BatchStats().InFlight == 0 })
	g.noneCancelled(t, "although nobody waits for it")
	if n := used(t, obs, r, "k"); n != 3 {
		t.Errorf("counter used %d, want 3: the abandoned decision's statement ran", n)
	}
	if n := connects.Load() - ready; n != 0 {
		t.Errorf("%d connections made after the store was ready, want 0: no statement may be cut off", n)
	}
	g.let(1)
	if ok, _ := decide(t, s, chk(r, "k")); !ok {
		t.Error("a decision after the abandoned batch was denied")
	}
}

// TestMalformedDecisionInBatch: a decision that cannot be built fails
// alone; the others queued with it are decided.
func TestMalformedDecisionInBatch(t *testing.T) {
	g := newGate()
	s, obs := heldStore(t, g)
	good := fixed("r", 100, time.Hour)
	bad := &policy.Rule{Name: "bad", Limit: 0, Window: time.Hour, Algorithm: policy.Fixed, Cost: 1}
	otherAlg := token("r", 100, time.Hour) // the name of good, another algorithm
	first := holdSlot(t, s, g, chk(good, "first"))
	a1 := decideAsync(context.Background(), s, chk(good, "k"))
	eventually(t, "1 queued", func() bool { return s.BatchStats().Queued == 1 })
	a2 := decideAsync(context.Background(), s, chk(bad, "k"), chk(good, "k"))
	eventually(t, "2 queued", func() bool { return s.BatchStats().Queued == 2 })
	a3 := decideAsync(context.Background(), s, chk(good, "k"))
	eventually(t, "3 queued", func() bool { return s.BatchStats().Queued == 3 })
	a4 := decideAsync(context.Background(), s, chk(otherAlg, "k"))
	eventually(t, "4 queued", func() bool { return s.BatchStats().Queued == 4 })
	g.let(100)
	receive(t, first)
	if a := receive(t, a2); a.err == nil {
		t.Error("the malformed decision succeeded")
	}
	for i, ch := range []<-chan answer{a1, a3, a4} {
		if a := receive(t, ch); a.err != nil || !a.ok {
			t.Errorf("well-formed decision %d = %+v", i, a)
		}
	}
	// One by one, in order: good, good, then otherAlg, which reads the
	// counter of the other algorithm as absent and starts it anew.
	if n := used(t, obs, otherAlg, "k"); n != 1 {
		t.Errorf("counter used %d, want 1", n)
	}
	if st := s.BatchStats(); st.Statements != 4 {
		t.Errorf("%d statements, want 4: the first, then one per well-formed decision of the failed batch", st.Statements)
	}
}

// TestPreparedOnce: on one connection, the decide statement is prepared
// once and then only executed, and the server settles on a generic plan
// for it instead of planning every call.
func TestPreparedOnce(t *testing.T) {
	db := pgtest.New(t)
	tr := &tracer{}
	pool := tracedPool(t, db, 1, tr)
	// patient: a probe that misses its deadline on a loaded machine costs
	// its connection, and the next one prepares again (2 prepares, seen in
	// CI); what is tested is one connection's statement cache.
	s := open(t, db, pool, newClock(base).Now, unleased, patient)
	r := fixed("r", 1000, time.Minute)
	const n = 30
	for i := range n {
		decide(t, s, chk(r, fmt.Sprint(i%7)))
	}
	if p, q := tr.prepares.Load(), tr.decides.Load(); p != 1 || q != n {
		t.Errorf("%d prepares for %d statements, want 1 for %d", p, q, n)
	}
	var generic, custom int64
	err := pool.QueryRow(context.Background(), `SELECT generic_plans, custom_plans FROM pg_prepared_statements
		WHERE statement LIKE '%.decide(%' AND statement NOT LIKE '%pg_prepared_statements%'`).Scan(&generic, &custom)
	if err != nil {
		t.Fatal(err)
	}
	// The server plans the first five executions on their own, then
	// switches to the generic plan if it is no worse.
	if custom > 5 || generic+custom != n+postgres.ProbeDecisions {
		t.Errorf("%d generic and %d custom plans for %d executions, want the generic plan from the sixth on", generic, custom, n)
	}
}

// TestAsynchronousCommit: with AsynchronousCommit the decide statement
// turns synchronous_commit off for its own transaction only.
func TestAsynchronousCommit(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("async=%v", async), func(t *testing.T) {
			pool := pgtest.NewPool(t, db.URL, 1)
			s := open(t, db, pool, newClock(base).Now, unleased, func(o *postgres.Options) { o.AsynchronousCommit = async })
			r := fixed("r", 10, time.Minute)
			if ok, _ := decide(t, s, chk(r, "k")); !ok {
				t.Fatal("denied")
			}
			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			setting := func(q pgx.Tx) string {
				var v string
				var err error
				if q != nil {
					err = q.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v)
				} else {
					err = conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v)
				}
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			session := setting(nil)
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			var nowUS int64
			var allowed []bool
			var remaining, resetUS, retryUS, granted []int64
			var held []bool
			if err := tx.QueryRow(ctx, postgres.DecideSQL(s), nil, false,
				[]string{"r"}, []string{"k"}, []int16{0}, []int64{10}, []int64{60_000_000}, []int64{0}, []int64{0}, []int64{0, 0, 0, 0},
				[]int32{0}, []int32{1}, []int64{1}, []bool{false}, []bool{false}, []int64{0}, []int64{0}, []int64{0}, []bool{false}, []int64{-1},
			).Scan(&nowUS, &allowed, &remaining, &resetUS, &retryUS, &granted, &held); err != nil {
				t.Fatal(err)
			}
			want := session
			if async {
				want = "off"
			}
			if got := setting(tx); got != want {
				t.Errorf("inside the decision's transaction synchronous_commit = %s, want %s", got, want)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if got := setting(nil); got != session {
				t.Errorf("after the transaction the session has synchronous_commit = %s, want %s as before", got, session)
			}
		})
	}
}

// TestDecideUsesPrimaryKey: decide reaches counters through the primary
// key only, even when its plans were made on an empty table that then
// grew (a plan made from the statistics of an empty table would scan the
// whole table on every later call of the session).
func TestDecideUsesPrimaryKey(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	s := open(t, db, nil, newClock(base).Now, unleased)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	decideIn := func(key string) {
		t.Helper()
		var nowUS int64
		var allowed []bool
		var remaining, resetUS, retryUS, granted []int64
		var held []bool
		if err := tx.QueryRow(ctx, postgres.DecideSQL(s), nil, false,
			[]string{"r", "r"}, []string{key, key + "2"}, []int16{0, 0}, []int64{10, 10}, []int64{60_000_000, 60_000_000},
			[]int64{0, 0}, []int64{0, 0}, make([]int64, 8), []int32{0, 0}, []int32{1, 2}, []int64{1, 1}, []bool{false, false}, []bool{false, false},
			[]int64{0, 0}, []int64{0, 0}, []int64{0, 0}, []bool{false, false}, []int64{-1, -1},
		).Scan(&nowUS, &allowed, &remaining, &resetUS, &retryUS, &granted, &held); err != nil {
			t.Fatal(err)
		}
	}
	// The view may hold counts of earlier transactions that the session
	// has not reported yet: compare with a baseline.
	scans := func() (seq, idx int64) {
		t.Helper()
		if err := tx.QueryRow(ctx, `SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables
			WHERE schemaname = $1 AND relname = 'counters'`, db.Schema).Scan(&seq, &idx); err != nil {
			t.Fatal(err)
		}
		return seq, idx
	}
	seq0, idx0 := scans()
	decideIn("a") // plans made on an empty table
	counters := db.Table("counters")
	if _, err := tx.Exec(ctx, "INSERT INTO "+counters+` (rule, key, alg, a, n, expires_at)
		SELECT 'r', 'k' || i, 0, 0, 1, 'infinity' FROM generate_series(1, 20000) AS i`); err != nil {
		t.Fatal(err)
	}
	decideIn("k77")
	decideIn("b")
	seq, idx := scans()
	if seq, idx = seq-seq0, idx-idx0; seq != 0 || idx == 0 {
		t.Errorf("decide scanned counters %d times sequentially and %d times by index, want only by index", seq, idx)
	}
}

// TestConfigurePool: ConfigurePool keeps connections warm unless told
// otherwise (the batcher's, one for the background work and, with leases,
// one for lease returns), and its connection set-up runs before the
// caller's own.
func TestConfigurePool(t *testing.T) {
	db := pgtest.New(t)
	for _, tc := range []struct {
		url     string
		leasing postgres.Leasing
		want    int32
	}{
		{db.URL, postgres.Leased, postgres.DefaultMaxInFlight + 2},
		{db.URL, postgres.Unleased, postgres.DefaultMaxInFlight + 1},
		{db.URL + sepFor(db.URL) + "pool_min_conns=1", postgres.Leased, 1},
	} {
		cfg, err := pgxpool.ParseConfig(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		var after atomic.Int64
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			after.Add(1)
			return nil
		}
		if err := postgres.ConfigurePool(cfg, postgres.Options{Schema: db.Schema, Leasing: tc.leasing}); err != nil {
			t.Fatal(err)
		}
		if cfg.MinConns != tc.want {
			t.Errorf("%s: MinConns %d, want %d", tc.url, cfg.MinConns, tc.want)
		}
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s := open(t, db, pool, newClock(base).Now, unleased)
		if ok, _ := decide(t, s, chk(fixed("r", 1, time.Minute), fmt.Sprint(tc.url, tc.leasing))); !ok {
			t.Error("denied")
		}
		if after.Load() == 0 {
			t.Error("the caller's AfterConnect did not run")
		}
	}
}

func sepFor(url string) string {
	if strings.Contains(url, "?") {
		return "&"
	}
	return "?"
}

// TestCollectors: the statement metrics follow BatchStats.
func TestCollectors(t *testing.T) {
	db := pgtest.New(t)
	s := open(t, db, nil, newClock(base).Now, unleased)
	r := fixed("r", 10, time.Minute)
	decide(t, s, chk(r, "a"))
	decide(t, s, chk(r, "b"), chk(r, "c"))
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collectors()...)
	want := `
# HELP sluice_db_decide_statements_total Decide statements (transactions) sent for them, retries included.
# TYPE sluice_db_decide_statements_total counter
sluice_db_decide_statements_total 2
# HELP sluice_db_decisions_total Decisions sent to the database.
# TYPE sluice_db_decisions_total counter
sluice_db_decisions_total 2
# HELP sluice_db_progress_questions_total Questions asked of the database about decide statements past their deadline: is it making progress on them?
# TYPE sluice_db_progress_questions_total counter
sluice_db_progress_questions_total 0
# HELP sluice_db_queued_decisions Decisions waiting for a statement while others are in flight.
# TYPE sluice_db_queued_decisions gauge
sluice_db_queued_decisions 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestRunOutlivesEveryDrain: a store's Run, ended while decisions keep
// coming, returns only after every drain they started has ended; none is
// counted after it returns. A drain counted with the batcher's lock let go
// could start after Run had waited for none, race its Wait (which -race
// reports) and decide after the leases were given back.
func TestRunOutlivesEveryDrain(t *testing.T) {
	db := pgtest.New(t)
	r := fixed("r", 1_000_000, time.Hour)
	for i := range 40 {
		s := open(t, db, nil, newClock(base).Now, unleased)
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan struct{})
		go func() { defer close(ran); s.Run(ctx) }()
		var deciders sync.WaitGroup
		for w := range 8 {
			deciders.Go(func() {
				res := make([]limiter.Result, 1)
				for {
					// Until Run ends: the store then refuses every decision.
					_, err := s.Decide(context.Background(), []limiter.Check{chk(r, fmt.Sprint(w))}, res)
					if err != nil && ctx.Err() != nil {
						return
					}
				}
			})
		}
		time.Sleep(time.Duration(i%5) * time.Millisecond)
		cancel()
		<-ran
		if st := s.BatchStats(); st.InFlight != 0 {
			t.Errorf("run %d: Run returned with %d drains counted: %+v", i, st.InFlight, st)
		}
		deciders.Wait()
		if st := s.BatchStats(); st.InFlight != 0 {
			t.Errorf("run %d: a decision after Run returned started a drain: %+v", i, st)
		}
	}
}
