//go:build unix

package faults

// Gateways in-process, requests to them, and what their metrics and logs
// say.

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
)

// faultRules are the rules of the fault tests: one per fail mode, each on
// its own path, keyed by the X-Key header so that a test picks its keys.
const faultRules = `
open:   POST /open   by header(X-Key) 1000/1h fail=open
closed: POST /closed by header(X-Key) 5/1h    fail=closed
local:  POST /local  by header(X-Key) 5/1h    fail=local
`

// faultEnv is the environment of a gateway on dbURL in front of upstream.
func faultEnv(upstream, dbURL string) map[string]string {
	return map[string]string{
		"SLUICE_UPSTREAM":     upstream,
		"SLUICE_RULES":        faultRules,
		"SLUICE_DATABASE_URL": dbURL,
		"SLUICE_HASH_KEY":     "fault-test-secret-0123456789",
		"SLUICE_DB_TIMEOUT":   "250ms",
	}
}

// faultGateway is a gateway serving on loopback: in-process (g, with its
// logs observed and the time it spends on each request measured), or a
// process of the sluice binary (url and admin only).
type faultGateway struct {
	url, admin string
	g          *gateway.Gateway
	logs       *observer.ObservedLogs
	served     *durations // how long each request took inside the gateway
	stop       func() error
}

// startFault runs a gateway for env until the test ends (or stop is
// called), logging at Info and above into an observer, and returns once
// its public listener is open.
func startFault(t *testing.T, env map[string]string) *faultGateway {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	served := &durations{}
	g, public := startGateway(t, env, gateway.Options{Logger: zap.New(core), Wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			began := time.Now()
			h.ServeHTTP(w, r)
			served.add(time.Since(began))
		})
	}})
	g.logs, g.served = logs, served
	select {
	case g.url = <-public:
	case <-time.After(60 * time.Second):
		t.Fatal("the public listener did not open within 60s")
	}
	return g
}

// schemaEnv is faultEnv for a gateway on db, a schema pgtest.New made and
// migrated: the gateway does not migrate it again.
func schemaEnv(upstream string, db *pgtest.DB) map[string]string {
	env := faultEnv(upstream, db.URL)
	env["SLUICE_DB_SCHEMA"] = db.Schema
	env["SLUICE_AUTO_MIGRATE"] = "false"
	return env
}

// parallelDB runs t in parallel with the other fault tests, on a schema of
// its own in the shared database (pgtest.New): for the tests that break
// nothing of the server's.
func parallelDB(t *testing.T) *pgtest.DB {
	t.Helper()
	t.Parallel()
	return pgtest.New(t)
}

// parallelCluster runs t in parallel with the other fault tests, on a
// private cluster of its own: what the test stops, locks or breaks there
// touches no other test. (The tests that bound answer times run alone and
// call pgtest.NewCluster themselves.)
func parallelCluster(t *testing.T) *pgtest.Cluster {
	t.Helper()
	t.Parallel()
	return pgtest.NewCluster(t, pgtest.ClusterOptions{})
}

// clusterGateways starts a private cluster and n gateways on it, as
// gatewaysOn starts them.
func clusterGateways(t *testing.T, n int) (*pgtest.Cluster, []*faultGateway) {
	t.Helper()
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	return c, gatewaysOn(t, c.URL(), n)
}

// gatewaysOn starts n gateways on dbURL with faultEnv, in front of one
// upstream, each as startFault starts it.
func gatewaysOn(t *testing.T, dbURL string, n int) []*faultGateway {
	t.Helper()
	up := newUpstream(t)
	env := faultEnv(up.URL, dbURL)
	var gws []*faultGateway
	for range n {
		gws = append(gws, startFault(t, env))
	}
	return gws
}

// startGateway runs a gateway for env and opts on loopback until the test
// ends (or stop is called), as main runs one: New, then Run with an admin
// listener that serves at once and a public one that Run opens once the
// store is ready, or SLUICE_START_TIMEOUT has passed. The public
// listener's URL arrives on the channel then; g.url is empty until the
// caller sets it.
func startGateway(t *testing.T, env map[string]string, opts gateway.Options) (g *faultGateway, public <-chan string) {
	t.Helper()
	gw, err := gateway.New(env, opts)
	if err != nil {
		t.Fatal(err)
	}
	admin, public, stop := proctest.Serve(t, gw.Run)
	return &faultGateway{admin: admin, g: gw, stop: stop}, public
}

// durations collects the times the gateway took to serve requests, from
// the moment its handler got a request to the moment it returned: what
// the gateway itself spent, without the client's side.
type durations struct {
	mu sync.Mutex
	ds []time.Duration
}

func (d *durations) add(x time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ds = append(d.ds, x)
}

// take returns the durations collected so far and forgets them.
func (d *durations) take() []time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	ds := d.ds
	d.ds = nil
	return ds
}

// faultClient is shared by the fault tests: enough idle connections for
// their concurrency, and a timeout that turns a hung request into a
// failure instead of a hung test.
var faultClient = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 128, IdleConnTimeout: 30 * time.Second},
}

// reply is one answered request.
type reply struct {
	status     int
	retryAfter string
	ctype      string
	took       time.Duration
}

// post sends POST path with X-Key: key to the gateway.
func (g *faultGateway) post(path, key string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, g.url+path, nil)
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("X-Key", key)
	began := time.Now()
	res, err := faultClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	io.Copy(io.Discard, res.Body) //nolint:errcheck // draining for reuse
	res.Body.Close()
	return reply{
		status: res.StatusCode, retryAfter: res.Header.Get("Retry-After"),
		ctype: res.Header.Get("Content-Type"), took: time.Since(began),
	}, nil
}

// mustPost is post failing t on a transport error.
func (g *faultGateway) mustPost(t *testing.T, path, key string) reply {
	t.Helper()
	r, err := g.post(path, key)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return r
}

// metrics scrapes the gateway's /metrics into series → value, the series
// written as in the exposition, e.g. sluice_store_errors_total{kind="timeout"}.
func (g *faultGateway) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	return proctest.Scrape(t, faultClient, g.admin+"/metrics")
}

// metric returns one series of the gateway's metrics, 0 when absent.
func (g *faultGateway) metric(t *testing.T, series string) float64 {
	t.Helper()
	return g.metrics(t)[series]
}

// waitDecides waits at most limit until the gateway's store decides again
// (a fail=closed request no longer gets 503), and returns how long that
// took.
func (g *faultGateway) waitDecides(t *testing.T, limit time.Duration, what string) time.Duration {
	t.Helper()
	return waitFor(t, limit, what, func() bool { return g.mustPost(t, "/closed", "probe").status != 503 })
}

// expectErrorsCounted fails t unless the gateway counted a store error of
// kind.
func (g *faultGateway) expectErrorsCounted(t *testing.T, kind string) {
	t.Helper()
	if g.metric(t, `sluice_store_errors_total{kind="`+kind+`"}`) == 0 {
		// What was counted, and what the gateway said: a CI run under
		// load once counted no read_only error here, and said no more.
		t.Errorf("no %s error counted; store errors %v", kind, storeErrorSeries(g.metrics(t)))
		if g.logs != nil {
			for _, e := range g.logs.All() {
				if e.Level >= zapcore.WarnLevel {
					t.Logf("gateway %s %s %s %v", e.Time.Format("15:04:05.000"), e.Level, e.Message, e.ContextMap())
				}
			}
		}
	}
}

// breakerState is the gateway's sluice_store_breaker_state.
func (g *faultGateway) breakerState(t *testing.T) float64 {
	t.Helper()
	return g.metric(t, "sluice_store_breaker_state")
}

// decisionBuckets returns the cumulative counts of the decision duration
// histogram by upper bound, and the total count.
func decisionBuckets(m map[string]float64) (map[float64]float64, float64) {
	b := map[float64]float64{}
	for k, v := range m {
		le, ok := strings.CutPrefix(k, `sluice_decision_duration_seconds_bucket{le="`)
		if !ok {
			continue
		}
		le = strings.TrimSuffix(le, `"}`)
		bound := math.Inf(1)
		if le != "+Inf" {
			bound, _ = strconv.ParseFloat(le, 64)
		}
		b[bound] = v
	}
	return b, m["sluice_decision_duration_seconds_count"]
}

// p99Bound returns the smallest histogram bound under which at least 99%
// of the decisions between before and after fell: an upper bound of their
// p99. n is the number of decisions.
func p99Bound(before, after map[string]float64) (bound float64, n float64) {
	b0, n0 := decisionBuckets(before)
	b1, n1 := decisionBuckets(after)
	n = n1 - n0
	bounds := make([]float64, 0, len(b1))
	for k := range b1 {
		bounds = append(bounds, k)
	}
	slices.Sort(bounds)
	for _, k := range bounds {
		if b1[k]-b0[k] >= 0.99*n {
			return k, n
		}
	}
	return math.Inf(1), n
}

// fractionUnder returns the fraction of the decisions between before and
// after that took at most bound (a bound of the histogram).
func fractionUnder(before, after map[string]float64, bound float64) float64 {
	b0, n0 := decisionBuckets(before)
	b1, n1 := decisionBuckets(after)
	if n1 == n0 {
		return 0
	}
	return (b1[bound] - b0[bound]) / (n1 - n0)
}

// waitFor polls cond until it holds and returns how long that took, or
// fails t after limit. Faults end by external events (a server starting, a
// probe succeeding), so polling them is the only way to see them.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	began := time.Now()
	for !cond() {
		if time.Since(began) > limit {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(began)
}

// percentile returns the p-th percentile (0 < p <= 100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// upstream is the API behind the gateways; it counts the requests that
// reach it, by path.
type upstream struct {
	*httptest.Server
	mu   sync.Mutex
	hits map[string]int
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{hits: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.hits[r.URL.Path]++
		u.mu.Unlock()
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[path]
}

// poolConnections is the number of connections in g's database pool
// (sluice_db_pool_connections, every state), gathered in-process.
func (g *faultGateway) poolConnections(t *testing.T) int {
	t.Helper()
	families, err := g.g.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() == "sluice_db_pool_connections" {
			for _, m := range f.GetMetric() {
				n += m.GetGauge().GetValue()
			}
		}
	}
	return int(n)
}

// burst sends n concurrent POST path with X-Key: key, spread over gws,
// and counts the statuses; a transport error fails t.
func burst(t *testing.T, gws []*faultGateway, path, key string, n int) map[int]int {
	t.Helper()
	return proctest.CountStatuses(t, n, func(i int) (int, error) {
		r, err := gws[i%len(gws)].post(path, key)
		return r.status, err
	})
}

// expectExact checks that 20 concurrent requests on a fresh key of the
// closed rule (limit 5), spread over gws, let exactly 5 through: the
// shared store decides.
func expectExact(t *testing.T, gws []*faultGateway, key string) {
	t.Helper()
	pgtest.ClearOf(t, time.Hour, 10*time.Second)
	if codes := burst(t, gws, "/closed", key, 20); codes[200] != 5 || codes[429] != 15 {
		t.Fatalf("20 requests on key %s against limit 5: %v, want 5×200 and 15×429", key, codes)
	}
}

// logged returns the observed log entries at level or above whose message
// contains msg and whose kind field is kind (any kind when empty).
func logged(logs *observer.ObservedLogs, level zapcore.Level, msg, kind string) []observer.LoggedEntry {
	var out []observer.LoggedEntry
	for _, e := range logs.All() {
		if e.Level < level || !strings.Contains(e.Message, msg) {
			continue
		}
		if kind != "" && e.ContextMap()["kind"] != kind {
			continue
		}
		out = append(out, e)
	}
	return out
}
