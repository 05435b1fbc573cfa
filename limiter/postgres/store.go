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
// A Store is ready, and decisions go to the database, only while its
// breaker is closed; health.go says how a probe makes it ready and how the
// background work ends readiness when the database goes away.
//
// Statements go through the pool's default query exec mode: prepared and
// cached by pgx unless the connection string says otherwise. Behind
// PgBouncer in transaction mode, add default_query_exec_mode=exec (or
// simple_protocol) to the connection string; pgx reads it from there, and
// every statement casts its parameters so that it means the same in every
// mode.
//
// It imports only limiter, policy and migrations of sluice: nothing of
// HTTP, no other store.
package postgres

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/migrations"
)

var _ limiter.SelfTimed = (*Store)(nil)

// TimesItself reports whether the Store holds each statement to
// DecisionTimeout from the moment it is sent (batcher.go), so that the
// limiter gives its decisions no deadline of their own: when it batches.
// Unbatched, nothing queues, and the limiter's deadline bounds each
// decision as before.
func (s *Store) TimesItself() bool { return s.batch != nil }

//go:embed sql/*.sql
var queryFiles embed.FS

// Defaults for the zero values of Options.
const (
	DefaultSchema            = "sluice"
	DefaultDecisionTimeout   = limiter.DefaultTimeout
	DefaultPollInterval      = 500 * time.Millisecond
	DefaultCleanupInterval   = time.Minute
	DefaultCleanupBatch      = 1000
	DefaultCleanupMaxBatches = 100
	DefaultCleanupPause      = 20 * time.Millisecond
	DefaultMaxInFlight       = 1
	DefaultMaxBatch          = 256
	DefaultMaxQueued         = 8192
	DefaultStatementTimeout  = 5 * time.Second
	DefaultBatchWait         = 2 * time.Millisecond
	DefaultMaxLeases         = 100_000
)

// maxAttempts bounds the attempts of a decision that decide gave up on
// because of counters created concurrently (see retryable).
const maxAttempts = 5

// Batching says whether concurrent decisions share statements.
type Batching uint8

const (
	// Batched, the default, gathers the decisions that arrive while
	// statements are in flight into shared statements; see batcher.go.
	Batched Batching = iota
	// Unbatched turns the batcher off: every Decide sends a statement of
	// its own. It exists to compare the two.
	Unbatched
)

// Leasing says whether the store spends parts of limits in memory (see
// lease.go).
type Leasing uint8

const (
	// Leased, the default: counters with room are leased to this gateway
	// in slices, and requests answered from them in memory.
	Leased Leasing = iota
	// Unleased: every decision goes to the database.
	Unleased
)

// Options configure a Store. The zero value of every field means its
// default, the Default… constant it names; a field that can be off is
// turned off by limiter.Off (see there for the convention).
type Options struct {
	// Schema holds sluice's tables and functions. Zero means
	// DefaultSchema.
	Schema string
	// Migrate makes the store apply the embedded migrations (migrations.Up)
	// before its first probe succeeds (SLUICE_AUTO_MIGRATE). Otherwise the
	// store waits, not ready, until someone else has migrated the schema.
	Migrate bool
	// Now, when set, replaces the database clock: its value is sent with
	// every decision and cleanup. It exists for tests, which move time
	// instead of sleeping; production leaves it nil so that every instance
	// counts on the one clock of the database.
	Now func() time.Time
	// Logger receives the background work's changes of state and cleanup
	// totals. Default: no logging. Keys are never logged.
	Logger *zap.Logger
	// Breaker is the store's circuit breaker and its readiness: Run probes
	// the database while it is open and closes it once decisions will be
	// exact (see Probe), and the background work trips it the moment it
	// sees the database go away. The gateway gives the same breaker to its
	// limiter. Nil: no breaker; the store is used as it is (tests call
	// Probe themselves).
	Breaker *limiter.CircuitBreaker
	// DecisionTimeout is the deadline of one decide statement once sent
	// (SLUICE_DB_TIMEOUT): a decision that waits on a statement the
	// database has not answered within it fails, while time queued behind
	// statements that are answered in time never counts (batcher.go). A
	// probe passes only when its decisions meet it. Zero means
	// DefaultDecisionTimeout.
	DecisionTimeout time.Duration
	// Forget is called for every key whose counter was reset or whose
	// override changed, on any instance, with the database's time of the
	// change; the gateway passes its limiter's Forget, so that an admin
	// reset clears the over-limit fast path of every instance, but no
	// denial decided after the reset. Nil: nobody is told.
	Forget func(rule, key string, at time.Time)
	// PollInterval is how often Run checks that the database answers and
	// reads the key events and the overrides' generation, all in one round
	// trip. Zero means DefaultPollInterval.
	PollInterval time.Duration
	// CleanupInterval is how often Run deletes expired counters. Zero
	// means DefaultCleanupInterval; limiter.Off turns Run's cleanup off
	// (e.g. when pg_cron does it).
	CleanupInterval time.Duration
	// CleanupBatch is the most rows one cleanup transaction deletes. Zero
	// means DefaultCleanupBatch.
	CleanupBatch int
	// CleanupMaxBatches bounds one cleanup run; the rest waits for the
	// next run. Zero means DefaultCleanupMaxBatches.
	CleanupMaxBatches int
	// CleanupPause is the pause between two batches of one run, which
	// leaves room to the decisions. Zero means DefaultCleanupPause;
	// limiter.Off means no pause.
	CleanupPause time.Duration

	// Batching says whether concurrent decisions share statements. Zero
	// means Batched.
	Batching Batching
	// MaxInFlight bounds the decide statements the batcher keeps in
	// flight at once, hence the connections decisions use. Zero means
	// DefaultMaxInFlight, 1: one statement in flight gathers the most
	// decisions per transaction, and on a database that shares few cores
	// with the gateway (the 2-core benchmark machine) it gave the best
	// throughput and tail latency; a remote database with many cores and a
	// long round trip may do better with 2 to 4. It is lowered to the
	// pool's MaxConns if that is smaller.
	MaxInFlight int
	// MaxBatch bounds the decisions of one batched statement. Zero means
	// DefaultMaxBatch.
	MaxBatch int
	// MaxQueued bounds the decisions waiting for a statement, so that
	// memory stays flat whatever the burst; a decision that finds the queue
	// full fails at once with limiter.ErrorOverload (its fail mode applies,
	// the breaker does not count it). Zero means DefaultMaxQueued.
	MaxQueued int
	// BatchWait is how long, at most, a busy batcher lets decisions wait
	// for company before it sends their statement (see batcher.go); an
	// idle one never waits. Zero means DefaultBatchWait; limiter.Off turns
	// gathering off.
	BatchWait time.Duration
	// StatementTimeout bounds a batched statement, which runs under a
	// context of its own rather than under its callers' deadlines (see
	// batcher.go): a database that does not answer within it loses the
	// connection. Zero means DefaultStatementTimeout.
	StatementTimeout time.Duration
	// Leasing says whether counters with room are leased (lease.go). Zero
	// means Leased.
	Leasing Leasing
	// MaxLeases bounds the counters this store keeps lease state for; past
	// it, new counters are decided per request. Zero means
	// DefaultMaxLeases.
	MaxLeases int
	// AsynchronousCommit commits the decisions' transactions with
	// synchronous_commit off (SET LOCAL, so it holds through a
	// transaction-mode pooler and touches no other transaction): a commit
	// no longer waits for its WAL to reach disk. A crash of Postgres (not of
	// a gateway) can then lose the counts of the last few hundred
	// milliseconds (up to 3 × wal_writer_delay); nothing is ever corrupted.
	AsynchronousCommit bool
}

// withDefaults returns o with every zero field set to its default, or an
// error for an invalid schema name or a negative duration other than
// limiter.Off.
func (o Options) withDefaults() (Options, error) {
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	if err := migrations.ValidateSchema(o.Schema); err != nil {
		return o, fmt.Errorf("postgres store: %w", err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"CleanupInterval", o.CleanupInterval}, {"CleanupPause", o.CleanupPause}, {"BatchWait", o.BatchWait}} {
		if d.v < 0 && d.v != limiter.Off {
			return o, fmt.Errorf("postgres store: %s %v: must be limiter.Off or not negative", d.name, d.v)
		}
	}
	if o.Batching > Unbatched {
		return o, fmt.Errorf("postgres store: Batching %d: unknown", o.Batching)
	}
	if o.Leasing > Unleased {
		return o, fmt.Errorf("postgres store: Leasing %d: unknown", o.Leasing)
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	o.DecisionTimeout = positiveOr(o.DecisionTimeout, DefaultDecisionTimeout)
	o.PollInterval = positiveOr(o.PollInterval, DefaultPollInterval)
	o.CleanupInterval = cmp.Or(o.CleanupInterval, DefaultCleanupInterval) // Off stays off
	o.CleanupBatch = positiveOr(o.CleanupBatch, DefaultCleanupBatch)
	o.CleanupMaxBatches = positiveOr(o.CleanupMaxBatches, DefaultCleanupMaxBatches)
	o.CleanupPause = cmp.Or(o.CleanupPause, DefaultCleanupPause)
	o.MaxInFlight = positiveOr(o.MaxInFlight, DefaultMaxInFlight)
	o.MaxBatch = positiveOr(o.MaxBatch, DefaultMaxBatch)
	o.MaxQueued = positiveOr(o.MaxQueued, DefaultMaxQueued)
	o.StatementTimeout = positiveOr(o.StatementTimeout, DefaultStatementTimeout)
	o.BatchWait = cmp.Or(o.BatchWait, DefaultBatchWait)
	o.MaxLeases = positiveOr(o.MaxLeases, DefaultMaxLeases)
	return o, nil
}

// positiveOr returns v if it is positive, else def: the default of a field
// that cannot be off.
func positiveOr[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// Store is the Postgres limiter.Store. It is safe for simultaneous use by
// multiple goroutines. Its background work (probing, polling, cleanup)
// runs only inside Run.
type Store struct {
	pool       *pgxpool.Pool
	opts       Options
	log        *zap.Logger
	schema     string
	cleanupKey int64
	q          queries
	overrides  atomic.Pointer[overrideSet]
	batch      *batcher    // nil when Unbatched
	renewals   renewals    // background lease renewals gathering
	leases     *leaseTable // nil when Unleased
	breaker    *limiter.CircuitBreaker
	forget     func(rule, key string, at time.Time)

	setUp      atomic.Bool // the schema was found migrated and the overrides read
	probes     atomic.Uint64
	dropLogged atomic.Bool // a stale server's pool drop was logged since the last successful probe

	nDecisions, nStatements atomic.Uint64
	nQuestions              atomic.Uint64 // progress questions (progress.go)

	checker  checker       // asks whether a late statement progresses
	recall   *recalls      // decisions waiting on recalled units
	recalled atomic.Uint64 // times a provisional denial was asked again
}

// queries are the statements of queryFiles, written for the Store's schema.
type queries struct {
	decide, cleanup, reset, poll, prune                                  string
	overrideEpoch, overrideLoad, overrideSet, overrideDel, schemaVersion string
	leaseReturn, progress                                                string
}

// New returns a Store on pool and opts.Schema. It touches nothing: the
// database may be down or unmigrated. With a Breaker, Run makes the store
// ready (see Probe); without one, call Probe before the first decision.
func New(pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, errors.New("postgres store: nil pool")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	opts.MaxInFlight = min(opts.MaxInFlight, int(pool.Config().MaxConns))
	s := &Store{
		pool:       pool,
		opts:       opts,
		log:        opts.Logger.Named("postgres"),
		schema:     opts.Schema,
		cleanupKey: migrations.AdvisoryLockKey("cleanup", opts.Schema),
		q:          loadQueries(opts.Schema, opts.AsynchronousCommit),
		breaker:    opts.Breaker,
		forget:     opts.Forget,
		recall:     newRecalls(),
		renewals:   renewals{gather: renewGather},
	}
	if s.forget == nil {
		s.forget = func(string, string, time.Time) {}
	}
	if opts.Leasing == Leased {
		s.leases = newLeaseTable(opts.MaxLeases)
	}
	s.overrides.Store(&overrideSet{generation: -1})
	if opts.Batching == Batched {
		s.batch = newBatcher(opts.MaxInFlight, opts.MaxBatch, opts.MaxQueued, opts.BatchWait, opts.DecisionTimeout)
	}
	return s, nil
}

// loadQueries returns the statements of queryFiles written for schema.
func loadQueries(schema string, asyncCommit bool) queries {
	decide := loadQuery(schema, "decide")
	if asyncCommit {
		// synchronous_commit off for the decision's transaction only:
		// set_config(…, true) is SET LOCAL, so it lasts until the
		// statement's implicit transaction commits, travels with the
		// statement through a transaction-mode pooler, and leaves the
		// session's other transactions alone. The WHERE clause applies it
		// (once per returned row, harmlessly).
		decide += "WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL\n"
	}
	return queries{
		decide:        decide,
		cleanup:       strings.Replace(loadQuery(schema, "cleanup_batch"), "{{cleanup}}", loadQuery(schema, "cleanup"), 1),
		reset:         loadQuery(schema, "reset"),
		poll:          loadQuery(schema, "poll"),
		prune:         loadQuery(schema, "key_events_prune"),
		overrideEpoch: loadQuery(schema, "override_epoch"),
		overrideLoad:  loadQuery(schema, "override_load"),
		overrideSet:   loadQuery(schema, "override_set"),
		overrideDel:   loadQuery(schema, "override_delete"),
		schemaVersion: loadQuery(schema, "schema_version"),
		leaseReturn:   loadQuery(schema, "lease_return"),
		progress:      loadQuery(schema, "progress"),
	}
}

// loadQuery returns the embedded statement name, written for schema.
func loadQuery(schema, name string) string {
	b, err := queryFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic(err) // embedded: cannot happen
	}
	return strings.ReplaceAll(string(b), migrations.Placeholder, pgx.Identifier{schema}.Sanitize())
}

// Reset forgets c's counter: its next request starts from a full limit.
// The units gateways hold on leases of it stay counted until they hear of
// the reset (see reset_counter): this one at once, the others through the
// notification reset_counter sends or, should they miss it (not yet
// listening, or behind a pooler), their next poll. Each then gives its
// lease up, and gives back with the units it did not spend those it spent
// before the reset (leaseTable.invalidate), so that the count is what was
// spent since. Every instance's over-limit cache forgets the key.
func (s *Store) Reset(ctx context.Context, c limiter.Check) error {
	var atUS int64
	if err := s.pool.QueryRow(ctx, s.q.reset, s.nowParam(), c.Rule.Name, c.Key).Scan(&atUS); err != nil {
		return fmt.Errorf("postgres store: reset rule %q: %w", c.Rule.Name, s.fault(err))
	}
	s.resetEvent(c.Rule.Name, c.Key, time.UnixMicro(atUS))
	return nil
}

// keyEvent handles a key event at at (database clock): an admin reset, an
// override change, or a gateway asking for the key's leased units. This
// instance's leases of the key granted before it are given up (what they
// spent stays counted) and its over-limit cache forgets the key.
func (s *Store) keyEvent(rule, key string, at time.Time) {
	if s.leases != nil {
		s.leases.invalidate(rule, key, at, false)
	}
	s.forget(rule, key, at)
}

// resetEvent handles an admin reset of (rule, key) at at (database
// clock), heard from Reset or from reset_counter's notification: as
// keyEvent, but the units this instance spent from its lease before the
// reset are given back too, at once.
func (s *Store) resetEvent(rule, key string, at time.Time) {
	if s.leases != nil {
		s.leases.forgiveQueued(rule, key, at.UnixMicro())
		if s.leases.invalidate(rule, key, at, true) {
			s.recall.flushNow()
		}
	}
	s.forget(rule, key, at)
}

// localNow is the clock of leases: Options.Now when a test set it (the
// database clock is then Now too), else the wall clock.
func (s *Store) localNow() time.Time {
	if s.opts.Now != nil {
		return s.opts.Now()
	}
	return time.Now()
}

// Run does the Store's background work until ctx is cancelled, and owns
// every goroutine the store starts: it probes the database while the
// Breaker is open (see Probe); while it is closed, it polls every
// PollInterval (see poll: the heartbeat that trips the breaker when the
// database goes away, key events and override changes) and deletes
// expired counters every CleanupInterval. When the breaker opens,
// statements in flight are abandoned and the pool's connections dropped.
// Errors are logged on changes of state, never returned. When ctx ends,
// Run returns once its loops have stopped and the batcher's drains (which
// decisions start and which end when the queue is empty) have ended; the
// caller stops making decisions first.
func (s *Store) Run(ctx context.Context) {
	var wg sync.WaitGroup
	if s.breaker != nil {
		wg.Go(func() { s.breaker.Run(ctx, s.Probe) })
		wg.Go(func() { s.watchBreaker(ctx) })
	}
	wg.Go(func() { s.runPoll(ctx) })
	if s.batch != nil {
		wg.Go(func() { s.keepChecker(ctx) })
	}
	wg.Go(func() { s.runCleanup(ctx) })
	if s.leases != nil {
		wg.Go(func() { s.runLeases(ctx) })
		wg.Go(func() { s.listen(ctx) })
	}
	wg.Wait()
	if s.batch != nil {
		s.stopBatch()
		s.batch.drains.Wait()
	}
	if s.leases != nil {
		// After the drains, so that no renewal grants more meanwhile.
		s.returnAll(ctx)
	}
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
