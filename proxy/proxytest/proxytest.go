// Package proxytest is test support for the listeners that decide through
// proxy's Decider (forward-auth, Envoy's rate limit service): a Decider on
// a memory store at a fixed instant, built as a gateway builds one.
//
// It is for tests only, and imports of sluice only what a Decider is
// made of: hashing, limiter, limiter/memory, limiter/storetest (the
// clock), policy, proxy and proxy/identity.
package proxytest

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/limiter/storetest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/identity"
)

// DeciderOptions are the options of NewDecider; the zero value is a
// memory store at 2026-01-01T00:00:00Z trusting no proxy.
type DeciderOptions struct {
	// Now is the clock's instant, which never moves; zero is
	// 2026-01-01T00:00:00Z.
	Now time.Time
	// Store decides; nil is a memory store on the clock.
	Store limiter.Store
	// Trusted is SLUICE_TRUSTED_PROXIES.
	Trusted string
}

// NewDecider returns a Decider for rules, which must parse, with the
// defaults of a gateway: fail open, a local memory store for fail=local,
// both header families, and a fixed hash key. It fails t on any error.
func NewDecider(t testing.TB, rules string, o DeciderOptions) *proxy.Decider {
	t.Helper()
	pol, err := policy.Parse(rules)
	if err != nil {
		t.Fatal(err)
	}
	if o.Now.IsZero() {
		o.Now = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	clock := storetest.NewClock(o.Now)
	if o.Store == nil {
		o.Store = memory.New(memory.Options{Now: clock.Now})
	}
	lim, err := limiter.New(limiter.Config{
		Store: o.Store, Local: memory.New(memory.Options{Now: clock.Now}),
		Timeout: time.Second, DefaultFail: policy.FailOpen, CacheSize: 1000, Now: clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	h, _ := hashing.New([]byte("proxytest-key-0123456789")) // long enough: no error
	tp, err := identity.ParseTrustedProxies(o.Trusted)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := proxy.NewDecider(proxy.DeciderConfig{Policy: pol, Limiter: lim, Hasher: h, Trusted: tp, Headers: proxy.HeaderFamilies{IETF: true, X: true}})
	if err != nil {
		t.Fatal(err)
	}
	return dec
}
