package postgres_test

import (
	"testing"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storetest"
	"github.com/sluicehq/sluice/migrations/pgtest"
)

// TestConformance runs the shared store suite with the database clock
// replaced by the suite's clock, each subtest on a schema of its own.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) limiter.Store {
		db := pgtest.New(t)
		return open(t, db, nil, clock.Now)
	})
	storetest.RunAdmin(t, func(t *testing.T, clock *storetest.Clock) storetest.AdminStore {
		db := pgtest.New(t)
		return open(t, db, nil, clock.Now)
	})
}
