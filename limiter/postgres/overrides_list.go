package postgres

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/limiter"
)

// Overrides lists every override, by rule and key. It refreshes the cache
// first (one small query, and a reload only when the table changed), so
// the list includes changes made through other instances or by hand.
func (s *Store) Overrides(ctx context.Context) ([]limiter.Override, error) {
	if err := s.RefreshOverrides(ctx); err != nil {
		return nil, fmt.Errorf("postgres store: list overrides: %w", s.fault(err))
	}
	set := s.overrides.Load()
	out := make([]limiter.Override, 0, len(set.m))
	for k, o := range set.m {
		out = append(out, limiter.Override{Rule: k.rule, Key: k.key, Limit: o.limit, Window: o.window})
	}
	limiter.SortOverrides(out)
	return out, nil
}
