package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// testPlans: a request counted under a plan (policy.Rule.ForPlan) is
// counted in its rule's counter with the plan's limit and window, and
// burst and bucket as an override of that limit and window gets them
// (limiter.OverrideParams); a key counted under two plans has one count;
// and a key's override beats its plan.
func testPlans(t *testing.T, newStore AdminFactory) {
	ctx := context.Background()
	pol, err := policy.Parse(`f: GET /f by jwt 2/1m plans(tier)=pro:5/1m,day:3/1h
t: GET /t by jwt 2/1m token plans(tier)=pro:4/1m
s: GET /s by jwt 2/1m sliding(10s) plans(tier)=pro:4/7m`)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := pol.Lookup("f")
	tok, _ := pol.Lookup("t")
	sl, _ := pol.Lookup("s")
	st := newStore(t, NewClock(Base))
	decide := func(r *policy.Rule, key string) limiter.Result {
		t.Helper()
		_, res := Decide(t, st, limiter.Check{Rule: r, Key: key})
		return res[0]
	}
	// The rule's own limit, and each plan's.
	for _, tt := range []struct {
		rule   *policy.Rule
		key    string
		n      int // requests; the last one must be denied
		limit  int64
		window time.Duration
	}{
		{f, "free", 3, 2, time.Minute},
		{f.ForPlan("pro"), "pro", 6, 5, time.Minute},
		{f.ForPlan("day"), "day", 4, 3, time.Hour},
		{tok.ForPlan("pro"), "pro", 5, 4, time.Minute}, // burst 4: the default burst follows the plan
		{sl.ForPlan("pro"), "pro", 5, 4, 7 * time.Minute},
	} {
		for i := 1; i <= tt.n; i++ {
			res := decide(tt.rule, tt.key)
			if res.Allowed != (i < tt.n) || res.Limit != tt.limit || res.Window != tt.window {
				t.Fatalf("rule %s key %s request %d: %s, want allowed %v under %d/%v",
					tt.rule.Name, tt.key, i, fmtResult(res), i < tt.n, tt.limit, tt.window)
			}
		}
	}
	// One key, two plans, one count: 2 used as free, 3 more as pro.
	for i := 1; i <= 2; i++ {
		if res := decide(f, "upgraded"); !res.Allowed {
			t.Fatalf("free request %d denied: %s", i, fmtResult(res))
		}
	}
	if res := decide(f, "upgraded"); res.Allowed {
		t.Fatalf("free request 3 allowed: %s", fmtResult(res))
	}
	for i := 3; i <= 5; i++ {
		if res := decide(f.ForPlan("pro"), "upgraded"); !res.Allowed || res.Remaining != int64(5-i) {
			t.Fatalf("pro request %d of a key that used 2: %s", i, fmtResult(res))
		}
	}
	if res := decide(f.ForPlan("pro"), "upgraded"); res.Allowed {
		t.Fatalf("pro request 6: %s", fmtResult(res))
	}
	// An override beats the plan.
	if err := st.SetOverride(ctx, limiter.Check{Rule: f, Key: "vip"}, 7, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*policy.Rule{f, f.ForPlan("pro"), f.ForPlan("day")} {
		if res := decide(r, "vip"); res.Limit != 7 || res.Window != time.Hour {
			t.Fatalf("overridden key under %d/%v: %s, want the override's 7/1h", r.Limit, r.Window, fmtResult(res))
		}
	}
}
