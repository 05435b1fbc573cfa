package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/policy"
)

// The soak: the Postgres store alone (no HTTP), driven for a long time at
// a steady rate over a population of keys that keeps being renewed, with
// the store's own background work (cleanup every minute) as in
// production. Every minute it samples the counters table, the process's
// resident memory and heap, and the decisions made, and prints one
// Markdown table: what it shows is whether anything grows that should
// not. The one-minute version is a test (limiter/postgres TestSoak).
//
//	go -C bench run . soak [-duration 1h] [-rate 2000] [-keys 20000] [-window 1m]

// soakOptions are the soak's flags.
type soakOptions struct {
	databaseURL string
	duration    time.Duration
	rate        int           // decisions per second
	keys        int           // live keys at any moment
	window      time.Duration // the rules' window
	sample      time.Duration
}

func parseSoakFlags(args []string) (soakOptions, error) {
	fs := flag.NewFlagSet("bench soak", flag.ContinueOnError)
	var o soakOptions
	defaultURL := defaultDatabaseURL()
	fs.StringVar(&o.databaseURL, "database-url", defaultURL, "Postgres to soak on; the soak creates and drops a database of its own there")
	fs.DurationVar(&o.duration, "duration", time.Hour, "how long to run")
	fs.IntVar(&o.rate, "rate", 2000, "decisions per second")
	fs.IntVar(&o.keys, "keys", 20000, "keys alive at any moment; a key is replaced by a new one after its window")
	fs.DurationVar(&o.window, "window", time.Minute, "the rules' window")
	fs.DurationVar(&o.sample, "sample", time.Minute, "how often to sample")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.duration <= 0 || o.rate < 1 || o.keys < 1 || o.window < time.Second || o.sample <= 0 {
		return o, errors.New("-duration and -sample must be positive, -rate and -keys at least 1, -window at least 1s")
	}
	return o, nil
}

// soak runs the soak and prints its table to stdout.
func soak(ctx context.Context, o soakOptions, stdout, progress io.Writer) error {
	db, err := createBenchDB(ctx, o.databaseURL)
	if err != nil {
		return err
	}
	defer func() {
		dropCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		db.drop(dropCtx) //nolint:errcheck // best effort at the end
	}()
	cfg, err := pgxpool.ParseConfig(db.url)
	if err != nil {
		return err
	}
	opts := postgres.Options{Schema: "sluice", Migrate: true}
	if err := postgres.ConfigurePool(cfg, opts); err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := postgres.New(pool, opts)
	if err != nil {
		return err
	}
	for err := store.Probe(ctx); err != nil; err = store.Probe(ctx) {
		if ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Second)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { store.Run(runCtx) })
	defer func() { stopRun(); bg.Wait() }()

	// Two rules as a login endpoint has them: by IP and by e-mail.
	rules := []*policy.Rule{
		{Name: "login-ip", Limit: 20, Window: o.window, Algorithm: policy.Fixed, Cost: 1},
		{Name: "login-email", Limit: 5, Window: o.window, Algorithm: policy.Sliding, Bucket: policy.DefaultBucket(o.window), Cost: 1},
	}
	var decided, failed atomic.Int64
	began := time.Now()
	deadline := began.Add(o.duration)
	workers := 16
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(began.UnixNano())))
			every := time.Duration(int64(time.Second) * int64(workers) / int64(o.rate))
			res := make([]limiter.Result, len(rules))
			next := time.Now()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				// Key i of the population is replaced every window: its
				// generation is part of its name.
				i := rng.IntN(o.keys)
				gen := int(time.Since(began) / o.window)
				checks := []limiter.Check{
					{Rule: rules[0], Key: "ip-" + strconv.Itoa(gen) + "-" + strconv.Itoa(i)},
					{Rule: rules[1], Key: "email-" + strconv.Itoa(gen) + "-" + strconv.Itoa(i)},
				}
				dctx, cancel := context.WithTimeout(ctx, time.Second)
				_, err := store.Decide(dctx, checks, res)
				cancel()
				decided.Add(1)
				if err != nil {
					failed.Add(1)
				}
				next = next.Add(every)
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
			}
		})
	}

	var autovacuum string
	if err := pool.QueryRow(ctx, "SHOW autovacuum").Scan(&autovacuum); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Soak: %s at %d decisions/s over %d live keys per rule, window %s (fixed and sliding), cleanup every minute. Machine: %s, Go %s, PostgreSQL %s, autovacuum %s.\n\n",
		o.duration, o.rate, o.keys, o.window, machine(), strings.TrimPrefix(runtime.Version(), "go"), db.version(ctx), autovacuum)
	if autovacuum != "on" {
		// Cleanup deletes rows; only vacuum gives their space back.
		fmt.Fprintln(stdout, "Note: autovacuum is off on this server, so the table's size grows with the dead rows of cleanup and updates; sluice relies on autovacuum, as Postgres runs it by default.")
		fmt.Fprintln(stdout)
	}
	fmt.Fprintln(stdout, "| elapsed | decisions/s | failed | counters rows | table size | resident memory | heap in use |")
	fmt.Fprintln(stdout, "|--:|--:|--:|--:|--:|--:|--:|")
	tick := time.NewTicker(o.sample)
	defer tick.Stop()
	last, lastAt := int64(0), began
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case now := <-tick.C:
			done = !now.Before(deadline)
			var rows, bytes int64
			err := pool.QueryRow(ctx, "SELECT count(*), pg_total_relation_size($1::regclass) FROM "+pgx.Identifier{"sluice", "counters"}.Sanitize(),
				"sluice.counters").Scan(&rows, &bytes)
			if err != nil {
				return fmt.Errorf("sample the counters table: %w", err)
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			n := decided.Load()
			fmt.Fprintf(stdout, "| %s | %.0f | %d | %d | %.1f MB | %.1f MB | %.1f MB |\n",
				now.Sub(began).Round(time.Second), float64(n-last)/now.Sub(lastAt).Seconds(), failed.Load(),
				rows, float64(bytes)/1e6, float64(residentBytes())/1e6, float64(m.HeapInuse)/1e6)
			fmt.Fprintf(progress, "soak: %s of %s\n", now.Sub(began).Round(time.Second), o.duration)
			last, lastAt = n, now
		}
	}
	wg.Wait()
	return ctx.Err()
}

// residentBytes is this process's resident memory, or 0 if unknown.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
