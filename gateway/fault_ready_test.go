//go:build unix

package gateway

// Fault tests of the moments that are not calm: a start, and the moment
// after an outage heals. The promise under test: once /readyz answers 200,
// decisions are exact at once; no request passes on a failed decision
// while the database answers.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/limiter"
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
	for _, path := range []string{"/closed", "/local"} {
		if codes := burst(t, gws, path, key, 20); codes[200] != 5 || codes[429] != 15 {
			states := make([]float64, len(gws))
			for i, g := range gws {
				states[i] = g.breakerState(t)
			}
			t.Fatalf("right after every /readyz said 200: 20 requests on a fresh key of %s (limit 5): %v, want 5×200 and 15×429 (breaker states %v)",
				path, codes, states)
		}
	}
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
// with its breaker: a sample whose breaker state did not change while
// /readyz was asked must see 200 exactly when the breaker is closed.
type readinessWatch struct {
	loops
	samples atomic.Int64
}

func watchReadiness(gws []*faultGateway) *readinessWatch {
	w := &readinessWatch{loops: newLoops(10)}
	for i, g := range gws {
		w.loop(func() bool {
			before := g.g.backend.breaker.State()
			res, err := faultClient.Get(g.admin + "/readyz")
			if err != nil {
				w.fail(fmt.Sprintf("gateway %d: %v", i, err))
				return false
			}
			res.Body.Close()
			after := g.g.backend.breaker.State()
			if before == after {
				w.samples.Add(1)
				if ready := res.StatusCode == http.StatusOK; ready != (before == limiter.BreakerClosed) {
					w.fail(fmt.Sprintf("gateway %d: /readyz %d with the breaker %v", i, res.StatusCode, before))
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

// TestFaultIdleInstanceRecovers: two gateways on one database, traffic on
// one only. The database stops for a moment and starts again. Once both
// /readyz answer 200, a burst spread over both lets exactly the limit
// through: the idle one learnt of the outage by itself and made its pool
// warm again before saying ready. Ten times.
func TestFaultIdleInstanceRecovers(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	up := newUpstream(t)
	env := faultEnv(up.URL, c.URL())
	busy, idle := startFault(t, env), startFault(t, env)
	gws := []*faultGateway{busy, idle}
	waitReady(t, gws, 10*time.Second)
	expectExactNow(t, gws, "before")
	faultRounds(t, gws, []*faultGateway{busy}, 1, 20*time.Second, func() {
		c.Stop(t)
		waitOpen(t, gws)
		time.Sleep(500 * time.Millisecond) // an outage of a moment
		c.Start(t)
	})
}

// TestFaultPauseAndKill: under traffic on every gateway, Postgres is
// paused (SIGSTOP: connections stay open, nothing answers), resumed, then
// killed (SIGKILL: a crash) and started again (crash recovery). Once every
// /readyz answers 200, fresh keys of a fail=local and a fail=closed rule
// get exactly their limit, and no 503. /readyz never says 200 while a
// breaker is open. Ten times.
func TestFaultPauseAndKill(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	up := newUpstream(t)
	env := faultEnv(up.URL, c.URL())
	gws := []*faultGateway{startFault(t, env), startFault(t, env), startFault(t, env)}
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

// TestFaultRestartUnderTraffic: Postgres restarts in the middle of steady
// traffic. Decisions that fail while it is down apply their modes; a key
// the database had found over its limit is never let through, during the
// outage (the fast path remembers it) or after; and once every /readyz
// answers 200 the store decides fresh keys exactly.
func TestFaultRestartUnderTraffic(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	up := newUpstream(t)
	env := faultEnv(up.URL, c.URL())
	gws := []*faultGateway{startFault(t, env), startFault(t, env)}
	waitReady(t, gws, 10*time.Second)
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

// TestFaultStartWithoutDatabase: a gateway starts while its database is
// down. Its public listener opens after SLUICE_START_TIMEOUT, not before;
// meanwhile /readyz answers 503; every request then gets its rule's fail
// mode. The database starts: without a restart the gateway becomes ready
// and decides exactly, with a second gateway that started later.
func TestFaultStartWithoutDatabase(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	c.Stop(t)
	up := newUpstream(t)
	env := faultEnv(up.URL, c.URL())
	env["SLUICE_DB_SCHEMA"] = "fresh" // migrated in the background, once the database answers
	env["SLUICE_START_TIMEOUT"] = "1500ms"
	g, r, public := serveGatewayAsync(t, env, Options{Logger: zap.NewNop()})
	began := time.Now()
	fg := &faultGateway{admin: r.admin, g: g, stop: r.stop}
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
	db := pgtest.New(t) // for its connection; each run makes a schema of its own
	up := newUpstream(t)
	for run := range 10 {
		schema := fmt.Sprintf("%s_cold%d", db.Schema, run)
		t.Cleanup(func() {
			db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") //nolint:errcheck // best effort
		})
		stopLoad := busyCores(t, 2)
		var (
			mu    sync.Mutex
			codes = map[int]int{}
			wg    sync.WaitGroup
			procs []*process
		)
		for range 3 {
			p := startProcess(t, bin, map[string]string{
				"SLUICE_UPSTREAM":     up.URL,
				"SLUICE_RULES":        faultRules,
				"SLUICE_DATABASE_URL": db.URL,
				"SLUICE_DB_SCHEMA":    schema,
				"SLUICE_HASH_KEY":     "fault-test-secret-0123456789",
				"SLUICE_DB_TIMEOUT":   coldStartTimeout.String(),
			})
			procs = append(procs, p)
			wg.Go(func() {
				if !p.waitAccepts(60 * time.Second) {
					t.Errorf("a public port did not accept within 60s:\n%s", p.output())
					return
				}
				g := &faultGateway{url: "http://" + p.public}
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

// sluiceBinary builds the sluice binary once per test run, as users build
// it (no race detector), and returns its path.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	return proctest.Build(t, "github.com/sluicehq/sluice")
}

// TestMain removes the binary sluiceBinary built, if any, once every test
// of the package has run.
func TestMain(m *testing.M) {
	code := m.Run()
	proctest.RemoveBuilt()
	os.Exit(code)
}

// process is a sluice binary running as a child of the test, on free
// loopback ports, its output collected.
type process struct {
	cmd           *exec.Cmd
	public, admin string
	out           *proctest.Buffer
	exited        chan struct{}
}

// startProcess starts bin with env plus free SLUICE_LISTEN and
// SLUICE_ADMIN_LISTEN ports; it is killed if the test binary dies, and
// stopped when the test ends.
func startProcess(t *testing.T, bin string, env map[string]string) *process {
	t.Helper()
	p := &process{public: proctest.FreeAddr(t), admin: proctest.FreeAddr(t), out: &proctest.Buffer{}}
	p.cmd = exec.Command(bin)
	p.cmd.Env = []string{"SLUICE_LISTEN=" + p.public, "SLUICE_ADMIN_LISTEN=" + p.admin, "SLUICE_LOG_LEVEL=warn"}
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	exited, err := proctest.StartChild(p.cmd, syscall.SIGKILL)
	if err != nil {
		t.Fatal(err)
	}
	p.exited = exited
	t.Cleanup(func() { p.stop(t) })
	return p
}

// waitAccepts waits until the public port accepts a connection.
func (p *process) waitAccepts(limit time.Duration) bool {
	return proctest.Accepts(p.public, p.exited, limit, 2*time.Millisecond)
}

// stop sends SIGTERM and waits for the process to exit.
func (p *process) stop(t *testing.T) {
	if !proctest.Stop(p.cmd, p.exited, 30*time.Second) {
		t.Errorf("sluice did not stop within 30s of SIGTERM:\n%s", p.output())
	}
}

func (p *process) output() string { return p.out.String() }

// metricValue returns the value of one series of the process's /metrics,
// written as in the exposition; it is an error when the series is absent.
// Unlike proctest.Scrape it may be called from any goroutine.
func (p *process) metricValue(series string) (float64, error) {
	res, err := faultClient.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no series %s", p.admin, series)
}

// storeMetrics returns the store's latency histogram and statement count
// from the process's /metrics, for failure messages.
func (p *process) storeMetrics() string {
	res, err := faultClient.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer res.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "sluice_store_duration_seconds_bucket") || strings.HasPrefix(l, "sluice_db_decide_statements_total") ||
			strings.HasPrefix(l, "sluice_db_decisions_total") || strings.HasPrefix(l, "sluice_store_breaker") || strings.HasPrefix(l, "sluice_db_pool_") {
			b.WriteString(l + " ")
		}
	}
	return b.String()
}

// busyCores starts n processes that each keep a core busy, for at most a
// minute; the returned function stops them.
func busyCores(t *testing.T, n int) func() {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	var cmds []*exec.Cmd
	for range n {
		cmd := exec.CommandContext(ctx, "sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			cancel()
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			for _, c := range cmds {
				c.Wait() //nolint:errcheck // killed
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestMemoryFloodBounded: a sluice process on the in-memory store, with
// SLUICE_MEMORY_MAX_KEYS=1000, gets 50,000 requests with fresh keys. Its
// resident memory stays within a few MB of where it was before the flood,
// and keys that were over their limit before it stay limited through it.
func TestMemoryFloodBounded(t *testing.T) {
	up := newUpstream(t)
	p := startProcess(t, sluiceBinary(t), map[string]string{
		"SLUICE_UPSTREAM":        up.URL,
		"SLUICE_RULES":           "flood: POST /flood by header(X-Key) 3/1h",
		"SLUICE_MEMORY_MAX_KEYS": "1000",
	})
	if !p.waitAccepts(30 * time.Second) {
		t.Fatalf("the public port did not open:\n%s", p.output())
	}
	g := &faultGateway{url: "http://" + p.public}
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
	admin := &faultGateway{admin: "http://" + p.admin}
	m := admin.metrics(t)
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

// rss returns the resident memory of process pid in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
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
