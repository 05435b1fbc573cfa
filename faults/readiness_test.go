//go:build unix

package faults

// Readiness: /readyz, and the moments after an outage heals.

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// readyz returns the status of the gateway's /readyz.
func (g *faultGateway) readyz(t *testing.T) int {
	t.Helper()
	res, err := faultClient.Get(g.admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// waitReady waits until every gateway's /readyz answers 200.
func waitReady(t *testing.T, gws []*faultGateway, limit time.Duration) time.Duration {
	t.Helper()
	return waitFor(t, limit, "every /readyz answers 200", func() bool {
		for _, g := range gws {
			if g.readyz(t) != 200 {
				return false
			}
		}
		return true
	})
}

// expectExactNow bursts 20 concurrent requests on a fresh key of each of
// the closed and the local rule (limit 5 each), spread over gws: exactly 5
// of each pass, the rest get 429, none 503. It is the check that follows
// every healing: the store must decide, not the fail modes.
func expectExactNow(t *testing.T, gws []*faultGateway, key string) {
	t.Helper()
	// Both bursts in one hour window: a wait, seconds before the hour
	// ends, is rare and short.
	pgtest.ClearOf(t, time.Hour, 5*time.Second)
	ready := time.Now()
	before := make([]map[string]float64, len(gws))
	for i, g := range gws {
		before[i] = storeErrorSeries(g.metrics(t))
	}
	for _, path := range []string{"/closed", "/local"} {
		if codes := burst(t, gws, path, key, 20); codes[200] != 5 || codes[429] != 15 {
			states := make([]float64, len(gws))
			var errs []string
			for i, g := range gws {
				states[i] = g.breakerState(t)
				for series, v := range storeErrorSeries(g.metrics(t)) {
					if d := v - before[i][series]; d > 0 {
						errs = append(errs, fmt.Sprintf("gateway %d %s +%v", i, series, d))
					}
				}
				// What the gateway said from a second before it was ready.
				for _, e := range g.logs.All() {
					if e.Level >= zapcore.WarnLevel && e.Time.After(ready.Add(-time.Second)) {
						t.Logf("gateway %d %s %s %s %v", i, e.Time.Format("15:04:05.000"), e.Level, e.Message, e.ContextMap())
					}
				}
			}
			slices.Sort(errs)
			t.Fatalf("right after every /readyz said 200: 20 requests on a fresh key of %s (limit 5): %v, want 5×200 and 15×429 (breaker states %v; store errors since ready: %v)",
				path, codes, states, errs)
		}
	}
}

// storeErrorSeries is the sluice_store_errors_total series of a gateway's
// metrics.
func storeErrorSeries(m map[string]float64) map[string]float64 {
	errs := map[string]float64{}
	for series, v := range m {
		if strings.HasPrefix(series, "sluice_store_errors_total") {
			errs[series] = v
		}
	}
	return errs
}

// waitOpen waits until the breaker of every gateway of gws is not closed.
func waitOpen(t *testing.T, gws []*faultGateway) {
	t.Helper()
	waitFor(t, 10*time.Second, "every breaker opens", func() bool {
		for _, g := range gws {
			if g.breakerState(t) == 0 {
				return false
			}
		}
		return true
	})
}

// faultRounds runs ten rounds of a fault under traffic: each starts
// traffic of callers callers on busy, calls fault, which returns once the
// database is back, waits at most ready until every /readyz of gws answers
// 200, stops the traffic and expects the store to decide fresh keys
// exactly. /readyz must agree with the breakers throughout.
func faultRounds(t *testing.T, gws, busy []*faultGateway, callers int, ready time.Duration, fault func()) {
	t.Helper()
	watch := watchReadiness(gws)
	for i := range 10 {
		bg := startTraffic(busy, callers)
		fault()
		took := waitReady(t, gws, ready)
		bg.stop(t)
		expectExactNow(t, gws, fmt.Sprint("healed-", i))
		t.Logf("round %d: ready %v after the database came back", i+1, took)
	}
	watch.check(t)
}

// readinessWatch checks, until stopped, that every gateway's /readyz agrees
// with its store's readiness (Gateway.Ready: its breaker is closed): a
// sample whose readiness did not change while /readyz was asked must see
// 200 exactly when the store is ready.
type readinessWatch struct {
	loops
	samples atomic.Int64
}

func watchReadiness(gws []*faultGateway) *readinessWatch {
	w := &readinessWatch{loops: newLoops(10)}
	for i, g := range gws {
		w.loop(func() bool {
			before := g.g.Ready() == nil
			res, err := faultClient.Get(g.admin + "/readyz")
			if err != nil {
				w.fail(fmt.Sprintf("gateway %d: %v", i, err))
				return false
			}
			res.Body.Close()
			after := g.g.Ready() == nil
			if before == after {
				w.samples.Add(1)
				if ready := res.StatusCode == http.StatusOK; ready != before {
					w.fail(fmt.Sprintf("gateway %d: /readyz %d with the store ready %v (its breaker closed)", i, res.StatusCode, before))
				}
			}
			time.Sleep(2 * time.Millisecond)
			return true
		})
	}
	return w
}

func (w *readinessWatch) check(t *testing.T) {
	t.Helper()
	if bad := w.loops.stop(); len(bad) > 0 {
		t.Errorf("/readyz and the breaker disagreed: %v", bad)
	}
	t.Logf("/readyz agreed with the breaker in %d samples", w.samples.Load())
}
