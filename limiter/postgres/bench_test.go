package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/migrations/pgtest"
	"github.com/sluicehq/sluice/policy"
)

// BenchmarkDecide measures one decision against the real database, on its
// own clock, with one rule (a per-IP fixed window over 10,000 keys) and
// with three rules (plus a global sliding window on one hot key and a
// per-tenant token bucket over 100 keys), serially and from 16 goroutines.
// Every key is created before the timer starts, so the numbers are those of
// a warm table (a new key costs one more row version). It reports the rows
// the table holds afterwards.
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
	checks := func(n int, i uint64) []limiter.Check {
		cs := []limiter.Check{{Rule: ip, Key: ipKeys[i%uint64(len(ipKeys))]}}
		if n == 3 {
			cs = append(cs, limiter.Check{Rule: global, Key: "global"},
				limiter.Check{Rule: tenant, Key: ipKeys[i%100]})
		}
		return cs
	}
	for _, rules := range []int{1, 3} {
		for _, parallel := range []bool{false, true} {
			name := fmt.Sprintf("rules=%d/serial", rules)
			if parallel {
				name = fmt.Sprintf("rules=%d/parallel", rules)
			}
			b.Run(name, func(b *testing.B) {
				db := pgtest.New(b)
				s := open(b, db, pgtest.NewPool(b, db.URL, 16), nil)
				ctx := context.Background()
				var seq atomic.Uint64
				warm(b, s, len(ipKeys), func(i int) []limiter.Check { return checks(rules, uint64(i)) })
				b.ReportAllocs()
				b.ResetTimer()
				if parallel {
					b.SetParallelism(8)
					b.RunParallel(func(pb *testing.PB) {
						res := make([]limiter.Result, rules)
						for pb.Next() {
							if _, err := s.Decide(ctx, checks(rules, seq.Add(1)), res); err != nil {
								b.Error(err)
								return
							}
						}
					})
				} else {
					res := make([]limiter.Result, rules)
					for b.Loop() {
						if _, err := s.Decide(ctx, checks(rules, seq.Add(1)), res); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(rowCount(b, db)), "rows")
			})
		}
	}
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
