package admin

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/limiter/storetest"
	"github.com/sluicehq/sluice/policy"
)

// statsFixture is a limiter whose metrics and denials feed a Stats, on
// one clock that the test moves.
type statsFixture struct {
	clock *storetest.Clock
	lim   *limiter.Limiter
	stats *Stats
	reg   *prometheus.Registry
	pol   *policy.Policy
}

func newStatsFixture(t *testing.T, rules string, store limiter.Store) *statsFixture {
	t.Helper()
	pol, err := policy.Parse(rules)
	if err != nil {
		t.Fatal(err)
	}
	f := &statsFixture{clock: storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), reg: prometheus.NewRegistry(), pol: pol}
	f.stats = NewStats(StatsConfig{Gatherer: f.reg, Now: f.clock.Now})
	if store == nil {
		store = memory.New(memory.Options{Now: f.clock.Now})
	}
	f.lim, err = limiter.New(limiter.Config{
		Store: store, Local: memory.New(memory.Options{Now: f.clock.Now}), Timeout: time.Second,
		CacheSize: 100, Now: f.clock.Now, Metrics: limiter.NewMetrics(f.reg), Denied: f.stats.Limited,
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// decide decides n requests of key under the named rule.
func (f *statsFixture) decide(t *testing.T, rule, key string, n int) {
	t.Helper()
	r, ok := f.pol.Lookup(rule)
	if !ok {
		t.Fatalf("no rule %s", rule)
	}
	for range n {
		f.lim.Decide(context.Background(), []limiter.Check{{Rule: r, Key: key}})
	}
}

// tick moves the clock a second and samples.
func (f *statsFixture) tick() {
	f.clock.Advance(time.Second)
	f.stats.Sample()
}

func (f *statsFixture) snapshot() statsJSON { return f.stats.snapshot(f.pol.Rules()) }

// TestStatsFromBeforeTheMetrics: a sample taken before the limiter's and
// the store's metrics exist (a gateway's baseline, taken while it is
// assembled) is a baseline of zeros, so decisions made before the next
// sample count, and so do the store's calls and their latency.
func TestStatsFromBeforeTheMetrics(t *testing.T) {
	clock := storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	reg := prometheus.NewRegistry()
	stats := NewStats(StatsConfig{Gatherer: reg, Now: clock.Now})
	stats.Sample() // nothing registered yet
	f := &statsFixture{clock: clock, reg: reg, stats: stats}
	pol, err := policy.Parse("login: POST /login by ip 2/1h")
	if err != nil {
		t.Fatal(err)
	}
	f.pol = pol
	store := memory.New(memory.Options{Now: clock.Now})
	f.lim, err = limiter.New(limiter.Config{
		Store: store, Local: memory.New(memory.Options{Now: clock.Now}), Timeout: time.Second,
		CacheSize: 100, Now: clock.Now, Metrics: limiter.NewMetrics(reg), Denied: stats.Limited,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.decide(t, "login", "k1", 5) // 2 allowed, 3 limited, before Run's first sample
	f.tick()
	s := f.snapshot()
	if d := s.Rules[0].Decisions; d["allowed"] != 2 || d["limited"] != 3 {
		t.Errorf("decisions %v, want 2 allowed and 3 limited", d)
	}
	if s.Store.Calls < 2 || s.Store.Latency == nil {
		t.Errorf("store: %d calls, latency %+v; want the calls made after the baseline", int(s.Store.Calls), s.Store.Latency)
	}
}

// TestStatsRates: the rates and counts cover the last minute of samples,
// the series has one figure per second ending with the newest, and the
// most limited keys are the denied ones, shadow rules left out.
func TestStatsRates(t *testing.T) {
	f := newStatsFixture(t, "login: POST /login by ip 3/1h; peek: GET /x by ip 1/1h shadow; quiet: GET /q by ip 9/1h", nil)
	f.stats.Sample()
	if s := f.snapshot(); s.WindowSeconds != 0 || s.Rules[0].AllowedPerSecond != 0 || len(s.Rules[0].Allowed) != 60 {
		t.Fatalf("one sample: %+v", s.Rules[0])
	}
	f.decide(t, "login", "k1", 5) // 3 allowed, 2 limited
	f.decide(t, "login", "k2", 1)
	f.decide(t, "peek", "k1", 3) // 1 allowed, 2 shadow-limited
	f.tick()
	f.decide(t, "login", "k2", 4) // 2 allowed, 2 limited
	f.tick()

	s := f.snapshot()
	if s.WindowSeconds != 2 {
		t.Fatalf("window %v s, want 2", s.WindowSeconds)
	}
	login := s.Rules[0]
	if login.Rule != "login" || login.Decisions["allowed"] != 6 || login.Decisions["limited"] != 4 {
		t.Fatalf("login: %+v", login)
	}
	if login.AllowedPerSecond != 3 || login.LimitedPerSecond != 2 {
		t.Fatalf("login rates: %v allowed/s, %v limited/s, want 3 and 2", login.AllowedPerSecond, login.LimitedPerSecond)
	}
	if !slices.Equal(login.Allowed[57:], []float64{0, 4, 2}) || !slices.Equal(login.Limited[57:], []float64{0, 2, 2}) {
		t.Fatalf("login series ends %v / %v", login.Allowed[57:], login.Limited[57:])
	}
	if peek := s.Rules[1]; peek.Decisions["shadow_limited"] != 2 || peek.Decisions["limited"] != 0 {
		t.Fatalf("peek: %+v", peek)
	}
	if quiet := s.Rules[2]; quiet.Rule != "quiet" || quiet.Decisions["allowed"] != 0 {
		t.Fatalf("a rule without traffic: %+v", quiet)
	}
	// k1 was denied twice (once by the store, once from the fast path), k2 twice.
	want := []topKeyJSON{{Rule: "login", Key: "k1", Count: 2}, {Rule: "login", Key: "k2", Count: 2}}
	if !slices.Equal(s.TopLimited, want) || s.TopMinutes != topIntervals {
		t.Fatalf("top limited %+v, want %+v", s.TopLimited, want)
	}

	// A minute later the window has moved past the traffic.
	for range 61 {
		f.tick()
	}
	s = f.snapshot()
	if s.WindowSeconds != 60 || s.Rules[0].Decisions["allowed"] != 0 || slices.Max(s.Rules[0].Allowed) != 0 {
		t.Fatalf("a minute later: window %v, %+v", s.WindowSeconds, s.Rules[0])
	}
	// The denials are still among the last minutes' most limited keys.
	if len(s.TopLimited) != 2 {
		t.Fatalf("top limited a minute later: %+v", s.TopLimited)
	}
	// The JSON names every field the console reads.
	body, _ := json.Marshal(s)
	var m map[string]any
	json.Unmarshal(body, &m)
	for _, k := range []string{"at", "window_seconds", "rules", "top_limited", "top_limited_minutes", "store"} {
		if _, ok := m[k]; !ok {
			t.Errorf("/v1/stats lacks %q: %s", k, body)
		}
	}
}

// slowStore decides after a delay and fails one call in four.
type slowStore struct {
	limiter.Store
	calls int
}

func (s *slowStore) Decide(ctx context.Context, cs []limiter.Check, rs []limiter.Result) (bool, error) {
	s.calls++
	if s.calls%4 == 0 {
		return false, errors.New("broken")
	}
	time.Sleep(2 * time.Millisecond)
	return s.Store.Decide(ctx, cs, rs)
}

// TestStatsStore: the store's calls, errors and latency quantiles over the
// window come from the limiter's metrics, and the pool from the
// sluice_db_pool_* gauges when they exist.
func TestStatsStore(t *testing.T) {
	f := newStatsFixture(t, "all: * /* by ip 1000/1h fail=open", &slowStore{Store: memory.New(memory.Options{})})
	f.stats.Sample()
	if s := f.snapshot(); s.Store.Latency != nil || s.Store.Pool != nil || s.Store.Calls != 0 {
		t.Fatalf("before any call: %+v", s.Store)
	}
	f.decide(t, "all", "k", 8)
	f.tick()
	s := f.snapshot()
	if s.Store.Calls != 8 || s.Store.Errors != 2 || s.Store.Latency == nil {
		t.Fatalf("store: %+v", s.Store)
	}
	// Six calls took 2 ms or more, two failed at once: the median is
	// above the 1 ms bound (TestQuantiles checks the arithmetic; a loaded
	// machine may stretch a 2 ms sleep).
	l := s.Store.Latency
	if l.P50 <= 0.001 || l.P50 > 0.1 || l.P90 < l.P50 || l.P99 < l.P90 {
		t.Fatalf("latency %+v", l)
	}

	pool := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricPoolConns, Help: "h"}, []string{"state"})
	pool.WithLabelValues("acquired").Set(3)
	pool.WithLabelValues("idle").Set(2)
	pool.WithLabelValues("constructing").Set(1)
	maxConns := prometheus.NewGauge(prometheus.GaugeOpts{Name: metricPoolMax, Help: "h"})
	maxConns.Set(10)
	f.reg.MustRegister(pool, maxConns)
	f.tick()
	if p := f.snapshot().Store.Pool; p == nil || *p != (poolJSON{Acquired: 3, Idle: 2, Constructing: 1, Max: 10}) {
		t.Fatalf("pool %+v", p)
	}
}

func TestQuantiles(t *testing.T) {
	from := histogram{bounds: []float64{1, 2, 4}, counts: []float64{0, 0, 0}}
	to := histogram{bounds: []float64{1, 2, 4}, counts: []float64{10, 90, 100}, count: 100}
	q := quantiles(from, to)
	// p50: rank 50 in (1, 2], 40 of its 80 in: 1.5. p90: rank 90, the
	// bucket's end: 2. p99: rank 99 in (2, 4], 9 of 10: 3.8.
	if math.Abs(q.P50-1.5) > 1e-9 || math.Abs(q.P90-2) > 1e-9 || math.Abs(q.P99-3.8) > 1e-9 {
		t.Fatalf("quantiles %+v", q)
	}
	to.count = 110 // ten beyond the last bound
	if q := quantiles(from, to); q.P99 != 4 {
		t.Fatalf("in the +Inf bucket: %+v, want the largest bound", q)
	}
	if quantiles(to, to) != nil {
		t.Fatal("no observations: want nil")
	}
}
