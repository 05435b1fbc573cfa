package memory_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/limiter/storetest"
	"github.com/sluicehq/sluice/policy"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) limiter.Store {
		return memory.New(memory.Options{Now: clock.Now})
	})
	storetest.RunAdmin(t, func(t *testing.T, clock *storetest.Clock) storetest.AdminStore {
		return memory.New(memory.Options{Now: clock.Now})
	})
}

func newStore() (*memory.Store, *storetest.Clock) {
	clock := storetest.NewClock(storetest.Base)
	return memory.New(memory.Options{Now: clock.Now}), clock
}

func TestAlgorithmChange(t *testing.T) {
	// A rule reloaded under the same name with another algorithm starts
	// from a clean counter instead of misreading the old state.
	st, _ := newStore()
	fixed := &policy.Rule{Name: "r", Limit: 1, Window: time.Minute, Cost: 1}
	token := &policy.Rule{Name: "r", Algorithm: policy.Token, Limit: 1, Burst: 1, Window: time.Minute, Cost: 1}
	storetest.Decide(t, st, limiter.Check{Rule: fixed, Key: "k"})
	if ok, res := storetest.Decide(t, st, limiter.Check{Rule: token, Key: "k"}); !ok {
		t.Errorf("token rule read the fixed rule's state: %+v", res[0])
	}
}

func TestErrors(t *testing.T) {
	st, _ := newStore()
	good := limiter.Check{Rule: &policy.Rule{Name: "g", Limit: 1, Window: time.Minute, Cost: 1}, Key: "k"}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := st.Decide(ctx, []limiter.Check{good}, make([]limiter.Result, 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled context: err = %v", err)
	}
	if _, err := st.Decide(context.Background(), []limiter.Check{good}, nil); err == nil {
		t.Error("no error for a results slice shorter than checks")
	}
	bad := []*policy.Rule{
		{Name: "no-limit", Window: time.Minute},
		{Name: "no-window", Limit: 1},
		{Name: "bad-bucket", Algorithm: policy.Sliding, Limit: 1, Window: time.Minute, Bucket: 500 * time.Nanosecond},
	}
	for _, r := range bad {
		// A bad rule fails the whole decision and consumes nothing.
		_, err := st.Decide(context.Background(), []limiter.Check{good, {Rule: r, Key: "k"}}, make([]limiter.Result, 2))
		if err == nil {
			t.Errorf("rule %s: no error", r.Name)
		}
	}
	if ok, _ := storetest.Decide(t, st, good); !ok {
		t.Error("a failed decision consumed from its good check")
	}
}

func TestSweep(t *testing.T) {
	st, clock := newStore()
	r := &policy.Rule{Name: "s", Limit: 5, Window: time.Minute, Cost: 1}
	long := &policy.Rule{Name: "l", Limit: 5, Window: time.Hour, Cost: 1}
	const n = 5000
	for i := range n {
		storetest.Decide(t, st, limiter.Check{Rule: r, Key: strconv.Itoa(i)})
	}
	storetest.Decide(t, st, limiter.Check{Rule: long, Key: "kept"})
	if got := st.Len(); got != n+1 {
		t.Fatalf("Len = %d, want %d", got, n+1)
	}
	if got := st.Sweep(clock.Now().Add(time.Minute - time.Microsecond)); got != 0 {
		t.Errorf("Sweep before expiry dropped %d", got)
	}

	// Decisions drop expired counters of the shards they touch on their own.
	clock.Advance(time.Minute)
	for range 64 {
		storetest.Decide(t, st, limiter.Check{Rule: long, Key: "kept"})
	}
	if got := st.Len(); got > n+1-3 {
		t.Errorf("Len = %d after 64 decisions on one shard, want fewer than %d", got, n+1-3)
	}

	want := st.Len() - 1
	if got := st.Sweep(clock.Now()); got != want {
		t.Errorf("Sweep dropped %d, want %d", got, want)
	}
	if got := st.Len(); got != 1 {
		t.Errorf("Len = %d after Sweep, want 1 (the unexpired counter)", got)
	}
	if ok, res := storetest.Decide(t, st, limiter.Check{Rule: long, Key: "kept"}); ok {
		t.Errorf("the unexpired counter was dropped: %+v", res[0])
	}
}

// TestRun: Run sweeps expired counters every sweep interval, by itself,
// and stops when its context ends.
func TestRun(t *testing.T) {
	clock := storetest.NewClock(storetest.Base)
	st := memory.New(memory.Options{Now: clock.Now, SweepInterval: time.Millisecond})
	storetest.Decide(t, st, limiter.Check{Rule: &policy.Rule{Name: "r", Limit: 5, Window: time.Minute, Cost: 1}, Key: "k"})
	clock.Advance(time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); st.Run(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); st.Len() != 0; {
		if time.Now().After(deadline) {
			t.Fatal("Run did not sweep the expired counter")
		}
		time.Sleep(time.Millisecond) // Run's ticker is real time: poll for its effect
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop when its context was canceled")
	}
}

func TestZeroAllocs(t *testing.T) {
	st, _ := newStore()
	rules := []*policy.Rule{
		{Name: "f", Limit: 1 << 40, Window: time.Minute, Cost: 1},
		{Name: "s", Algorithm: policy.Sliding, Limit: 1 << 40, Window: time.Minute, Bucket: time.Second, Cost: 1},
		{Name: "r", Algorithm: policy.Reset, Limit: 1 << 40, Window: time.Minute, Cost: 1},
		{Name: "t", Algorithm: policy.Token, Limit: 1 << 40, Burst: 1 << 40, Window: time.Hour, Cost: 1},
	}
	cs := make([]limiter.Check, len(rules))
	for i, r := range rules {
		cs[i] = limiter.Check{Rule: r, Key: "k"}
	}
	res := make([]limiter.Result, len(cs))
	ctx := context.Background()
	if _, err := st.Decide(ctx, cs, res); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := st.Decide(ctx, cs, res); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per decision on existing keys, want 0", allocs)
	}
}

// BenchmarkDecide measures one decision on existing keys: one rule over
// many keys, and three rules over one key each.
func BenchmarkDecide(b *testing.B) {
	const keys = 10000
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("%064x", i) // the length of a hex HMAC
	}
	algos := []policy.Algorithm{policy.Fixed, policy.Sliding, policy.Reset, policy.Token}
	for _, a := range algos {
		// Token state of a huge limit would expire microseconds after each
		// request; 1000 per hour with an unbounded burst keeps it alive.
		rule := &policy.Rule{Name: "r", Algorithm: a, Limit: 1 << 40, Window: time.Minute, Bucket: time.Second, Cost: 1}
		if a == policy.Token {
			rule.Limit, rule.Burst, rule.Window = 1000, 1<<40, time.Hour
		}
		b.Run("one-rule/"+a.String(), func(b *testing.B) {
			st := memory.New(memory.Options{})
			warm(b, st, rule, names)
			benchDecide(b, st, func(i int, cs []limiter.Check) []limiter.Check {
				return append(cs, limiter.Check{Rule: rule, Key: names[i%keys]})
			})
		})
	}
	b.Run("three-rules", func(b *testing.B) {
		rules := []*policy.Rule{
			{Name: "ip", Limit: 1 << 40, Window: time.Minute, Cost: 1},
			{Name: "email", Algorithm: policy.Sliding, Limit: 1 << 40, Window: time.Hour, Bucket: time.Minute, Cost: 1},
			{Name: "global", Algorithm: policy.Token, Limit: 1000, Burst: 1 << 40, Window: time.Hour, Cost: 1},
		}
		st := memory.New(memory.Options{})
		for _, r := range rules {
			warm(b, st, r, names)
		}
		benchDecide(b, st, func(i int, cs []limiter.Check) []limiter.Check {
			return append(cs, limiter.Check{Rule: rules[0], Key: names[i%keys]},
				limiter.Check{Rule: rules[1], Key: names[(i*31)%keys]}, limiter.Check{Rule: rules[2], Key: "global"})
		})
	})
}

// benchDecide makes decisions on st in b's parallel loop: the i-th of a
// goroutine is of the checks that checks(i, cs[:0]) appends to cs, with i
// stepping by 7.
func benchDecide(b *testing.B, st *memory.Store, checks func(i int, cs []limiter.Check) []limiter.Check) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var cs []limiter.Check
		var res []limiter.Result
		i := 0
		for pb.Next() {
			cs = checks(i, cs[:0])
			i += 7
			if len(res) != len(cs) {
				res = make([]limiter.Result, len(cs))
			}
			if _, err := st.Decide(context.Background(), cs, res); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func warm(b *testing.B, st *memory.Store, r *policy.Rule, keys []string) {
	b.Helper()
	res := make([]limiter.Result, 1)
	for _, k := range keys {
		if _, err := st.Decide(context.Background(), []limiter.Check{{Rule: r, Key: k}}, res); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMaxKeys: a flood of fresh keys into a full store neither grows it
// past MaxKeys (plus one overflow counter per rule and shard) nor resets
// anyone: keys over their limit before the flood stay limited, and the
// flood's keys share the overflow counters, so most of them are limited
// too. Once the counters expire, new keys get counters of their own again.
func TestMaxKeys(t *testing.T) {
	const maxKeys, limit = 100, 3
	clock := storetest.NewClock(storetest.Base)
	st := memory.New(memory.Options{Now: clock.Now, MaxKeys: maxKeys})
	r := &policy.Rule{Name: "login", Limit: limit, Window: time.Minute, Cost: 1}
	victim := limiter.Check{Rule: r, Key: "victim"}
	for range limit {
		storetest.Decide(t, st, victim)
	}
	if ok, _ := storetest.Decide(t, st, victim); ok {
		t.Fatal("the victim's key is not over its limit before the flood")
	}

	allowed, shared := 0, 0
	for i := range 5000 {
		ok, res := storetest.Decide(t, st, limiter.Check{Rule: r, Key: fmt.Sprint("flood-", i)})
		if ok {
			allowed++
		}
		if res[0].Shared {
			shared++
		}
		clock.Advance(time.Millisecond) // the flood lasts 5s, well inside the window
	}
	if n := st.Len(); n > maxKeys+64 {
		t.Errorf("%d counters after the flood, want at most %d", n, maxKeys+64)
	}
	if ok, _ := storetest.Decide(t, st, victim); ok {
		t.Error("the flood reset the victim's counter")
	}
	// 99 keys got counters of their own (3 each at most, here 1 each);
	// the other 4901 shared 64 overflow counters of limit 3.
	if max := maxKeys - 1 + 64*limit; allowed > max {
		t.Errorf("%d flood requests allowed, want at most %d", allowed, max)
	}
	if st.Overflowed() == 0 || shared != int(st.Overflowed()) {
		t.Errorf("%d decisions overflowed, %d results say Shared; want the same, more than 0", st.Overflowed(), shared)
	}

	// A minute later everything has expired and Run's sweep has made room:
	// a new key gets its own counter (and its own limit) again.
	clock.Advance(time.Minute)
	st.Sweep(clock.Now())
	fresh := limiter.Check{Rule: r, Key: "fresh"}
	for i := range limit + 1 {
		if ok, _ := storetest.Decide(t, st, fresh); ok != (i < limit) {
			t.Fatalf("fresh key, request %d: allowed=%v", i+1, ok)
		}
	}
	before := st.Overflowed()
	storetest.Decide(t, st, limiter.Check{Rule: r, Key: "another"})
	if st.Overflowed() != before {
		t.Error("a new key overflowed although the store had room again")
	}
}
