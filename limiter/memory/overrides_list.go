package memory

import (
	"context"

	"github.com/sluicehq/sluice/limiter"
)

// Overrides lists every override, by rule and key. The context is not
// used: nothing here waits.
func (s *Store) Overrides(_ context.Context) ([]limiter.Override, error) {
	var out []limiter.Override
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, o := range sh.overrides {
			out = append(out, limiter.Override{Rule: k.rule, Key: k.key, Limit: o.limit, Window: o.window})
		}
		sh.mu.Unlock()
	}
	limiter.SortOverrides(out)
	return out, nil
}
