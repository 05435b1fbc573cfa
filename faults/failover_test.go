//go:build unix

package faults

// Failover to a standby, and a primary turned read-only.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestFaultFailover: a primary and a streaming standby; the primary stops,
// the standby is promoted, and two gateways (one busy, one idle), on a
// multi-host connection string with target_session_attrs=read-write, are
// ready again within seconds and exact from their first decision after
// /readyz said 200, with the counts made before the failover.
func TestFaultFailover(t *testing.T) {
	primary := parallelCluster(t)
	standby := primary.NewStandby(t)
	url := fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write",
		primary.Port, standby.Port)
	gws := gatewaysOn(t, url, 2)
	// The key "kept" is counted before the failover and after it.
	pgtest.ClearOf(t, time.Hour, 30*time.Second)
	busy, idle := gws[0], gws[1]
	for range 3 {
		if r := busy.mustPost(t, "/closed", "kept"); r.status != 200 {
			t.Fatalf("status %d before the failover", r.status)
		}
	}
	primary.WaitForStandby(t, standby)

	bg := startTraffic([]*faultGateway{busy}, 2)
	primary.Stop(t)
	stopped := time.Now()
	waitFor(t, 10*time.Second, "both breakers open", func() bool {
		return busy.breakerState(t) != 0 && idle.breakerState(t) != 0
	})
	standby.Promote(t)
	promoted := time.Now()
	took := waitReady(t, gws, 20*time.Second)
	t.Logf("failover: every /readyz 200 %v after the promotion, %v after the primary stopped (promotion took %v)",
		took, time.Since(stopped), promoted.Sub(stopped))
	bg.stop(t)

	// Ready means exact at once: the three requests made on the old
	// primary count, and a fresh key gets exactly its limit, from the
	// first decision after /readyz said 200, on both gateways.
	codes := burst(t, gws, "/closed", "kept", 5)
	if codes[200] != 2 || codes[429] != 3 {
		m := busy.metrics(t)
		errs := map[string]float64{}
		for k, v := range m {
			if strings.HasPrefix(k, "sluice_store_errors_total") {
				errs[k] = v
			}
		}
		t.Errorf("key with 3 of 5 used before the failover: %v after it, want 2×200 and 3×429 (breaker state %v, store errors %v)",
			codes, m["sluice_store_breaker_state"], errs)
	}
	expectExactNow(t, gws, "after")
}

// TestFaultDemotedPrimary: the server turns read-only under the pool's
// connections (as a demoted primary does). Their first error drops every
// pooled connection, new connections refuse the read-only server
// (target_session_attrs=read-write), the fail modes apply, and decisions
// resume by themselves when it takes writes again.
func TestFaultDemotedPrimary(t *testing.T) {
	c := parallelCluster(t)
	gws := gatewaysOn(t, c.URL()+"&target_session_attrs=read-write", 1)
	g := gws[0]
	expectExact(t, gws, "before")

	c.Exec(t, "ALTER SYSTEM SET default_transaction_read_only = on")
	c.Exec(t, "SELECT pg_reload_conf()")
	waitFor(t, 10*time.Second, "fail=closed answers 503 on the read-only server", func() bool {
		return g.mustPost(t, "/closed", "probe").status == 503
	})
	for i := range 10 {
		if r := g.mustPost(t, "/open", fmt.Sprintf("ro-%d", i)); r.status != 200 {
			t.Fatalf("fail=open on a read-only server: %d", r.status)
		}
	}
	if e := logged(g.logs, zapcore.WarnLevel, "dropped every pooled connection", "read_only"); len(e) == 0 {
		t.Error("the read-only connections were not dropped (no log line)")
	}
	g.expectErrorsCounted(t, "read_only")

	c.Exec(t, "ALTER SYSTEM RESET default_transaction_read_only")
	c.Exec(t, "SELECT pg_reload_conf()")
	recovered := g.waitDecides(t, 10*time.Second, "decisions resume on the writable server")
	t.Logf("store decisions again %v after the server took writes again", recovered)
	expectExact(t, gws, "after")
}
