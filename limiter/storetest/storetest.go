// Package storetest is the conformance suite that every limiter.Store must
// pass: the exact counting semantics of docs/algorithms.md, checked to the
// microsecond at window and bucket edges, the all-or-nothing rule across the
// checks of one decision, cost, count=all, shadow rules, and atomicity under
// concurrency.
//
// A store's test calls Run with a Factory:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, clock *storetest.Clock) limiter.Store {
//			return memory.New(memory.Options{Now: clock.Now})
//		})
//	}
//
// Every subtest asks the Factory for a fresh, empty store and moves the
// clock to fixed instants; nothing sleeps.
//
// Where docs/algorithms.md leaves room, the suite pins the reading below:
// every Result is computed on the state after consumption (step 4), so for a
// token rule with count=all, a denied request's RetryAfter is
// max(tat', now) + c·T − τ − now with tat' the state after it was counted
// (for every other denied request this equals next − τ − now). That is the
// only reading under which a retry at exactly now+RetryAfter is allowed.
//
// It imports only limiter and policy of sluice, never a particular store:
// the stores' tests import it.
package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// Factory returns a fresh, empty store whose clock is clock.Now. It may
// register cleanups with t.
type Factory func(t *testing.T, clock *Clock) limiter.Store

// Base is the instant every subtest starts from: a round instant, aligned to
// the day, so fixed windows of a second to a day start exactly at Base.
var Base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Run runs the whole conformance suite against the stores newStore makes.
func Run(t *testing.T, newStore Factory) {
	t.Helper()
	t.Run("Empty", func(t *testing.T) { testEmpty(t, newStore) })
	t.Run("Fixed", func(t *testing.T) { testFixed(t, newStore) })
	t.Run("Reset", func(t *testing.T) { testReset(t, newStore) })
	t.Run("Sliding", func(t *testing.T) { testSliding(t, newStore) })
	t.Run("Token", func(t *testing.T) { testToken(t, newStore) })
	t.Run("AllOrNothing", func(t *testing.T) { testAllOrNothing(t, newStore) })
	t.Run("Cost", func(t *testing.T) { testCost(t, newStore) })
	t.Run("CountAll", func(t *testing.T) { testCountAll(t, newStore) })
	t.Run("Shadow", func(t *testing.T) { testShadow(t, newStore) })
	t.Run("Counters", func(t *testing.T) { testCounters(t, newStore) })
	t.Run("RetryAfter", func(t *testing.T) { testRetryAfter(t, newStore) })
	t.Run("ConcurrentOneKey", func(t *testing.T) { testConcurrentOneKey(t, newStore) })
	t.Run("ConcurrentOppositeOrders", func(t *testing.T) { testConcurrentOpposite(t, newStore) })
	t.Run("Calendar", func(t *testing.T) { testCalendar(t, newStore) })
	t.Run("Charges", func(t *testing.T) { testCharges(t, newStore) })
}

// Rules are built directly, as the parser would build them. The builders
// are exported for the stores' own tests, so that every test of a store
// builds its rules one way.

// Fixed returns a fixed-window rule of cost 1.
func Fixed(name string, limit int64, window time.Duration) *policy.Rule {
	return &policy.Rule{Name: name, Limit: limit, Window: window, Algorithm: policy.Fixed, Cost: 1}
}

// ResetRule returns a rule whose window restarts at the first request
// after it expires, of cost 1.
func ResetRule(name string, limit int64, window time.Duration) *policy.Rule {
	return &policy.Rule{Name: name, Limit: limit, Window: window, Algorithm: policy.Reset, Cost: 1}
}

// Sliding returns a sliding-window rule with the given bucket, of cost 1.
func Sliding(name string, limit int64, window, bucket time.Duration) *policy.Rule {
	return &policy.Rule{Name: name, Limit: limit, Window: window, Algorithm: policy.Sliding, Bucket: bucket, Cost: 1}
}

// Token returns a token-bucket rule with the given burst, of cost 1.
func Token(name string, limit int64, window time.Duration, burst int64) *policy.Rule {
	return &policy.Rule{Name: name, Limit: limit, Window: window, Algorithm: policy.Token, Burst: burst, Cost: 1}
}

// With returns a copy of r changed by each of set.
func With(r *policy.Rule, set ...func(*policy.Rule)) *policy.Rule {
	c := *r
	for _, f := range set {
		f(&c)
	}
	return &c
}

// CostOf, CountAll and Shadow are changes for With.
func CostOf(n int64) func(*policy.Rule) { return func(r *policy.Rule) { r.Cost = n } }

// CountAll makes a rule count denied requests too.
func CountAll(r *policy.Rule) { r.CountAll = true }

// Shadow makes a rule decide and report without blocking.
func Shadow(r *policy.Rule) { r.Shadow = true }

// Algos makes one rule of each algorithm with the same limit and window
// (token: burst equals the limit; sliding: 1 s buckets).
var Algos = []struct {
	Name string
	Make func(name string, limit int64, window time.Duration) *policy.Rule
}{
	{"fixed", Fixed},
	{"reset", ResetRule},
	{"sliding", func(n string, l int64, w time.Duration) *policy.Rule { return Sliding(n, l, w, time.Second) }},
	{"token", func(n string, l int64, w time.Duration) *policy.Rule { return Token(n, l, w, l) }},
}

func chk(r *policy.Rule, key string) limiter.Check { return limiter.Check{Rule: r, Key: key} }

func checks(cs ...limiter.Check) []limiter.Check { return cs }

// want is the expected Result of one check; Limit and Window are the rule's
// and ResetAfter is Reset minus the decision's instant.
type want struct {
	allowed   bool
	remaining int64
	reset     time.Duration // Reset as an offset from Base
	retry     time.Duration
}

func ok(remaining int64, reset time.Duration) want {
	return want{allowed: true, remaining: remaining, reset: reset}
}

func deny(remaining int64, reset, retry time.Duration) want {
	return want{allowed: false, remaining: remaining, reset: reset, retry: retry}
}

// step is one decision at Base+at.
type step struct {
	at      time.Duration
	checks  []limiter.Check
	allowed bool
	want    []want
}

// runSteps makes the decisions of steps one after another on one fresh
// store and compares every Result exactly.
func runSteps(t *testing.T, newStore Factory, steps []step) {
	t.Helper()
	clock := NewClock(Base)
	s := newStore(t, clock)
	for i, st := range steps {
		now := Base.Add(st.at)
		clock.Set(now)
		allowed, results := Decide(t, s, st.checks...)
		label := fmt.Sprintf("step %d (at +%v)", i+1, st.at)
		if allowed != st.allowed {
			t.Errorf("%s: allowed = %v, want %v", label, allowed, st.allowed)
		}
		if len(st.want) != len(st.checks) {
			t.Fatalf("%s: bad test: %d wants for %d checks", label, len(st.want), len(st.checks))
		}
		for j, w := range st.want {
			expectResult(t, fmt.Sprintf("%s check %d (%s)", label, j, st.checks[j].Rule.Name),
				results[j], expected(st.checks[j].Rule, w, now))
		}
	}
}

func expected(r *policy.Rule, w want, now time.Time) limiter.Result {
	reset := Base.Add(w.reset)
	after := max(reset.Sub(now), 0)
	return limiter.Result{
		Allowed: w.allowed, Limit: r.Limit, Window: r.Window, Remaining: w.remaining,
		Reset: reset, ResetAfter: after, RetryAfter: w.retry,
	}
}

// Decide calls s.Decide with a background context, fails the test on an
// error, checks that the verdict agrees with limiter.Allowed, and returns
// the verdict and the results.
func Decide(t testing.TB, s limiter.Store, cs ...limiter.Check) (bool, []limiter.Result) {
	t.Helper()
	results := make([]limiter.Result, len(cs))
	allowed, err := s.Decide(context.Background(), cs, results)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if combined := limiter.Allowed(cs, results); combined != allowed {
		t.Errorf("Decide returned allowed=%v but its results combine to %v", allowed, combined)
	}
	return allowed, results
}

func expectResult(t *testing.T, label string, got, want limiter.Result) {
	t.Helper()
	if got.Allowed != want.Allowed || got.Limit != want.Limit || got.Window != want.Window ||
		got.Remaining != want.Remaining || !got.Reset.Equal(want.Reset) ||
		got.ResetAfter != want.ResetAfter || got.RetryAfter != want.RetryAfter {
		t.Errorf("%s:\n got  %s\n want %s", label, fmtResult(got), fmtResult(want))
	}
}

func fmtResult(r limiter.Result) string {
	return fmt.Sprintf("{Allowed:%v Limit:%d Window:%v Remaining:%d Reset:+%v ResetAfter:%v RetryAfter:%v}",
		r.Allowed, r.Limit, r.Window, r.Remaining, r.Reset.Sub(Base), r.ResetAfter, r.RetryAfter)
}

const us = time.Microsecond

func testEmpty(t *testing.T, newStore Factory) {
	s := newStore(t, NewClock(Base))
	if allowed, _ := Decide(t, s); !allowed {
		t.Error("a decision without checks was denied")
	}
}

func testFixed(t *testing.T, newStore Factory) {
	r := Fixed("f", 3, time.Minute)
	t.Run("WindowEdges", func(t *testing.T) {
		runSteps(t, newStore, []step{
			{10 * time.Second, checks(chk(r, "k")), true, []want{ok(2, time.Minute)}},
			{10 * time.Second, checks(chk(r, "k")), true, []want{ok(1, time.Minute)}},
			{30 * time.Second, checks(chk(r, "k")), true, []want{ok(0, time.Minute)}},
			{30 * time.Second, checks(chk(r, "k")), false, []want{deny(0, time.Minute, 30*time.Second)}},
			{time.Minute - us, checks(chk(r, "k")), false, []want{deny(0, time.Minute, us)}},
			// A request one microsecond before the boundary counts in the old window.
			{time.Minute - us, checks(chk(r, "k2")), true, []want{ok(2, time.Minute)}},
			{time.Minute, checks(chk(r, "k")), true, []want{ok(2, 2*time.Minute)}},
			{time.Minute, checks(chk(r, "k")), true, []want{ok(1, 2*time.Minute)}},
			{time.Minute, checks(chk(r, "k2")), true, []want{ok(2, 2*time.Minute)}},
		})
	})
	t.Run("EpochAligned", func(t *testing.T) {
		// Base is 10 s past a multiple of 13 s since the Unix epoch, so the
		// window that holds Base ends 3 s after it.
		r := Fixed("f13", 1, 13*time.Second)
		runSteps(t, newStore, []step{
			{0, checks(chk(r, "k")), true, []want{ok(0, 3*time.Second)}},
			{0, checks(chk(r, "k")), false, []want{deny(0, 3*time.Second, 3*time.Second)}},
			{3*time.Second - us, checks(chk(r, "k")), false, []want{deny(0, 3*time.Second, us)}},
			{3 * time.Second, checks(chk(r, "k")), true, []want{ok(0, 16*time.Second)}},
		})
	})
}

func testReset(t *testing.T, newStore Factory) {
	r := ResetRule("r", 2, 10*time.Second)
	t.Run("WindowEdges", func(t *testing.T) {
		runSteps(t, newStore, []step{
			{5 * time.Second, checks(chk(r, "k")), true, []want{ok(1, 15*time.Second)}},
			{7 * time.Second, checks(chk(r, "k")), true, []want{ok(0, 15*time.Second)}},
			{7 * time.Second, checks(chk(r, "k")), false, []want{deny(0, 15*time.Second, 8*time.Second)}},
			{15*time.Second - us, checks(chk(r, "k")), false, []want{deny(0, 15*time.Second, us)}},
			// The window restarts at exactly start+W.
			{15 * time.Second, checks(chk(r, "k")), true, []want{ok(1, 25*time.Second)}},
		})
	})
	t.Run("RestartsAtFirstRequest", func(t *testing.T) {
		runSteps(t, newStore, []step{
			{5 * time.Second, checks(chk(r, "k")), true, []want{ok(1, 15*time.Second)}},
			// Nothing at +15s: the next window starts with the next request.
			{20 * time.Second, checks(chk(r, "k")), true, []want{ok(1, 30*time.Second)}},
			{29 * time.Second, checks(chk(r, "k")), true, []want{ok(0, 30*time.Second)}},
			{29 * time.Second, checks(chk(r, "k")), false, []want{deny(0, 30*time.Second, time.Second)}},
		})
	})
	t.Run("DenialStartsNoWindow", func(t *testing.T) {
		// Cost 3 over a limit of 2 never passes and never consumes, so no
		// window is persisted: each decision reports a window from its now.
		rc := With(r, CostOf(3))
		runSteps(t, newStore, []step{
			{0, checks(chk(rc, "k")), false, []want{deny(2, 10*time.Second, 10*time.Second)}},
			{4 * time.Second, checks(chk(rc, "k")), false, []want{deny(2, 14*time.Second, 10*time.Second)}},
		})
	})
}

func testSliding(t *testing.T, newStore Factory) {
	t.Run("WindowEdges", func(t *testing.T) {
		r := Sliding("s", 4, 10*time.Second, time.Second)
		ms := time.Millisecond
		runSteps(t, newStore, []step{
			{500 * ms, checks(chk(r, "k")), true, []want{ok(3, 10*time.Second)}},
			{2500 * ms, checks(chk(r, "k")), true, []want{ok(2, 12*time.Second)}},
			{2500 * ms, checks(chk(r, "k")), true, []want{ok(1, 12*time.Second)}},
			{3500 * ms, checks(chk(r, "k")), true, []want{ok(0, 13*time.Second)}},
			// need 1: the oldest bucket (0, one request) leaves at +10s.
			{4500 * ms, checks(chk(r, "k")), false, []want{deny(0, 13*time.Second, 5500*ms)}},
			{10*time.Second - us, checks(chk(r, "k")), false, []want{deny(0, 13*time.Second, us)}},
			{10 * time.Second, checks(chk(r, "k")), true, []want{ok(0, 20*time.Second)}},
			// need 1: bucket 1 is empty, bucket 2 (two requests) leaves at +12s.
			{10 * time.Second, checks(chk(r, "k")), false, []want{deny(0, 20*time.Second, 2*time.Second)}},
			{12*time.Second - us, checks(chk(r, "k")), false, []want{deny(0, 20*time.Second, us)}},
			{12 * time.Second, checks(chk(r, "k")), true, []want{ok(1, 22*time.Second)}},
		})
	})
	t.Run("BucketByBucket", func(t *testing.T) {
		// Buckets 0, 1, 2 hold 1, 2, 3 requests; each leaves the 5 s window
		// at its own edge, which the Remaining of a probe shows.
		r := Sliding("s", 10, 5*time.Second, time.Second)
		s := time.Second
		runSteps(t, newStore, []step{
			{0, checks(chk(r, "k")), true, []want{ok(9, 5*s)}},
			{1 * s, checks(chk(r, "k")), true, []want{ok(8, 6*s)}},
			{1 * s, checks(chk(r, "k")), true, []want{ok(7, 6*s)}},
			{2 * s, checks(chk(r, "k")), true, []want{ok(6, 7*s)}},
			{2 * s, checks(chk(r, "k")), true, []want{ok(5, 7*s)}},
			{2 * s, checks(chk(r, "k")), true, []want{ok(4, 7*s)}},
			{5 * s, checks(chk(r, "k")), true, []want{ok(4, 10*s)}},       // bucket 0 left
			{6*s - us, checks(chk(r, "k")), true, []want{ok(3, 10*s)}},    // bucket 1 still in
			{6 * s, checks(chk(r, "k")), true, []want{ok(4, 11*s)}},       // bucket 1 left
			{7 * s, checks(chk(r, "k")), true, []want{ok(6, 12*s)}},       // bucket 2 left
			{10*s - us, checks(chk(r, "k")), true, []want{ok(5, 14*s)}},   // window 5..9
			{10 * s, checks(chk(r, "k")), true, []want{ok(6, 15*s)}},      // bucket 5 left
			{100 * s, checks(chk(r, "k")), true, []want{ok(9, 105*s)}},    // all gone
			{100 * s, checks(chk(r, "k2")), true, []want{ok(9, 105*s)}},   // other key
			{100 * s, checks(chk(r, "k")), true, []want{ok(8, 105*s)}},    // same bucket
			{105*s - us, checks(chk(r, "k")), true, []want{ok(7, 109*s)}}, // newest is 104
		})
	})
	t.Run("CoarseBuckets", func(t *testing.T) {
		// 10 s buckets over a minute: k = 6.
		r := Sliding("s", 2, time.Minute, 10*time.Second)
		s := time.Second
		runSteps(t, newStore, []step{
			{15 * s, checks(chk(r, "k")), true, []want{ok(1, 70*s)}},
			{25 * s, checks(chk(r, "k")), true, []want{ok(0, 80*s)}},
			{59 * s, checks(chk(r, "k")), false, []want{deny(0, 80*s, 11*s)}},
			{70*s - us, checks(chk(r, "k")), false, []want{deny(0, 80*s, us)}},
			{70 * s, checks(chk(r, "k")), true, []want{ok(0, 130*s)}},
		})
	})
	t.Run("CountAllWalk", func(t *testing.T) {
		// Counted denials push the count over the limit, so the walk must
		// add up several buckets before it reaches need.
		r := With(Sliding("s", 3, 10*time.Second, time.Second), CountAll)
		ms := time.Millisecond
		s := time.Second
		runSteps(t, newStore, []step{
			{500 * ms, checks(chk(r, "k")), true, []want{ok(2, 10*s)}},
			{1500 * ms, checks(chk(r, "k")), true, []want{ok(1, 11*s)}},
			{2500 * ms, checks(chk(r, "k")), true, []want{ok(0, 12*s)}},
			// count 4 after counting: need 2 = buckets 0 and 1, so +11s.
			{3500 * ms, checks(chk(r, "k")), false, []want{deny(0, 13*s, 7500*ms)}},
			// Window 1..10 holds 3, the denial is counted in bucket 10:
			// need 2 = buckets 1 and 2, so +12s.
			{11*s - us, checks(chk(r, "k")), false, []want{deny(0, 20*s, s+us)}},
			// Window 3..12 holds 2.
			{12 * s, checks(chk(r, "k")), true, []want{ok(0, 22*s)}},
		})
	})
	t.Run("CostOverLimit", func(t *testing.T) {
		// A cost above the limit never passes: RetryAfter is ResetAfter,
		// which is zero while every bucket is empty.
		r := With(Sliding("s", 2, 10*time.Second, time.Second), CostOf(3))
		runSteps(t, newStore, []step{
			{500 * time.Millisecond, checks(chk(r, "k")), false, []want{deny(2, 500*time.Millisecond, 0)}},
		})
	})
}

func testToken(t *testing.T, newStore Factory) {
	ms := time.Millisecond
	s := time.Second
	t.Run("BurstAndRefill", func(t *testing.T) {
		// 10 per 10 s: T = 1 s; burst 3: τ = 3 s.
		r := Token("t", 10, 10*s, 3)
		runSteps(t, newStore, []step{
			{0, checks(chk(r, "k")), true, []want{ok(2, 1*s)}},
			{0, checks(chk(r, "k")), true, []want{ok(1, 2*s)}},
			{0, checks(chk(r, "k")), true, []want{ok(0, 3*s)}},
			{0, checks(chk(r, "k")), false, []want{deny(0, 3*s, 1*s)}},
			{1*s - us, checks(chk(r, "k")), false, []want{deny(0, 3*s, us)}},
			{1 * s, checks(chk(r, "k")), true, []want{ok(0, 4*s)}},
			// Partial refill: half a token's worth of room is not a token.
			{2500 * ms, checks(chk(r, "k")), true, []want{ok(0, 5*s)}},
			{2500 * ms, checks(chk(r, "k")), false, []want{deny(0, 5*s, 500*ms)}},
			{4500 * ms, checks(chk(r, "k")), true, []want{ok(1, 6*s)}},
			// Refilled: the burst caps the room, not the limit.
			{100 * s, checks(chk(r, "k")), true, []want{ok(2, 101*s)}},
		})
	})
	t.Run("IntegerInterval", func(t *testing.T) {
		// T = 1 s / 3 = 333333 µs (integer division), τ = 999999 µs.
		r := Token("t", 3, s, 3)
		runSteps(t, newStore, []step{
			{0, checks(chk(r, "k")), true, []want{ok(2, 333333*us)}},
			{0, checks(chk(r, "k")), true, []want{ok(1, 666666*us)}},
			{0, checks(chk(r, "k")), true, []want{ok(0, 999999*us)}},
			{0, checks(chk(r, "k")), false, []want{deny(0, 999999*us, 333333*us)}},
			{333333 * us, checks(chk(r, "k")), true, []want{ok(0, 1333332*us)}},
		})
	})
	t.Run("MinimumInterval", func(t *testing.T) {
		// W / L rounds to 0; T is 1 µs, τ = 2 s.
		r := Token("t", 2_000_000, s, 2_000_000)
		runSteps(t, newStore, []step{
			{0, checks(chk(r, "k")), true, []want{ok(1_999_999, us)}},
		})
	})
}

// testAllOrNothing checks that one denying rule makes every other rule of
// the decision consume nothing, in either order and for every algorithm.
func testAllOrNothing(t *testing.T, newStore Factory) {
	s := time.Second
	gate := Fixed("gate", 1, time.Minute)
	// Reset of a rule of 5 per minute after one and after two requests at +10s.
	resets := map[string][2]time.Duration{
		"fixed": {60 * s, 60 * s}, "reset": {70 * s, 70 * s},
		"sliding": {70 * s, 70 * s}, "token": {22 * s, 34 * s},
	}
	for _, a := range Algos {
		t.Run(a.Name, func(t *testing.T) {
			x := a.Make("x", 5, time.Minute)
			r1, r2 := resets[a.Name][0], resets[a.Name][1]
			runSteps(t, newStore, []step{
				{10 * s, checks(chk(x, "k"), chk(gate, "k")), true, []want{ok(4, r1), ok(0, 60*s)}},
				{10 * s, checks(chk(gate, "k"), chk(x, "k")), false, []want{deny(0, 60*s, 50*s), ok(4, r1)}},
				{10 * s, checks(chk(x, "k"), chk(gate, "k")), false, []want{ok(4, r1), deny(0, 60*s, 50*s)}},
				{10 * s, checks(chk(x, "k")), true, []want{ok(3, r2)}},
			})
		})
	}
	t.Run("Mixed", func(t *testing.T) {
		var rules []*policy.Rule
		var cs []limiter.Check
		var first, held, after []want
		for _, a := range Algos {
			r := a.Make("m-"+a.Name, 5, time.Minute)
			rules = append(rules, r)
			cs = append(cs, chk(r, "k"))
			first = append(first, ok(4, resets[a.Name][0]))
			after = append(after, ok(3, resets[a.Name][1]))
		}
		held = append(held, first...)
		cs = append(cs, chk(gate, "k"))
		first = append(first, ok(0, 60*s))
		held = append(held, deny(0, 60*s, 50*s))
		steps := []step{
			{10 * s, cs, true, first},
			{10 * s, cs, false, held},
		}
		for i, r := range rules {
			steps = append(steps, step{10 * s, checks(chk(r, "k")), true, []want{after[i]}})
		}
		runSteps(t, newStore, steps)
	})
}

// testCost checks that a rule of cost 2 consumes 2 and denies when fewer
// than 2 remain, while a cost-1 rule on the same state would pass.
func testCost(t *testing.T, newStore Factory) {
	s := time.Second
	type exp struct{ a1, b1, a2, b2, a3, b3, b4 want }
	cases := map[string]exp{
		"fixed":   {ok(3, 60*s), ok(4, 60*s), ok(1, 60*s), ok(3, 60*s), deny(1, 60*s, 50*s), ok(3, 60*s), ok(2, 60*s)},
		"reset":   {ok(3, 70*s), ok(4, 70*s), ok(1, 70*s), ok(3, 70*s), deny(1, 70*s, 60*s), ok(3, 70*s), ok(2, 70*s)},
		"sliding": {ok(3, 70*s), ok(4, 70*s), ok(1, 70*s), ok(3, 70*s), deny(1, 70*s, 60*s), ok(3, 70*s), ok(2, 70*s)},
		// T = 12 s, τ = 60 s; cost 2 moves tat by 24 s.
		"token": {ok(3, 34*s), ok(4, 22*s), ok(1, 58*s), ok(3, 34*s), deny(1, 58*s, 12*s), ok(3, 34*s), ok(2, 46*s)},
	}
	for _, a := range Algos {
		t.Run(a.Name, func(t *testing.T) {
			ra := With(a.Make("a", 5, time.Minute), CostOf(2))
			rb := a.Make("b", 5, time.Minute)
			e := cases[a.Name]
			runSteps(t, newStore, []step{
				{10 * s, checks(chk(ra, "k"), chk(rb, "k")), true, []want{e.a1, e.b1}},
				{10 * s, checks(chk(ra, "k"), chk(rb, "k")), true, []want{e.a2, e.b2}},
				{10 * s, checks(chk(ra, "k"), chk(rb, "k")), false, []want{e.a3, e.b3}},
				{10 * s, checks(chk(rb, "k")), true, []want{e.b4}},
			})
		})
	}
}

func testCountAll(t *testing.T, newStore Factory) {
	s := time.Second
	t.Run("CountedWhenAnotherRuleDenies", func(t *testing.T) {
		a := With(Fixed("a", 5, time.Minute), CountAll)
		gate := Fixed("gate", 1, time.Minute)
		runSteps(t, newStore, []step{
			{10 * s, checks(chk(a, "k"), chk(gate, "k")), true, []want{ok(4, 60*s), ok(0, 60*s)}},
			{10 * s, checks(chk(a, "k"), chk(gate, "k")), false, []want{ok(3, 60*s), deny(0, 60*s, 50*s)}},
			{10 * s, checks(chk(gate, "k"), chk(a, "k")), false, []want{deny(0, 60*s, 50*s), ok(2, 60*s)}},
			{10 * s, checks(chk(a, "k")), true, []want{ok(1, 60*s)}},
			{10 * s, checks(chk(a, "k")), true, []want{ok(0, 60*s)}},
			{10 * s, checks(chk(a, "k")), false, []want{deny(0, 60*s, 50*s)}},
		})
	})
	t.Run("TokenCountsDenials", func(t *testing.T) {
		// T = 12 s, τ = 60 s. The sixth request is denied and counted: tat
		// moves to +72s, so the next request passes at +24s, not +12s.
		a := With(Token("a", 5, time.Minute, 5), CountAll)
		runSteps(t, newStore, []step{
			{0, checks(chk(a, "k")), true, []want{ok(4, 12*s)}},
			{0, checks(chk(a, "k")), true, []want{ok(3, 24*s)}},
			{0, checks(chk(a, "k")), true, []want{ok(2, 36*s)}},
			{0, checks(chk(a, "k")), true, []want{ok(1, 48*s)}},
			{0, checks(chk(a, "k")), true, []want{ok(0, 60*s)}},
			{0, checks(chk(a, "k")), false, []want{deny(0, 72*s, 24*s)}},
			{24 * s, checks(chk(a, "k")), true, []want{ok(0, 84*s)}},
		})
	})
	t.Run("ResetCountsDenials", func(t *testing.T) {
		// A counted denial on a fresh key starts the window.
		a := With(With(ResetRule("a", 2, 10*time.Second), CountAll), CostOf(3))
		runSteps(t, newStore, []step{
			{0, checks(chk(a, "k")), false, []want{deny(0, 10*s, 10*s)}},
			{4 * s, checks(chk(a, "k")), false, []want{deny(0, 10*s, 6*s)}},
		})
	})
}

func testShadow(t *testing.T, newStore Factory) {
	s := time.Second
	t.Run("OverLimitDoesNotDeny", func(t *testing.T) {
		// T = 30 s, τ = 60 s.
		sh := With(Token("sh", 2, time.Minute, 2), Shadow)
		r := Fixed("r", 5, time.Minute)
		runSteps(t, newStore, []step{
			{0, checks(chk(sh, "k"), chk(r, "k")), true, []want{ok(1, 30*s), ok(4, 60*s)}},
			{0, checks(chk(sh, "k"), chk(r, "k")), true, []want{ok(0, 60*s), ok(3, 60*s)}},
			// Over its limit: reports the denial, consumes nothing (tat stays +60s).
			{0, checks(chk(sh, "k"), chk(r, "k")), true, []want{deny(0, 60*s, 30*s), ok(2, 60*s)}},
			{30 * s, checks(chk(sh, "k"), chk(r, "k")), true, []want{ok(0, 90*s), ok(1, 60*s)}},
			{30 * s, checks(chk(sh, "k")), true, []want{deny(0, 90*s, 30*s)}},
		})
	})
	t.Run("CountAllCountsWhatItWouldDeny", func(t *testing.T) {
		// A shadow rule with count=all counts as the enforced rule would:
		// every request, including the ones it would have denied, while the
		// request itself goes through. T = 30 s, τ = 60 s: the counted
		// denial moves tat to +90s.
		sh := With(With(Token("sh", 2, time.Minute, 2), Shadow), CountAll)
		r := Fixed("r", 10, time.Minute)
		runSteps(t, newStore, []step{
			{0, checks(chk(sh, "k"), chk(r, "k")), true, []want{ok(1, 30*s), ok(9, 60*s)}},
			{0, checks(chk(sh, "k"), chk(r, "k")), true, []want{ok(0, 60*s), ok(8, 60*s)}},
			{0, checks(chk(sh, "k"), chk(r, "k")), true, []want{deny(0, 90*s, 60*s), ok(7, 60*s)}},
			{60 * s, checks(chk(sh, "k")), true, []want{ok(0, 120*s)}},
		})
	})
	t.Run("DeniedRequestConsumesNothing", func(t *testing.T) {
		sh := With(Fixed("sh", 5, time.Minute), Shadow)
		gate := Fixed("gate", 1, time.Minute)
		runSteps(t, newStore, []step{
			{0, checks(chk(sh, "k"), chk(gate, "k")), true, []want{ok(4, 60*s), ok(0, 60*s)}},
			{0, checks(chk(sh, "k"), chk(gate, "k")), false, []want{ok(4, 60*s), deny(0, 60*s, 60*s)}},
			{0, checks(chk(sh, "k")), true, []want{ok(3, 60*s)}},
		})
	})
}

// testCounters checks that a counter is named by its rule and its key
// together.
func testCounters(t *testing.T, newStore Factory) {
	s := time.Second
	a := Fixed("a", 2, time.Minute)
	b := Fixed("b", 2, time.Minute)
	ab := Fixed("ab", 2, time.Minute)
	runSteps(t, newStore, []step{
		{0, checks(chk(a, "k1")), true, []want{ok(1, 60*s)}},
		{0, checks(chk(a, "k1")), true, []want{ok(0, 60*s)}},
		{0, checks(chk(a, "k1")), false, []want{deny(0, 60*s, 60*s)}},
		{0, checks(chk(b, "k1")), true, []want{ok(1, 60*s)}}, // same key, other rule
		{0, checks(chk(a, "k2")), true, []want{ok(1, 60*s)}}, // same rule, other key
		{0, checks(chk(a, "bc")), true, []want{ok(1, 60*s)}}, // "a"+"bc" ...
		{0, checks(chk(ab, "c")), true, []want{ok(1, 60*s)}}, // ... is not "ab"+"c"
		{0, checks(chk(a, "K1")), true, []want{ok(1, 60*s)}}, // keys are case-sensitive
	})
}

// testRetryAfter checks that a retry at exactly now+RetryAfter is allowed
// and one microsecond earlier is not, each probe on its own fresh store
// (a counted denial would change the state the other probe sees).
func testRetryAfter(t *testing.T, newStore Factory) {
	type decision struct {
		at     time.Duration
		checks []limiter.Check
	}
	s := time.Second
	ms := time.Millisecond
	rep := func(at time.Duration, c limiter.Check, n int) []decision {
		var ds []decision
		for range n {
			ds = append(ds, decision{at, checks(c)})
		}
		return ds
	}
	f := Fixed("f", 2, time.Minute)
	r := ResetRule("r", 2, 10*s)
	sl := Sliding("s", 4, 10*s, s)
	slAll := With(Sliding("s", 3, 10*s, s), CountAll)
	slCoarse := Sliding("s", 2, time.Minute, 10*s)
	tk := Token("t", 10, 10*s, 3)
	tkAll := With(Token("t", 5, time.Minute, 5), CountAll)
	tkCost := With(Token("t", 5, time.Minute, 5), CostOf(2))
	fCost := With(Fixed("f", 5, time.Minute), CostOf(2))
	gate := Fixed("gate", 1, 13*s)
	cases := []struct {
		name string
		ds   []decision // the last one must be denied
	}{
		{"fixed", rep(10*s, chk(f, "k"), 3)},
		{"fixed-cost", rep(10*s, chk(fCost, "k"), 3)},
		{"reset", append(rep(5*s, chk(r, "k"), 1), rep(7*s, chk(r, "k"), 2)...)},
		{"sliding", []decision{
			{500 * ms, checks(chk(sl, "k"))}, {2500 * ms, checks(chk(sl, "k"))},
			{2500 * ms, checks(chk(sl, "k"))}, {3500 * ms, checks(chk(sl, "k"))},
			{4500 * ms, checks(chk(sl, "k"))},
		}},
		{"sliding-count-all", []decision{
			{500 * ms, checks(chk(slAll, "k"))}, {1500 * ms, checks(chk(slAll, "k"))},
			{2500 * ms, checks(chk(slAll, "k"))}, {3500 * ms, checks(chk(slAll, "k"))},
		}},
		{"sliding-coarse", []decision{
			{15 * s, checks(chk(slCoarse, "k"))}, {25 * s, checks(chk(slCoarse, "k"))},
			{59 * s, checks(chk(slCoarse, "k"))},
		}},
		{"token", rep(0, chk(tk, "k"), 4)},
		{"token-partial", append(rep(0, chk(tk, "k"), 3),
			decision{1 * s, checks(chk(tk, "k"))}, decision{2500 * ms, checks(chk(tk, "k"))},
			decision{2500 * ms, checks(chk(tk, "k"))})},
		{"token-count-all", rep(0, chk(tkAll, "k"), 6)},
		{"token-cost", rep(10*s, chk(tkCost, "k"), 3)},
		{"two-rules", append(rep(0, chk(gate, "k"), 1),
			decision{0, checks(chk(tk, "k"))}, decision{0, checks(chk(tk, "k"))},
			decision{0, checks(chk(tk, "k"))}, decision{0, checks(chk(tk, "k"), chk(gate, "k"))})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// setup replays the decisions on a fresh store and returns it,
			// its clock and the longest RetryAfter of the final denial.
			setup := func() (limiter.Store, *Clock, time.Duration) {
				clock := NewClock(Base)
				st := newStore(t, clock)
				var results []limiter.Result
				var allowed bool
				for _, d := range c.ds {
					clock.Set(Base.Add(d.at))
					allowed, results = Decide(t, st, d.checks...)
				}
				if allowed {
					t.Fatal("bad test: the last decision was allowed")
				}
				var wait time.Duration
				for _, res := range results {
					if !res.Allowed {
						wait = max(wait, res.RetryAfter)
					}
				}
				if wait <= 0 {
					t.Fatalf("denied with RetryAfter %v", wait)
				}
				return st, clock, wait
			}
			last := c.ds[len(c.ds)-1].checks

			st, clock, wait := setup()
			clock.Advance(wait - us)
			if allowed, _ := Decide(t, st, last...); allowed {
				t.Errorf("retry 1µs before RetryAfter (%v) was allowed", wait)
			}

			st, clock, wait = setup()
			clock.Advance(wait)
			if allowed, _ := Decide(t, st, last...); !allowed {
				t.Errorf("retry at exactly RetryAfter (%v) was denied", wait)
			}
		})
	}
}

// testConcurrentOneKey lets 200 goroutines race for a limit of 5 on one
// key: exactly 5 win, and their Remaining values are 4, 3, 2, 1, 0.
func testConcurrentOneKey(t *testing.T, newStore Factory) {
	const goroutines, limit = 200, 5
	for _, a := range Algos {
		t.Run(a.Name, func(t *testing.T) {
			r := a.Make("c", limit, 24*time.Hour)
			st := newStore(t, NewClock(Base.Add(time.Hour)))
			var (
				mu        sync.Mutex
				allowed   int
				remaining = map[int64]int{}
				errs      []error
				wg        sync.WaitGroup
			)
			start := make(chan struct{})
			for range goroutines {
				wg.Go(func() {
					<-start
					cs := checks(chk(r, "hot"))
					res := make([]limiter.Result, 1)
					won, err := st.Decide(context.Background(), cs, res)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, err)
						return
					}
					if won {
						allowed++
						remaining[res[0].Remaining]++
					}
				})
			}
			close(start)
			waitOrFail(t, &wg, 30*time.Second)
			if len(errs) > 0 {
				t.Fatalf("%d decisions failed, first: %v", len(errs), errs[0])
			}
			if allowed != limit {
				t.Errorf("allowed %d of %d, want exactly %d", allowed, goroutines, limit)
			}
			for n := range int64(limit) {
				if remaining[n] != 1 {
					t.Errorf("Remaining=%d reported %d times, want once (all: %v)", n, remaining[n], remaining)
				}
			}
		})
	}
}

// testConcurrentOpposite makes 1,000 two-rule decisions on counters that
// overlap in a ring (A:x–B:x–A:y–B:y–A:x), each pair named in both orders,
// so a store that locks counters in the order they are named deadlocks and
// one that locks only part of a decision loses updates. Rule A (limit 300)
// binds: each of its two keys lets exactly 300 through, and each counter of
// rule B (limit 1000) counts exactly the decisions it was allowed in.
func testConcurrentOpposite(t *testing.T, newStore Factory) {
	const workers, decisions = 8, 1000
	for _, algo := range Algos {
		t.Run(algo.Name, func(t *testing.T) {
			a := algo.Make("a", 300, 24*time.Hour)
			b := Fixed("b", 1000, 24*time.Hour)
			pairs := [][2]limiter.Check{
				{chk(a, "x"), chk(b, "x")},
				{chk(a, "y"), chk(b, "x")},
				{chk(a, "y"), chk(b, "y")},
				{chk(a, "x"), chk(b, "y")},
			}
			var sets [][]limiter.Check
			for _, p := range pairs {
				sets = append(sets, checks(p[0], p[1]), checks(p[1], p[0]))
			}
			clock := NewClock(Base.Add(time.Hour))
			st := newStore(t, clock)
			var (
				mu      sync.Mutex
				allowed = make([]int, len(sets))
				errs    []error
				wg      sync.WaitGroup
			)
			start := make(chan struct{})
			for w := range workers {
				wg.Go(func() {
					<-start
					res := make([]limiter.Result, 2)
					for i := w; i < decisions; i += workers {
						won, err := st.Decide(context.Background(), sets[i%len(sets)], res)
						mu.Lock()
						if err != nil {
							errs = append(errs, err)
						} else if won {
							allowed[i%len(sets)]++
						}
						mu.Unlock()
					}
				})
			}
			close(start)
			waitOrFail(t, &wg, 30*time.Second)
			if len(errs) > 0 {
				t.Fatalf("%d decisions failed, first: %v", len(errs), errs[0])
			}
			// count[c] is how many allowed decisions counter c took part in.
			count := map[limiter.Check]int{}
			for i, set := range sets {
				for _, c := range set {
					count[c] += allowed[i]
				}
			}
			for _, key := range []string{"x", "y"} {
				if n := count[chk(a, key)]; n != 300 {
					t.Errorf("rule a key %s allowed %d decisions, want 300", key, n)
				}
				_, res := Decide(t, st, chk(a, key))
				if res[0].Allowed {
					t.Errorf("rule a key %s still has room after the race: %s", key, fmtResult(res[0]))
				}
				want := int64(1000 - count[chk(b, key)] - 1)
				_, res = Decide(t, st, chk(b, key))
				if res[0].Remaining != want {
					t.Errorf("rule b key %s: Remaining %d after a probe, want %d (%d allowed decisions)",
						key, res[0].Remaining, want, count[chk(b, key)])
				}
			}
		})
	}
}

// waitOrFail waits for wg, failing the test if that takes longer than d
// (a deadlock).
func waitOrFail(t *testing.T, wg *sync.WaitGroup, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("concurrent decisions did not finish within %v: deadlock?", d)
	}
}
