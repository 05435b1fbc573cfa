// Package postgres is the durable limiter.Store: counters in PostgreSQL,
// shared by every gateway instance and surviving restarts.
//
// Decisions are made by one statement, SELECT … FROM decide(…), that
// locks, evaluates and writes the counters of a whole batch of decisions
// inside the database, with the database's clock (see
// migrations/0003_decide.up.sql for the algorithm and its locking). The Go
// side only gathers the distinct counters of a batch, applies per-key
// overrides from a local cache, and turns the answer into limiter.Results.
// Concurrent Decide calls share statements through the batcher
// (batcher.go): a decision that arrives while a statement is in flight
// goes with the others that arrived meanwhile in the next one, and a
// decision that finds the store idle goes at once, alone.
//
// Statements go through the pool's default query exec mode: prepared and
// cached by pgx unless the connection string says otherwise. Behind
// PgBouncer in transaction mode, add default_query_exec_mode=exec (or
// simple_protocol) to the connection string; pgx reads it from there, and
// every statement casts its parameters so that it means the same in every
// mode.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/migrations"
)

var _ limiter.Store = (*Store)(nil)

//go:embed sql/*.sql
var queryFiles embed.FS

// Defaults for the zero values of Options.
const (
	DefaultSchema            = "sluice"
	DefaultOverrideRefresh   = 2 * time.Second
	DefaultCleanupInterval   = time.Minute
	DefaultCleanupBatch      = 1000
	DefaultCleanupMaxBatches = 100
	DefaultCleanupPause      = 20 * time.Millisecond
	DefaultMaxInFlight       = 1
	DefaultMaxBatch          = 256
	DefaultStatementTimeout  = 5 * time.Second
	DefaultBatchWait         = 2 * time.Millisecond
)

// maxAttempts bounds the attempts of a decision that decide gave up on
// because of counters created concurrently (see retryable).
const maxAttempts = 5

// Options configure a Store. The zero value of every field means its
// default.
type Options struct {
	// Schema holds sluice's tables and functions, already migrated
	// (migrations.Up). Default "sluice".
	Schema string
	// Now, when set, replaces the database clock: its value is sent with
	// every decision and cleanup. It exists for tests, which move time
	// instead of sleeping; production leaves it nil so that every instance
	// counts on the one clock of the database.
	Now func() time.Time
	// Logger receives the background loops' errors and cleanup totals.
	// Default: no logging. Keys are never logged.
	Logger *zap.Logger
	// OverrideRefresh is how often Run polls for override changes.
	// Default 2s.
	OverrideRefresh time.Duration
	// CleanupInterval is how often Run deletes expired counters. Default
	// 1m. A negative value turns Run's cleanup off (e.g. when pg_cron does
	// it).
	CleanupInterval time.Duration
	// CleanupBatch is the most rows one cleanup transaction deletes.
	// Default 1000.
	CleanupBatch int
	// CleanupMaxBatches bounds one cleanup run; the rest waits for the
	// next run. Default 100.
	CleanupMaxBatches int
	// CleanupPause is the pause between two batches of one run, which
	// leaves room to the decisions. Default 20ms; negative means none.
	CleanupPause time.Duration

	// Unbatched turns the batcher off: every Decide then sends a statement
	// of its own. The default (false) gathers the decisions that arrive
	// while statements are in flight into shared statements; see
	// batcher.go. It exists to compare the two.
	Unbatched bool
	// MaxInFlight bounds the decide statements the batcher keeps in
	// flight at once, hence the connections decisions use. Default 1: one
	// statement in flight gathers the most decisions per transaction, and
	// on a database that shares few cores with the gateway (the 2-core
	// benchmark machine) it gave the best throughput and tail latency; a
	// remote database with many cores and a long round trip may do better
	// with 2 to 4. It is lowered to the pool's MaxConns if that is
	// smaller.
	MaxInFlight int
	// MaxBatch bounds the decisions of one batched statement. Default 256.
	MaxBatch int
	// BatchWait is how long, at most, a busy batcher lets decisions wait
	// for company before it sends their statement (see batcher.go); an
	// idle one never waits. Default 2ms; negative turns gathering off.
	BatchWait time.Duration
	// StatementTimeout bounds a batched statement, which runs under a
	// context of its own rather than under its callers' deadlines (see
	// batcher.go): a database that does not answer within it loses the
	// connection. Default 5s.
	StatementTimeout time.Duration
	// AsynchronousCommit commits the decisions' transactions with
	// synchronous_commit off (SET LOCAL, so it holds through a
	// transaction-mode pooler and touches no other transaction): a commit
	// no longer waits for its WAL to reach disk. A crash of Postgres (not of
	// a gateway) can then lose the counts of the last few hundred
	// milliseconds (up to 3 × wal_writer_delay); nothing is ever corrupted.
	AsynchronousCommit bool
}

// Store is the Postgres limiter.Store. It is safe for simultaneous use by
// multiple goroutines. Its background work (override refresh, cleanup)
// runs only inside Run.
type Store struct {
	pool       *pgxpool.Pool
	opts       Options
	log        *zap.Logger
	schema     string
	cleanupKey int64
	q          queries
	overrides  atomic.Pointer[overrideSet]
	batch      *batcher // nil when Options.Unbatched

	nDecisions, nStatements atomic.Uint64
}

// queries are the statements of queryFiles, written for the Store's schema.
type queries struct {
	decide, cleanupLock, cleanup, reset                   string
	overrideEpoch, overrideLoad, overrideSet, overrideDel string
}

// New returns a Store on pool and schema. It reads the overrides once, which
// also proves that the schema is migrated; it starts nothing in the
// background (see Run).
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, errors.New("postgres store: nil pool")
	}
	if opts.Schema == "" {
		opts.Schema = DefaultSchema
	}
	if err := migrations.ValidateSchema(opts.Schema); err != nil {
		return nil, fmt.Errorf("postgres store: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.OverrideRefresh <= 0 {
		opts.OverrideRefresh = DefaultOverrideRefresh
	}
	if opts.CleanupInterval == 0 {
		opts.CleanupInterval = DefaultCleanupInterval
	}
	if opts.CleanupBatch <= 0 {
		opts.CleanupBatch = DefaultCleanupBatch
	}
	if opts.CleanupMaxBatches <= 0 {
		opts.CleanupMaxBatches = DefaultCleanupMaxBatches
	}
	if opts.CleanupPause == 0 {
		opts.CleanupPause = DefaultCleanupPause
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	opts.MaxInFlight = min(opts.MaxInFlight, int(pool.Config().MaxConns))
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	if opts.StatementTimeout <= 0 {
		opts.StatementTimeout = DefaultStatementTimeout
	}
	if opts.BatchWait == 0 {
		opts.BatchWait = DefaultBatchWait
	}
	s := &Store{
		pool:       pool,
		opts:       opts,
		log:        opts.Logger.Named("postgres"),
		schema:     opts.Schema,
		cleanupKey: migrations.AdvisoryLockKey("cleanup", opts.Schema),
	}
	s.overrides.Store(&overrideSet{generation: -1})
	if !opts.Unbatched {
		s.batch = newBatcher(opts.MaxInFlight, opts.MaxBatch, opts.BatchWait)
	}
	quoted := pgx.Identifier{opts.Schema}.Sanitize()
	load := func(name string) string {
		b, err := queryFiles.ReadFile("sql/" + name + ".sql")
		if err != nil {
			panic(err) // embedded: cannot happen
		}
		return strings.ReplaceAll(string(b), migrations.Placeholder, quoted)
	}
	decide := load("decide")
	if opts.AsynchronousCommit {
		// synchronous_commit off for the decision's transaction only:
		// set_config(…, true) is SET LOCAL, so it lasts until the
		// statement's implicit transaction commits, travels with the
		// statement through a transaction-mode pooler, and leaves the
		// session's other transactions alone. The WHERE clause applies it
		// (once per returned row, harmlessly).
		decide += "WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL\n"
	}
	s.q = queries{
		decide:        decide,
		cleanupLock:   load("cleanup_lock"),
		cleanup:       load("cleanup"),
		reset:         load("reset"),
		overrideEpoch: load("override_epoch"),
		overrideLoad:  load("override_load"),
		overrideSet:   load("override_set"),
		overrideDel:   load("override_delete"),
	}
	if err := s.RefreshOverrides(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
			return nil, fmt.Errorf("postgres store: schema %q is not migrated (run ./sluice migrate): %w", opts.Schema, err)
		}
		return nil, fmt.Errorf("postgres store: %w", err)
	}
	return s, nil
}

// Ping reports whether the store can read its schema: the database is
// reachable and sluice's tables are there and readable. It backs /readyz.
func (s *Store) Ping(ctx context.Context) error {
	var gen int64
	if err := s.pool.QueryRow(ctx, s.q.overrideEpoch).Scan(&gen); err != nil {
		return fmt.Errorf("postgres store ping: %w", s.fault(err))
	}
	return nil
}

// Reset forgets the counter of key under rule: its next request starts
// from a full limit. Other instances see it at their next decision (their
// over-limit caches are the caller's concern).
func (s *Store) Reset(ctx context.Context, rule, key string) error {
	if _, err := s.pool.Exec(ctx, s.q.reset, rule, key); err != nil {
		return fmt.Errorf("postgres store: reset rule %q: %w", rule, err)
	}
	return nil
}

// Run does the Store's background work until ctx is cancelled: it polls
// for override changes every OverrideRefresh and deletes expired counters
// every CleanupInterval. Errors are logged and retried at the next tick,
// never returned; Run returns nil once ctx is done and its work has
// stopped.
func (s *Store) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.runCleanup(ctx)
	}()
	s.runOverrides(ctx)
	<-done
	return nil
}

// sleep waits for d or until ctx is done, and reports whether it waited.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// nowParam is the clock parameter of a statement: NULL for the database
// clock, or Options.Now in µs.
func (s *Store) nowParam() *int64 {
	if s.opts.Now == nil {
		return nil
	}
	us := s.opts.Now().UnixMicro()
	return &us
}
