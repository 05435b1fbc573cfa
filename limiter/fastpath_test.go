package limiter

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// These tests drive the fast path directly, as a step of its own.

func TestFastPathStep(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	plain := &policy.Rule{Name: "plain", Limit: 2, Window: time.Minute, Cost: 1}
	other := &policy.Rule{Name: "other", Limit: 9, Window: time.Hour, Cost: 1}
	shadow := &policy.Rule{Name: "shadow", Limit: 2, Window: time.Minute, Cost: 1, Shadow: true}
	all := &policy.Rule{Name: "all", Limit: 2, Window: time.Minute, Cost: 1, CountAll: true}
	// A token rule's denial: a retry may pass in 30 s, the bucket is full
	// again in 50 min (its reset, on the store's clock, a second ahead).
	storeNow := now.Add(time.Second)
	denied := Result{Allowed: false, Limit: 5, Window: time.Hour, Count: 5, RetryAfter: 30 * time.Second,
		Reset: storeNow.Add(50 * time.Minute), ResetAfter: 50 * time.Minute}

	f, err := newFastPath(10)
	if err != nil {
		t.Fatal(err)
	}
	cs := []Check{{plain, "k"}, {shadow, "k"}, {all, "k"}, {other, "k"}}
	f.remember(cs, []Result{denied, denied, denied, {Allowed: true}}, now)
	if n := f.cache.Len(); n != 1 {
		t.Fatalf("remembered %d checks, want 1 (shadow, count=all and allowed checks are not)", n)
	}

	results := make([]Result, 2)
	sources := make([]Source, 2)
	hit, wait := f.deny([]Check{{other, "k"}, {plain, "k"}}, now.Add(10*time.Second), results, sources)
	// 10 s later: the store's reset as it gave it, the time left until it,
	// and the time left until a retry may pass.
	want := Result{Allowed: false, Limit: 5, Window: time.Hour, Remaining: 0, Count: 5,
		Reset: storeNow.Add(50 * time.Minute), ResetAfter: 50*time.Minute - 10*time.Second, RetryAfter: 20 * time.Second}
	if !hit || wait != 20*time.Second || results[1] != want || sources[1] != SourceFastPath {
		t.Errorf("hit=%v wait=%v result %+v source %v, want a hit with %+v", hit, wait, results[1], sources[1], want)
	}
	if sources[0] != SourceNotEvaluated || results[0] != (Result{Limit: 9, Window: time.Hour}) {
		t.Errorf("other check: %v %+v, want not evaluated with only Limit and Window", sources[0], results[0])
	}

	// A shadow check is never answered from the cache, even if an entry
	// for its counter exists.
	f.cache.Add(cacheKey{"shadow", "k"}, overLimit{until: now.Add(time.Hour)})
	if hit, _ := f.deny([]Check{{shadow, "k"}}, now, results[:1], sources[:1]); hit {
		t.Error("a shadow check was denied from the cache")
	}
	// count=all anywhere in the request bypasses the cache.
	if hit, _ := f.deny([]Check{{plain, "k"}, {all, "k"}}, now, results, sources); hit {
		t.Error("a request with a count=all check was denied from the cache")
	}
	// At the deadline the entry is absent, and removed.
	if hit, _ := f.deny([]Check{{plain, "k"}}, now.Add(30*time.Second), results[:1], sources[:1]); hit {
		t.Error("hit at the deadline")
	}
	if f.cache.Contains(cacheKey{"plain", "k"}) {
		t.Error("expired entry kept")
	}
}

// TestFastPathAcrossReload: a denial remembered under one definition of a
// rule answers a later check only while the rule counts the same way. A
// reload that changes the limit, window or algorithm drops it at once,
// also when the denial was remembered after the reload by a request that
// started under the old rule; an unchanged rule parsed anew keeps it.
func TestFastPathAcrossReload(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	old := &policy.Rule{Name: "login", Limit: 5, Window: time.Hour, Cost: 1}
	denied := Result{Allowed: false, Limit: 5, Window: time.Hour, RetryAfter: 50 * time.Minute}
	results := make([]Result, 1)
	sources := make([]Source, 1)
	for _, tc := range []struct {
		name string
		edit func(*policy.Rule)
		hit  bool
	}{
		{"unchanged, parsed anew", func(r *policy.Rule) {}, true},
		{"other path and methods", func(r *policy.Rule) { r.Path, r.Methods = "/other", []string{"GET"} }, true},
		{"other fail mode", func(r *policy.Rule) { r.Fail = policy.FailClosed }, true},
		{"higher limit", func(r *policy.Rule) { r.Limit = 10 }, false},
		{"shorter window", func(r *policy.Rule) { r.Window = time.Minute }, false},
		{"other algorithm", func(r *policy.Rule) { r.Algorithm = policy.Sliding; r.Bucket = time.Minute }, false},
		{"other cost", func(r *policy.Rule) { r.Cost = 2 }, false},
		{"other identity", func(r *policy.Rule) { r.Identity = policy.Identity{Kind: policy.ByTenant, Field: "X-Tenant-Id"} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := newFastPath(10)
			if err != nil {
				t.Fatal(err)
			}
			f.remember([]Check{{old, "k"}}, []Result{denied}, now)
			reloaded := *old
			tc.edit(&reloaded)
			hit, _ := f.deny([]Check{{&reloaded, "k"}}, now.Add(time.Second), results, sources)
			if hit != tc.hit {
				t.Fatalf("hit %v, want %v", hit, tc.hit)
			}
			if !tc.hit && f.cache.Contains(cacheKey{"login", "k"}) {
				t.Error("the stale denial was kept")
			}
			// The old rule itself is still answered while its entry lives:
			// a request in flight under it is decided as it began.
			if tc.hit {
				if hit, _ := f.deny([]Check{{old, "k"}}, now.Add(time.Second), results, sources); !hit {
					t.Error("the old rule's own denial was not answered")
				}
			}
		})
	}
}
