package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// Overrides are cached whole in every instance and refreshed when the
// background poll sees override_epoch move, a one-row generation counter
// that a trigger bumps on every change to the overrides table. Polling was
// chosen over LISTEN/NOTIFY because LISTEN needs a session of its own, which a
// transaction-mode pooler (PgBouncer) does not give, and because
// notifications sent while an instance is reconnecting or failing over are
// lost, so a poll would be needed as a fallback anyway. One tiny query per
// instance every PollInterval, shared with the key events, is the whole
// cost; a change is seen by every instance within that interval.

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

// SetOverride makes c's key use limit and window instead of its rule's own
// (see limiter.OverrideParams for burst and bucket), after
// limiter.ValidateOverride. This instance applies it at once, every other
// one at its next poll; every instance's Forget hears of it. The key's
// counter is kept and read under the new parameters; callers that want a
// fresh start also call Reset.
func (s *Store) SetOverride(ctx context.Context, c limiter.Check, limit int64, window time.Duration) error {
	if err := limiter.ValidateOverride(c.Rule, limit, window); err != nil {
		return err
	}
	return s.changeOverride(ctx, c.Rule.Name, c.Key, s.q.overrideSet, limit, window.Microseconds())
}

// DeleteOverride returns c's key to its rule's own limit.
func (s *Store) DeleteOverride(ctx context.Context, c limiter.Check) error {
	return s.changeOverride(ctx, c.Rule.Name, c.Key, s.q.overrideDel)
}

// changeOverride runs the override statement sql, which returns the
// database's clock after the change, then reloads the overrides and tells
// Forget.
func (s *Store) changeOverride(ctx context.Context, rule, key, sql string, args ...any) error {
	var atUS int64
	if err := s.pool.QueryRow(ctx, sql, append([]any{rule, key}, args...)...).Scan(&atUS); err != nil {
		return fmt.Errorf("postgres store: change the override of rule %q: %w", rule, s.fault(err))
	}
	if err := s.RefreshOverrides(ctx); err != nil {
		return err
	}
	s.keyEvent(rule, key, time.UnixMicro(atUS))
	return nil
}

// RefreshOverrides reloads the override cache if the overrides changed
// since it was last read. The background poll does it every PollInterval.
func (s *Store) RefreshOverrides(ctx context.Context) error {
	var gen int64
	if err := s.pool.QueryRow(ctx, s.q.overrideEpoch).Scan(&gen); err != nil {
		return fmt.Errorf("read override generation: %w", err)
	}
	if gen == s.overrides.Load().generation {
		return nil
	}
	return s.loadOverrides(ctx, gen)
}

// loadOverrides reads the overrides table into a new cache of generation
// gen. The generation is read before the rows: a change that lands in
// between is in the rows already and bumps the generation again, so the
// next poll reloads; the cache is never older than its generation.
func (s *Store) loadOverrides(ctx context.Context, gen int64) error {
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
