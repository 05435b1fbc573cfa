//go:build unix

package faults

// Postgres killed and a failover to a synchronous standby, with the
// default settings: no count lost, no limit passed.

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// durableRules are fail=closed rules, so that a decision the store could
// not make lets nothing through: a tight one (5 per key, decided per
// request) and a roomy one (1,000 per key, spent through leases). They
// count in windows that start at a key's first request (reset), so that a
// test never straddles a window's edge.
const durableRules = `
tight: POST /tight by header(X-Key) 5/1h    reset fail=closed
roomy: POST /roomy by header(X-Key) 1000/1h reset fail=closed
`

var durableLimits = map[string]int{"/tight": 5, "/roomy": 1000}

// keyUpstream counts, per path and X-Key, the requests that reached it:
// what the gateways let through.
type keyUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	hits map[string]int // path + " " + key
}

func newKeyUpstream(t *testing.T) *keyUpstream {
	u := &keyUpstream{hits: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.hits[r.URL.Path+" "+r.Header.Get("X-Key")]++
		u.mu.Unlock()
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *keyUpstream) snapshot() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return maps.Clone(u.hits)
}

// TestFaultDurableThroughCrashAndFailover: three gateways with the default
// settings (the server's synchronous_commit, leases on) under steady
// traffic on a primary that requires a synchronous standby. Ten times in a
// row, Postgres is killed (SIGKILL) and started again (crash recovery),
// then killed again and its standby promoted (a failover), a new standby
// made of the old primary's port. After every fault, once every /readyz
// answers 200: no key of either fail=closed rule has had more requests
// through than its limit, and every request the gateways let through is
// counted in the database (no count lost). With
// SLUICE_DB_SYNCHRONOUS_COMMIT=off the same test loses counts.
func TestFaultDurableThroughCrashAndFailover(t *testing.T) {
	t.Parallel()
	// A standby retries its connection to a restarted primary every 200 ms
	// (5 s by default): until it is back, the primary's commits wait.
	primary := pgtest.NewCluster(t, pgtest.ClusterOptions{Settings: map[string]string{"wal_retrieve_retry_interval": "200ms"}})
	// Before the standby is made, so that it copies the setting: promoted,
	// it requires a synchronous standby of its own, as a server of a
	// synchronous cluster does. (Made the other way round, the first
	// promoted server replicated asynchronously, and this test caught its
	// failover losing counts.)
	primary.RequireSynchronousStandby(t)
	standby := primary.NewStandby(t)
	primary.WaitForStandby(t, standby)
	ports := []int{primary.Port, standby.Port}
	dbURL := fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write",
		ports[0], ports[1])
	up := newKeyUpstream(t)
	env := faultEnv(up.URL, dbURL)
	env["SLUICE_RULES"] = durableRules
	gws := []*faultGateway{startFault(t, env), startFault(t, env), startFault(t, env)}
	waitReady(t, gws, 30*time.Second)

	load := startDurableLoad(gws)
	defer load.stop()
	var checked map[string]int
	check := func(when string) {
		t.Helper()
		took := waitReady(t, gws, 60*time.Second)
		time.Sleep(300 * time.Millisecond) // some decisions on the healed database
		now := up.snapshot()
		checkCounts(t, gws[0], now, checked, when)
		checked = now
		t.Logf("%s: ready after %v; statuses so far %v", when, took.Round(time.Millisecond), load.statuses())
	}
	for round := 1; round <= 10; round++ {
		time.Sleep(500 * time.Millisecond)
		primary.Kill(t)
		primary.Start(t)
		check(fmt.Sprintf("round %d, after a crash and restart", round))

		time.Sleep(500 * time.Millisecond)
		primary.Kill(t)
		standby.Promote(t)
		// The promoted server requires a synchronous standby too (the
		// setting came with the base backup): until it has one, its
		// commits wait, and no gateway may call itself ready.
		next := standby.NewStandbyAt(t, primary.Port)
		standby.WaitForStandby(t, next)
		primary, standby = standby, next
		check(fmt.Sprintf("round %d, after a failover", round))
	}
	sent := load.stop()
	t.Logf("%d requests sent through 10 crashes and 10 failovers; statuses %v", sent, load.statuses())
	if load.statuses()[200] == 0 || load.statuses()[429] == 0 {
		t.Errorf("statuses %v: want requests both allowed and limited", load.statuses())
	}
	checkCounts(t, gws[0], up.snapshot(), nil, "at the end")
}

// durableLoad sends about 1,000 requests a second to the gateways in turn
// until stopped: each tight key gets 8 requests (3 over its limit), and
// four roomy keys get a third of them.
type durableLoad struct {
	loops
	sent     atomic.Int64
	mu       sync.Mutex
	statusOf map[int]int
	once     sync.Once
	total    int64
}

func startDurableLoad(gws []*faultGateway) *durableLoad {
	l := &durableLoad{loops: newLoops(20), statusOf: map[int]int{}}
	var next atomic.Int64
	for w := range 6 {
		l.loop(func() bool {
			i := next.Add(1)
			path, key := "/tight", fmt.Sprintf("t%d", i/8)
			if i%3 == 0 {
				path, key = "/roomy", fmt.Sprintf("r%d", i%4)
			}
			r, err := gws[(w+int(i))%len(gws)].post(path, key)
			l.sent.Add(1)
			time.Sleep(5 * time.Millisecond) // about 1,000 requests a second in all
			if err != nil {
				l.fail(err.Error())
				return true
			}
			l.mu.Lock()
			l.statusOf[r.status]++
			l.mu.Unlock()
			if r.status != 200 && r.status != 429 && r.status != 503 {
				l.fail(fmt.Sprintf("%s: status %d", path, r.status))
			}
			return true
		})
	}
	return l
}

func (l *durableLoad) stop() int64 {
	l.once.Do(func() { l.loops.stop(); l.total = l.sent.Load() })
	return l.total
}

func (l *durableLoad) statuses() map[int]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.statusOf)
}

// checkCounts compares what reached the upstream, per key, with the
// limits and with the counts the database holds (read through g's admin
// API): no key past its limit, no count missing. Keys whose count is the
// same as in before (a previous check) are skipped: they were checked.
func checkCounts(t *testing.T, g *faultGateway, through, before map[string]int, when string) {
	t.Helper()
	var over, missing []string
	keys := slices.Sorted(maps.Keys(through))
	for _, pk := range keys {
		path, key, _ := strings.Cut(pk, " ")
		n := through[pk]
		if before != nil && before[pk] == n {
			continue
		}
		if n > durableLimits[path] {
			over = append(over, fmt.Sprintf("%s %s: %d through", path, key, n))
		}
		count, err := adminCount(g, strings.TrimPrefix(path, "/"), key)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if count < int64(n) {
			missing = append(missing, fmt.Sprintf("%s %s: %d through, %d counted", path, key, n, count))
		}
	}
	if len(over) > 0 {
		t.Errorf("%s: %d keys past their limits: %v", when, len(over), over[:min(len(over), 10)])
	}
	if len(missing) > 0 {
		t.Errorf("%s: %d keys with counts missing in the database: %v", when, len(missing), missing[:min(len(missing), 10)])
	}
	if t.Failed() {
		t.FailNow()
	}
}

// adminCount reads the count of (rule, header key) from the admin API:
// the database's count, leased units included.
func adminCount(g *faultGateway, rule, key string) (int64, error) {
	q := url.Values{"rule": {rule}, "header": {key}}
	res, err := faultClient.Get(g.admin + "/v1/keys?" + q.Encode())
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	var v struct {
		Count int64 `json:"count"`
	}
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil || res.StatusCode != 200 {
		return 0, fmt.Errorf("GET /v1/keys %s %s: status %d, %v", rule, key, res.StatusCode, err)
	}
	return v.Count, nil
}
