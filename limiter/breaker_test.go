package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/limiter/storetest"
	"github.com/sluicehq/sluice/policy"
)

// errDown is what a dial to a stopped Postgres returns.
var errDown error = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// trip is the five consecutive failures that open a default breaker.
var trip = append(repeat(4, step{0, "fail", false, limiter.BreakerClosed}), step{0, "fail", false, limiter.BreakerOpen})

// step is one event of a breaker script, at a fixed instant.
type step struct {
	at    time.Duration // after storetest.Base
	op    string        // "allow", "ok", "fail" (errDown), "cancel" (context.Canceled), "timeout", "trip", "probe-ok", "probe-fail"
	allow bool          // for "allow": what Allow must report
	state limiter.BreakerState
}

func runScript(t *testing.T, cfg limiter.BreakerConfig, steps []step) {
	t.Helper()
	clock := storetest.NewClock(storetest.Base)
	cfg.Now = clock.Now
	b, err := limiter.NewBreaker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range steps {
		clock.Set(storetest.Base.Add(s.at))
		switch s.op {
		case "allow":
			if got := b.Allow(); got != s.allow {
				t.Fatalf("step %d (+%v allow): Allow() = %v, want %v", i, s.at, got, s.allow)
			}
		case "ok":
			b.Record(0, nil)
		case "fail":
			b.Record(0, fmt.Errorf("postgres decide: %w", errDown))
		case "cancel":
			b.Record(0, fmt.Errorf("postgres decide: %w", context.Canceled))
		case "timeout":
			b.Record(0, fmt.Errorf("postgres decide: %w", context.DeadlineExceeded))
		case "trip":
			b.Trip(fmt.Errorf("key events: %w", errDown))
		case "probe-ok":
			limiter.EndProbe(b, nil)
		case "probe-fail":
			limiter.EndProbe(b, errDown)
		default:
			t.Fatalf("step %d: unknown op %q", i, s.op)
		}
		if got := b.State(); got != s.state {
			t.Fatalf("step %d (+%v %s): state %v, want %v", i, s.at, s.op, got, s.state)
		}
	}
}

// repeat returns n copies of s.
func repeat(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func TestBreakerScripts(t *testing.T) {
	const (
		C = limiter.BreakerClosed
		O = limiter.BreakerOpen
	)
	tests := []struct {
		name  string
		cfg   limiter.BreakerConfig
		steps [][]step
	}{
		{"consecutive failures open; a success in between resets", limiter.BreakerConfig{}, [][]step{
			repeat(4, step{0, "fail", false, C}),
			{{0, "ok", false, C}},
			repeat(4, step{0, "fail", false, C}),
			{{0, "timeout", false, O}}, // the fifth in a row
			{{1, "allow", false, O}},
			// Decisions never probe, however long it has been open.
			{{time.Hour, "allow", false, O}},
		}},
		{"only a probe closes it", limiter.BreakerConfig{}, [][]step{
			trip,
			{{time.Second, "ok", false, O}}, // a decision that was in flight
			{{time.Second, "probe-fail", false, O}},
			{{2 * time.Second, "allow", false, O}},
			{{2 * time.Second, "probe-ok", false, C}},
			{{2 * time.Second, "allow", true, C}},
			// Closed again with a clean slate: four failures do not open it.
			repeat(4, step{2 * time.Second, "fail", false, C}),
		}},
		{"starts open until the first probe succeeds", limiter.BreakerConfig{StartOpen: true}, [][]step{
			{{0, "allow", false, O}},
			{{0, "ok", false, O}},
			{{0, "probe-fail", false, O}},
			{{time.Second, "probe-ok", false, C}},
			{{time.Second, "allow", true, C}},
		}},
		{"the background trips it at once", limiter.BreakerConfig{}, [][]step{
			{{0, "trip", false, O}},
			{{0, "allow", false, O}},
			{{0, "trip", false, O}}, // already open: nothing changes
			{{time.Second, "probe-ok", false, C}},
		}},
		{"cancelled calls count for nothing", limiter.BreakerConfig{}, [][]step{
			repeat(4, step{0, "fail", false, C}),
			repeat(50, step{0, "cancel", false, C}),
			{{0, "fail", false, O}}, // still the fifth failure in a row
		}},
		{"calls in flight when it opened are ignored", limiter.BreakerConfig{}, [][]step{
			trip,
			{{10 * time.Millisecond, "ok", false, O}},
			repeat(10, step{10 * time.Millisecond, "fail", false, O}),
		}},
		{"failure ratio over the window", limiter.BreakerConfig{Failures: 100, MinCalls: 10, Ratio: 0.5, Window: 10 * time.Second}, [][]step{
			// 9 calls, 5 failed: below MinCalls.
			{{0, "fail", false, C}, {0, "ok", false, C}, {0, "fail", false, C}, {0, "ok", false, C}, {0, "fail", false, C},
				{0, "ok", false, C}, {0, "fail", false, C}, {0, "ok", false, C}},
			{{0, "ok", false, C}},
			// The tenth: 10 calls, 5 failed.
			{{0, "fail", false, O}},
		}},
		{"failures older than the window do not count", limiter.BreakerConfig{Failures: 100, MinCalls: 10, Ratio: 0.5, Window: 10 * time.Second}, [][]step{
			repeat(9, step{0, "fail", false, C}),
			// 10 s later the first bucket has left the window: 1 call.
			{{10 * time.Second, "fail", false, C}},
			repeat(8, step{10 * time.Second, "fail", false, C}),
			{{10 * time.Second, "fail", false, O}},
		}},
		{"ratio off", limiter.BreakerConfig{Failures: 3, Ratio: limiter.Off, MinCalls: 2}, [][]step{
			{{0, "fail", false, C}, {0, "ok", false, C}, {0, "fail", false, C}, {0, "ok", false, C}, {0, "fail", false, C}},
			{{0, "fail", false, C}},
			{{0, "fail", false, O}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var steps []step
			for _, s := range tt.steps {
				steps = append(steps, s...)
			}
			runScript(t, tt.cfg, steps)
		})
	}
}

// TestBreakerRun: Run probes an open breaker every cool-down, without any
// traffic, closes it on the first success, and does not probe while it is
// closed. Changed reports every change of state.
func TestBreakerRun(t *testing.T) {
	b, err := limiter.NewBreaker(limiter.BreakerConfig{StartOpen: true, Cooldown: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		probes []time.Time
		fail   = 3 // the first three probes fail
	)
	probe := func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		probes = append(probes, time.Now())
		if len(probes) <= fail {
			return errDown
		}
		return nil
	}
	nprobes := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(probes)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx, probe) }()
	defer func() { cancel(); <-done }()

	waitState := func(want limiter.BreakerState) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			changed := b.Changed()
			if b.State() == want {
				return
			}
			select {
			case <-changed:
			case <-deadline:
				t.Fatalf("state %v, want %v", b.State(), want)
			}
		}
	}
	waitState(limiter.BreakerClosed)
	if n := nprobes(); n != 4 {
		t.Fatalf("%d probes before closing, want 4 (three failed)", n)
	}
	mu.Lock()
	for i := 1; i < len(probes); i++ {
		if gap := probes[i].Sub(probes[i-1]); gap < 10*time.Millisecond {
			t.Errorf("probe %d came %v after the previous one, want at least the 10ms cool-down", i, gap)
		}
	}
	mu.Unlock()

	// Closed: no probes.
	time.Sleep(50 * time.Millisecond) // nothing to wait for: proving an absence
	if n := nprobes(); n != 4 {
		t.Fatalf("%d probes while closed, want none beyond the 4", n-4)
	}
	// The background trips it; Run probes again by itself and closes it.
	b.Trip(errDown)
	if b.Allow() {
		t.Fatal("tripped breaker allows")
	}
	waitState(limiter.BreakerClosed)
	if n := nprobes(); n != 5 {
		t.Fatalf("%d probes after the trip, want 1", n-4)
	}
}

// TestBreakerOverlappingFailures: failed calls that were in flight
// together are one failure (one slow moment of the store fails every
// decision waiting on it), while calls that fail one after another are an
// outage and open the breaker.
func TestBreakerOverlappingFailures(t *testing.T) {
	clock := storetest.NewClock(storetest.Base)
	b, err := limiter.NewBreaker(limiter.BreakerConfig{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	timeout := fmt.Errorf("postgres decide: %w", context.DeadlineExceeded)
	const d = 50 * time.Millisecond // the decision timeout
	// A busy store: a thousand decisions in the last second.
	for range 1000 {
		clock.Advance(time.Millisecond)
		b.Record(0, nil)
	}
	// A statement that outlived the timeout: 200 decisions began within
	// one timeout of each other, and all fail.
	t0 := clock.Now()
	for i := range 200 {
		clock.Set(t0.Add(time.Duration(i) * d / 200).Add(d))
		b.Record(d, timeout) // each waited the whole timeout
	}
	if s := b.State(); s != limiter.BreakerClosed {
		t.Fatalf("state %v after one slow moment, want closed", s)
	}
	// Failures one after another: the first already counted, four more
	// open the breaker, whatever overlapping failures come in between.
	for i := range 4 {
		if s := b.State(); s != limiter.BreakerClosed {
			t.Fatalf("state %v after %d failures in a row, want closed", s, i+1)
		}
		clock.Advance(d)
		b.Record(d, timeout)
		for range 10 {
			b.Record(d+time.Millisecond, timeout) // began a little earlier
		}
	}
	if s := b.State(); s != limiter.BreakerOpen {
		t.Fatalf("state %v after five failures in a row, want open", s)
	}
}

func TestBreakerMetricsAndLogs(t *testing.T) {
	clock := storetest.NewClock(storetest.Base)
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zapcore.InfoLevel)
	m := limiter.NewMetrics(reg)
	b, err := limiter.NewBreaker(limiter.BreakerConfig{
		Now: clock.Now, Metrics: m, Logger: zap.New(core),
	})
	if err != nil {
		t.Fatal(err)
	}
	state := func() float64 {
		t.Helper()
		return proctest.Metric(t, reg, "sluice_store_breaker_state")
	}
	if s := state(); s != 0 {
		t.Fatalf("initial state gauge %v, want 0", s)
	}
	for range 5 {
		b.Record(0, errDown)
	}
	if s := state(); s != 2 {
		t.Fatalf("state gauge %v after opening, want 2", s)
	}
	// An outage: a thousand refused decisions and three failed probes log
	// nothing above Debug beyond the one Warn of the opening.
	for i := range 3 {
		for range 1000 {
			if b.Allow() {
				t.Fatal("open breaker allowed a call")
			}
		}
		clock.Advance(time.Second)
		limiter.StartProbe(b)
		if s := state(); s != 1 {
			t.Fatalf("state gauge %v while probing (%d), want 1", s, i)
		}
		limiter.EndProbe(b, errDown)
	}
	clock.Advance(time.Second)
	limiter.StartProbe(b)
	clock.Advance(250 * time.Millisecond)
	limiter.EndProbe(b, nil)
	if s := state(); s != 0 {
		t.Fatalf("state gauge %v after closing, want 0", s)
	}

	want := `
# HELP sluice_store_breaker_transitions_total Changes of the store circuit breaker's state, by the state entered.
# TYPE sluice_store_breaker_transitions_total counter
sluice_store_breaker_transitions_total{to="closed"} 1
sluice_store_breaker_transitions_total{to="half_open"} 4
sluice_store_breaker_transitions_total{to="open"} 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_store_breaker_transitions_total"); err != nil {
		t.Error(err)
	}
	// The failed probes count as store errors: an outage shows in the
	// metrics without traffic.
	if n := testutil.ToFloat64(m.StoreErrors("connection")); n != 3 {
		t.Errorf("sluice_store_errors_total{kind=\"connection\"} = %v after three failed probes, want 3", n)
	}
	entries := logs.All()
	if len(entries) != 2 {
		t.Fatalf("%d log lines at Info and above, want 2 (opened, closed): %v", len(entries), entries)
	}
	opened, closed := entries[0], entries[1]
	if opened.Level != zapcore.WarnLevel || !strings.Contains(opened.Message, "opened") ||
		opened.ContextMap()["kind"] != "connection" || opened.ContextMap()["consecutive_failures"] != int64(5) {
		t.Errorf("opening logged as %v %q %v", opened.Level, opened.Message, opened.ContextMap())
	}
	if closed.Level != zapcore.InfoLevel || !strings.Contains(closed.Message, "closed") ||
		closed.ContextMap()["outage"] != 4250*time.Millisecond || closed.ContextMap()["failed_probes"] != int64(3) {
		t.Errorf("closing logged as %v %q %v", closed.Level, closed.Message, closed.ContextMap())
	}
}

func newLocal(c *storetest.Clock) *memory.Store { return memory.New(memory.Options{Now: c.Now}) }

// TestBreakerInLimiter: once the breaker opens, decisions stop calling a
// store that would make each of them wait for the timeout, apply their
// fail modes at once, and resume by themselves when a probe succeeds.
func TestBreakerInLimiter(t *testing.T) {
	clock := storetest.NewClock(storetest.Base.Add(10 * time.Second))
	st := &switchStore{}
	reg := prometheus.NewRegistry()
	m := limiter.NewMetrics(reg)
	b, err := limiter.NewBreaker(limiter.BreakerConfig{Now: clock.Now, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	l, err := limiter.New(limiter.Config{
		Store: st, Local: newLocal(clock), Timeout: 20 * time.Millisecond, CacheSize: limiter.Off,
		Now: clock.Now, Metrics: m, Breaker: b,
	})
	if err != nil {
		t.Fatal(err)
	}
	open := rule("open", 5, fail(policy.FailOpen))
	closed := rule("closed", 5, fail(policy.FailClosed))
	local := rule("local", 2, fail(policy.FailLocal))

	st.set(true)
	for i := range 5 { // each of these waits for the 20ms timeout
		if o := l.Decide(context.Background(), []limiter.Check{chk(open, fmt.Sprint(i))}); !o.Allowed || o.Sources[0] != limiter.SourceFailedOpen {
			t.Fatalf("decision %d: %+v", i, o)
		}
	}
	if b.State() != limiter.BreakerOpen || st.calls() != 5 {
		t.Fatalf("state %v after %d store calls, want open after 5", b.State(), st.calls())
	}
	for i := range 100 {
		o := l.Decide(context.Background(), []limiter.Check{chk(closed, fmt.Sprint(i))})
		if !o.Unavailable || !errors.Is(o.Err, limiter.ErrBreakerOpen) {
			t.Fatalf("closed rule while open: %+v", o)
		}
		o = l.Decide(context.Background(), []limiter.Check{chk(local, "k")})
		if o.Allowed != (i < 2) || o.Sources[0] != limiter.SourceLocal {
			t.Fatalf("local decision %d while open: %+v", i, o)
		}
	}
	if st.calls() != 5 {
		t.Fatalf("the store was called %d times while the breaker was open", st.calls()-5)
	}
	// The store is back; no decision probes it, however long it has been:
	// the breaker's own probe closes it, and the exact store decides again.
	st.set(false)
	clock.Advance(time.Hour)
	if o := l.Decide(context.Background(), []limiter.Check{chk(closed, "x")}); !o.Unavailable {
		t.Fatalf("a decision probed the store: %+v", o)
	}
	limiter.StartProbe(b)
	limiter.EndProbe(b, nil)
	o := l.Decide(context.Background(), []limiter.Check{chk(closed, "x")})
	if !o.Allowed || o.Sources[0] != limiter.SourceStore || b.State() != limiter.BreakerClosed {
		t.Fatalf("after the probe: %+v, state %v", o, b.State())
	}
}

// switchStore blocks until the deadline while down, and allows (or, with
// denyAll, denies for an hour) while up.
type switchStore struct {
	mu      sync.Mutex
	down    bool
	denyAll bool
	now     func() time.Time // the store's clock, for denyAll
	n       int
}

func (s *switchStore) set(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

func (s *switchStore) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *switchStore) Decide(ctx context.Context, cs []limiter.Check, rs []limiter.Result) (bool, error) {
	s.mu.Lock()
	s.n++
	down := s.down
	s.mu.Unlock()
	if down {
		<-ctx.Done()
		return false, fmt.Errorf("switch store: %w", ctx.Err())
	}
	for i, c := range cs {
		if s.denyAll {
			rs[i] = limiter.Result{Limit: c.Rule.Limit, Window: c.Rule.Window, Reset: s.now().Add(time.Hour),
				ResetAfter: time.Hour, RetryAfter: time.Hour}
			continue
		}
		rs[i] = limiter.Result{Allowed: true, Limit: c.Rule.Limit, Window: c.Rule.Window, Remaining: c.Rule.Limit - 1}
	}
	return !s.denyAll, nil
}

func TestNewBreakerErrors(t *testing.T) {
	_, err := limiter.NewBreaker(limiter.BreakerConfig{Failures: -1, Ratio: -2, MinCalls: -1, Window: -1, Cooldown: -1})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"Failures -1", "Ratio -2", "MinCalls -1", "Window -1ns", "Cooldown -1ns"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestBreakerConcurrent hammers one breaker from many goroutines, with Run
// probing it, for the race detector, and checks that it ends closed.
func TestBreakerConcurrent(t *testing.T) {
	b, err := limiter.NewBreaker(limiter.BreakerConfig{Cooldown: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var probes sync.WaitGroup
	probes.Go(func() { b.Run(ctx, func(context.Context) error { return nil }) })
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				if i%100 == 0 {
					b.Trip(errDown)
				}
				if !b.Allow() {
					continue
				}
				if (g+i)%3 == 0 {
					b.Record(0, errDown)
				} else {
					b.Record(0, nil)
				}
			}
		})
	}
	wg.Wait()
	for {
		changed := b.Changed()
		if b.State() == limiter.BreakerClosed {
			break
		}
		<-changed
	}
	cancel()
	probes.Wait()
}

func BenchmarkBreaker(b *testing.B) {
	br, err := limiter.NewBreaker(limiter.BreakerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if br.Allow() {
				br.Record(0, nil)
			}
		}
	})
}
