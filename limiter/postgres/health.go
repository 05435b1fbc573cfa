package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// Readiness: a store is ready when its breaker is closed, and only a probe
// closes it (limiter.CircuitBreaker). The probe is what makes "ready"
// mean "exact": the first decisions after a start or an outage are the
// ones a cold or broken pool fails, and a failed decision applies its
// rule's fail mode, which lets requests through. So before the breaker
// closes, the probe makes the schema usable (migrated when the store may
// migrate, its version checked, the overrides read) and makes the pool
// warm: connections made, each with the decision statement prepared and
// the decide function compiled and planned in its server process, and
// each answering a real decision within the decision deadline. Until then
// decisions apply their fail modes at once and never wait on the database.
//
// An outage ends readiness the moment the store sees it: the breaker
// opens on failed decisions, and the background poll trips it when the
// database stops answering, even on an idle instance. When it opens, every
// statement in flight is abandoned and every pooled connection dropped:
// connections from before an outage are suspect (a restarted server closed
// them, a failed-over primary no longer takes writes), and a statement
// stuck on a dead connection must not hold the batcher after the database
// is back.

// setupTimeout bounds the schema work of one probe (migrations, version,
// overrides); warmTimeout bounds making and warming its connections.
const (
	setupTimeout = time.Minute
	warmTimeout  = 10 * time.Second
)

// coldTimeout bounds the first decision on a connection, which may have to
// compile and plan the decide function.
const coldTimeout = time.Second

// probeRounds is how many decisions in a row each warm connection must
// make within the decision deadline for a probe to pass: one could be
// luck, right after an outage, while the server works through its backlog.
const probeRounds = 2

// probeRule and probeKey name the counter that probes and warm-ups decide
// on, inside a transaction that is rolled back: the whole write path runs
// (locks, inserts, a read-only server's refusal) and nothing stays. No
// configured rule can have the name: rule names are [a-z0-9-]+.
var probeRule = &policy.Rule{Name: "_sluice_probe", Algorithm: policy.Fixed, Limit: 1 << 40, Window: time.Hour, Cost: 1}

// probeKey is this process's key of probeRule. A key of its own for every
// process: the probe's insert is rolled back, but until then it holds the
// key, and gateways that start together would otherwise probe through one
// another's locks.
var probeKey = func() string {
	var b [8]byte
	rand.Read(b[:])
	return "probe-" + hex.EncodeToString(b[:])
}()

// Probe makes the store ready and proves it: it sets the schema up once
// (see Options.Migrate; a schema that is not migrated far enough is an
// error naming the command to run), then makes sure the pool holds its
// warm connections (pgxpool's MinConns, and at least warmConns) and
// that each makes probeRounds decisions in a row within DecisionTimeout.
// It fails while a statement from before is still in flight. Run calls it
// while the Breaker is open; without a Breaker, call it before the first
// decision. It consumes nothing.
func (s *Store) Probe(ctx context.Context) error {
	s.probes.Add(1)
	if !s.setUp.Load() {
		if err := s.setup(ctx); err != nil {
			return err
		}
	}
	if b := s.batch; b != nil {
		// Statements sent and not answered, not the batcher's slots: a
		// drain that has answered its statement holds its slot until it
		// finds the queue empty, which a loaded machine can delay past
		// the next probe (TestExecModes once saw it in CI).
		if st := s.BatchStats(); st.Unanswered > 0 {
			return fmt.Errorf("postgres store probe: %d decide statements from before are still in flight", st.Unanswered)
		}
	}
	return s.warm(ctx)
}

// setup applies the migrations when the store may, checks the schema's
// version and reads the overrides.
func (s *Store) setup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	// On a pool of its own, without the store pool's AfterConnect: the
	// store's connections are warmed with a decision as they are made,
	// which needs the schema this step migrates and checks.
	cfg := s.pool.Config()
	cfg.AfterConnect, cfg.MinConns, cfg.MaxConns = nil, 0, 1
	plain, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("postgres store: %w", err)
	}
	defer plain.Close()
	if s.opts.Migrate {
		n, err := Migrate(ctx, plain, s.schema)
		if err != nil {
			return fmt.Errorf("postgres store: %w", s.fault(err))
		}
		if n > 0 {
			s.log.Info("migrated the schema", zap.String("schema", s.schema), zap.Int("applied", n))
		}
	}
	if err := s.checkSchema(ctx, plain); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") { // undefined_table, invalid_schema_name
			return fmt.Errorf("postgres store: schema %q is not migrated (run sluice migrate, or leave SLUICE_AUTO_MIGRATE on): %w", s.schema, s.fault(err))
		}
		if errors.As(err, &pgErr) {
			return fmt.Errorf("postgres store: read the schema's version: %w", s.fault(err))
		}
		return &faultError{kind: limiter.ErrorUndefinedTable, err: fmt.Errorf("postgres store: %w", err)}
	}
	if err := s.RefreshOverrides(ctx); err != nil {
		return fmt.Errorf("postgres store: %w", s.fault(err))
	}
	s.setUp.Store(true)
	return nil
}

// warm acquires the pool's warm connections at once (making the missing
// ones, each warmed by ConfigurePool's AfterConnect when the pool has it)
// and has each make a first decision, then probeRounds probe decisions in
// a row, each within DecisionTimeout.
func (s *Store) warm(ctx context.Context) error {
	n := max(int(s.pool.Config().MinConns), warmConns(s.opts))
	n = min(n, int(s.pool.Config().MaxConns))
	actx, cancel := context.WithTimeout(ctx, warmTimeout)
	defer cancel()
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := s.pool.Acquire(actx)
		if err != nil {
			return fmt.Errorf("postgres store probe: connect: %w", s.fault(err))
		}
		conns = append(conns, c)
	}
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			// The first decision of a server process compiles and plans the
			// decide function, tens of milliseconds (unless the connection's
			// AfterConnect did it already): it gets longer than a decision.
			if errs[i] = probeConn(actx, c.Conn(), s.q.decide, coldTimeout); errs[i] != nil {
				return
			}
			for range probeRounds {
				if errs[i] = probeConn(actx, c.Conn(), s.q.decide, s.opts.DecisionTimeout); errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("postgres store probe: %w", s.fault(err))
	}
	if err := s.probeCommit(actx, conns[0]); err != nil {
		return fmt.Errorf("postgres store probe: %w", s.fault(err))
	}
	s.dropLogged.Store(false)
	return nil
}

// probeCommit commits a transaction on conn, as decisions commit theirs
// (with the server's synchronous_commit, or off when the store's commits
// are asynchronous), within the decision deadline. The probe's decisions
// are rolled back, and a rollback waits for nobody; a commit waits for
// the synchronous standbys the server names. A server whose standbys do
// not answer (none left after a failover, say) decides nothing durably,
// and must not be called ready. A late commit is waited for up to
// coldTimeout, as probeConn waits for a late decision, so that a probe on
// a loaded machine does not cost its connection (pgx closes a connection
// whose statement is cancelled).
func (s *Store) probeCommit(ctx context.Context, conn *pgxpool.Conn) error {
	timeout := s.opts.DecisionTimeout
	wait := max(timeout, coldTimeout)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	data := conn.Conn().PgConn().CustomData()
	delete(data, warnedKey)
	// A real decision of the probe's counter, committed: a commit waits
	// only for a transaction that wrote WAL. It costs one unit of the
	// probe's own counter (2^40 an hour), which cleanup removes.
	b, err := probeBatch()
	if err != nil {
		return err
	}
	defer b.release()
	start := time.Now()
	if err := b.query(ctx, conn, s.q.decide, nil, false); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("a probe commit took longer than %v (its deadline is %v; are the synchronous standbys answering?): %w", wait, timeout, err)
		}
		return err
	}
	if _, warned := data[warnedKey]; warned {
		return &faultError{kind: limiter.ErrorTimeout, err: errUncertain}
	}
	if took := time.Since(start); took > timeout {
		return &faultError{kind: limiter.ErrorTimeout,
			err: fmt.Errorf("a probe commit took %v, longer than the %v deadline (are the synchronous standbys answering?)", took.Round(time.Millisecond), timeout)}
	}
	return nil
}

// probeBatch returns a batch built for one decision of probeRule's
// counter, the decision every probe makes; the caller releases it.
func probeBatch() (*batch, error) {
	b := batchPool.Get().(*batch)
	var res [1]limiter.Result
	d := [1]Decision{{Checks: []limiter.Check{{Rule: probeRule, Key: probeKey}}, Results: res[:]}}
	if _, err := b.build(d[:], emptyOverrides, time.Now()); err != nil {
		b.release()
		return nil, err
	}
	return b, nil
}

// probeConn makes one decision of probeRule on conn with the decide
// statement, inside a transaction that it rolls back, and fails unless the
// decision answered within timeout.
//
// A late decision is waited for, up to coldTimeout, rather than abandoned
// at timeout: abandoning a statement closes its connection (pgx closes on
// a cancelled context), and the next probe would then connect, compile
// and plan again, the same cold work that was late. On a loaded machine
// that kept a store unready for as long as the load lasted; waited for, a
// late probe leaves its connection warm, and the next probe can pass.
func probeConn(ctx context.Context, conn *pgx.Conn, decide string, timeout time.Duration) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a failed rollback closes the connection
	b, err := probeBatch()
	if err != nil {
		return err
	}
	defer b.release()
	wait := max(timeout, coldTimeout)
	dctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	start := time.Now()
	if err := b.query(dctx, tx, decide, nil, false); err != nil {
		if dctx.Err() != nil && ctx.Err() == nil {
			return fmt.Errorf("a probe decision took longer than %v (its deadline is %v): %w", wait, timeout, err)
		}
		return err
	}
	if took := time.Since(start); took > timeout {
		return &faultError{kind: limiter.ErrorTimeout,
			err: fmt.Errorf("a probe decision took %v, longer than the %v deadline", took.Round(time.Millisecond), timeout)}
	}
	return nil
}

// emptyOverrides is the override set of probes: none.
var emptyOverrides = &overrideSet{generation: -1}

// watchBreaker abandons the statements in flight and drops the pool's
// connections whenever the breaker opens, until ctx is done. A breaker
// that is open when it starts (a store that was never ready) has no
// connections from before an outage to distrust: dropping them then would
// only throw away the connections the pool is making and warming, and
// make it start again while the first requests arrive.
func (s *Store) watchBreaker(ctx context.Context) {
	prev := s.breaker.State()
	for {
		changed := s.breaker.Changed()
		state := s.breaker.State()
		if state == limiter.BreakerOpen && prev != limiter.BreakerOpen {
			s.abort()
			if s.leases != nil && s.opts.AsynchronousCommit {
				// Without synchronous commit, a crash of the database can
				// lose the last grants: units spent from them after it
				// would be counted nowhere.
				s.leases.dropAll(false)
			}
		}
		prev = state
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// abort abandons every decide statement in flight (their connections are
// closed) and drops every idle pooled connection; busy ones are dropped
// when released. Decisions still queued fail at once (see drain).
func (s *Store) abort() {
	if s.batch != nil {
		s.batch.abort()
	}
	s.pool.Reset()
}

// ready reports whether decisions may go to the database: always without
// a breaker.
func (s *Store) ready() bool {
	return s.breaker == nil || s.breaker.Ready()
}

// trip tells the breaker that the background work saw err, with its kind:
// the breaker counts it in sluice_store_errors_total, and only the store
// knows pgx's errors (a connection attempt that found only read-only
// servers is read_only, not other).
func (s *Store) trip(err error) {
	if s.breaker != nil && err != nil {
		s.breaker.Trip(kinded(err))
	}
}

// warmConns is how many connections a store with opts keeps warm: the
// batcher's MaxInFlight, one for the background work (the poll, cleanup,
// the admin API) and, with leases, one for lease returns. A recall in a
// burst makes every holder send its return while its batcher's statement
// is in flight and the poll may run: with one connection fewer, that
// return waited for a connection to be made, on a cold start beside two
// CPU-bound loops one burst in about five (faults: TestFaultColdStartUnderLoad).
func warmConns(opts Options) int {
	n := opts.MaxInFlight + 1
	if opts.Leasing == Leased {
		n++
	}
	return n
}

// ConfigurePool adapts cfg to a Store with opts before the pool is made:
//
//   - MinConns, unless the connection string set pool_min_conns, becomes
//     warmConns (within MaxConns): the batcher's connections, one for the
//     background work and the admin API and, with leases, one for the
//     returns a recall asks for stay open and warm while the gateway is
//     idle, and pgxpool replaces them in the background when they reach
//     their lifetime, not on a decision's time.
//   - Every new connection is warmed before the pool hands it out: it
//     first runs sql/warm_backend.sql, which stops the server process from
//     handing freed memory back to the kernel after every transaction (see
//     the file), then one probe decision in a rolled-back transaction,
//     which prepares the decide statement on the connection and compiles
//     and plans the decide function in its server process (tens of
//     milliseconds the first time, more than a decision's deadline on a
//     loaded machine). A connection that cannot make that decision (the
//     schema is not migrated yet) is not kept: the pool holds warm
//     connections only. An AfterConnect already in cfg runs after that.
//   - The server's warnings are noted on the connection (CustomData), so
//     that a decide statement during which the server warned counts as
//     uncertain (errUncertain): a commit whose wait for a synchronous
//     standby was cancelled succeeds with only a warning. Without this, a
//     cancelled wait would count as a durable grant.
//   - A connection is not pinged before use, unless cfg.ShouldPing says
//     otherwise. pgxpool pings one that was idle for a second, a round
//     trip more on the decision's deadline for the first request after
//     every quiet second, and on a loaded machine enough to miss it. A
//     connection that died meanwhile fails its statement instead, which is
//     sent again once on a fresh connection (see run), and the background
//     poll trips the breaker within a second when the database goes away.
//
// The store migrates and checks the schema on a pool of its own, without
// this AfterConnect; so does `sluice migrate`.
func ConfigurePool(cfg *pgxpool.Config, opts Options) error {
	opts, err := opts.withDefaults()
	if err != nil {
		return err
	}
	if cfg.MinConns == 0 {
		cfg.MinConns = int32(min(warmConns(opts), int(cfg.MaxConns)))
	}
	if cfg.ShouldPing == nil {
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	}
	decide := loadQueries(opts.Schema, opts.AsynchronousCommit).decide
	notice := cfg.ConnConfig.OnNotice
	cfg.ConnConfig.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		sev := n.SeverityUnlocalized
		if sev == "" {
			sev = n.Severity
		}
		if sev == "WARNING" {
			c.CustomData()[warnedKey] = true
		}
		if notice != nil {
			notice(c, n)
		}
	}
	next := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		// Simple protocol: a statement run once is not worth preparing.
		if _, err := c.Exec(ctx, warmBackendSQL, pgx.QueryExecModeSimpleProtocol); err != nil {
			return fmt.Errorf("postgres store: set up connection: %w", err)
		}
		// The connection's own deadline is the caller's, not a decision's.
		if err := probeConn(ctx, c, decide, warmTimeout); err != nil {
			return fmt.Errorf("postgres store: warm connection: %w", err)
		}
		if next != nil {
			return next(ctx, c)
		}
		return nil
	}
	return nil
}

var warmBackendSQL = func() string {
	b, err := queryFiles.ReadFile("sql/warm_backend.sql")
	if err != nil {
		panic(err) // embedded: cannot happen
	}
	return string(b)
}()
