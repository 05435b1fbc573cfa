package postgres

import (
	"context"
	"time"
)

// DecideSQL exposes the decide statement a Store sends, for tests that run
// it inside a transaction of their own.
func DecideSQL(s *Store) string { return s.q.decide }

// Poll runs one background poll (see runPoll) and returns the database's
// clock in µs.
func Poll(ctx context.Context, s *Store, since int64) (int64, error) { return s.poll(ctx, since) }

// ProbeRule is the rule name of the probes' decisions.
var ProbeRule = probeRule.Name

// ProbeDecisions is the number of decisions one probe makes on each of
// its connections.
const ProbeDecisions = 1 + probeRounds

// SetBatchClock makes the batcher of s gather on clock instead of the wall
// clock, so that tests move time instead of sleeping.
func SetBatchClock(s *Store, clock interface {
	Now() time.Time
	After(time.Duration) <-chan time.Time
}) {
	s.batch.clock = clock
}
