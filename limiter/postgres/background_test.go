package postgres_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// TestCleanupHoldsNoLockBetweenRoundTrips: the cleaner deletes an expired
// counter that a decision wants again (its key is back in a new window)
// and is then slow to go on: its process is descheduled, as on a loaded
// machine (here, a tracer that sleeps after the cleaner's statement). The
// decision does not wait for it. The cleaner's lock and DELETE once ran
// in a transaction of three round trips, and between the DELETE and the
// COMMIT its session sat idle in transaction holding the deleted row: a
// decision of that key waited for the row, passed its deadline, and
// failed, since a session idle in transaction is not a statement that is
// making progress (TestSoak failed so in a CI run, 184 decisions).
func TestCleanupHoldsNoLockBetweenRoundTrips(t *testing.T) {
	db := pgtest.New(t)
	clk := newClock(base)
	deleted, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	slowCleaner := func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = tracerFunc(func(sql string) {
			if strings.Contains(sql, "DELETE FROM") {
				once.Do(func() { close(deleted); <-resume })
			}
		})
	}
	opts := postgres.Options{Schema: db.Schema, Now: clk.Now, CleanupPause: limiter.Off}
	s := open(t, db, gatewayPool(t, db.URL, 4, opts, slowCleaner), clk.Now, unleased, func(o *postgres.Options) { o.CleanupPause = limiter.Off })
	f := fixed("f", 5, time.Minute)
	decide(t, s, chk(f, "k"))
	clk.Set(base.Add(2 * time.Minute))

	ctx := context.Background()
	cleaned := make(chan error, 1)
	go func() {
		n, err := s.Cleanup(ctx)
		if err == nil && n != 1 {
			err = fmt.Errorf("deleted %d rows, want 1", n)
		}
		cleaned <- err
	}()
	select {
	case <-deleted:
	case err := <-cleaned:
		t.Fatalf("Cleanup ended before its statement was traced: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the cleaner's DELETE did not run")
	}
	// The cleaner is stalled after its statement. A decision of the key
	// it deleted, with the default deadline (50 ms).
	start := time.Now()
	res := make([]limiter.Result, 1)
	ok, err := s.Decide(ctx, []limiter.Check{chk(f, "k")}, res)
	took := time.Since(start)
	close(resume)
	if err != nil || !ok || res[0].Remaining != 4 {
		t.Errorf("decision while the cleaner stalls = %v, %+v, %v after %v; want allowed, 4 left, a new window's first", ok, res[0], err, took.Round(time.Millisecond))
	}
	if err := <-cleaned; err != nil {
		t.Error(err)
	}
}

// tracerFunc is a pgx query tracer that calls f with every statement's
// SQL once the statement has ended, before its connection sends anything
// else: what a process descheduled between two round trips looks like to
// the server.
type tracerFunc func(sql string)

type sqlKey struct{}

func (f tracerFunc) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, sqlKey{}, d.SQL)
}

func (f tracerFunc) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(sqlKey{}).(string)
	f(sql)
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

// TestSoak: a minute of decisions with a one-second window over tens of
// thousands of keys (up to 1,000 new keys every second, each used twice),
// on the database's clock, with Run's cleanup every five seconds. The counters table never
// holds more than the keys of the last cleanup period and a few windows,
// and the process's heap after a collection is flat once warm. The hour
// long version is `go -C bench run . soak -duration 1h`.
//
// It reads the heap of the whole test process, so it is never parallel:
// the package's parallel tests start only once it has ended. .ci/test
// runs it in a process of its own beside the others.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute long")
	}
	const (
		duration      = time.Minute
		keysPerSecond = 1000
		cleanupEvery  = 5 * time.Second
		warmUp        = 15 * time.Second
	)
	db := pgtest.New(t)
	s := open(t, db, pgtest.NewPool(t, db.URL, 4), nil, func(o *postgres.Options) {
		o.CleanupInterval = cleanupEvery
		o.CleanupPause = limiter.Off
	})
	runStore(t, s)

	r := fixed("soak", 10, time.Second)
	began := time.Now()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed int
	)
	for w := range 8 {
		wg.Go(func() {
			res := make([]limiter.Result, 1)
			for i := w; time.Since(began) < duration; i += 8 {
				sec := int(time.Since(began) / time.Second)
				key := fmt.Sprintf("%d-%d", sec, (i/2)%keysPerSecond)
				if _, err := s.Decide(context.Background(), []limiter.Check{chk(r, key)}, res); err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
				}
				// About 2,000 decisions a second in all.
				time.Sleep(4 * time.Millisecond)
			}
		})
	}

	maxRows := (int(cleanupEvery/time.Second) + 3) * keysPerSecond
	var (
		warmHeap, lastHeap uint64
		peakRows           int
	)
	for tick := time.NewTicker(time.Second); time.Since(began) < duration; <-tick.C {
		rows := rowCount(t, db)
		peakRows = max(peakRows, rows)
		if rows > maxRows {
			t.Errorf("%v in: %d counters, want at most %d (the keys of one cleanup period and three windows)",
				time.Since(began).Round(time.Second), rows, maxRows)
		}
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		lastHeap = m.HeapInuse
		if warmHeap == 0 && time.Since(began) >= warmUp {
			warmHeap = m.HeapInuse
		}
	}
	wg.Wait()
	if failed > 0 {
		t.Errorf("%d decisions failed", failed)
	}
	t.Logf("peak %d counters (bound %d); heap in use %.1f MB after warm-up, %.1f MB at the end; resident %.1f MB",
		peakRows, maxRows, float64(warmHeap)/1e6, float64(lastHeap)/1e6, float64(selfRSS(t))/1e6)
	if lastHeap > warmHeap+4<<20 {
		t.Errorf("heap in use grew from %.1f MB to %.1f MB after warm-up", float64(warmHeap)/1e6, float64(lastHeap)/1e6)
	}
}

// selfRSS returns this process's resident memory in bytes.
func selfRSS(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	return 0
}
