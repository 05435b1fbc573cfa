package postgres_test

import (
	"testing"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/limiter/storetest"
)

// TestConformance runs the shared store suites with the database clock
// replaced by the suite's clock, each subtest on a schema of its own.
func TestConformance(t *testing.T) {
	t.Parallel()
	newStore := func(t *testing.T, clock *storetest.Clock) *postgres.Store {
		return open(t, pgtest.New(t), nil, clock.Now)
	}
	storetest.Run(t, func(t *testing.T, c *storetest.Clock) limiter.Store { return newStore(t, c) })
	storetest.RunAdmin(t, func(t *testing.T, c *storetest.Clock) storetest.AdminStore { return newStore(t, c) })
}
