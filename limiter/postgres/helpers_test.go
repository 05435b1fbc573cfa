package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/limiter/storetest"
	"github.com/sluicehq/sluice/migrations/pgtest"
	"github.com/sluicehq/sluice/policy"
)

// base is a round instant: windows of a second to a day start at it.
var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newClock is the conformance suite's settable clock, for Options.Now.
func newClock(t time.Time) *storetest.Clock { return storetest.NewClock(t) }

// open returns a ready Store on pool and db's schema (New, then Probe);
// now nil means the database clock.
func open(t testing.TB, db *pgtest.DB, pool *pgxpool.Pool, now func() time.Time, opts ...func(*postgres.Options)) *postgres.Store {
	t.Helper()
	if pool == nil {
		pool = db.Pool
	}
	o := postgres.Options{Schema: db.Schema, Now: now}
	for _, f := range opts {
		f(&o)
	}
	s, err := postgres.New(pool, o)
	if err != nil {
		t.Fatal(err)
	}
	// As Run would, probe until the store is ready: on a loaded machine a
	// probe decision can miss its deadline.
	for deadline := time.Now().Add(15 * time.Second); ; {
		err := s.Probe(context.Background())
		if err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The rule builders are the conformance suite's, so that every test of a
// store builds its rules one way.
var (
	fixed     = storetest.Fixed
	resetRule = storetest.ResetRule
	sliding   = storetest.Sliding
)

// token is a token rule whose burst is its limit.
func token(name string, limit int64, window time.Duration) *policy.Rule {
	return storetest.Token(name, limit, window, limit)
}

// algos makes one rule of each algorithm.
var algos = []struct {
	name string
	make func(name string, limit int64, window time.Duration) *policy.Rule
}{
	{"fixed", fixed},
	{"reset", resetRule},
	{"sliding", func(n string, l int64, w time.Duration) *policy.Rule { return sliding(n, l, w, time.Second) }},
	{"token", token},
}

func chk(r *policy.Rule, key string) limiter.Check { return limiter.Check{Rule: r, Key: key} }

// decide is storetest.Decide.
var decide = storetest.Decide

// rowCount returns the number of counter rows in db's schema.
func rowCount(t testing.TB, db *pgtest.DB) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+pgx.Identifier{db.Schema, "counters"}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// wait waits for wg, failing t after d (a deadlock would hang otherwise).
func wait(t *testing.T, wg *sync.WaitGroup, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("decisions did not finish within %v", d)
	}
}
