//go:build unix

package faults

// The in-memory store flooded with fresh keys.

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestMemoryFloodBounded: a sluice process on the in-memory store, with
// SLUICE_MEMORY_MAX_KEYS=1000, gets 50,000 requests with fresh keys. Its
// resident memory stays within a few MB of where it was before the flood,
// and keys that were over their limit before it stay limited through it.
func TestMemoryFloodBounded(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startGatewayProcesses(t, 1, map[string]string{
		"SLUICE_UPSTREAM":        up.URL,
		"SLUICE_RULES":           "flood: POST /flood by header(X-Key) 3/1h",
		"SLUICE_MEMORY_MAX_KEYS": "1000",
	})[0]
	g := p.gateway()
	// The victims stay over their limit through the flood.
	pgtest.ClearOf(t, time.Hour, 15*time.Second)
	send := func(key string) int {
		r, err := g.post("/flood", key)
		if err != nil {
			t.Fatal(err)
		}
		return r.status
	}
	// Victims over their limit, and a warm-up that fills the store.
	for v := range 10 {
		for range 3 {
			send(fmt.Sprint("victim-", v))
		}
		if s := send(fmt.Sprint("victim-", v)); s != 429 {
			t.Fatalf("victim %d not over its limit before the flood: %d", v, s)
		}
	}
	for i := range 2000 {
		send(fmt.Sprint("warm-", i))
	}
	before := rss(t, p.cmd.Process.Pid)

	const flood, workers = 50000, 8
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Go(func() {
			for i := next.Add(1); i <= flood; i = next.Add(1) {
				if _, err := g.post("/flood", fmt.Sprint("flood-", i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	after := rss(t, p.cmd.Process.Pid)
	for v := range 10 {
		if s := send(fmt.Sprint("victim-", v)); s != 429 {
			t.Errorf("victim %d after the flood: %d, want 429", v, s)
		}
	}
	m := g.metrics(t)
	if n := m[`sluice_memory_counters{store="memory"}`]; n > 1000+64 {
		t.Errorf("sluice_memory_counters %v, want at most SLUICE_MEMORY_MAX_KEYS and the overflow counters", n)
	}
	if m[`sluice_memory_overflowed_total{store="memory"}`] == 0 {
		t.Error("sluice_memory_overflowed_total is 0 after the flood")
	}
	t.Logf("resident memory %.1f MB before %d fresh keys, %.1f MB after", float64(before)/1e6, flood, float64(after)/1e6)
	if grew := after - before; grew > 8<<20 {
		t.Errorf("resident memory grew by %.1f MB over the flood, want a few MB at most", float64(grew)/1e6)
	}
}
