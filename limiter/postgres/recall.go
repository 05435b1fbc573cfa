package postgres

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/limiter"
)

// The recall: a 429 means the limit is spent, never that other gateways
// hold the units.
//
// Invariants, kept here and in decide_function.sql:
//   - Never over L: leased units are counted when granted (lease.go), so
//     giving them back early only ever lowers the count.
//   - No denial with room left: a decision denied while other gateways hold
//     units of its counter is provisional. The database recalls the units
//     (a notification on sluice_leases, and a key event for the polls);
//     every holder listens (listen), gives up its lease of the counter and
//     returns what it did not spend at once (kick); the return notifies the
//     waiting gateways, which decide again (Decide). Only a holder that does
//     not answer within the database's recall grace (one second: it died,
//     or lost its database) can make a denial final while its units are out,
//     and it wastes at most what it held (leaseCap).

// recallWait bounds how long one decision waits on recalls, beyond the
// database's own grace, in case the database's clock and this gateway's
// disagree about when the grace ends.
const recallWait = 2 * time.Second

// recallPoll is how often a waiting decision asks again when no return is
// heard of: a notification can be missed while the listener reconnects.
const recallPoll = 25 * time.Millisecond

// leaseChannel is the channel the database notifies of recalls and
// returns; a payload is the schema (quoted), the kind ('r' recall, 'g'
// given back), the rule and the key, separated by U+001F.
const leaseChannel = "sluice_leases"

// recalls is the set of decisions waiting for units to come back, by
// counter. It is safe for simultaneous use.
type recalls struct {
	mu    sync.Mutex
	waits map[slotKey]chan struct{}
	kick  chan struct{} // wakes runLeases to send returns now
}

func newRecalls() *recalls {
	return &recalls{waits: map[slotKey]chan struct{}{}, kick: make(chan struct{}, 1)}
}

// wait returns a channel that is closed when units of k are given back.
func (r *recalls) wait(k slotKey) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, ok := r.waits[k]
	if !ok {
		ch = make(chan struct{})
		r.waits[k] = ch
	}
	return ch
}

// returned wakes the decisions waiting on k.
func (r *recalls) returned(k slotKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.waits[k]; ok {
		close(ch)
		delete(r.waits, k)
	}
}

// flushNow asks runLeases to send the queued returns at once.
func (r *recalls) flushNow() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// decideRecalling is decide, asked again while its denial is provisional
// (other gateways hold units it needs and are giving them back), until it
// is allowed, finally denied, fails, ctx ends or recallWait has passed.
func (s *Store) decideRecalling(ctx context.Context, checks []limiter.Check, results []limiter.Result,
	decide func(context.Context, []limiter.Check, []limiter.Result) (bool, error)) (bool, error) {
	var until time.Time
	for {
		allowed, err := decide(ctx, checks, results)
		if err != nil || allowed || !provisional(checks, results) {
			return allowed, err
		}
		now := time.Now()
		if until.IsZero() {
			until = now.Add(recallWait)
		} else if !now.Before(until) {
			return allowed, nil
		}
		s.recalled.Add(1)
		if !s.awaitReturn(ctx, checks, results, min(recallPoll, until.Sub(now))) {
			return allowed, nil
		}
	}
}

// provisional reports whether a denial may turn into an allowance once
// recalled units are back: some enforced check was denied provisionally,
// and asking again counts nothing twice (no check counts denied requests).
func provisional(checks []limiter.Check, results []limiter.Result) bool {
	any := false
	for i, c := range checks {
		if c.Rule.CountAll {
			return false
		}
		if !c.Rule.Shadow && !results[i].Allowed && results[i].Provisional {
			any = true
		}
	}
	return any
}

// awaitReturn waits until units of a provisionally denied check's counter
// are given back, or for d; it reports false when ctx ended.
func (s *Store) awaitReturn(ctx context.Context, checks []limiter.Check, results []limiter.Result, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	var back <-chan struct{}
	for i, c := range checks {
		if !results[i].Allowed && results[i].Provisional {
			back = s.recall.wait(slotKey{c.Rule.Name, c.Key})
			break // one is enough: the next decision sees them all
		}
	}
	select {
	case <-back:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}

// listen holds a connection of its own that listens on leaseChannel while
// the store is ready, until ctx ends: a recall of a counter this gateway
// holds units of gives the lease up and sends the return at once; a return
// wakes the decisions waiting on it. Through a pooler in transaction mode
// LISTEN does not work; the polls' key events then carry recalls (within
// PollInterval) and waiting decisions ask again every recallPoll.
func (s *Store) listen(ctx context.Context) {
	failing := newStateLog(s.log, "listening for lease recalls")
	for ctx.Err() == nil {
		if !s.ready() {
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		err := s.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		failing.report(err)
		sleep(ctx, 100*time.Millisecond)
	}
}

// listenOnce connects, listens and handles notifications until the
// connection fails or ctx ends.
func (s *Store) listenOnce(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, pollTimeout)
	conn, err := pgx.ConnectConfig(cctx, s.pool.Config().ConnConfig.Copy())
	cancel()
	if err != nil {
		return s.fault(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{leaseChannel}.Sanitize()); err != nil {
		return s.fault(err)
	}
	tag := pgx.Identifier{s.schema}.Sanitize()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return s.fault(err)
		}
		parts := strings.Split(n.Payload, "\x1f")
		if len(parts) < 4 || parts[0] != tag {
			continue // another schema's
		}
		k := slotKey{parts[2], parts[3]}
		switch {
		case parts[1] == "r" && len(parts) == 4:
			if s.leases.invalidate(k.rule, k.key, farFuture, false) {
				s.recall.flushNow()
			}
		case parts[1] == "g" && len(parts) == 4:
			s.recall.returned(k)
		case parts[1] == "x" && len(parts) == 5:
			// An admin reset, with its time (µs, database clock).
			if atUS, err := strconv.ParseInt(parts[4], 10, 64); err == nil {
				s.resetEvent(k.rule, k.key, time.UnixMicro(atUS))
			}
		}
	}
}

// farFuture gives up a lease whenever it was granted.
var farFuture = time.Unix(1<<40, 0)
