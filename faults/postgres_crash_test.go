//go:build unix

package faults

// Postgres paused (SIGSTOP) and killed (SIGKILL): a hang and a crash.

import (
	"testing"
	"time"
)

// TestFaultPauseAndKill: under traffic on every gateway, Postgres is
// paused (SIGSTOP: connections stay open, nothing answers), resumed, then
// killed (SIGKILL: a crash) and started again (crash recovery). Once every
// /readyz answers 200, fresh keys of a fail=local and a fail=closed rule
// get exactly their limit, and no 503. /readyz never says 200 while a
// breaker is open. Ten times.
func TestFaultPauseAndKill(t *testing.T) {
	t.Parallel()
	c, gws := clusterGateways(t, 3)
	waitReady(t, gws, 10*time.Second)
	faultRounds(t, gws, gws, 3, 30*time.Second, func() {
		c.Pause(t)
		waitOpen(t, gws)
		c.Resume(t)
		time.Sleep(200 * time.Millisecond) // the backlog of the pause meets the probes
		c.Kill(t)
		c.Start(t)
	})
}
