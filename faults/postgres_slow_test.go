//go:build unix

package faults

// Postgres slow: a lock held on the counters.

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestFaultPostgresSlow: a session holds an exclusive lock on the counters
// table. Requests are answered within SLUICE_DB_TIMEOUT plus a small
// margin; goroutines, pooled connections and server sessions stay bounded;
// decisions resume when the lock goes.
func TestFaultPostgresSlow(t *testing.T) {
	// Not parallel: it bounds the gateway's answer time and counts the
	// goroutines of the whole test process, which the other fault tests'
	// load would be part of. It runs before them.
	const (
		timeout = 250 * time.Millisecond
		margin  = 100 * time.Millisecond
		workers = 8
	)
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	up := newUpstream(t)
	env := faultEnv(up.URL, c.URL()+"&pool_max_conns=4")
	env["SLUICE_DB_TIMEOUT"] = timeout.String()
	g := startFault(t, env)
	expectExact(t, []*faultGateway{g}, "before")

	ctx := context.Background()
	locker, watcher := c.Conn(t, ctx), c.Conn(t, ctx)
	if _, err := locker.Exec(ctx, "BEGIN; LOCK TABLE sluice.counters IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	baseline := runtime.NumGoroutine()
	g.served.take()

	// Sample goroutines, the pool and the server's sessions while the
	// load runs.
	var (
		mu                                  sync.Mutex
		maxGoroutines, maxConns, maxBackend int
	)
	sampleStop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampleStop:
				return
			case <-tick.C:
			}
			var backends int
			if err := watcher.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sluice'").Scan(&backends); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			maxGoroutines = max(maxGoroutines, runtime.NumGoroutine())
			maxConns = max(maxConns, g.poolConnections(t))
			maxBackend = max(maxBackend, backends)
			mu.Unlock()
		}
	}()

	var (
		lmu   sync.Mutex
		took  []time.Duration
		codes = map[string]map[int]int{"/open": {}, "/closed": {}}
		wg    sync.WaitGroup
	)
	end := time.Now().Add(2 * time.Second)
	for w := range workers {
		wg.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				path := []string{"/open", "/closed"}[(w+i)%2]
				r, err := g.post(path, fmt.Sprintf("slow-%d-%d", w, i))
				if err != nil {
					t.Error(err)
					return
				}
				lmu.Lock()
				took = append(took, r.took)
				codes[path][r.status]++
				lmu.Unlock()
			}
		})
	}
	wg.Wait()
	close(sampleStop)
	<-sampled
	state := g.breakerState(t)
	if _, err := locker.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}

	served := g.served.take()
	worst := percentile(served, 100)
	t.Logf("lock held: %d requests by %d clients; inside the gateway: p50 %v, p99 %v, max %v; round trips: p50 %v, p99 %v, max %v; statuses %v",
		len(took), workers, percentile(served, 50), percentile(served, 99), worst,
		percentile(took, 50), percentile(took, 99), percentile(took, 100), codes)
	t.Logf("bounded: goroutines %d at the start, at most %d; pool connections at most %d (max 4); server sessions at most %d",
		baseline, maxGoroutines, maxConns, maxBackend)
	if worst > timeout+margin {
		t.Errorf("the gateway took up to %v to answer, want under SLUICE_DB_TIMEOUT %v + %v", worst, timeout, margin)
	}
	// Seen from the client, on a busy machine, the round trip adds
	// scheduling noise; still nobody waits for the lock (2 s).
	if rt := percentile(took, 100); rt > time.Second {
		t.Errorf("a round trip took %v: requests wait for the lock", rt)
	}
	if len(codes["/open"]) != 1 || codes["/open"][200] == 0 || len(codes["/closed"]) != 1 || codes["/closed"][503] == 0 {
		t.Errorf("statuses %v: want only 200 for fail=open and only 503 for fail=closed", codes)
	}
	if state == 0 {
		t.Errorf("breaker state %v under a held lock, want open (2), or half-open (1) while its probe waits", state)
	}
	if g.metric(t, `sluice_store_errors_total{kind="timeout"}`) == 0 {
		t.Error("no timeout counted")
	}
	// No pile-up: a fixed allowance per client, not growing with time.
	if maxGoroutines > baseline+8*workers {
		t.Errorf("goroutines reached %d from %d with %d clients", maxGoroutines, baseline, workers)
	}
	if maxConns > 4 {
		t.Errorf("pool reached %d connections, more than pool_max_conns=4", maxConns)
	}
	if maxBackend > 8 {
		t.Errorf("the server had up to %d sessions of sluice: timed-out statements pile up", maxBackend)
	}

	recovered := g.waitDecides(t, 10*time.Second, "decisions resume after the lock")
	t.Logf("store decisions again %v after the lock was released", recovered)
	expectExact(t, []*faultGateway{g}, "after")
	// Once the clients' idle keep-alive connections are closed, nothing of
	// the load is left behind.
	waitFor(t, 20*time.Second, "goroutines back to their number before the load", func() bool {
		faultClient.CloseIdleConnections()
		return runtime.NumGoroutine() <= baseline+10
	})
}
