package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// The background poll: every PollInterval, while the store is ready, one
// round trip reads the key events (admin resets and override changes made
// on any instance) and the overrides' generation, and the pool's idle
// connections are pinged. It is the heartbeat that tells an idle instance
// that the database went away: a failure trips the breaker, which drops the
// pool and keeps decisions off the database until a probe has made
// everything warm again.

// pollTimeout bounds one poll: the ping of the idle connections and the
// query. A database that cannot answer that within it is not deciding
// within any decision's deadline either.
const pollTimeout = 2 * time.Second

// keyEventOverlap is how far back each poll of key events reaches before
// the previous poll's clock: events of transactions that committed late
// (their rows carry the time they were written, not committed) are still
// seen. Re-reading an event only forgets a key twice.
const keyEventOverlap = 5 * time.Second

// pruneEvery is how many polls pass between two prunes of old key events.
const pruneEvery = 600

// runPoll polls every PollInterval until ctx is done.
func (s *Store) runPoll(ctx context.Context) {
	since := time.Now().Add(-keyEventOverlap).UnixMicro() // first poll: a gateway-clock guess, corrected by the reply
	failing := newStateLog(s.log, "background poll")
	for n := 0; sleep(ctx, s.opts.PollInterval); {
		if !s.ready() {
			continue // the probe is the only thing that talks to a store that is not ready
		}
		next, err := s.poll(ctx, since)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.trip(err)
			failing.report(err)
			continue
		}
		failing.report(nil)
		since = next - keyEventOverlap.Microseconds()
		if n++; n%pruneEvery == 1 { // the first poll, then every pruneEvery
			if _, err := s.pool.Exec(ctx, s.q.prune); err != nil && ctx.Err() == nil {
				s.log.Debug("prune key events", zap.Error(err))
			}
		}
	}
}

// poll pings the idle connections, forgets the keys of the events since
// since (µs), refreshes the overrides if their generation moved, and
// returns the database's clock.
func (s *Store) poll(ctx context.Context, since int64) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	if err := s.pingIdle(ctx); err != nil {
		return 0, err
	}
	rows, err := s.pool.Query(ctx, s.q.poll, since)
	if err != nil {
		return 0, s.fault(err)
	}
	var (
		rule, key *string
		atUS      int64
		gen       *int64
		now       int64
		newest    int64 = -1
	)
	_, err = pgx.ForEachRow(rows, []any{&rule, &key, &atUS, &gen}, func() error {
		if rule != nil && key != nil {
			s.forget(*rule, *key, time.UnixMicro(atUS))
			return nil
		}
		now = atUS
		if gen != nil {
			newest = *gen
		}
		return nil
	})
	if err != nil {
		return 0, s.fault(err)
	}
	if newest != s.overrides.Load().generation {
		if err := s.loadOverrides(ctx, newest); err != nil {
			return 0, s.fault(err)
		}
	}
	return now, nil
}

// pingIdle pings every idle pooled connection at once and closes the ones
// that do not answer, so that a connection the server dropped while the
// instance was idle is found by the heartbeat, not by a decision. It
// returns the first error.
func (s *Store) pingIdle(ctx context.Context) error {
	conns := s.pool.AcquireAllIdle(ctx)
	errs := make(chan error, len(conns))
	for _, c := range conns {
		go func(c *pgxpool.Conn) {
			err := c.Ping(ctx)
			if err != nil {
				c.Conn().Close(context.WithoutCancel(ctx)) //nolint:errcheck // closing a broken connection
			}
			c.Release() // a closed connection leaves the pool
			errs <- err
		}(c)
	}
	var first error
	for range conns {
		if err := <-errs; err != nil && first == nil {
			first = s.fault(err)
		}
	}
	return first
}

// stateLog logs the failures of a background loop on changes of state
// only: Warn when it starts failing (or fails with another kind of error),
// Info when it works again, nothing while it keeps failing the same way,
// so that an outage is a line at each end rather than one per tick.
type stateLog struct {
	log  *zap.Logger
	what string
	kind string // the kind of the current failure; "" while working
}

func newStateLog(log *zap.Logger, what string) *stateLog {
	return &stateLog{log: log, what: what}
}

func (l *stateLog) report(err error) {
	switch {
	case err == nil && l.kind != "":
		l.log.Info(l.what + " works again")
		l.kind = ""
	case err != nil && ErrorKind(err) != l.kind:
		l.kind = ErrorKind(err)
		l.log.Warn(l.what+" failed", zap.String("kind", l.kind), zap.Error(err))
	}
}
