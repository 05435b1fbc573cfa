//go:build unix

package faults

// The burst-exactness matrix: three gateway processes with the default
// settings (SLUICE_DB_TIMEOUT 50ms, fail=local, leases on) on one
// database, every algorithm × limits 5, 20, 100 and 3,000 × the traffic
// that makes a limit matter: a burst of three times the limit, 1,000 at
// once on a limit of 5, two bursts that straddle the limit, a client that
// walks the gateways one request after another, a paced trickle, and 300
// keys at once. Each must be exact: min(N, L) allowed, and the walking
// client gets 200 for exactly its first L requests. It runs on a quiet
// machine and beside two CPU-bound loops: load is not an outage.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// burstAlgorithms and burstLimits span the matrix; burstRules has one rule
// per cell, on the path /ALG/LIMIT.
var (
	burstAlgorithms = []string{"fixed", "reset", "sliding", "token"}
	burstLimits     = []int{5, 20, 100, 3000}
)

func burstRules() string {
	var b strings.Builder
	for _, alg := range burstAlgorithms {
		for _, l := range burstLimits {
			opt := alg
			if alg == "fixed" {
				opt = ""
			}
			fmt.Fprintf(&b, "%s-%d: POST /%s/%d by header(X-Key) %d/1d %s\n", alg, l, alg, l, l, opt)
		}
	}
	return b.String()
}

// burstClient keeps a connection for each of its 1,000 requests in
// flight: with fewer idle places, Go's transport can report a request that
// was answered as failed ("putIdleConn: too many idle connections"). Its
// requests carry an Idempotency-Key, which makes Go's transport send one
// again, as it does a GET, when a kept-alive connection it chose turns out
// closed before anything was read from it (seen as "EOF" on connections
// that were idle about five seconds, a few in 3,000): the gateway never
// read that request, so nothing was counted twice.
var burstClient = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 30 * time.Second},
}

// burstCell is one cell's traffic: the gateways, its path, and a fresh key
// per pattern.
type burstCell struct {
	ps    []*process
	path  string
	limit int
	run   string // distinguishes this run's keys from another's
	t     *testing.T
	errs  *atomic.Int64 // requests without an answer, logged up to 3
	sent  *atomic.Int64 // numbers the requests' Idempotency-Key
}

// send sends one request for key through gateway gw and returns its status
// (0: no answer).
func (c *burstCell) send(gw int, key string) int {
	req, _ := http.NewRequest(http.MethodPost, "http://"+c.ps[gw%len(c.ps)].public+c.path, nil)
	req.Header.Set("X-Key", c.run+key)
	req.Header.Set("Idempotency-Key", strconv.FormatInt(c.sent.Add(1), 10))
	var conn httptrace.GotConnInfo
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { conn = i }}))
	res, err := burstClient.Do(req)
	if err != nil {
		if c.errs.Add(1) <= 3 {
			c.t.Logf("%s: %v (connection reused %v, idle %v before)", c.path, err, conn.Reused, conn.IdleTime)
		}
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// concurrently sends n requests for key(i) at once, request i through
// gateway i%3, at most 1,000 in flight, and counts the statuses.
func (c *burstCell) concurrently(n int, key func(i int) string) map[int]int {
	return c.paced(n, 0, key)
}

// paced sends n requests as concurrently does, but one every interval (0:
// all at once), each without waiting for the ones before to be answered.
func (c *burstCell) paced(n int, interval time.Duration, key func(i int) string) map[int]int {
	var (
		mu   sync.Mutex
		st   = map[int]int{}
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 1000)
		tick <-chan time.Time
	)
	if interval > 0 {
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		tick = ticker.C
	}
	for i := range n {
		if tick != nil {
			<-tick
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			code := c.send(i, key(i))
			mu.Lock()
			st[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return st
}

// burstPattern is one kind of traffic: run sends it on a fresh key and
// returns what went wrong ("" when exact).
type burstPattern struct {
	name string
	run  func(c *burstCell, key string) string
}

// exact reports how st differs from want×200 and the rest 429.
func exact(st map[int]int, n, want int) string {
	if st[200] == want && st[429] == n-want {
		return ""
	}
	return fmt.Sprintf("%d requests: statuses %v, want %d×200 and %d×429", n, st, want, n-want)
}

// prefill spends all but keep of key's limit in one burst, so that the
// patterns of a large limit reach the limit without sending it one by one.
func (c *burstCell) prefill(key string, keep int) (int, string) {
	if c.limit <= 100 {
		return c.limit, ""
	}
	n := c.limit - keep
	if msg := exact(c.concurrently(n, func(int) string { return key }), n, n); msg != "" {
		return 0, "prefill: " + msg
	}
	return keep, ""
}

var burstPatterns = []burstPattern{
	{"burst of 3×L", func(c *burstCell, key string) string {
		n := 3 * c.limit
		return exact(c.concurrently(n, func(int) string { return key }), n, c.limit)
	}},
	{"1,000 at once", func(c *burstCell, key string) string {
		if c.limit != 5 {
			return ""
		}
		return exact(c.concurrently(1000, func(int) string { return key }), 1000, 5)
	}},
	{"two bursts across the limit", func(c *burstCell, key string) string {
		first := (c.limit*6 + 9) / 10
		if msg := exact(c.concurrently(first, func(int) string { return key }), first, first); msg != "" {
			return "first burst: " + msg
		}
		return exact(c.concurrently(c.limit, func(int) string { return key }), c.limit, c.limit-first)
	}},
	{"one client walking the gateways", func(c *burstCell, key string) string {
		room, msg := c.prefill(key, 60)
		if msg != "" {
			return msg
		}
		var got []string
		for i := range room + 10 {
			code := c.send(i, key)
			if want := map[bool]int{true: 200, false: 429}[i < room]; code != want {
				got = append(got, fmt.Sprintf("request %d of %d: %d, want %d", c.limit-room+i+1, c.limit+10, code, want))
			}
		}
		return strings.Join(got, "; ")
	}},
	{"paced trickle", func(c *burstCell, key string) string {
		room, msg := c.prefill(key, 60)
		if msg != "" {
			return msg
		}
		n := room + 20
		return exact(c.paced(n, 3*time.Millisecond, func(int) string { return key }), n, room)
	}},
	{"300 keys at once", func(c *burstCell, key string) string {
		// Past the limit for limits 5 and 20; for 100 and 3,000, ten
		// requests a key check that none is denied with room left.
		per := c.limit + 5
		if c.limit > 25 {
			per = 10
		}
		st := c.concurrently(300*per, func(i int) string { return key + "-" + strconv.Itoa(i%300) })
		return exact(st, 300*per, 300*min(per, c.limit))
	}},
}

// runBurstMatrix runs every cell of the matrix against three gateway
// processes on a database of its own.
func runBurstMatrix(t *testing.T) {
	db := pgtest.New(t)
	up := newKeyUpstream(t)
	env := schemaEnv(up.URL, db)
	env["SLUICE_RULES"] = burstRules()
	delete(env, "SLUICE_DB_TIMEOUT") // the default deadline: 50ms
	ps := startGatewayProcesses(t, 3, env)
	run := strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	errorsBefore := storeErrors(t, ps)
	var errs, sent atomic.Int64
	for _, alg := range burstAlgorithms {
		for _, l := range burstLimits {
			c := &burstCell{ps: ps, path: fmt.Sprintf("/%s/%d", alg, l), limit: l, run: run, t: t, errs: &errs, sent: &sent}
			for pi, p := range burstPatterns {
				began := time.Now()
				if msg := p.run(c, fmt.Sprintf("p%d", pi)); msg != "" {
					t.Errorf("%s, limit %d, %s: %s; counters of the rule now: %s", alg, l, p.name, msg, counterRows(t, db, fmt.Sprintf("%s-%d", alg, l)))
				}
				if d := time.Since(began); d > 5*time.Second {
					t.Logf("%s, limit %d, %s took %v", alg, l, p.name, d.Round(time.Millisecond))
				}
			}
		}
	}
	var failed float64
	for _, p := range ps {
		if t.Failed() {
			out := p.output()
			if d := os.Getenv("SLUICE_TEST_LOG_DIR"); d != "" {
				os.WriteFile(filepath.Join(d, p.public+".log"), []byte(out), 0o644) //nolint:errcheck // diagnosis only
			}
			t.Logf("gateway %s: %s\nlog (last 4 KiB):\n%s", p.public, p.storeMetrics(), out[max(0, len(out)-4096):])
		}
		for _, kind := range []string{"failed_open", "local", "failed_closed"} {
			failed += sumSeries(t, p, `sluice_decisions_total{`, `outcome="`+kind+`"`)
		}
	}
	storeErrs := storeErrors(t, ps)
	for k, v := range errorsBefore {
		if storeErrs[k] -= v; storeErrs[k] == 0 {
			delete(storeErrs, k)
		}
	}
	if failed > 0 || len(storeErrs) > 0 {
		t.Errorf("%v decisions were made by a fail mode; store errors by kind %v: a healthy store under load must decide every one", failed, storeErrs)
	}
}

// storeErrors sums sluice_store_errors_total over ps by kind, leaving out
// kinds at zero.
func storeErrors(t *testing.T, ps []*process) map[string]float64 {
	t.Helper()
	errs := map[string]float64{}
	for _, p := range ps {
		for _, kind := range []string{"timeout", "overload", "connection", "other", "too_many_connections"} {
			if v := sumSeries(t, p, `sluice_store_errors_total{`, `kind="`+kind+`"`); v > 0 {
				errs[kind] += v
			}
		}
	}
	return errs
}

// counterRows describes the counters of rule in db, for failure messages.
func counterRows(t *testing.T, db *pgtest.DB, rule string) string {
	rows, err := db.Pool.Query(context.Background(), "SELECT n, leased, need_us FROM "+db.Table("counters")+" WHERE rule = $1 ORDER BY n DESC LIMIT 5", rule)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var n, leased, need int64
		if err := rows.Scan(&n, &leased, &need); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "[n %d leased %d need %d] ", n, leased, need)
	}
	return b.String()
}

// sumSeries adds the values of p's series that start with prefix and
// contain label.
func sumSeries(t *testing.T, p *process, prefix, label string) float64 {
	t.Helper()
	series, err := p.metrics()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for name, v := range series {
		if strings.HasPrefix(name, prefix) && strings.Contains(name, label) {
			sum += v
		}
	}
	return sum
}

// TestBurstExactness runs the matrix on the machine as it is.
func TestBurstExactness(t *testing.T) {
	runBurstMatrix(t)
}

// TestBurstExactnessLoaded runs the matrix beside two CPU-bound loops
// (`while :; do :; done`), one per core of the CI machine, for as long as
// the matrix runs (at most half an hour).
func TestBurstExactnessLoaded(t *testing.T) {
	busyCores(t, 2, 30*time.Minute)
	runBurstMatrix(t)
}
