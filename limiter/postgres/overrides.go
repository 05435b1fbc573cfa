package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// Overrides are cached whole in every instance and refreshed by polling
// override_epoch, a one-row generation counter that a trigger bumps on
// every change to the overrides table. Polling was chosen over
// LISTEN/NOTIFY because LISTEN needs a session of its own, which a
// transaction-mode pooler (PgBouncer) does not give, and because
// notifications sent while an instance is reconnecting or failing over are
// lost, so a poll would be needed as a fallback anyway. One tiny query per
// instance every OverrideRefresh is the whole cost; a change is seen by
// every instance within that interval.

// ErrInvalidOverride is returned by SetOverride for a limit below 1 or a
// window below a second.
var ErrInvalidOverride = errors.New("postgres store: override needs a limit of at least 1 and a window of at least 1s")

type override struct {
	limit  int64
	window time.Duration
}

// overrideSet is one immutable snapshot of the overrides table.
type overrideSet struct {
	generation int64 // override_epoch.generation it was read at; -1 before the first read
	m          map[slotKey]override
}

// params returns the counting parameters of rule r for key, with key's
// override applied when it has one.
func (o *overrideSet) params(r *policy.Rule, key string) limiter.Params {
	if len(o.m) > 0 {
		if v, ok := o.m[slotKey{r.Name, key}]; ok {
			return limiter.OverrideParams(r, v.limit, v.window)
		}
	}
	return limiter.RuleParams(r)
}

// SetOverride makes key use limit and window instead of rule's own (see
// limiter.OverrideParams for burst and bucket). Every instance applies it
// within its OverrideRefresh; this one at once. The key's counter is kept
// and read under the new parameters; callers that want a fresh start also
// call Reset.
func (s *Store) SetOverride(ctx context.Context, rule, key string, limit int64, window time.Duration) error {
	if limit < 1 || window < time.Second {
		return ErrInvalidOverride
	}
	if _, err := s.pool.Exec(ctx, s.q.overrideSet, rule, key, limit, window.Microseconds()); err != nil {
		return fmt.Errorf("postgres store: set override of rule %q: %w", rule, err)
	}
	return s.RefreshOverrides(ctx)
}

// DeleteOverride removes key's override under rule, if any.
func (s *Store) DeleteOverride(ctx context.Context, rule, key string) error {
	if _, err := s.pool.Exec(ctx, s.q.overrideDel, rule, key); err != nil {
		return fmt.Errorf("postgres store: delete override of rule %q: %w", rule, err)
	}
	return s.RefreshOverrides(ctx)
}

// Override returns key's override under rule as this instance currently
// applies it.
func (s *Store) Override(rule, key string) (limit int64, window time.Duration, ok bool) {
	v, ok := s.overrides.Load().m[slotKey{rule, key}]
	return v.limit, v.window, ok
}

// RefreshOverrides reloads the override cache if the overrides changed
// since it was last read. Run calls it every OverrideRefresh.
func (s *Store) RefreshOverrides(ctx context.Context) error {
	var gen int64
	if err := s.pool.QueryRow(ctx, s.q.overrideEpoch).Scan(&gen); err != nil {
		return fmt.Errorf("read override generation: %w", err)
	}
	if gen == s.overrides.Load().generation {
		return nil
	}
	// The generation is read before the rows: a change that lands in
	// between is in the rows already and bumps the generation again, so the
	// next poll reloads; the cache is never older than its generation.
	rows, err := s.pool.Query(ctx, s.q.overrideLoad)
	if err != nil {
		return fmt.Errorf("load overrides: %w", err)
	}
	defer rows.Close()
	m := make(map[slotKey]override)
	for rows.Next() {
		var (
			k        slotKey
			limit    int64
			windowUS int64
		)
		if err := rows.Scan(&k.rule, &k.key, &limit, &windowUS); err != nil {
			return fmt.Errorf("load overrides: %w", err)
		}
		m[k] = override{limit: limit, window: time.Duration(windowUS) * time.Microsecond}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load overrides: %w", err)
	}
	next := &overrideSet{generation: gen, m: m}
	// Keep the newest generation when two refreshes race.
	for {
		cur := s.overrides.Load()
		if cur.generation >= gen || s.overrides.CompareAndSwap(cur, next) {
			return nil
		}
	}
}

// runOverrides polls for override changes until ctx is done.
func (s *Store) runOverrides(ctx context.Context) {
	t := time.NewTicker(s.opts.OverrideRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.RefreshOverrides(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("refresh overrides", zap.Error(err))
			}
		}
	}
}
