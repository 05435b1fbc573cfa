package limiter_test

import (
	"testing"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// TestPlanParams: a plan's rule (policy.Rule.ForPlan) is counted with the
// parameters an override of the plan's limit and window gives the rule,
// so that limits by plan and overrides have one definition of burst and
// bucket (OverrideParams).
func TestPlanParams(t *testing.T) {
	pol, err := policy.Parse(`f: * /a by jwt 10/1m cost=2 plans(p)=a:100/1h,b:2/1s
s: * /a by jwt 60/1m sliding(10s) plans(p)=a:600/1m,b:100/1h,c:7/7s,d:5/5s
s2: * /a by jwt 60/1h sliding plans(p)=a:10/1m,b:10/1d
t: * /a by jwt 10/1m token plans(p)=a:100/1m,b:1/1h
t2: * /a by jwt 10/1m token burst=20 cost=5 plans(p)=a:100/1m,b:20/1d
r: * /a by jwt 10/1m reset plans(p)=a:100/1d`)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range pol.Rules() {
		for _, p := range r.Plans {
			got := limiter.RuleParams(r.ForPlan(p.Name))
			want := limiter.OverrideParams(r, p.Limit, p.Window)
			if got != want {
				t.Errorf("rule %s plan %s: %+v, want the override's %+v", r.Name, p.Name, got, want)
			}
			if err := got.Validate(r.Algorithm); err != nil {
				t.Errorf("rule %s plan %s: %v", r.Name, p.Name, err)
			}
		}
	}
}

// TestFastPathPlans: a key denied under one plan is not denied from the
// over-limit cache under another: an upgraded user's next request reaches
// the store, which counts it under the new plan.
func TestFastPathPlans(t *testing.T) {
	f := newFixture(t, nil)
	pol, err := policy.Parse("f: * /a by jwt 1/1m plans(tier)=pro:5/1m")
	if err != nil {
		t.Fatal(err)
	}
	free := pol.Rules()[0]
	pro := free.ForPlan("pro")
	f.decide(chk(free, "u"))
	if o := f.decide(chk(free, "u")); o.Allowed {
		t.Fatal("free: second request allowed")
	}
	calls := f.store.calls.Load()
	if o := f.decide(chk(free, "u")); o.Allowed || f.store.calls.Load() != calls {
		t.Fatal("free: the repeat denial should come from the cache")
	}
	o := f.decide(chk(pro, "u"))
	if !o.Allowed || o.Results[0].Limit != 5 || f.store.calls.Load() != calls+1 {
		t.Fatalf("pro after a denial as free: allowed %v, limit %d, store calls %d (want the store's verdict under 5/1m)",
			o.Allowed, o.Results[0].Limit, f.store.calls.Load()-calls)
	}
}
