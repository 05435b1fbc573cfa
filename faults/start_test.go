//go:build unix

package faults

// Starts: without a database, and cold, at once, on a loaded machine.

import (
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestFaultStartWithoutDatabase: a gateway starts while its database is
// down. Its public listener opens after SLUICE_START_TIMEOUT, not before;
// meanwhile /readyz answers 503; every request then gets its rule's fail
// mode. The database starts: without a restart the gateway becomes ready
// and decides exactly, with a second gateway that started later.
func TestFaultStartWithoutDatabase(t *testing.T) {
	c := parallelCluster(t)
	c.Stop(t)
	up := newUpstream(t)
	env := faultEnv(up.URL, c.URL())
	env["SLUICE_DB_SCHEMA"] = "fresh" // migrated in the background, once the database answers
	env["SLUICE_START_TIMEOUT"] = "1500ms"
	fg, public := startGateway(t, env, gateway.Options{Logger: zap.NewNop()})
	began := time.Now()
	if code := fg.readyz(t); code != 503 {
		t.Errorf("/readyz %d with the database down, want 503", code)
	}
	select {
	case fg.url = <-public:
	case <-time.After(30 * time.Second):
		t.Fatal("the public listener never opened")
	}
	if opened := time.Since(began); opened < 1400*time.Millisecond {
		t.Errorf("the public listener opened %v after the start, before SLUICE_START_TIMEOUT (1.5s)", opened)
	}
	pgtest.ClearOf(t, time.Hour, 10*time.Second)
	for i := range 7 {
		if r := fg.mustPost(t, "/open", "k"); r.status != 200 {
			t.Errorf("fail=open without a database: %d", r.status)
		}
		if r := fg.mustPost(t, "/closed", "k"); r.status != 503 {
			t.Errorf("fail=closed without a database: %d", r.status)
		}
		if r, want := fg.mustPost(t, "/local", "k"), map[bool]int{true: 200, false: 429}[i < 5]; r.status != want {
			t.Errorf("fail=local request %d without a database: %d, want %d", i+1, r.status, want)
		}
	}
	if code := fg.readyz(t); code != 503 {
		t.Errorf("/readyz %d with the database down, want 503", code)
	}

	c.Start(t)
	second := startFault(t, env)
	gws := []*faultGateway{fg, second}
	took := waitReady(t, gws, 20*time.Second)
	expectExactNow(t, gws, "after-start")
	t.Logf("ready %v after the database started", took)
}

// TestFaultColdStartUnderLoad: three gateways, real processes of the
// sluice binary, start at once on an empty schema while two busy processes
// keep both cores of the machine busy. The moment each public port
// accepts, it gets ten concurrent requests on one key of limit 5 (of a
// fail=local rule, which a failed decision would let through per
// instance): exactly 5 of the 30 pass, ten times out of ten. Each
// gateway's listener opens only once its store is ready: migrated, pool
// connected and warm.
func TestFaultColdStartUnderLoad(t *testing.T) {
	bin := sluiceBinary(t)
	db := parallelDB(t) // for its connection; each run makes a schema of its own
	up := newUpstream(t)
	for run := range 10 {
		// The 30 requests of the run, however late each port opens, in one
		// window of the hour rule.
		pgtest.ClearOf(t, time.Hour, 15*time.Second)
		env := faultEnv(up.URL, db.URL)
		env["SLUICE_DB_SCHEMA"] = pgtest.NewSchema(t, db.Pool, "cold_")
		env["SLUICE_DB_TIMEOUT"] = coldStartTimeout.String()
		stopLoad := busyCores(t, 2, time.Minute)
		var (
			mu    sync.Mutex
			codes = map[int]int{}
			wg    sync.WaitGroup
			procs []*process
		)
		for range 3 {
			p := startProcess(t, bin, env)
			procs = append(procs, p)
			wg.Go(func() {
				if !p.waitAccepts(60 * time.Second) {
					t.Errorf("a public port did not accept within 60s:\n%s", p.output())
					return
				}
				g := p.gateway()
				const waited = "sluice_db_pool_empty_acquire_total"
				before, err := p.metricValue(waited)
				if err != nil {
					t.Error(err)
					return
				}
				defer func() {
					// Whatever the deadline, a decision of the burst that
					// waited for a connection to be made is a pool that was
					// not warm when the port opened.
					if after, err := p.metricValue(waited); err != nil {
						t.Error(err)
					} else if after != before {
						t.Errorf("run %d: %v acquires waited for a database connection during the burst: the pool was not warm when the public port opened", run+1, after-before)
					}
				}()
				var inner sync.WaitGroup
				for range 10 {
					inner.Go(func() {
						rep, err := g.post("/local", "cold")
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						codes[rep.status]++
						mu.Unlock()
					})
				}
				inner.Wait()
			})
		}
		wg.Wait()
		stopLoad()
		var metrics []string
		for _, p := range procs {
			metrics = append(metrics, p.storeMetrics())
			p.stop(t)
		}
		if codes[200] != 5 || codes[429] != 25 {
			var logs []string
			for i, p := range procs {
				logs = append(logs, metrics[i], p.output())
			}
			t.Fatalf("run %d: 30 requests at the moment three cold gateways opened, on a loaded machine: %v, want 5×200 and 25×429; logs:\n%s",
				run+1, codes, strings.Join(logs, "\n"))
		}
	}
}

// coldStartTimeout is the decision deadline of TestFaultColdStartUnderLoad.
// Not the default 50ms: with both cores kept busy, this machine's
// scheduling alone makes a decision miss 50ms now and then, at start-up or
// long after it (three warm gateways under the same load, 3 s after the
// last opened, let 7 and 9 of 30 through a limit of 5 in 2 of 20 bursts),
// and a missed deadline is the fail mode's business, not readiness'. What
// this test is about is what start-up adds. Two parts of that are checked
// without a clock: the pool is warm when the port opens
// (TestProbeWarmsThePool, in limiter/postgres) and no decision of the
// burst waits for a connection to be made (the pool's empty acquires,
// above). What is left to the deadline is the rest: a listener open before
// the store is ready, a breaker not yet closed. Those fail every time, at
// any deadline. 250ms was tried first; on a busier day it failed 4 of
// about 190 cold starts, each time with the burst's decisions taking 250
// to 500ms in one gateway while Postgres spent 30 to 135ms on each of its
// decide statements and up to 415ms warming the other gateways' new
// connections; 400ms passed 100 of 100 that day.
const coldStartTimeout = 400 * time.Millisecond
