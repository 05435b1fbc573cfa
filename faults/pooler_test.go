//go:build unix

package faults

// PgBouncer between the gateway and Postgres, in transaction pooling.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter/postgres"
)

// TestFaultPgBouncer: 10,000 decisions through PgBouncer in transaction
// pooling mode, with the connection string the README gives: no error,
// exact counts. Migrations run directly against Postgres, since their
// advisory lock needs a session of its own.
func TestFaultPgBouncer(t *testing.T) {
	c := parallelCluster(t)
	bouncer := c.NewPgBouncer(t, map[string]string{"pool_mode": "transaction", "default_pool_size": "8"})
	ctx := context.Background()
	pool := pgtest.NewPool(t, c.URL(), 2)
	if _, err := postgres.Migrate(ctx, pool, "sluice"); err != nil {
		t.Fatal(err)
	}

	up := newUpstream(t)
	env := faultEnv(up.URL, bouncer.URL("default_query_exec_mode=exec"))
	env["SLUICE_RULES"] = "bulk: POST /bulk by header(X-Key) 60/1h fail=closed"
	env["SLUICE_AUTO_MIGRATE"] = "false"
	env["SLUICE_LOCAL_CACHE_SIZE"] = "0" // every decision goes to the database
	env["SLUICE_DB_TIMEOUT"] = "5s"      // exactness, not latency, is under test
	g := startFault(t, env)
	pgtest.ClearOf(t, time.Hour, 45*time.Second)

	const keys, perKey, workers = 100, 100, 16
	var (
		mu    sync.Mutex
		codes = map[int]int{}
		wg    sync.WaitGroup
		next  = make(chan int)
	)
	for range workers {
		wg.Go(func() {
			for i := range next {
				r, err := g.post("/bulk", fmt.Sprintf("key-%d", i%keys))
				mu.Lock()
				if err != nil {
					codes[-1]++
				} else {
					codes[r.status]++
				}
				mu.Unlock()
			}
		})
	}
	began := time.Now()
	for i := range keys * perKey {
		next <- i
	}
	close(next)
	wg.Wait()
	t.Logf("%d decisions through PgBouncer (transaction pooling) in %v: %v", keys*perKey, time.Since(began), codes)

	if codes[200] != keys*60 || codes[429] != keys*(perKey-60) || len(codes) != 2 {
		t.Errorf("statuses %v, want exactly %d×200 and %d×429", codes, keys*60, keys*(perKey-60))
	}
	if n := up.count("/bulk"); n != keys*60 {
		t.Errorf("upstream saw %d requests, want %d", n, keys*60)
	}
	m := g.metrics(t)
	for k, v := range m {
		if strings.HasPrefix(k, "sluice_store_errors_total") && v != 0 {
			t.Errorf("%s = %v, want no store error", k, v)
		}
	}
	if e := logged(g.logs, zapcore.WarnLevel, "", ""); len(e) != 0 {
		t.Errorf("%d log lines at Warn or above, first: %s %v", len(e), e[0].Message, e[0].ContextMap())
	}
	var rows, sum int64
	if err := pool.QueryRow(ctx, "SELECT count(*), coalesce(sum(n), 0) FROM sluice.counters WHERE rule = 'bulk'").Scan(&rows, &sum); err != nil {
		t.Fatal(err)
	}
	if rows != keys || sum != keys*60 {
		t.Errorf("counters: %d rows summing to %d, want %d rows summing to %d", rows, sum, keys, keys*60)
	}
	if t.Failed() {
		t.Logf("pgbouncer log:\n%s", bouncer.Log())
	}
}
