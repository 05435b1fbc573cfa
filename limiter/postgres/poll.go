package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// The background poll: every PollInterval, while the store is ready, one
// round trip reads the key events (admin resets and override changes made
// on any instance) and the overrides' generation. It is the heartbeat that
// tells an idle instance that the database went away: a failure trips the
// breaker, which drops the pool and keeps decisions off the database until
// a probe has made everything warm again. (Pooled connections that died
// while idle are found by pgxpool itself, which pings a connection idle for
// more than a second before handing it out; the poll does not hold the
// idle connections to ping them, since a decision arriving meanwhile would
// have to make a new one.)

// pollTimeout bounds one poll. A database that cannot answer that within it is not deciding
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

// poll forgets the keys of the events since since (µs), refreshes the
// overrides if their generation moved, and returns the database's clock.
func (s *Store) poll(ctx context.Context, since int64) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, s.q.poll, since)
	if err != nil {
		return 0, s.fault(err)
	}
	var (
		rule, key *string
		atUS      int64
		gen       *int64
		reset     *bool
		now       int64
		newest    int64 = -1
	)
	_, err = pgx.ForEachRow(rows, []any{&rule, &key, &atUS, &gen, &reset}, func() error {
		if rule != nil && key != nil {
			if reset != nil && *reset {
				s.resetEvent(*rule, *key, time.UnixMicro(atUS))
			} else {
				s.keyEvent(*rule, *key, time.UnixMicro(atUS))
			}
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
	case err != nil && errorKind(err) != l.kind:
		l.kind = errorKind(err)
		l.log.Warn(l.what+" failed", zap.String("kind", l.kind), zap.Error(err))
	}
}
