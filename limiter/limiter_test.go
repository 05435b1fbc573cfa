package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/limiter/storetest"
	"github.com/sluicehq/sluice/policy"
)

// countingStore counts the decisions that reach the store it wraps.
type countingStore struct {
	limiter.Store
	calls atomic.Int64
}

func (s *countingStore) Decide(ctx context.Context, cs []limiter.Check, rs []limiter.Result) (bool, error) {
	s.calls.Add(1)
	return s.Store.Decide(ctx, cs, rs)
}

// errStore fails every decision.
type errStore struct{ err error }

func (s errStore) Decide(context.Context, []limiter.Check, []limiter.Result) (bool, error) {
	return false, s.err
}

// blockingStore never decides: it waits until the decision's context is
// done, like a store whose database does not answer.
type blockingStore struct{ entered chan struct{} }

func (s blockingStore) Decide(ctx context.Context, _ []limiter.Check, _ []limiter.Result) (bool, error) {
	if s.entered != nil {
		s.entered <- struct{}{}
	}
	<-ctx.Done()
	return false, fmt.Errorf("blocking store: %w", ctx.Err())
}

type fixture struct {
	clock   *storetest.Clock
	store   *countingStore
	local   *memory.Store
	reg     *prometheus.Registry
	limiter *limiter.Limiter
}

// newFixture builds a Limiter over a counting memory store, both on one
// settable clock at Base+10s. edit may change the Config first.
func newFixture(t testing.TB, edit func(*limiter.Config)) *fixture {
	t.Helper()
	f := &fixture{clock: storetest.NewClock(storetest.Base.Add(10 * time.Second)), reg: prometheus.NewRegistry()}
	f.store = &countingStore{Store: memory.New(memory.Options{Now: f.clock.Now})}
	f.local = memory.New(memory.Options{Now: f.clock.Now})
	cfg := limiter.Config{
		Store:     f.store,
		Local:     f.local,
		Timeout:   time.Second,
		CacheSize: 100,
		Now:       f.clock.Now,
		Metrics:   limiter.NewMetrics(f.reg),
	}
	if edit != nil {
		edit(&cfg)
	}
	l, err := limiter.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.limiter = l
	return f
}

func (f *fixture) decide(cs ...limiter.Check) limiter.Outcome {
	return f.limiter.Decide(context.Background(), cs)
}

// metric returns the value of a counter, or the sample count of a
// histogram, named name with the given label pairs; 0 when absent.
func (f *fixture) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			matched := 0
			for _, lp := range m.GetLabel() {
				for i := 0; i+1 < len(labels); i += 2 {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						matched++
					}
				}
			}
			if matched == len(labels)/2 {
				if h := m.GetHistogram(); h != nil {
					return float64(h.GetSampleCount())
				}
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// rule is a fixed rule of a minute with set applied, built as the
// conformance suite builds rules.
func rule(name string, limit int64, set ...func(*policy.Rule)) *policy.Rule {
	return storetest.With(storetest.Fixed(name, limit, time.Minute), set...)
}

var (
	shadow   = storetest.Shadow
	countAll = storetest.CountAll
)

func fail(m policy.FailMode) func(*policy.Rule) {
	return func(r *policy.Rule) { r.Fail = m }
}

func chk(r *policy.Rule, key string) limiter.Check { return limiter.Check{Rule: r, Key: key} }

func TestFastPath(t *testing.T) {
	f := newFixture(t, nil)
	a := rule("a", 2)
	b := rule("b", 100)
	for i := range 2 {
		if o := f.decide(chk(a, "k")); !o.Allowed {
			t.Fatalf("request %d denied", i+1)
		}
	}
	o := f.decide(chk(a, "k"))
	if o.Allowed || o.Sources[0] != limiter.SourceStore || o.RetryAfter != 50*time.Second {
		t.Fatalf("third request: %+v, want denied by the store with RetryAfter 50s", o)
	}
	if n := f.store.calls.Load(); n != 3 {
		t.Fatalf("store calls = %d, want 3", n)
	}

	steps := []struct {
		at    time.Duration // after Base
		left  time.Duration // RetryAfter expected from the fast path; 0: the store answers
		calls int64
	}{
		{10 * time.Second, 50 * time.Second, 3},
		{30 * time.Second, 30 * time.Second, 3},
		{time.Minute - time.Microsecond, time.Microsecond, 3},
		{time.Minute, 0, 4}, // the exact reset instant: expired, the store decides
	}
	for _, st := range steps {
		f.clock.Set(storetest.Base.Add(st.at))
		cs := []limiter.Check{chk(a, "k"), chk(b, "k")}
		o := f.decide(cs...)
		if got := f.store.calls.Load(); got != st.calls {
			t.Errorf("at +%v: store calls = %d, want %d", st.at, got, st.calls)
		}
		if st.left == 0 {
			if !o.Allowed || o.Sources[0] != limiter.SourceStore {
				t.Errorf("at +%v: %+v, want allowed by the store", st.at, o)
			}
			continue
		}
		want := limiter.Result{
			Allowed: false, Limit: 2, Window: time.Minute, Remaining: 0, Count: 2,
			Reset: storetest.Base.Add(time.Minute), ResetAfter: st.left, RetryAfter: st.left,
		}
		if o.Allowed || o.Sources[0] != limiter.SourceFastPath || o.Results[0] != want || o.RetryAfter != st.left {
			t.Errorf("at +%v: got %+v\nwant denied from the fast path with %+v", st.at, o, want)
		}
		if o.Sources[1] != limiter.SourceNotEvaluated || o.Denied(cs, 1) || !o.Denied(cs, 0) {
			t.Errorf("at +%v: the other check should be not evaluated: %v", st.at, o.Sources)
		}
		if p := o.Primary(cs); p != 0 {
			t.Errorf("at +%v: Primary = %d, want 0", st.at, p)
		}
	}
	if got := f.metric(t, "sluice_fast_path_hits_total", "rule", "a"); got != 3 {
		t.Errorf("fast path hits = %v, want 3", got)
	}
	// Rule b was never evaluated during the hits: only its one store decision counts.
	if got := f.metric(t, "sluice_decisions_total", "rule", "b", "outcome", "allowed"); got != 1 {
		t.Errorf("rule b decisions = %v, want 1", got)
	}
	if got := f.metric(t, "sluice_decisions_total", "rule", "a", "outcome", "limited"); got != 4 {
		t.Errorf("rule a limited = %v, want 4 (1 by the store, 3 by the fast path)", got)
	}
}

// TestFastPathDisabled: CacheSize Off turns the fast path off; zero means
// the default size, with the fast path on.
func TestFastPathDisabled(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cacheSize int
		want      int64
	}{
		{"off", limiter.Off, 5},
		{"default", 0, 2}, // the store allows one and denies one; the fast path the rest
	} {
		f := newFixture(t, func(c *limiter.Config) { c.CacheSize = tc.cacheSize })
		a := rule("a", 1)
		for range 5 {
			f.decide(chk(a, "k"))
		}
		if n := f.store.calls.Load(); n != tc.want {
			t.Errorf("CacheSize %s: store calls = %d, want %d", tc.name, n, tc.want)
		}
	}
}

func TestFastPathCountAll(t *testing.T) {
	f := newFixture(t, nil)
	a := rule("a", 1)
	all := rule("all", 10, countAll)
	f.decide(chk(a, "k"))
	f.decide(chk(a, "k")) // denied: a:k is remembered
	calls := f.store.calls.Load()

	// A request that also has a count=all check must reach the store,
	// which counts it there although the request is denied.
	for i := range 3 {
		o := f.decide(chk(a, "k"), chk(all, "k"))
		if o.Allowed || o.Sources[0] != limiter.SourceStore || o.Sources[1] != limiter.SourceStore {
			t.Fatalf("request %d: %+v, want denied by the store", i, o)
		}
		if want := int64(10 - 1 - i); o.Results[1].Remaining != want {
			t.Errorf("request %d: count=all Remaining = %d, want %d", i, o.Results[1].Remaining, want)
		}
	}
	if got := f.store.calls.Load() - calls; got != 3 {
		t.Errorf("store calls = %d, want 3", got)
	}

	// A count=all rule's own denials are not remembered either.
	one := rule("one", 1, countAll)
	for range 3 {
		f.decide(chk(one, "k"))
	}
	if got := f.store.calls.Load() - calls; got != 6 {
		t.Errorf("store calls = %d, want 6", got)
	}
}

func TestShadowNeverBlocksNorCached(t *testing.T) {
	f := newFixture(t, nil)
	s := rule("s", 1, shadow)
	for i := range 4 {
		cs := []limiter.Check{chk(s, "k")}
		o := f.decide(cs...)
		if !o.Allowed || o.Sources[0] != limiter.SourceStore {
			t.Fatalf("request %d: %+v, want allowed by the store", i, o)
		}
		if wantOwn := i == 0; o.Results[0].Allowed != wantOwn {
			t.Errorf("request %d: shadow verdict %v, want %v", i, o.Results[0].Allowed, wantOwn)
		}
		if o.Denied(cs, 0) || o.RetryAfter != 0 {
			t.Errorf("request %d: a shadow check denied the request", i)
		}
	}
	if n := f.store.calls.Load(); n != 4 {
		t.Errorf("store calls = %d, want 4 (shadow denials are never cached)", n)
	}
	if got := f.metric(t, "sluice_decisions_total", "rule", "s", "outcome", "shadow_limited"); got != 3 {
		t.Errorf("shadow_limited = %v, want 3", got)
	}
}

// TestForget: a reset or override change drops a remembered denial that
// the store decided before it, and keeps one decided after it, however
// late the news of the change arrives (a delayed event during an outage
// must not let an over-limit key through).
func TestForget(t *testing.T) {
	f := newFixture(t, nil)
	a := rule("a", 1)
	f.decide(chk(a, "k"))
	f.decide(chk(a, "k")) // denied by the store at Base+10s: remembered
	if o := f.decide(chk(a, "k")); o.Sources[0] != limiter.SourceFastPath {
		t.Fatalf("not remembered: %v", o.Sources)
	}
	denied := f.clock.Now()

	// News of a reset made before the denial, arriving late: kept.
	f.limiter.Forget("a", "k", denied.Add(-time.Second))
	if o := f.decide(chk(a, "k")); o.Sources[0] != limiter.SourceFastPath {
		t.Fatalf("a reset older than the denial dropped it: %v", o.Sources)
	}
	// A reset after the denial: dropped, and the store decides.
	f.clock.Advance(time.Millisecond)
	f.store.Store.(*memory.Store).Reset(context.Background(), chk(a, "k")) //nolint:errcheck // cannot fail
	f.limiter.Forget("a", "k", f.clock.Now())
	if o := f.decide(chk(a, "k")); !o.Allowed || o.Sources[0] != limiter.SourceStore {
		t.Errorf("after Reset and Forget: %+v, want allowed by the store", o)
	}
}

// TestSharedDenialNotRemembered: a denial by a counter shared with other
// keys (a full memory store's overflow) is not about the key, and the fast
// path does not remember it.
func TestSharedDenialNotRemembered(t *testing.T) {
	clock := storetest.NewClock(storetest.Base.Add(10 * time.Second))
	f := newFixture(t, func(c *limiter.Config) {
		c.Store = memory.New(memory.Options{Now: clock.Now, MaxKeys: 1})
	})
	a := rule("a", 1)
	f.decide(chk(a, "first")) // the store is full now
	f.decide(chk(a, "x"))     // overflow: allowed, the overflow counter used up
	for i := range 3 {
		o := f.decide(chk(a, "x"))
		if o.Allowed || !o.Results[0].Shared || o.Sources[0] != limiter.SourceStore {
			t.Fatalf("decision %d on an overflowing key: %+v, want a shared denial from the store", i, o)
		}
	}
}

// TestLateResetDuringOutage: the observed leak. A key over its limit is
// remembered; the store then fails, and the event of an earlier reset
// arrives. The key stays denied by the fast path, whatever the rule's fail
// mode, instead of passing on it.
func TestLateResetDuringOutage(t *testing.T) {
	st := &switchStore{}
	f := newFixture(t, func(c *limiter.Config) { c.Store = st; c.Timeout = 10 * time.Millisecond })
	st.now = f.clock.Now
	a := rule("a", 1, fail(policy.FailOpen))
	resetAt := f.clock.Now()
	f.clock.Advance(time.Second)
	st.denyAll = true
	if o := f.decide(chk(a, "k")); o.Allowed {
		t.Fatal("the store allowed")
	}
	st.set(true) // down: every decision would fail open
	f.limiter.Forget("a", "k", resetAt)
	for i := range 12 {
		if o := f.decide(chk(a, "k")); o.Allowed {
			t.Fatalf("request %d passed during the outage after a late reset event: %+v", i+1, o)
		}
	}
}

func TestFailModes(t *testing.T) {
	storeErr := errors.New("connection refused")
	open := rule("open", 5, fail(policy.FailOpen))
	closed := rule("closed", 5, fail(policy.FailClosed))
	local := rule("local", 2, fail(policy.FailLocal))
	local2 := rule("local2", 1, fail(policy.FailLocal))
	def := rule("def", 5)
	S := limiter.SourceFailedOpen
	tests := []struct {
		name        string
		defaultFail policy.FailMode
		checks      []limiter.Check
		repeat      int // decisions made before the one checked
		allowed     bool
		unavailable bool
		sources     []limiter.Source
	}{
		{"open", policy.FailOpen, []limiter.Check{chk(open, "k")}, 0, true, false, []limiter.Source{S}},
		{"default-unset-is-local", policy.FailDefault, []limiter.Check{chk(def, "k")}, 0, true, false, []limiter.Source{limiter.SourceLocal}},
		{"closed", policy.FailOpen, []limiter.Check{chk(open, "k"), chk(closed, "k")}, 0, false, true,
			[]limiter.Source{limiter.SourceFailedClosed, limiter.SourceFailedClosed}},
		{"default-closed", policy.FailClosed, []limiter.Check{chk(def, "k")}, 0, false, true,
			[]limiter.Source{limiter.SourceFailedClosed}},
		{"closed-wins-over-local", policy.FailOpen, []limiter.Check{chk(local, "k"), chk(closed, "k")}, 0, false, true,
			[]limiter.Source{limiter.SourceFailedClosed, limiter.SourceFailedClosed}},
		{"local-under-limit", policy.FailOpen, []limiter.Check{chk(open, "k"), chk(local, "k")}, 1, true, false,
			[]limiter.Source{S, limiter.SourceLocal}},
		{"local-over-limit", policy.FailOpen, []limiter.Check{chk(open, "k"), chk(local, "k")}, 2, false, false,
			[]limiter.Source{S, limiter.SourceLocal}},
		{"default-local", policy.FailLocal, []limiter.Check{chk(def, "k"), chk(local2, "k")}, 1, false, false,
			[]limiter.Source{limiter.SourceLocal, limiter.SourceLocal}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, func(c *limiter.Config) {
				c.Store = errStore{storeErr}
				c.DefaultFail = tt.defaultFail
			})
			for range tt.repeat {
				f.decide(tt.checks...)
			}
			o := f.decide(tt.checks...)
			if o.Allowed != tt.allowed || o.Unavailable != tt.unavailable {
				t.Errorf("Allowed=%v Unavailable=%v, want %v %v", o.Allowed, o.Unavailable, tt.allowed, tt.unavailable)
			}
			if fmt.Sprint(o.Sources) != fmt.Sprint(tt.sources) {
				t.Errorf("Sources = %v, want %v", o.Sources, tt.sources)
			}
			if !errors.Is(o.Err, storeErr) {
				t.Errorf("Err = %v, want the store's error", o.Err)
			}
			if tt.unavailable && o.RetryAfter != limiter.UnavailableRetryAfter {
				t.Errorf("RetryAfter = %v for an unavailable store", o.RetryAfter)
			}
			for i, c := range tt.checks {
				if o.Sources[i] != limiter.SourceFailedOpen {
					continue
				}
				want := limiter.Result{Allowed: true, Limit: c.Rule.Limit, Window: c.Rule.Window,
					Remaining: c.Rule.Limit, Reset: f.clock.Now()}
				if o.Results[i] != want {
					t.Errorf("failed-open result %+v, want %+v", o.Results[i], want)
				}
			}
			if got := f.metric(t, "sluice_store_errors_total", "kind", "other"); got != float64(tt.repeat+1) {
				t.Errorf("store errors = %v, want %d", got, tt.repeat+1)
			}
		})
	}
}

func TestFailLocalHoldsLimit(t *testing.T) {
	f := newFixture(t, func(c *limiter.Config) {
		c.Store = errStore{errors.New("down")}
		c.DefaultFail = policy.FailLocal
	})
	a := rule("a", 3)
	gate := rule("gate", 100)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if o := f.decide(chk(gate, "g"), chk(a, "k")); o.Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	if n := allowed.Load(); n != 3 {
		t.Errorf("allowed %d, want exactly 3 under the local fallback", n)
	}
	// All or nothing: the 47 denials consumed nothing from gate.
	res, err := f.local.Peek(context.Background(), chk(gate, "g"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Remaining != 97 {
		t.Errorf("gate Remaining = %d, want 97", res.Remaining)
	}
	if got := f.metric(t, "sluice_decisions_total", "rule", "a", "outcome", "local"); got != 3 {
		t.Errorf("local = %v, want 3", got)
	}
	if got := f.metric(t, "sluice_decisions_total", "rule", "a", "outcome", "limited"); got != 47 {
		t.Errorf("limited = %v, want 47", got)
	}
}

func TestTimeout(t *testing.T) {
	for _, mode := range []policy.FailMode{policy.FailOpen, policy.FailClosed} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, func(c *limiter.Config) {
				c.Store = blockingStore{}
				c.Timeout = 20 * time.Millisecond
				c.DefaultFail = mode
			})
			done := make(chan limiter.Outcome, 1)
			go func() { done <- f.decide(chk(rule("a", 1), "k")) }()
			var o limiter.Outcome
			select {
			case o = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Decide did not return after its store timed out")
			}
			if !errors.Is(o.Err, context.DeadlineExceeded) {
				t.Errorf("Err = %v, want a deadline", o.Err)
			}
			if o.Allowed != (mode == policy.FailOpen) || o.Unavailable != (mode == policy.FailClosed) {
				t.Errorf("Allowed=%v Unavailable=%v under fail=%v", o.Allowed, o.Unavailable, mode)
			}
			if got := f.metric(t, "sluice_store_errors_total", "kind", "timeout"); got != 1 {
				t.Errorf("timeout errors = %v, want 1", got)
			}
			if got := f.metric(t, "sluice_store_duration_seconds"); got != 1 {
				t.Errorf("store duration samples = %v, want 1", got)
			}
			outcome := map[policy.FailMode]string{policy.FailOpen: "failed_open", policy.FailClosed: "failed_closed"}[mode]
			if got := f.metric(t, "sluice_decisions_total", "rule", "a", "outcome", outcome); got != 1 {
				t.Errorf("%s = %v, want 1", outcome, got)
			}
		})
	}
}

func TestCallerCancel(t *testing.T) {
	f := newFixture(t, func(c *limiter.Config) { c.Store = blockingStore{entered: make(chan struct{}, 1)} })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o := f.limiter.Decide(ctx, []limiter.Check{chk(rule("a", 1), "k")})
	if !errors.Is(o.Err, context.Canceled) || !o.Allowed {
		t.Errorf("Outcome %+v, want failed open with context.Canceled", o)
	}
	if got := f.metric(t, "sluice_store_errors_total", "kind", "canceled"); got != 1 {
		t.Errorf("canceled errors = %v, want 1", got)
	}
	// The client went away: the store did not fail, and no failed
	// decision is counted.
	for _, outcome := range []string{"failed_open", "failed_closed", "local"} {
		if got := f.metric(t, "sluice_decisions_total", "rule", "a", "outcome", outcome); got != 0 {
			t.Errorf("%s decisions = %v, want 0 for a caller that went away", outcome, got)
		}
	}
}

func TestCallerCancelLocal(t *testing.T) {
	// The caller's own context may be what failed the store; the local
	// fallback still decides.
	f := newFixture(t, func(c *limiter.Config) {
		c.Store = blockingStore{}
		c.DefaultFail = policy.FailLocal
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o := f.limiter.Decide(ctx, []limiter.Check{chk(rule("a", 1), "k")})
	if !o.Allowed || o.Sources[0] != limiter.SourceLocal {
		t.Errorf("Outcome %+v, want allowed by the local store", o)
	}
	if got := f.metric(t, "sluice_decisions_total", "rule", "a", "outcome", "local"); got != 0 {
		t.Errorf("local decisions = %v, want 0 for a caller that went away", got)
	}
}

type fakeBreaker struct {
	open     bool
	recorded []error
	mu       sync.Mutex
}

func (b *fakeBreaker) Allow() bool { return !b.open }
func (b *fakeBreaker) Record(_ time.Duration, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.recorded = append(b.recorded, err)
}

func TestBreaker(t *testing.T) {
	br := &fakeBreaker{}
	f := newFixture(t, func(c *limiter.Config) { c.Breaker = br })
	a := rule("a", 5, fail(policy.FailClosed))
	f.decide(chk(a, "k"))
	if len(br.recorded) != 1 || br.recorded[0] != nil {
		t.Errorf("recorded %v, want one nil", br.recorded)
	}
	br.open = true
	o := f.decide(chk(a, "k"))
	if !o.Unavailable || !errors.Is(o.Err, limiter.ErrBreakerOpen) {
		t.Errorf("Outcome %+v, want unavailable with ErrBreakerOpen", o)
	}
	if n := f.store.calls.Load(); n != 1 {
		t.Errorf("store calls = %d, want 1: an open breaker skips the store", n)
	}
	if len(br.recorded) != 1 {
		t.Errorf("a skipped call was recorded: %v", br.recorded)
	}
}

func TestNewErrors(t *testing.T) {
	_, err := limiter.New(limiter.Config{Timeout: -2, CacheSize: -2, DefaultFail: 9})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"Store is required", "Local", "Timeout -2ns", "CacheSize -2", "DefaultFail 9"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	local := memory.New(memory.Options{})
	if _, err := limiter.New(limiter.Config{Store: local, Local: local, Timeout: limiter.Off, CacheSize: limiter.Off}); err != nil {
		t.Errorf("Off: %v", err)
	}
}

func TestPrimary(t *testing.T) {
	a, b, s := rule("a", 10), rule("b", 10), rule("s", 10, shadow)
	cs := []limiter.Check{chk(a, "k"), chk(b, "k"), chk(s, "k")}
	st := limiter.SourceStore
	reset := storetest.Base
	tests := []struct {
		name    string
		o       limiter.Outcome
		primary int
	}{
		{"allowed: least remaining", limiter.Outcome{Allowed: true, Sources: []limiter.Source{st, st, st}, Results: []limiter.Result{
			{Allowed: true, Remaining: 5, Reset: reset}, {Allowed: true, Remaining: 3, Reset: reset}, {Allowed: false, Remaining: 0}}}, 1},
		{"allowed: tie goes to the earliest reset", limiter.Outcome{Allowed: true, Sources: []limiter.Source{st, st, st}, Results: []limiter.Result{
			{Allowed: true, Remaining: 3, Reset: reset.Add(time.Second)}, {Allowed: true, Remaining: 3, Reset: reset}, {Allowed: true}}}, 1},
		{"denied: longest wait", limiter.Outcome{Sources: []limiter.Source{st, st, st}, Results: []limiter.Result{
			{RetryAfter: 5 * time.Second}, {RetryAfter: 9 * time.Second}, {RetryAfter: time.Hour}}}, 1},
		{"denied: allowed checks skipped", limiter.Outcome{Sources: []limiter.Source{st, st, st}, Results: []limiter.Result{
			{Allowed: true, Remaining: 0}, {RetryAfter: time.Second}, {}}}, 1},
		{"failed open: none", limiter.Outcome{Allowed: true, Sources: []limiter.Source{limiter.SourceFailedOpen, limiter.SourceFailedOpen, st}, Results: []limiter.Result{
			{Allowed: true}, {Allowed: true}, {Allowed: true}}}, -1},
	}
	for _, tt := range tests {
		if got := tt.o.Primary(cs); got != tt.primary {
			t.Errorf("%s: Primary = %d, want %d", tt.name, got, tt.primary)
		}
	}
}

// TestConcurrentDecide races many goroutines through the fast path and the
// store: the store's exactness survives, and hits never call it.
func TestConcurrentDecide(t *testing.T) {
	f := newFixture(t, nil)
	a := rule("a", 7)
	var allowed, hits atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			var o limiter.Outcome
			for range 50 {
				f.limiter.DecideInto(context.Background(), []limiter.Check{chk(a, "k")}, &o)
				if o.Allowed {
					allowed.Add(1)
				}
				if o.Sources[0] == limiter.SourceFastPath {
					hits.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := allowed.Load(); n != 7 {
		t.Errorf("allowed %d, want 7", n)
	}
	if calls, h := f.store.calls.Load(), hits.Load(); calls+h != 800 || h == 0 {
		t.Errorf("store calls %d + fast-path hits %d, want 800 with some hits", calls, h)
	}
}

func TestFastPathHitAllocs(t *testing.T) {
	f := newFixture(t, func(c *limiter.Config) { c.Metrics = nil })
	a := rule("a", 1)
	cs := []limiter.Check{chk(a, "k"), chk(rule("b", 5), "k")}
	var o limiter.Outcome
	f.limiter.DecideInto(context.Background(), cs, &o)
	f.limiter.DecideInto(context.Background(), cs, &o)
	allocs := testing.AllocsPerRun(100, func() {
		f.limiter.DecideInto(context.Background(), cs, &o)
		if o.Sources[0] != limiter.SourceFastPath {
			t.Fatal("not a fast-path hit")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per fast-path hit, want 0", allocs)
	}
}

func BenchmarkLimiterDecide(b *testing.B) {
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("%064x", i)
	}
	for _, bc := range []struct {
		name      string
		cacheSize int
		rule      *policy.Rule
		prime     bool // decide each key twice first, which puts it over its limit
	}{
		{"miss", 100, &policy.Rule{Name: "r", Limit: 1 << 40, Window: time.Minute, Cost: 1}, false},
		{"hit", 10000, &policy.Rule{Name: "r", Limit: 1, Window: time.Hour, Cost: 1}, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			f := newFixture(b, func(c *limiter.Config) {
				c.Store = memory.New(memory.Options{})
				c.Now = time.Now
				c.CacheSize = bc.cacheSize
			})
			r := bc.rule
			for _, k := range keys {
				if bc.prime {
					f.limiter.Decide(context.Background(), []limiter.Check{chk(r, k)})
					f.limiter.Decide(context.Background(), []limiter.Check{chk(r, k)})
				}
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var o limiter.Outcome
				cs := make([]limiter.Check, 1)
				i := 0
				for pb.Next() {
					cs[0] = chk(r, keys[i%len(keys)])
					i++
					f.limiter.DecideInto(context.Background(), cs, &o)
				}
			})
		})
	}
}

func TestMetricsInit(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := limiter.NewMetrics(reg)
	m.Init("login", "send")
	// Six outcomes per rule, all zero, before any decision.
	n, err := testutil.GatherAndCount(reg, "sluice_decisions_total")
	if err != nil || n != 12 {
		t.Errorf("%d decision series (%v), want 12", n, err)
	}
	var nilMetrics *limiter.Metrics
	nilMetrics.Init("login") // a nil *Metrics records nothing, without panicking
}

func TestMetricsExposition(t *testing.T) {
	f := newFixture(t, nil)
	a := rule("login", 1)
	s := rule("probe", 1, shadow)
	f.decide(chk(a, "k"), chk(s, "k"))
	f.decide(chk(a, "k"), chk(s, "k"))
	f.decide(chk(a, "k"), chk(s, "k")) // fast path: probe is not evaluated
	// The exposition of the two rules' decisions and fast-path hits, as
	// Prometheus scrapes it.
	want, err := os.Open("testdata/exposition.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	if err := testutil.GatherAndCompare(f.reg, want,
		"sluice_decisions_total", "sluice_fast_path_hits_total"); err != nil {
		t.Error(err)
	}
	// Every kind's series exists from the start, at zero.
	for _, kind := range []string{"timeout", "canceled", "connection", "read_only", "too_many_connections",
		"undefined_table", "insufficient_privilege", "overload", "other"} {
		if got := f.metric(t, "sluice_store_errors_total", "kind", kind); got != 0 {
			t.Errorf("store errors of kind %s = %v after successful decisions", kind, got)
		}
	}
	n, err := testutil.GatherAndCount(f.reg, "sluice_store_errors_total")
	if err != nil || n != 9 {
		t.Errorf("%d store error series (%v), want one per kind", n, err)
	}
}
