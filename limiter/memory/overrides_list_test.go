package memory

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

func TestOverridesList(t *testing.T) {
	s := New()
	ctx := context.Background()
	if got, err := s.Overrides(ctx); err != nil || len(got) != 0 {
		t.Fatalf("empty store: %v %v", got, err)
	}
	for _, o := range []limiter.Override{{Rule: "query", Key: "k2", Limit: 9, Window: time.Hour}, {Rule: "login", Key: "k1", Limit: 3, Window: time.Minute}, {Rule: "query", Key: "k1", Limit: 7, Window: 24 * time.Hour}} {
		if err := s.SetOverride(ctx, o.Rule, o.Key, o.Limit, o.Window); err != nil {
			t.Fatal(err)
		}
	}
	s.DeleteOverride(ctx, "query", "k2")
	want := []limiter.Override{{Rule: "login", Key: "k1", Limit: 3, Window: time.Minute}, {Rule: "query", Key: "k1", Limit: 7, Window: 24 * time.Hour}}
	if got, err := s.Overrides(ctx); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Overrides() = %v %v, want %v", got, err, want)
	}
}
