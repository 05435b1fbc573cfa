package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestOverridesListAcrossInstances: an instance lists the overrides set
// through another one since its last poll (the suite's OverridesList
// covers the rest of the listing).
func TestOverridesListAcrossInstances(t *testing.T) {
	db, clk := pgtest.New(t), newClock(base)
	a, b := instance(t, db, clk), instance(t, db, clk)
	ctx := context.Background()
	if err := a.SetOverride(ctx, chk(fixed("query", 5, time.Minute), "k1"), 7, time.Hour); err != nil {
		t.Fatal(err)
	}
	got, err := b.Overrides(ctx)
	if err != nil || len(got) != 1 || got[0].Rule != "query" || got[0].Key != "k1" || got[0].Limit != 7 || got[0].Window != time.Hour {
		t.Fatalf("another instance lists %v %v, want the override set through the first", got, err)
	}
}
