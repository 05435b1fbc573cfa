package postgres

import (
	"context"
	"time"
)

// DecideBatch decides every decision of ds in one statement and one
// transaction, as a batch of the batcher goes: the decisions are applied
// in order, each seeing the state the previous left, so the outcome is
// that of calling Decide for each in turn. The same counter may appear in
// any number of decisions. On error no decision took effect.
func (s *Store) DecideBatch(ctx context.Context, ds []Decision) error {
	return s.run(ctx, ds, false)
}

// Override returns key's override under rule as this instance currently
// applies it.
func (s *Store) Override(rule, key string) (limit int64, window time.Duration, ok bool) {
	v, ok := s.overrides.Load().m[slotKey{rule, key}]
	return v.limit, v.window, ok
}

// ErrorKind is the classification of pgx's errors (errorKind).
func ErrorKind(err error) string { return errorKind(err) }

// DecideSQL exposes the decide statement a Store sends, for tests that run
// it inside a transaction of their own.
func DecideSQL(s *Store) string { return s.q.decide }

// Poll runs one background poll (see runPoll) and returns the database's
// clock in µs.
func Poll(ctx context.Context, s *Store, since int64) (int64, error) { return s.poll(ctx, since) }

// ProbeRule is the rule name of the probes' decisions.
var ProbeRule = probeRule.Name

// ProbeDecisions is the number of decisions one probe makes on its first
// connection: a first one, probeRounds more, and one it commits.
const ProbeDecisions = 1 + probeRounds + 1

// SetBatchClock makes the batcher of s gather on clock instead of the wall
// clock, so that tests move time instead of sleeping.
func SetBatchClock(s *Store, clock interface {
	Now() time.Time
	After(time.Duration) <-chan time.Time
}) {
	s.batch.clock = clock
}

// SetRenewGather makes the background renewals of s wait d for one another
// (renewGather) from now on.
func SetRenewGather(s *Store, d time.Duration) {
	s.renewals.mu.Lock()
	s.renewals.gather = d
	s.renewals.mu.Unlock()
}

// Trip tells the breaker of s that its background work saw err.
func Trip(s *Store, err error) { s.trip(err) }

// LeaseWant is leaseWant: how many units a lease asks for.
var LeaseWant = leaseWant

// SettleLeases does at now what Run's lease upkeep does in the background:
// it ends the leases whose deadline passed and sends every queued return.
func SettleLeases(ctx context.Context, s *Store, now time.Time) error {
	s.leases.sweep(now, leaseIdle)
	return s.flushReturns(ctx)
}

// DropLeases forgets every lease of s without giving anything back, as a
// gateway that dies does.
func DropLeases(s *Store) { s.leases.dropAll(false) }

// RecallWaits is how many times a provisional denial was asked again.
func (s *Store) RecallWaits() uint64 { return s.recalled.Load() }

// QuestionBudget is the progress question's budget after answers that
// took recent, with floor (progress.go).
func QuestionBudget(recent []time.Duration, floor time.Duration) time.Duration {
	var a answerTimes
	for _, d := range recent {
		a.add(d)
	}
	return a.budget(floor)
}

// ProgressQuestions is the number of progress questions s has asked.
func ProgressQuestions(s *Store) uint64 { return s.nQuestions.Load() }

// GiveUpLease gives up this gateway's lease of (rule, key), as a recall
// does, queueing the return of what it did not spend; it reports whether
// there was one.
func GiveUpLease(s *Store, rule, key string) bool {
	return s.leases.invalidate(rule, key, farFuture, false)
}
