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
	op    string        // "allow", "ok", "fail" (errDown), "cancel" (context.Canceled), "timeout"
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
		H = limiter.BreakerHalfOpen
		O = limiter.BreakerOpen
	)
	ms := time.Millisecond
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
			{{999 * ms, "allow", false, O}},
		}},
		{"cool-down, one probe, success closes", limiter.BreakerConfig{}, [][]step{
			trip,
			{{time.Second, "allow", true, H}}, // the exact end of the cool-down
			{{time.Second, "allow", false, H}},
			{{1500 * ms, "allow", false, H}}, // the probe is in flight
			{{1500 * ms, "ok", false, C}},
			{{1500 * ms, "allow", true, C}},
			// Closed again with a clean slate: four failures do not open it.
			repeat(4, step{1500 * ms, "fail", false, C}),
		}},
		{"failed probe opens for another cool-down", limiter.BreakerConfig{Cooldown: 2 * time.Second}, [][]step{
			trip,
			{{2 * time.Second, "allow", true, H}},
			{{2100 * ms, "fail", false, O}},
			{{4099 * ms, "allow", false, O}},
			{{4100 * ms, "allow", true, H}},
			{{4100 * ms, "ok", false, C}},
		}},
		{"a lost probe is replaced after a cool-down", limiter.BreakerConfig{}, [][]step{
			trip,
			{{time.Second, "allow", true, H}},
			{{1999 * ms, "allow", false, H}},
			{{2 * time.Second, "allow", true, H}},
			{{2 * time.Second, "ok", false, C}},
		}},
		{"cancelled calls count for nothing", limiter.BreakerConfig{}, [][]step{
			repeat(4, step{0, "fail", false, C}),
			repeat(50, step{0, "cancel", false, C}),
			{{0, "fail", false, O}}, // still the fifth failure in a row
			{{time.Second, "allow", true, H}},
			{{time.Second, "cancel", false, H}}, // the probe's client left: probe again at once
			{{time.Second, "allow", true, H}},
			{{time.Second, "allow", false, H}},
		}},
		{"calls in flight when it opened are ignored", limiter.BreakerConfig{}, [][]step{
			trip,
			{{10 * ms, "ok", false, O}},
			repeat(10, step{10 * ms, "fail", false, O}),
			{{time.Second, "allow", true, H}}, // the cool-down runs from the opening
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
		{"ratio off", limiter.BreakerConfig{Failures: 3, Ratio: 2, MinCalls: 2}, [][]step{
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
	b, err := limiter.NewBreaker(limiter.BreakerConfig{
		Now: clock.Now, Metrics: limiter.NewMetrics(reg), Logger: zap.New(core),
	})
	if err != nil {
		t.Fatal(err)
	}
	state := func() float64 {
		t.Helper()
		return gauge(t, reg, "sluice_store_breaker_state")
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
		if !b.Allow() {
			t.Fatalf("probe %d refused", i)
		}
		if s := state(); s != 1 {
			t.Fatalf("state gauge %v while probing, want 1", s)
		}
		b.Record(0, errDown)
	}
	clock.Advance(time.Second)
	b.Allow()
	clock.Advance(250 * time.Millisecond)
	b.Record(0, nil)
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

// gauge returns the value of the single-series gauge name in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func newLocal(c *storetest.Clock) *memory.Store { return memory.New(memory.WithClock(c.Now)) }

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
		Store: st, Local: newLocal(clock), Timeout: 20 * time.Millisecond,
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
	// The store is back; after the cool-down the next decision probes and
	// closes the breaker; the exact store decides again.
	st.set(false)
	clock.Advance(time.Second)
	o := l.Decide(context.Background(), []limiter.Check{chk(closed, "x")})
	if !o.Allowed || o.Sources[0] != limiter.SourceStore || b.State() != limiter.BreakerClosed {
		t.Fatalf("probe: %+v, state %v", o, b.State())
	}
}

// switchStore blocks until the deadline while down, and allows while up.
type switchStore struct {
	mu   sync.Mutex
	down bool
	n    int
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
		rs[i] = limiter.Result{Allowed: true, Limit: c.Rule.Limit, Window: c.Rule.Window, Remaining: c.Rule.Limit - 1}
	}
	return true, nil
}

func TestNewBreakerErrors(t *testing.T) {
	_, err := limiter.NewBreaker(limiter.BreakerConfig{Failures: -1, Ratio: -1, MinCalls: -1, Window: -1, Cooldown: -1})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"Failures -1", "Ratio -1", "MinCalls -1", "Window -1ns", "Cooldown -1ns"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestBreakerConcurrent hammers one breaker from many goroutines (for the
// race detector) and checks that it ends in a consistent state.
func TestBreakerConcurrent(t *testing.T) {
	b, err := limiter.NewBreaker(limiter.BreakerConfig{Cooldown: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
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
	// Whatever happened, one success after the cool-down closes it.
	for b.State() != limiter.BreakerClosed {
		if b.Allow() {
			b.Record(0, nil)
		}
	}
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
