//go:build unix

package faults

// Postgres stops, and starts again, under traffic.

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestFaultPostgresStopped: Postgres stops in the middle of traffic. Every
// request is answered; once the breaker is open, decisions take well under
// a millisecond; open rules pass, closed rules get 503, local rules hold
// their limit per instance. Postgres starts again: exact shared decisions
// resume within seconds, without a restart.
func TestFaultPostgresStopped(t *testing.T) {
	// Not parallel: it bounds the p99 of decisions with the breaker open, which
	// the other fault tests' load would be part of. It runs before them.
	c, gws := clusterGateways(t, 2)
	// The key "before" is counted before the outage and after it.
	pgtest.ClearOf(t, time.Hour, 30*time.Second)
	expectExact(t, gws, "before")

	bg := startTraffic(gws, 2)
	c.Stop(t)
	stopped := time.Now()
	for i, g := range gws {
		waitFor(t, 10*time.Second, fmt.Sprintf("gateway %d's breaker opens", i), func() bool { return g.breakerState(t) == 2 })
	}
	openedAfter := time.Since(stopped)

	// With the breaker open: measure whole decisions inside each gateway
	// (the decision histogram) and requests from outside.
	const perRule = 300
	var took []time.Duration
	for i, g := range gws {
		before := g.metrics(t)
		for j := range perRule {
			r := g.mustPost(t, "/open", fmt.Sprintf("o-%d-%d", i, j))
			if r.status != 200 {
				t.Fatalf("fail=open while down: status %d", r.status)
			}
			took = append(took, r.took)
			r = g.mustPost(t, "/closed", fmt.Sprintf("c-%d-%d", i, j))
			if r.status != 503 || r.retryAfter != "1" || r.ctype != "application/problem+json" {
				t.Fatalf("fail=closed while down: %+v, want 503 problem+json with Retry-After: 1", r)
			}
			took = append(took, r.took)
			// One key for every local request: the per-instance limit holds.
			r = g.mustPost(t, "/local", "local-key")
			if want := map[bool]int{true: 200, false: 429}[j < 5]; r.status != want {
				t.Fatalf("fail=local request %d on gateway %d while down: status %d, want %d", j+1, i, r.status, want)
			}
			took = append(took, r.took)
		}
		after := g.metrics(t)
		bound, n := p99Bound(before, after)
		if n < 3*perRule || bound > 0.001 {
			t.Errorf("gateway %d: p99 of %v decisions with the breaker open is under %vs, want under 1ms", i, n, bound)
		}
		t.Logf("gateway %d, breaker open: %v decisions, p99 <= %vs (histogram bound); %.2f%% under 100µs, %.2f%% under 250µs, %.2f%% under 1ms",
			i, n, bound, 100*fractionUnder(before, after, 0.0001), 100*fractionUnder(before, after, 0.00025), 100*fractionUnder(before, after, 0.001))
	}
	t.Logf("breaker open: HTTP round trip through the gateway p50 %v, p99 %v, max %v (%d requests)",
		percentile(took, 50), percentile(took, 99), percentile(took, 100), len(took))

	c.Start(t)
	for i, g := range gws {
		recovered := g.waitDecides(t, 15*time.Second, fmt.Sprintf("gateway %d decides with the store again", i))
		t.Logf("gateway %d: store decisions again %v after Postgres accepted connections (breaker opened %v after the stop)",
			i, recovered, openedAfter)
	}
	expectExact(t, gws, "after")
	// The counts from before the outage are still there.
	for _, g := range gws {
		if r := g.mustPost(t, "/closed", "before"); r.status != 429 {
			t.Errorf("key used up before the outage: status %d after it, want 429", r.status)
		}
	}
	n := bg.stop(t)
	t.Logf("%d background requests, every one answered", n)

	for i, g := range gws {
		m := g.metrics(t)
		for _, s := range []string{
			`sluice_decisions_total{outcome="failed_open",rule="open"}`,
			`sluice_decisions_total{outcome="failed_closed",rule="closed"}`,
			`sluice_decisions_total{outcome="local",rule="local"}`,
			`sluice_store_errors_total{kind="connection"}`,
			`sluice_store_breaker_transitions_total{to="open"}`,
			`sluice_store_breaker_transitions_total{to="closed"}`,
		} {
			if m[s] == 0 {
				t.Errorf("gateway %d: %s is 0", i, s)
			}
		}
		if m["sluice_store_breaker_state"] != 0 {
			t.Errorf("gateway %d: breaker state %v after recovery", i, m["sluice_store_breaker_state"])
		}
		if w := logged(g.logs, zapcore.WarnLevel, "circuit breaker opened", ""); len(w) != 1 {
			t.Errorf("gateway %d: %d breaker-opened lines, want 1", i, len(w))
		}
		if c := logged(g.logs, zapcore.InfoLevel, "circuit breaker closed", ""); len(c) != 1 {
			t.Errorf("gateway %d: %d breaker-closed lines, want 1", i, len(c))
		}
		// The background work logs changes of state, not every tick of an
		// outage that lasted seconds.
		seen := map[string]int{}
		for _, e := range logged(g.logs, zapcore.WarnLevel, "", "") {
			if e.Message != "rate-limit store could not decide; applying fail modes" {
				seen[e.Message]++
			}
		}
		for msg, n := range seen {
			if n > 1 {
				t.Errorf("gateway %d: %q logged %d times in one outage, want once", i, msg, n)
			}
		}
	}
}

// TestFaultIdleInstanceRecovers: two gateways on one database, traffic on
// one only. The database stops for a moment and starts again. Once both
// /readyz answer 200, a burst spread over both lets exactly the limit
// through: the idle one learnt of the outage by itself and made its pool
// warm again before saying ready. Ten times.
func TestFaultIdleInstanceRecovers(t *testing.T) {
	t.Parallel()
	c, gws := clusterGateways(t, 2) // busy and idle
	waitReady(t, gws, 10*time.Second)
	expectExactNow(t, gws, "before")
	faultRounds(t, gws, gws[:1], 1, 20*time.Second, func() {
		c.Stop(t)
		waitOpen(t, gws)
		time.Sleep(500 * time.Millisecond) // an outage of a moment
		c.Start(t)
	})
}

// TestFaultRestartUnderTraffic: Postgres restarts in the middle of steady
// traffic. Decisions that fail while it is down apply their modes; a key
// the database had found over its limit is never let through, during the
// outage (the fast path remembers it) or after; and once every /readyz
// answers 200 the store decides fresh keys exactly.
func TestFaultRestartUnderTraffic(t *testing.T) {
	t.Parallel()
	c, gws := clusterGateways(t, 2)
	waitReady(t, gws, 10*time.Second)
	// The key "used-up" must stay over its limit across the restart.
	pgtest.ClearOf(t, time.Hour, 20*time.Second)
	expectExactNow(t, gws, "used-up") // both keys at their limit now

	var leaked atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				g := gws[(w+i)%len(gws)]
				for _, path := range []string{"/closed", "/local"} {
					r, err := g.post(path, "used-up")
					if err == nil && r.status == 200 {
						leaked.Add(1)
					}
				}
				g.post("/open", fmt.Sprintf("steady-%d-%d", w, i)) //nolint:errcheck // traffic
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	c.Stop(t)
	time.Sleep(time.Second)
	c.Start(t)
	took := waitReady(t, gws, 20*time.Second)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if n := leaked.Load(); n > 0 {
		t.Errorf("a key over its limit got %d requests through across the restart", n)
	}
	expectExactNow(t, gws, "after-restart")
	t.Logf("ready %v after Postgres started again", took)
}
