package postgres_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/policy"
)

// BenchmarkDecide measures one decision against the real database, on its
// own clock, with one rule (a per-IP fixed window over 10,000 keys) and
// with three rules (plus a global sliding window on one hot key and a
// per-tenant token bucket over 100 keys), serially and from 64 goroutines
// (SetParallelism(32) on 2 cores), through the batcher with 1 (the
// default), 2 or 4 statements in flight, and unbatched. Every key is created
// before the timer starts, so the numbers are those of a warm table (a new
// key costs one more row version).
//
// Besides time and allocations it reports stmts/op, the decide statements
// (transactions) the store sent per decision, and xacts/op, the
// transactions the database committed per decision according to
// pg_stat_database (every client of the database counts there, so it is
// an upper bound on a shared server), and the rows the table holds.
//
//	go test -run '^$' -bench Decide -benchtime 3s ./limiter/postgres
func BenchmarkDecide(b *testing.B) {
	ip := &policy.Rule{Name: "ip", Limit: 1 << 40, Window: time.Hour, Algorithm: policy.Fixed, Cost: 1}
	global := &policy.Rule{Name: "global", Limit: 1 << 40, Window: time.Minute, Algorithm: policy.Sliding, Bucket: time.Second, Cost: 1}
	tenant := &policy.Rule{Name: "tenant", Limit: 1 << 40, Window: time.Hour, Algorithm: policy.Token, Burst: 1 << 40, Cost: 1}
	ipKeys := make([]string, 10_000)
	for i := range ipKeys {
		ipKeys[i] = fmt.Sprintf("%064x", i) // the length of a hex HMAC-SHA256
	}
	checks := func(cs []limiter.Check, n int, i uint64) []limiter.Check {
		cs = append(cs[:0], limiter.Check{Rule: ip, Key: ipKeys[i%uint64(len(ipKeys))]})
		if n == 3 {
			cs = append(cs, limiter.Check{Rule: global, Key: "global"},
				limiter.Check{Rule: tenant, Key: ipKeys[i%100]})
		}
		return cs
	}
	type mode struct {
		name     string
		parallel bool
		set      func(*postgres.Options)
	}
	inFlight := func(n int) func(*postgres.Options) { return func(o *postgres.Options) { o.MaxInFlight = n } }
	modes := []mode{
		{"serial/batched", false, func(*postgres.Options) {}},
		{"serial/unbatched", false, func(o *postgres.Options) { o.Batching = postgres.Unbatched }},
		{"parallel/batched1", true, inFlight(1)},
		{"parallel/batched2", true, inFlight(2)},
		{"parallel/batched4", true, inFlight(4)},
		{"parallel/unbatched", true, func(o *postgres.Options) { o.Batching = postgres.Unbatched }},
	}
	for _, rules := range []int{1, 3} {
		for _, m := range modes {
			b.Run(fmt.Sprintf("rules=%d/%s", rules, m.name), func(b *testing.B) {
				db := pgtest.New(b)
				pool := benchPool(b, db)
				s := open(b, db, pool, nil, m.set)
				ctx := context.Background()
				var seq atomic.Uint64
				warm(b, s, len(ipKeys), func(i int) []limiter.Check { return checks(nil, rules, uint64(i)) })
				before := s.BatchStats()
				xacts := committed(b, db.Pool)
				b.ReportAllocs()
				b.ResetTimer()
				// decider returns a maker of the next decision, with
				// buffers of its own.
				decider := func() func() error {
					res := make([]limiter.Result, rules)
					var cs []limiter.Check
					return func() error {
						cs = checks(cs, rules, seq.Add(1))
						_, err := s.Decide(ctx, cs, res)
						return err
					}
				}
				if m.parallel {
					b.SetParallelism(32)
					b.RunParallel(func(pb *testing.PB) {
						next := decider()
						for pb.Next() {
							if err := next(); err != nil {
								b.Error(err)
								return
							}
						}
					})
				} else {
					next := decider()
					for b.Loop() {
						if err := next(); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				after := s.BatchStats()
				closePool(b, db, pool) // a closing backend reports its pending statistics
				n := float64(after.Decisions - before.Decisions)
				b.ReportMetric(float64(after.Statements-before.Statements)/n, "stmts/op")
				b.ReportMetric(float64(committed(b, db.Pool)-xacts)/n, "xacts/op")
				b.ReportMetric(float64(rowCount(b, db)), "rows")
			})
		}
	}
}

// benchPool opens a pool of 16 connections named after db's schema,
// configured as the gateway configures its pool.
func benchPool(b *testing.B, db *pgtest.DB) *pgxpool.Pool {
	b.Helper()
	return gatewayPool(b, db.URL, 16, postgres.Options{Schema: db.Schema}, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["application_name"] = "bench-" + db.Schema
	})
}

// closePool closes pool and waits until its server processes are gone, so
// that their statistics have reached pg_stat_database.
func closePool(b *testing.B, db *pgtest.DB, pool *pgxpool.Pool) {
	b.Helper()
	pool.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := db.Pool.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", "bench-"+db.Schema).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// committed returns the transactions committed in the pool's database so
// far, as pg_stat_database reports them.
func committed(b *testing.B, pool *pgxpool.Pool) int64 {
	b.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(),
		"SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// warm decides n decisions made by mk in batches, to create their rows.
func warm(b *testing.B, s *postgres.Store, n int, mk func(i int) []limiter.Check) {
	b.Helper()
	const batch = 500
	for lo := 0; lo < n; lo += batch {
		var ds []postgres.Decision
		for i := lo; i < min(n, lo+batch); i++ {
			cs := mk(i)
			ds = append(ds, postgres.Decision{Checks: cs, Results: make([]limiter.Result, len(cs))})
		}
		if err := s.DecideBatch(context.Background(), ds); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecideBatch sends batches of a fixed size from one goroutine on
// one connection, a warm table of 10,000 per-IP keys, and reports what one
// decision costs the database: pg-cpu-µs/decision is the CPU time (user and
// system, from /proc) of the connection's server process per decision,
// where the database runs on this machine and /proc is readable (else it
// is not reported). Its fall with the batch size is the fixed cost of a
// transaction that a batch shares; what remains at large sizes is the
// per-decision work. walwriter-µs/decision is the CPU time of the server's
// WAL writer, which flushes what asynchronous commits leave behind (it
// serves the whole server: other work on it shows too). commit=sync waits
// for the commit's WAL flush (the default: the server's own
// synchronous_commit); commit=async does not
// (SLUICE_DB_SYNCHRONOUS_COMMIT=off).
//
//	go test -run '^$' -bench DecideBatch -benchtime 2s ./limiter/postgres
func BenchmarkDecideBatch(b *testing.B) {
	ip := &policy.Rule{Name: "ip", Limit: 1 << 40, Window: time.Hour, Algorithm: policy.Fixed, Cost: 1}
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("%064x", i)
	}
	for _, async := range []bool{false, true} {
		commit := map[bool]string{false: "sync", true: "async"}[async]
		for _, size := range []int{1, 8, 32, 128} {
			b.Run(fmt.Sprintf("commit=%s/size=%d", commit, size), func(b *testing.B) {
				benchmarkDecideBatch(b, ip, keys, size, async)
			})
		}
	}
	// A burst: every decision of the batch on one key.
	for _, size := range []int{1, 32, 256} {
		b.Run(fmt.Sprintf("commit=sync/hot/size=%d", size), func(b *testing.B) {
			benchmarkDecideBatch(b, ip, keys[:1], size, false)
		})
	}
}

func benchmarkDecideBatch(b *testing.B, ip *policy.Rule, keys []string, size int, async bool) {
	db := pgtest.New(b)
	pool := benchPool(b, db)
	s := open(b, db, pool, nil, func(o *postgres.Options) { o.Batching, o.AsynchronousCommit = postgres.Unbatched, async })
	warm(b, s, len(keys), func(i int) []limiter.Check { return []limiter.Check{{Rule: ip, Key: keys[i]}} })
	pool.Reset() // one connection from here on
	var pid, walWriter int
	if err := pool.QueryRow(context.Background(),
		"SELECT pg_backend_pid(), coalesce((SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'), 0)").Scan(&pid, &walWriter); err != nil {
		b.Fatal(err)
	}
	ds := make([]postgres.Decision, size)
	for i := range ds {
		ds[i] = postgres.Decision{Checks: make([]limiter.Check, 1), Results: make([]limiter.Result, 1)}
	}
	next := 0
	cpu0, cpuOK := processCPU(pid)
	wal0, walOK := processCPU(walWriter)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for i := range ds {
			ds[i].Checks[0] = limiter.Check{Rule: ip, Key: keys[next]}
			next = (next + 1) % len(keys)
		}
		if err := s.DecideBatch(context.Background(), ds); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	decisions := float64(b.N * size)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/decisions, "ns/decision")
	if cpu1, ok := processCPU(pid); ok && cpuOK {
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/decisions, "pg-cpu-µs/decision")
	}
	if wal1, ok := processCPU(walWriter); ok && walOK {
		b.ReportMetric(float64((wal1-wal0).Microseconds())/decisions, "walwriter-µs/decision")
	}
}

// processCPU returns the user and system CPU time process pid has used,
// from /proc/<pid>/stat; ok is false where that cannot be read.
func processCPU(pid int) (d time.Duration, ok bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	s := string(raw)
	// The fields after the command name, which is in parentheses and may
	// hold spaces: utime and stime are the 12th and 13th of them.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	const clockTicks = 100 // USER_HZ, 100 on every Linux platform Go supports
	return time.Duration(ut+st) * time.Second / clockTicks, true
}
