//go:build unix

package faults

// Limits spent through leases, exactly, across real gateways: under
// uneven traffic, and when a gateway dies holding units.

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// leaseGatewayEnv is the environment of a gateway process on db (as
// schemaEnv) in front of up, with rules. The rules' fail mode is closed and the deadline long:
// these tests are about exactness, and a decision that misses its deadline
// on a loaded machine must show as a 503, not be decided by a fallback
// (fail=local would let it through on a per-instance limit).
func leaseGatewayEnv(up string, db *pgtest.DB, rules string) map[string]string {
	env := schemaEnv(up, db)
	env["SLUICE_RULES"] = rules
	env["SLUICE_FAIL_MODE"] = "closed"
	env["SLUICE_DB_TIMEOUT"] = "2s"
	return env
}

// split7020 is the gateway of request i: 70 % the first, 20 % the second,
// 10 % the third, interleaved as one service's clients would send them.
func split7020(i int) int {
	switch i % 10 {
	case 7, 8:
		return 1
	case 9:
		return 2
	}
	return 0
}

// sendAll sends requests POST path with X-Key key(i), i from 0 to n-1,
// from 30 clients, each to gateway via(i); it returns the statuses, with
// 0 for a request that got no answer.
func sendAll(ps []*process, n int, path string, key func(i int) string, via func(i int) int, before func(i int)) map[int]int {
	var (
		next atomic.Int64
		mu   sync.Mutex
		st   = map[int]int{}
		wg   sync.WaitGroup
	)
	for range 30 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if before != nil {
					before(i)
				}
				code := 0
				req, _ := http.NewRequest(http.MethodPost, "http://"+ps[via(i)].public+path, nil)
				req.Header.Set("X-Key", key(i))
				if res, err := faultClient.Do(req); err == nil {
					code = res.StatusCode
					res.Body.Close()
				}
				mu.Lock()
				st[code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return st
}

// TestLeasesExactThroughGateways: three gateway processes with the
// default settings (leases on) on one database. For each algorithm, one
// key with a limit of 3,000 and 4,500 requests spread 70/20/10 over the
// gateways: exactly 3,000 reach the upstream. And 300 keys with a limit
// of 20 each, 30 requests per key spread over the gateways: exactly 20
// each.
func TestLeasesExactThroughGateways(t *testing.T) {
	db := parallelDB(t)
	up := newKeyUpstream(t)
	rules := `
fixed:   POST /fixed   by header(X-Key) 3000/1d
reset:   POST /reset   by header(X-Key) 3000/1d reset
sliding: POST /sliding by header(X-Key) 3000/1d sliding
token:   POST /token   by header(X-Key) 3000/1d token
small:   POST /small   by header(X-Key) 20/1d
`
	ps := startGatewayProcesses(t, 3, leaseGatewayEnv(up.URL, db, rules))
	for _, alg := range []string{"fixed", "reset", "sliding", "token"} {
		path := "/" + alg
		st := sendAll(ps, 4500, path, func(int) string { return "hot" }, split7020, nil)
		if got := up.snapshot()[path+" hot"]; got != 3000 || st[200] != 3000 || st[429] != 1500 {
			t.Errorf("%s: %d reached the upstream, statuses %v; want exactly 3000 (and 1500×429)", alg, got, st)
		}
	}
	st := sendAll(ps, 300*30, "/small", func(i int) string { return fmt.Sprint(i % 300) }, func(i int) int { return (i / 300) % 3 }, nil)
	through := up.snapshot()
	for k := range 300 {
		if got := through[fmt.Sprintf("/small %d", k)]; got != 20 {
			t.Errorf("/small key %d: %d reached the upstream, want exactly 20", k, got)
		}
	}
	if st[200] != 300*20 {
		t.Errorf("/small: statuses %v, want %d×200", st, 300*20)
	}
	var local float64
	for _, p := range ps {
		v, err := p.metricValue("sluice_lease_decisions_total")
		if err != nil {
			t.Fatal(err)
		}
		local += v
	}
	t.Logf("%v decisions answered from leases", local)
	if local == 0 {
		t.Errorf("no decision was answered from a lease")
	}
}

// leaseDeathBound is what docs/store.md ("Leases") promises a gateway that
// dies can waste of a counter: a sixteenth of its limit, in whole
// requests, or two requests of a limit below 32.
func leaseDeathBound(limit int) int { return max(limit/16, 2) }

// TestLeaseGatewayKilledMidBurst: three gateway processes share one key
// with a limit of 3,000, 4,500 requests spread 70/20/10; the second
// gateway is killed (SIGKILL) a third of the way through. At most 3,000
// reach the upstream, and no fewer than 3,000 less what README says a
// dead gateway can waste.
func TestLeaseGatewayKilledMidBurst(t *testing.T) {
	db := parallelDB(t)
	up := newKeyUpstream(t)
	ps := startGatewayProcesses(t, 3, leaseGatewayEnv(up.URL, db, "hot: POST /hot by header(X-Key) 3000/1d"))
	var killOnce sync.Once
	st := sendAll(ps, 4500, "/hot", func(int) string { return "k" }, split7020, func(i int) {
		if i == 1500 {
			killOnce.Do(ps[1].kill)
		}
	})
	got := up.snapshot()["/hot k"]
	floor := 3000 - leaseDeathBound(3000)
	t.Logf("killed mid-burst: %d reached the upstream (statuses %v); bound [%d, 3000]", got, st, floor)
	if got > 3000 || got < floor {
		t.Errorf("%d reached the upstream, want at most 3000 and at least %d", got, floor)
	}
}

// TestSmallLeasesGatewayKilled: limits below 32 lease too, a request or
// two per gateway (docs/store.md, "Leases"). Three gateway processes share
// 300 keys of a limit of 10, each key's requests moving between them as
// a client's would, 20 per key; the second gateway is killed (SIGKILL)
// after each key's fifth. No key gets more than 10 through, and none
// fewer than 10 less what a dead gateway can waste.
func TestSmallLeasesGatewayKilled(t *testing.T) {
	db := parallelDB(t)
	up := newKeyUpstream(t)
	ps := startGatewayProcesses(t, 3, leaseGatewayEnv(up.URL, db, "login: POST /login by header(X-Key) 10/1d"))
	var killOnce sync.Once
	const keys, each, limit = 300, 20, 10
	st := sendAll(ps, keys*each, "/login", func(i int) string { return fmt.Sprint(i % keys) }, func(i int) int { return (i / keys) % 3 }, func(i int) {
		if i == keys*5 {
			killOnce.Do(ps[1].kill)
		}
	})
	through := up.snapshot()
	floor := limit - leaseDeathBound(limit)
	short := 0
	for k := range keys {
		got := through[fmt.Sprintf("/login %d", k)]
		if got > limit || got < floor {
			t.Errorf("key %d: %d reached the upstream, want at most %d and at least %d", k, got, limit, floor)
		}
		if got < limit {
			short++
		}
	}
	t.Logf("statuses %v; %d of %d keys lost units to the dead gateway", st, short, keys)
	var local float64
	for _, p := range []*process{ps[0], ps[2]} {
		v, err := p.metricValue("sluice_lease_decisions_total")
		if err != nil {
			t.Fatal(err)
		}
		local += v
	}
	if local == 0 {
		t.Errorf("no decision was answered from a lease")
	}
}
