package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/migrations"
)

// TestCleanup: after their windows pass, expired rows go in bounded
// batches, and live rows stay with their state.
func TestCleanup(t *testing.T) {
	db := pgtest.New(t)
	clk := newClock(base)
	s := open(t, db, nil, clk.Now, func(o *postgres.Options) {
		o.CleanupBatch, o.CleanupMaxBatches, o.CleanupPause = 3, 2, limiter.Off
	})
	ctx := context.Background()
	f := fixed("f", 5, time.Minute)               // expires at +1m
	tk := token("t", 5, time.Minute)              // one request: TAT +12s
	rs := resetRule("r", 5, 10*time.Minute)       // expires at +10m
	sl := sliding("s", 5, time.Hour, time.Minute) // expires at +1h
	for i := range 8 {
		decide(t, s, chk(f, fmt.Sprint(i)))
	}
	decide(t, s, chk(tk, "k"), chk(rs, "k"), chk(sl, "k"))

	if n, err := s.Cleanup(ctx); err != nil || n != 0 {
		t.Fatalf("Cleanup before anything expired = %d, %v", n, err)
	}
	clk.Set(base.Add(2 * time.Minute))
	// 9 rows expired; a run deletes at most 2 batches of 3.
	if n, err := s.Cleanup(ctx); err != nil || n != 6 {
		t.Fatalf("first bounded run = %d, %v; want 6", n, err)
	}
	if n, err := s.Cleanup(ctx); err != nil || n != 3 {
		t.Fatalf("second run = %d, %v; want 3", n, err)
	}
	if got := keys(t, db); len(got) != 2 || !got["r/k"] || !got["s/k"] {
		t.Fatalf("rows left: %v, want r/k and s/k", got)
	}
	// The live rows kept their counts.
	if ok, res := decide(t, s, chk(rs, "k"), chk(sl, "k")); !ok || res[0].Remaining != 3 || res[1].Remaining != 3 {
		t.Errorf("live counters after cleanup: %+v", res)
	}
	clk.Set(base.Add(2 * time.Hour))
	if n, err := s.Cleanup(ctx); err != nil || n != 2 {
		t.Errorf("final run = %d, %v; want 2", n, err)
	}
}

// TestCleanupOneAtATime: while one transaction holds the cleanup lock,
// nobody else deletes; cleaners racing each other delete every expired row
// exactly once, and rows held by a decision are skipped without waiting.
func TestCleanupOneAtATime(t *testing.T) {
	db := pgtest.New(t)
	clk := newClock(base)
	stores := make([]*postgres.Store, 4)
	for i := range stores {
		stores[i] = open(t, db, pgtest.NewPool(t, db.URL, 2), clk.Now, func(o *postgres.Options) {
			o.CleanupBatch, o.CleanupPause = 7, limiter.Off
		})
	}
	f := fixed("f", 5, time.Minute)
	for i := range 100 {
		decide(t, stores[0], chk(f, fmt.Sprint(i)))
	}
	clk.Set(base.Add(time.Hour))
	ctx := context.Background()

	// Another instance is cleaning: nobody else deletes.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrations.AdvisoryLockKey("cleanup", db.Schema)); err != nil {
		t.Fatal(err)
	}
	for _, s := range stores {
		if n, err := s.Cleanup(ctx); err != nil || n != 0 {
			t.Errorf("Cleanup while another cleaner runs = %d, %v; want 0", n, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// A row locked by a decision in flight is skipped, not waited for.
	tx, err = db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+db.Table("counters")+" WHERE rule = 'f' AND key = '0' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
	)
	for _, s := range stores {
		wg.Go(func() {
			for {
				n, err := s.Cleanup(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				total += n
				done := total >= 99
				mu.Unlock()
				if done {
					return
				}
			}
		})
	}
	wait(t, &wg, 30*time.Second)
	if total != 99 {
		t.Errorf("cleaners deleted %d rows, want 99 (the locked one stays)", total)
	}
	if got := keys(t, db); len(got) != 1 || !got["f/0"] {
		t.Errorf("rows left: %v, want only the locked f/0", got)
	}
}

// TestOverrides: an override set on one instance applies there at once
// and on another after its refresh; deleting it restores the rule.
func TestOverrides(t *testing.T) {
	db := pgtest.New(t)
	clk := newClock(base)
	a, b := instance(t, db, clk), instance(t, db, clk)
	ctx := context.Background()
	r := fixed("query", 5, time.Minute)

	if err := a.SetOverride(ctx, chk(r, "vip"), 2, time.Hour); err != nil {
		t.Fatal(err)
	}
	ok, res := decide(t, a, chk(r, "vip"))
	if !ok || res[0].Limit != 2 || res[0].Window != time.Hour || res[0].Remaining != 1 || !res[0].Reset.Equal(base.Add(time.Hour)) {
		t.Errorf("override not applied on the writing instance: %+v", res[0])
	}
	if _, res := decide(t, a, chk(r, "other")); res[0].Limit != 5 {
		t.Errorf("override leaked to another key: %+v", res[0])
	}
	if _, _, ok := b.Override("query", "vip"); ok {
		t.Fatal("b saw the override before refreshing: the test cannot show the refresh")
	}
	if err := b.RefreshOverrides(ctx); err != nil {
		t.Fatal(err)
	}
	if l, w, ok := b.Override("query", "vip"); !ok || l != 2 || w != time.Hour {
		t.Fatalf("b after refresh: %d %v %v", l, w, ok)
	}
	decide(t, b, chk(r, "vip"))
	if ok, res := decide(t, b, chk(r, "vip")); ok || res[0].Limit != 2 {
		t.Errorf("third request with an override of 2 was allowed on b: %+v", res[0])
	}

	// Overrides written by hand are seen too (the trigger bumps the epoch).
	if _, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Table("overrides")+
		` (rule, key, "limit", window_us) VALUES ('query', 'hand', 7, 60000000)`); err != nil {
		t.Fatal(err)
	}
	if err := b.RefreshOverrides(ctx); err != nil {
		t.Fatal(err)
	}
	if l, _, ok := b.Override("query", "hand"); !ok || l != 7 {
		t.Errorf("hand-written override not seen: %d %v", l, ok)
	}

	// Run's poll picks up a deletion within its interval.
	c := open(t, db, pgtest.NewPool(t, db.URL, 2), clk.Now, func(o *postgres.Options) {
		o.PollInterval = 10 * time.Millisecond
		o.CleanupInterval = limiter.Off
	})
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); c.Run(runCtx) }()
	if err := a.DeleteOverride(ctx, chk(r, "vip")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, ok := c.Override("query", "vip"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Run did not refresh the overrides within 5s with a 10ms interval")
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	<-ran
	if _, res := decide(t, a, chk(r, "vip")); res[0].Limit != 5 {
		t.Errorf("after DeleteOverride the rule's limit should apply: %+v", res[0])
	}
}
