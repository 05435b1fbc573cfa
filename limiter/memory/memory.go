// Package memory is a limiter.Store that keeps its counters in the memory of
// one process. It implements docs/algorithms.md exactly, like the Postgres
// store, so it serves as the store when no database is configured and as
// the per-instance fallback of fail=local rules.
//
// Limits held by a memory store are per process and do not survive a
// restart.
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// numShards is the number of independently locked parts of the keyspace.
// It is 64 so that the set of shards one decision touches fits a uint64
// bitmask, which gives the ascending lock order without allocating.
const numShards = 64

// sweepEvery is how many decisions a shard makes between two opportunistic
// sweeps, and sweepSample how many of its counters such a sweep inspects.
// Together they bound the memory held by keys that are never seen again
// even when Run is not used, at a cost of a few nanoseconds per decision.
const (
	sweepEvery  = 32
	sweepSample = 4
)

// Store is an in-memory limiter.Store. The zero value is not usable; call
// New. A Store is safe for simultaneous use by multiple goroutines.
type Store struct {
	now    func() time.Time
	seed   maphash.Seed
	shards [numShards]shard
}

var _ limiter.Store = (*Store)(nil)

// counterKey names one counter: a rule and a key.
type counterKey struct {
	rule, key string
}

type shard struct {
	mu        sync.Mutex
	counters  map[counterKey]*counter
	overrides map[counterKey]override
	decisions uint32
	// Pad to a cache line of its own so that neighbouring shards' locks
	// do not share one.
	_ [36]byte
}

// override is a per-key limit and window.
type override struct {
	limit  int64
	window time.Duration
}

// Option configures a Store.
type Option func(*Store)

// WithClock makes the store read the time from now instead of time.Now.
// Tests pass a settable clock.
func WithClock(now func() time.Time) Option {
	return func(s *Store) { s.now = now }
}

// New returns an empty Store. It starts no goroutine: expired counters are
// dropped opportunistically as decisions touch their shard, and entirely by
// Sweep or Run.
func New(opts ...Option) *Store {
	s := &Store{now: time.Now, seed: maphash.MakeSeed()}
	for _, o := range opts {
		o(s)
	}
	for i := range s.shards {
		s.shards[i].counters = make(map[counterKey]*counter)
		s.shards[i].overrides = make(map[counterKey]override)
	}
	return s
}

func (s *Store) shardOf(rule, key string) uint {
	h := maphash.String(s.seed, rule)
	h = h*0x9E3779B97F4A7C15 ^ maphash.String(s.seed, key)
	return uint(h>>32) % numShards
}

// lockShards locks the shards named by mask in ascending order, the one
// order every decision uses, so that two decisions never wait on each
// other in a cycle.
func (s *Store) lockShards(mask uint64) {
	for m := mask; m != 0; m &= m - 1 {
		s.shards[bits.TrailingZeros64(m)].mu.Lock()
	}
}

func (s *Store) unlockShards(mask uint64) {
	for m := mask; m != 0; m &= m - 1 {
		s.shards[bits.TrailingZeros64(m)].mu.Unlock()
	}
}

// work is the scratch state of one check during a decision.
type work struct {
	sh  *shard
	ck  counterKey
	p   params
	ctr *counter // nil while the counter does not exist
	ok  bool     // the check's own verdict
}

// stackChecks is how many checks a decision handles without allocating.
const stackChecks = 8

// Decide implements limiter.Store. It fails only when ctx is already done,
// when results is shorter than checks, or when a check's rule (or the
// key's override) cannot be counted.
func (s *Store) Decide(ctx context.Context, checks []limiter.Check, results []limiter.Result) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if len(results) < len(checks) {
		return false, fmt.Errorf("memory: %d results for %d checks", len(results), len(checks))
	}
	var buf [stackChecks]work
	ws := buf[:0]
	if len(checks) > stackChecks {
		ws = make([]work, 0, len(checks))
	}
	var mask uint64
	for _, c := range checks {
		i := s.shardOf(c.Rule.Name, c.Key)
		mask |= 1 << i
		ws = append(ws, work{sh: &s.shards[i], ck: counterKey{c.Rule.Name, c.Key}})
	}

	s.lockShards(mask)
	defer s.unlockShards(mask)
	now := s.now().UnixMicro()

	// Step 1: every check's own verdict against the state as of now.
	for i, c := range checks {
		w := &ws[i]
		p, err := w.sh.params(c.Rule, w.ck)
		if err != nil {
			return false, fmt.Errorf("memory: rule %q: %w", c.Rule.Name, err)
		}
		w.p = p
		w.ctr = w.sh.counters[w.ck]
		if w.ctr != nil && w.ctr.algo != c.Rule.Algorithm {
			// The rule changed its algorithm under the same name: its old
			// state means nothing now.
			delete(w.sh.counters, w.ck)
			w.ctr = nil
		}
		w.ok = verdict(&w.p, c.Rule.Algorithm, w.ctr, now)
	}

	// Step 2: the combined verdict.
	allowed := true
	for i, c := range checks {
		if !c.Rule.Shadow && !ws[i].ok {
			allowed = false
			break
		}
	}

	// Step 3: consume.
	for i, c := range checks {
		w := &ws[i]
		if (allowed && w.ok) || (!allowed && c.Rule.CountAll) {
			if w.ctr == nil {
				// Another check of this decision may have created it.
				if w.ctr = w.sh.counters[w.ck]; w.ctr == nil {
					w.ctr = &counter{algo: c.Rule.Algorithm}
					w.sh.counters[w.ck] = w.ctr
				}
			}
			consume(&w.p, c.Rule.Algorithm, w.ctr, now)
		}
	}

	// Step 4: results on the state after consuming.
	for i, c := range checks {
		w := &ws[i]
		if w.ctr == nil {
			w.ctr = w.sh.counters[w.ck]
		}
		results[i] = result(&w.p, c.Rule.Algorithm, w.ctr, now, w.ok)
	}

	for m := mask; m != 0; m &= m - 1 {
		sh := &s.shards[bits.TrailingZeros64(m)]
		if sh.decisions++; sh.decisions%sweepEvery == 0 {
			sh.sweep(now, sweepSample)
		}
	}
	return allowed, nil
}

// Peek returns what a request of c's rule would get from c's counter now,
// without consuming anything: the admin API's view of a key.
func (s *Store) Peek(ctx context.Context, c limiter.Check) (limiter.Result, error) {
	if err := ctx.Err(); err != nil {
		return limiter.Result{}, err
	}
	sh := &s.shards[s.shardOf(c.Rule.Name, c.Key)]
	ck := counterKey{c.Rule.Name, c.Key}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now().UnixMicro()
	p, err := sh.params(c.Rule, ck)
	if err != nil {
		return limiter.Result{}, fmt.Errorf("memory: rule %q: %w", c.Rule.Name, err)
	}
	ctr := sh.counters[ck]
	if ctr != nil && ctr.algo != c.Rule.Algorithm {
		ctr = nil
	}
	return result(&p, c.Rule.Algorithm, ctr, now, verdict(&p, c.Rule.Algorithm, ctr, now)), nil
}

// params returns the counting parameters of rule r for ck, applying the
// key's override. The caller holds sh.mu.
func (sh *shard) params(r *policy.Rule, ck counterKey) (params, error) {
	var lp limiter.Params
	if o, ok := sh.overrides[ck]; ok {
		lp = limiter.OverrideParams(r, o.limit, o.window)
	} else {
		lp = limiter.RuleParams(r)
	}
	if err := lp.Validate(r.Algorithm); err != nil {
		return params{}, err
	}
	return makeParams(lp), nil
}

// ErrInvalidOverride is returned by SetOverride for a limit below 1 or a
// window below a second.
var ErrInvalidOverride = errors.New("memory: override needs a limit of at least 1 and a window of at least 1s")

// SetOverride makes key use limit and window instead of rule's own (see
// limiter.OverrideParams for burst and bucket). The key's counter is kept
// and read under the new parameters; callers that want a fresh start also
// call Reset.
func (s *Store) SetOverride(rule, key string, limit int64, window time.Duration) error {
	if limit < 1 || window < time.Second {
		return ErrInvalidOverride
	}
	sh := &s.shards[s.shardOf(rule, key)]
	o := override{limit: limit, window: window}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.overrides[counterKey{rule, key}] = o
	return nil
}

// DeleteOverride removes key's override under rule, if any.
func (s *Store) DeleteOverride(rule, key string) {
	sh := &s.shards[s.shardOf(rule, key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	delete(sh.overrides, counterKey{rule, key})
}

// Override returns key's override under rule, if it has one.
func (s *Store) Override(rule, key string) (limit int64, window time.Duration, ok bool) {
	sh := &s.shards[s.shardOf(rule, key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o, ok := sh.overrides[counterKey{rule, key}]
	return o.limit, o.window, ok
}

// Reset deletes key's counter under rule: its next request starts from a
// full limit.
func (s *Store) Reset(rule, key string) {
	sh := &s.shards[s.shardOf(rule, key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	delete(sh.counters, counterKey{rule, key})
}

// Len returns the number of counters held, expired or not.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.counters)
		sh.mu.Unlock()
	}
	return n
}

// Sweep drops every counter whose state has expired at now (an expired
// counter reads exactly like an absent one) and returns how many it
// dropped. It locks one shard at a time.
func (s *Store) Sweep(now time.Time) int {
	t := now.UnixMicro()
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.sweep(t, -1)
		sh.mu.Unlock()
	}
	return n
}

// Run calls Sweep with the store's clock every interval until ctx is done,
// then returns ctx's error. It is how a long-lived store bounds its memory.
func (s *Store) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("memory: sweep interval %v: must be positive", interval)
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			s.Sweep(s.now())
		}
	}
}

// sweep deletes expired counters, inspecting at most limit of them (all
// when limit < 0). Go's map iteration starts at a random place, so small
// limits sample the shard. The caller holds sh.mu.
func (sh *shard) sweep(now int64, limit int) int {
	n := 0
	for k, c := range sh.counters {
		if limit == 0 {
			break
		}
		limit--
		if c.expires <= now {
			delete(sh.counters, k)
			n++
		}
	}
	return n
}
