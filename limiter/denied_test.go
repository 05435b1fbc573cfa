package limiter_test

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// TestDeniedHook: Denied hears of every check whose own verdict was to
// deny, whoever decided it (the store, the fast path, the fail=local
// fallback), shadow checks included, and of nothing else.
func TestDeniedHook(t *testing.T) {
	var mu sync.Mutex
	var heard []string
	hook := func(c limiter.Check) {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, c.Rule.Name+"/"+c.Key)
	}
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		h := heard
		heard = nil
		return h
	}

	f := newFixture(t, func(c *limiter.Config) { c.Denied = hook })
	a, sh, roomy := rule("a", 1), rule("sh", 1, shadow), rule("roomy", 100)
	steps := []struct {
		name   string
		checks []limiter.Check
		want   []string
	}{
		{"allowed", []limiter.Check{chk(a, "k"), chk(sh, "k"), chk(roomy, "k")}, nil},
		{"the store denies; the shadow rule would", []limiter.Check{chk(a, "k"), chk(sh, "k"), chk(roomy, "k")}, []string{"a/k", "sh/k"}},
		{"the fast path denies", []limiter.Check{chk(a, "k"), chk(roomy, "k")}, []string{"a/k"}},
		{"another key", []limiter.Check{chk(a, "other")}, nil},
	}
	for _, s := range steps {
		f.decide(s.checks...)
		if got := take(); !slices.Equal(got, s.want) {
			t.Errorf("%s: heard %v, want %v", s.name, got, s.want)
		}
	}

	// The local fallback's denials too, when the store cannot decide.
	down := newFixture(t, func(c *limiter.Config) {
		c.Denied = hook
		c.Store = errStore{errors.New("down")}
		c.DefaultFail = policy.FailLocal
	})
	for range 2 {
		down.decide(chk(a, "k"))
	}
	if got := take(); !slices.Equal(got, []string{"a/k"}) {
		t.Errorf("local fallback: heard %v, want [a/k]", got)
	}
}
