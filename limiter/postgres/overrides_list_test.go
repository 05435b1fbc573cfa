package postgres_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/migrations/pgtest"
)

// TestOverridesList: every instance lists every override, also those set
// through another instance since its last poll.
func TestOverridesList(t *testing.T) {
	db := pgtest.New(t)
	clk := newClock(base)
	a := open(t, db, nil, clk.Now)
	b := open(t, db, pgtest.NewPool(t, db.URL, 2), clk.Now)
	ctx := context.Background()
	if got, err := b.Overrides(ctx); err != nil || len(got) != 0 {
		t.Fatalf("no overrides yet: %v %v", got, err)
	}
	for _, o := range []limiter.Override{{Rule: "query", Key: "k2", Limit: 9, Window: time.Hour}, {Rule: "login", Key: "k1", Limit: 3, Window: time.Minute}, {Rule: "query", Key: "k1", Limit: 7, Window: 24 * time.Hour}} {
		if err := a.SetOverride(ctx, o.Rule, o.Key, o.Limit, o.Window); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.DeleteOverride(ctx, "query", "k2"); err != nil {
		t.Fatal(err)
	}
	want := []limiter.Override{{Rule: "login", Key: "k1", Limit: 3, Window: time.Minute}, {Rule: "query", Key: "k1", Limit: 7, Window: 24 * time.Hour}}
	for name, s := range map[string]interface {
		Overrides(context.Context) ([]limiter.Override, error)
	}{"the writing instance": a, "another instance": b} {
		if got, err := s.Overrides(ctx); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Overrides() = %v %v, want %v", name, got, err, want)
		}
	}
}
