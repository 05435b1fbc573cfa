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
	denied := Result{Allowed: false, Limit: 5, Window: time.Hour, RetryAfter: 30 * time.Second}

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
	want := Result{Allowed: false, Limit: 5, Window: time.Hour, Remaining: 0,
		Reset: now.Add(30 * time.Second), ResetAfter: 20 * time.Second, RetryAfter: 20 * time.Second}
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
