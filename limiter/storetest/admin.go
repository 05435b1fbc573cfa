package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// AdminStore is a store with the operator's side that the admin API uses:
// a look at one counter, a reset, and per-key overrides of a rule's limit
// and window. Both stores implement it.
type AdminStore interface {
	limiter.Store
	Peek(ctx context.Context, c limiter.Check) (limiter.Result, error)
	Reset(ctx context.Context, c limiter.Check) error
	SetOverride(ctx context.Context, c limiter.Check, limit int64, window time.Duration) error
	DeleteOverride(ctx context.Context, c limiter.Check) error
	Overrides(ctx context.Context) ([]limiter.Override, error)
}

// AdminFactory returns a fresh, empty AdminStore on the given clock.
type AdminFactory func(t *testing.T, clock *Clock) AdminStore

// RunAdmin runs the admin behaviour suite against the stores newStore
// makes: what Peek, Reset, SetOverride and DeleteOverride do to a key and
// to the decisions after them, and how limits by plan meet overrides. Like Run, it is the one definition that
// both stores follow.
func RunAdmin(t *testing.T, newStore AdminFactory) {
	t.Run("OverrideParams", func(t *testing.T) { testOverrideParams(t, newStore) })
	t.Run("OverrideLifecycle", func(t *testing.T) { testOverrideLifecycle(t, newStore) })
	t.Run("InvalidOverride", func(t *testing.T) { testInvalidOverride(t, newStore) })
	t.Run("PeekAndReset", func(t *testing.T) { testPeekAndReset(t, newStore) })
	t.Run("OverridesList", func(t *testing.T) { testOverridesList(t, newStore) })
	t.Run("Plans", func(t *testing.T) { testPlans(t, newStore) })
}

// testOverridesList: Overrides lists every override there is, by rule and
// then key, without the deleted ones.
func testOverridesList(t *testing.T, newStore AdminFactory) {
	ctx := context.Background()
	st := newStore(t, NewClock(Base))
	if got, err := st.Overrides(ctx); err != nil || len(got) != 0 {
		t.Fatalf("no overrides yet: %v %v", got, err)
	}
	query, login := Fixed("query", 5, time.Minute), Fixed("login", 5, time.Minute)
	for _, o := range []struct {
		r      *policy.Rule
		key    string
		limit  int64
		window time.Duration
	}{{query, "k2", 9, time.Hour}, {login, "k1", 3, time.Minute}, {query, "k1", 7, 24 * time.Hour}} {
		if err := st.SetOverride(ctx, limiter.Check{Rule: o.r, Key: o.key}, o.limit, o.window); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.DeleteOverride(ctx, limiter.Check{Rule: query, Key: "k2"}); err != nil {
		t.Fatal(err)
	}
	want := []limiter.Override{{Rule: "login", Key: "k1", Limit: 3, Window: time.Minute}, {Rule: "query", Key: "k1", Limit: 7, Window: 24 * time.Hour}}
	got, err := st.Overrides(ctx)
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Overrides() = %v %v, want %v", got, err, want)
	}
}

// testOverrideParams: an override replaces a rule's limit and window for
// one key, with the burst and bucket limiter.OverrideParams gives.
func testOverrideParams(t *testing.T, newStore AdminFactory) {
	s := time.Second
	tests := []struct {
		name   string
		rule   *policy.Rule
		limit  int64
		window time.Duration
		n      int            // requests at Base
		want   limiter.Result // the n-th
	}{
		{
			name: "fixed", rule: Fixed("f", 2, time.Minute),
			limit: 10, window: time.Hour, n: 3,
			want: limiter.Result{Allowed: true, Limit: 10, Window: time.Hour, Remaining: 7,
				Reset: Base.Add(time.Hour), ResetAfter: time.Hour},
		},
		{
			// The default burst (recorded as the limit) follows the override.
			name: "token-default-burst", rule: Token("t", 2, time.Minute, 2),
			limit: 10, window: 10 * s, n: 3,
			want: limiter.Result{Allowed: true, Limit: 10, Window: 10 * s, Remaining: 7,
				Reset: Base.Add(3 * s), ResetAfter: 3 * s},
		},
		{
			// An explicit burst stays: 3 tokens, T = 1 s.
			name: "token-explicit-burst", rule: Token("t", 2, time.Minute, 3),
			limit: 10, window: 10 * s, n: 4,
			want: limiter.Result{Allowed: false, Limit: 10, Window: 10 * s, Remaining: 0,
				Reset: Base.Add(3 * s), ResetAfter: 3 * s, RetryAfter: s},
		},
		{
			// 7 s buckets do not divide 1h: DefaultBucket(1h) = 60 s.
			name: "sliding-rebucketed", rule: Sliding("s", 2, 7*time.Minute, 7*s),
			limit: 10, window: time.Hour, n: 1,
			want: limiter.Result{Allowed: true, Limit: 10, Window: time.Hour, Remaining: 9,
				Reset: Base.Add(time.Hour), ResetAfter: time.Hour},
		},
		{
			// 10 s buckets divide 1h and are kept.
			name: "sliding-kept", rule: Sliding("s", 2, time.Minute, 10*s),
			limit: 10, window: time.Hour, n: 1,
			want: limiter.Result{Allowed: true, Limit: 10, Window: time.Hour, Remaining: 9,
				Reset: Base.Add(time.Hour), ResetAfter: time.Hour},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := newStore(t, NewClock(Base))
			c := limiter.Check{Rule: tt.rule, Key: "acme"}
			if err := st.SetOverride(context.Background(), c, tt.limit, tt.window); err != nil {
				t.Fatal(err)
			}
			var res []limiter.Result
			for range tt.n {
				_, res = Decide(t, st, c)
			}
			expectResult(t, "the overridden key", res[0], tt.want)
			// Other keys keep the rule's own limit.
			_, res = Decide(t, st, limiter.Check{Rule: tt.rule, Key: "other"})
			if res[0].Limit != tt.rule.Limit || res[0].Window != tt.rule.Window {
				t.Errorf("other key: Limit %d Window %v, want the rule's", res[0].Limit, res[0].Window)
			}
		})
	}
}

// testOverrideLifecycle: an override applies, its deletion returns the
// key to the rule's limit with what it counted meanwhile, and a reset
// starts the key afresh.
func testOverrideLifecycle(t *testing.T, newStore AdminFactory) {
	ctx := context.Background()
	st := newStore(t, NewClock(Base))
	c := limiter.Check{Rule: Fixed("q", 1, time.Minute), Key: "acme"}
	if err := st.SetOverride(ctx, c, 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	Decide(t, st, c)
	if ok, _ := Decide(t, st, c); !ok {
		t.Fatal("second request denied under an override of 3")
	}
	if err := st.DeleteOverride(ctx, c); err != nil {
		t.Fatal(err)
	}
	// Back under the rule's limit of 1, with 2 already counted.
	if ok, _ := Decide(t, st, c); ok {
		t.Fatal("request allowed after the override was deleted")
	}
	if err := st.Reset(ctx, c); err != nil {
		t.Fatal(err)
	}
	if ok, _ := Decide(t, st, c); !ok {
		t.Fatal("request denied after Reset")
	}
	// Deleting an override that does not exist is not an error.
	if err := st.DeleteOverride(ctx, limiter.Check{Rule: c.Rule, Key: "none"}); err != nil {
		t.Errorf("DeleteOverride of a key without one: %v", err)
	}
}

// testInvalidOverride: an override that cannot apply to its rule is
// refused with limiter.ErrInvalidOverride and changes nothing.
func testInvalidOverride(t *testing.T, newStore AdminFactory) {
	ctx := context.Background()
	st := newStore(t, NewClock(Base))
	r := With(Fixed("q", 2, time.Minute), CostOf(3))
	for _, bad := range []struct {
		limit  int64
		window time.Duration
	}{
		{0, time.Minute}, {-1, time.Minute}, {policy.MaxCount + 1, time.Minute},
		{2, time.Minute}, // below the rule's cost of 3: nothing could pass
		{5, 0}, {5, time.Millisecond}, {5, policy.MaxWindow + time.Second},
	} {
		c := limiter.Check{Rule: r, Key: fmt.Sprint("k", bad.limit, bad.window)}
		if err := st.SetOverride(ctx, c, bad.limit, bad.window); !errors.Is(err, limiter.ErrInvalidOverride) {
			t.Errorf("SetOverride(%d, %v) = %v, want ErrInvalidOverride", bad.limit, bad.window, err)
		}
		if _, res := Decide(t, st, c); res[0].Limit != r.Limit {
			t.Errorf("after a refused override of %d/%v: limit %d, want the rule's %d", bad.limit, bad.window, res[0].Limit, r.Limit)
		}
	}
}

// testPeekAndReset: Peek reports what the next request would get and
// consumes nothing; Reset gives the key its whole limit back.
func testPeekAndReset(t *testing.T, newStore AdminFactory) {
	ctx := context.Background()
	st := newStore(t, NewClock(Base))
	c := limiter.Check{Rule: Fixed("p", 2, time.Minute), Key: "k"}
	for range 3 {
		res, err := st.Peek(ctx, c)
		if err != nil || !res.Allowed || res.Remaining != 2 {
			t.Fatalf("Peek on a fresh key = %+v, %v", res, err)
		}
	}
	Decide(t, st, c)
	if res, _ := st.Peek(ctx, c); !res.Allowed || res.Remaining != 1 {
		t.Errorf("Peek after one request = %+v, want allowed with 1 left", res)
	}
	Decide(t, st, c)
	if res, _ := st.Peek(ctx, c); res.Allowed || res.Remaining != 0 || res.RetryAfter != time.Minute {
		t.Errorf("Peek at the limit = %+v, want denied, retry in a minute", res)
	}
	if err := st.Reset(ctx, c); err != nil {
		t.Fatal(err)
	}
	if ok, res := Decide(t, st, c); !ok || res[0].Remaining != 1 {
		t.Errorf("after Reset: allowed=%v remaining=%d, want allowed with 1 left", ok, res[0].Remaining)
	}
}
