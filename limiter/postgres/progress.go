package postgres

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// Progress: telling a database that answers slowly from one that does not
// answer.
//
// A decide statement that has not been answered within the decision
// deadline is not, on its own, a failing database. On a gateway that a
// burst keeps busy, or on a hot key that several gateways decide at once
// (their statements queue on the counter's row lock, each holding it
// through its commit), a statement can take longer than the deadline while
// the database does exactly what it should: that is load, and load is not
// an outage. So when a statement passes its deadline, the store asks the
// database, on another connection and within another deadline, what the
// statement's server process is doing (sql/progress.sql). It is making
// progress when it is waiting only for other sluice statements that are
// running (their locks are released as they commit): the statement is
// then asked about again later (see below). It is not when the database does not answer
// the question in time (down, paused, cut off, out of connections), when a
// session that is not a running sluice statement holds what it waits for
// (a lock held by an idle transaction, a migration, a manual LOCK), or
// when its commit waits for a synchronous standby: then every decision
// waiting on the statement fails (batcher.go), and the breaker counts it.
//
// How long the database has to answer the question is the one judgement
// of time left, and it follows the database: three times the slowest
// answer the gateway has had from it lately (its last 64 decide statements
// and questions), at least progressFloor (or the decision deadline, if
// longer) and at most progressCeiling. A calm database that stops
// answering is noticed within the deadline and about progressFloor; one
// that was answering slowly because the machine is loaded (two CPU-bound
// loops beside it, a race-instrumented test client: questions seen taking
// up to 570 ms where the median was 24 ms) gets the time its recent
// answers show it needs. A "no" is asked again once before it counts: the
// question reads the blocking sessions and their states at two moments,
// so a sluice session that went idle between them can pass for a
// stranger. A lock held by a stranger is thus noticed within the deadline
// and two round trips.
//
// A statement found progressing is asked again after a wait that doubles
// with each "yes", from the decision deadline up to progressFloor. The
// question is not free: pg_blocking_pids takes every partition of the
// server's lock manager, once per question (as first written, the query
// ran it once per server process it scanned: some 400 times a question with
// 64 gateways). When 64 gateways queue their renewals on one hot row,
// each of their late statements asked every 50 ms, and the questions (43
// of them at once, waiting on LWLock:LockManager) slowed the very queue
// they were asking about until breakers opened on a healthy database. A
// stranger that takes a lock after a statement was found progressing is
// noticed at the next question, within a second and the question's own
// budget.

const (
	progressFloor   = time.Second
	progressCeiling = 3 * time.Second
	// confirmAfter is the pause before a "no" is asked again.
	confirmAfter = 10 * time.Millisecond
)

// answerTimes are the durations of the database's recent answers.
type answerTimes struct {
	mu   sync.Mutex
	ring [64]time.Duration
	next int
}

// add records an answer that took d.
func (a *answerTimes) add(d time.Duration) {
	a.mu.Lock()
	a.ring[a.next] = d
	a.next = (a.next + 1) % len(a.ring)
	a.mu.Unlock()
}

// budget is how long the database has to answer a question now: three
// times its slowest recent answer, within [floor, max(floor,
// progressCeiling)].
func (a *answerTimes) budget(floor time.Duration) time.Duration {
	a.mu.Lock()
	slowest := slices.Max(a.ring[:])
	a.mu.Unlock()
	return min(max(floor, 3*slowest), max(floor, progressCeiling))
}

// watch runs when st has passed its deadline unanswered, in a goroutine of
// its own; it returns once st is answered or marked late.
func (s *Store) watch(st *inFlight) {
	wait := s.opts.DecisionTimeout
	for {
		why, timedOut := s.progressing(st)
		if why != "" && !timedOut && s.pause(st, confirmAfter) {
			why, _ = s.progressing(st) // a "no" counts when said twice
		}
		if why != "" {
			select {
			case <-st.done:
				return
			default:
			}
			s.log.Warn("a decide statement missed its deadline and the database is not answering it: the decisions waiting on it fail",
				zap.String("why", why), zap.Duration("deadline", s.opts.DecisionTimeout))
			s.batch.miss(st)
			return
		}
		if !s.pause(st, wait) {
			return
		}
		wait = min(2*wait, max(progressFloor, s.opts.DecisionTimeout))
	}
}

// logOverBound says why a statement that was never judged late ran into
// its bound (StatementTimeout): the database kept answering that it made
// progress, and what the statement's process waited for when last asked.
func (s *Store) logOverBound(st *inFlight) {
	waiting := "not asked"
	if w := st.waiting.Load(); w != nil {
		waiting = *w
	}
	s.log.Warn("a decide statement ran into its bound while the database said it was progressing: the decisions in it fail",
		zap.Duration("bound", s.opts.StatementTimeout), zap.String("waiting", waiting))
}

// pause waits d, or until st is answered; it reports false in that case.
func (s *Store) pause(st *inFlight, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-st.done:
		return false
	case <-t.C:
		return true
	}
}

// progressing reports why the statement st is not making progress (see
// the top of this file), or "" when it is; timedOut tells that the
// database did not answer in time (and so was not asked twice). The
// statement may still be waiting for a connection: it gets the budget to
// have one. The question goes over a connection of its own (keepChecker
// keeps it open; the pool's when it is not), so that it never waits for
// the pool, nor for a new connection to be made and warmed.
func (s *Store) progressing(st *inFlight) (why string, timedOut bool) {
	budget := s.batch.recent.budget(max(progressFloor, s.opts.DecisionTimeout))
	began := time.Now()
	pid := st.pid.Load()
	for pid == 0 {
		if time.Since(began) >= budget {
			return fmt.Sprintf("the statement has had no connection for %v after its deadline", budget), true
		}
		if !s.pause(st, 5*time.Millisecond) {
			return "", false // answered
		}
		pid = st.pid.Load()
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget-time.Since(began))
	defer cancel()
	s.checker.mu.Lock()
	defer s.checker.mu.Unlock()
	var q querier = s.checker.conn
	if s.checker.conn == nil || s.checker.conn.IsClosed() {
		q = s.pool // not open yet (or lost): the pool's, if it has one free
	}
	asked := time.Now()
	s.nQuestions.Add(1)
	var (
		ok                 bool
		waiting, strangers string
	)
	ask := func(q querier) error {
		return q.QueryRow(ctx, s.q.progress, pgx.QueryExecModeSimpleProtocol, int32(pid)).Scan(&ok, &waiting, &strangers)
	}
	err := ask(q)
	if err != nil && q != querier(s.pool) && ctx.Err() == nil {
		// The checking connection died with its server process (the
		// server restarted, or the backend was ended), which pgx learns
		// only when it sends: the question failed at once, and says
		// nothing of the statement. Asked again on a new connection,
		// within the same budget.
		s.checker.conn.Close(context.Background()) //nolint:errcheck // replaced here
		s.checker.conn = nil
		var conn *pgx.Conn
		if conn, err = pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy()); err == nil {
			s.checker.conn = conn
			err = ask(conn)
		}
	}
	if err != nil {
		if s.checker.conn != nil {
			s.checker.conn.Close(context.Background()) //nolint:errcheck // replaced by keepChecker
		}
		return fmt.Sprintf("the database did not answer the question within %v: %v", budget, err), true
	}
	s.batch.recent.add(time.Since(asked))
	if waiting == "" {
		waiting = "nothing (running)"
	}
	st.waiting.Store(&waiting)
	switch {
	case ok:
	case strangers != "":
		return "it waits for sessions that are not running sluice statements: " + strangers, false
	case waiting == "IPC:SyncRep":
		return "its commit waits for a synchronous standby", false
	default: // a stranger that was gone by the time its state was read
		return "it waits for a session that is not a running sluice statement, or for a synchronous standby", false
	}
	return "", false
}

// checker is the connection progressing asks over.
type checker struct {
	mu   sync.Mutex
	conn *pgx.Conn // nil or closed: keepChecker opens another
}

// keepChecker keeps the checking connection open while the store is
// ready, until ctx ends.
func (s *Store) keepChecker(ctx context.Context) {
	defer func() {
		s.checker.mu.Lock()
		if s.checker.conn != nil {
			s.checker.conn.Close(context.Background()) //nolint:errcheck // shutting down
		}
		s.checker.mu.Unlock()
	}()
	for sleep(ctx, 20*time.Millisecond) {
		s.checker.mu.Lock()
		open := s.checker.conn != nil && !s.checker.conn.IsClosed()
		s.checker.mu.Unlock()
		if open || !s.ready() {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, pollTimeout)
		conn, err := pgx.ConnectConfig(cctx, s.pool.Config().ConnConfig.Copy())
		cancel()
		if err != nil {
			continue // the poll trips the breaker if the database is gone
		}
		s.checker.mu.Lock()
		s.checker.conn = conn
		s.checker.mu.Unlock()
	}
}
