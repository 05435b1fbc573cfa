// Package memory is a limiter.Store that keeps its counters in the memory of
// one process. It implements docs/algorithms.md exactly, like the Postgres
// store, so it serves as the store when no database is configured and as
// the per-instance fallback of fail=local rules.
//
// Limits held by a memory store are per process and do not survive a
// restart.
//
// Memory is bounded: a Store holds at most MaxKeys counters (one per rule
// and key) of its own. When it is full, a new key gets no counter of its
// own: it is counted in its rule's overflow counter of its shard, shared
// with every other new key of that rule and shard, until expired counters
// make room (they are swept as decisions meet them, and all at once by
// Run). Existing counters are never evicted before they expire: an
// attacker who floods fresh keys cannot push anyone's counter out to reset
// it, and over-limit keys stay limited; what a flood does is make new keys
// share a limit, which errs towards limiting more, never less.
//
// It imports only limiter and policy of sluice: nothing of HTTP, no other
// store.
package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

// DefaultMaxKeys is the bound on counters of a Store whose Options leave
// MaxKeys zero (SLUICE_MEMORY_MAX_KEYS's default).
const DefaultMaxKeys = 1_000_000

// overflowKey is the key of the overflow counters. Real keys are HMACs in
// hex or base64 and never start with a NUL byte.
const overflowKey = "\x00overflow"

// fullSweepSample is how many counters of its shard a decision that finds
// the store full inspects for expired ones before it overflows: enough to
// find room that expiry made, bounded so that a flood cannot make every
// decision scan a shard.
const fullSweepSample = 16

// Store is an in-memory limiter.Store. The zero value is not usable; call
// New. A Store is safe for simultaneous use by multiple goroutines.
type Store struct {
	now     func() time.Time
	sweep   time.Duration // Run's interval
	maxKeys int64
	forget  func(rule, key string, at time.Time)
	seed    maphash.Seed
	// keys counts the counters held, overflow counters excepted.
	keys     atomic.Int64
	overflow atomic.Uint64 // decisions counted in an overflow counter
	shards   [numShards]shard
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

// DefaultSweepInterval is how often Run drops expired counters by
// default.
const DefaultSweepInterval = 10 * time.Second

// Options configure a Store. The zero value of every field means its
// default, as for the other stores' options (see limiter.Off for the
// convention).
type Options struct {
	// Now is the store's clock. Default time.Now; tests pass a settable
	// clock.
	Now func() time.Time
	// MaxKeys bounds the counters the store holds of its own (see the
	// package comment for what happens when it is full). Default
	// DefaultMaxKeys.
	MaxKeys int
	// SweepInterval is how often Run drops expired counters. Default
	// DefaultSweepInterval.
	SweepInterval time.Duration
	// Forget is called by Reset, SetOverride and DeleteOverride with the
	// rule, the key and the store's time of the change; the gateway passes
	// its limiter's Forget, so that the over-limit fast path drops the
	// denials the change made stale. Default: nobody is told.
	Forget func(rule, key string, at time.Time)
}

// New returns an empty Store. It starts no goroutine: expired counters are
// dropped opportunistically as decisions touch their shard, and entirely by
// Sweep or Run.
func New(opts Options) *Store {
	s := &Store{now: opts.Now, sweep: opts.SweepInterval, maxKeys: int64(opts.MaxKeys), forget: opts.Forget, seed: maphash.MakeSeed()}
	if s.now == nil {
		s.now = time.Now
	}
	if s.sweep <= 0 {
		s.sweep = DefaultSweepInterval
	}
	if s.maxKeys <= 0 {
		s.maxKeys = DefaultMaxKeys
	}
	if s.forget == nil {
		s.forget = func(string, string, time.Time) {}
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
	if s.keys.Load() >= s.maxKeys {
		// Full: look for room that expiry made in the shards at hand,
		// before any counter of this decision is looked up (a sweep must
		// not delete a counter a check already holds).
		for m := mask; m != 0; m &= m - 1 {
			s.keys.Add(-int64(s.shards[bits.TrailingZeros64(m)].sweep(now, fullSweepSample)))
		}
	}

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
			s.drop(w.sh, w.ck)
			w.ctr = nil
		}
		if w.ctr == nil && s.keys.Load() >= s.maxKeys {
			// Full: the key is counted with the other new keys of its rule
			// in this shard (see the package comment).
			w.ck = counterKey{c.Rule.Name, overflowKey}
			w.ctr = w.sh.counters[w.ck]
			if w.ctr != nil && w.ctr.algo != c.Rule.Algorithm {
				delete(w.sh.counters, w.ck)
				w.ctr = nil
			}
			s.overflow.Add(1)
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
		// A count=all check counts every request, whatever its own verdict
		// and the request's; any other check only what it let through.
		if (allowed && w.ok) || c.Rule.CountAll {
			if w.ctr == nil {
				// Another check of this decision may have created it.
				if w.ctr = w.sh.counters[w.ck]; w.ctr == nil {
					w.ctr = &counter{algo: c.Rule.Algorithm}
					w.sh.counters[w.ck] = w.ctr
					if w.ck.key != overflowKey {
						s.keys.Add(1)
					}
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
		results[i].Shared = w.ck.key == overflowKey
	}

	for m := mask; m != 0; m &= m - 1 {
		sh := &s.shards[bits.TrailingZeros64(m)]
		if sh.decisions++; sh.decisions%sweepEvery == 0 {
			s.keys.Add(-int64(sh.sweep(now, sweepSample)))
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

// SetOverride makes c's key use limit and window instead of its rule's own
// (see limiter.OverrideParams for burst and bucket), after
// limiter.ValidateOverride. The key's counter is kept and read under the
// new parameters; callers that want a fresh start also call Reset. The
// context is not used: nothing here waits.
func (s *Store) SetOverride(_ context.Context, c limiter.Check, limit int64, window time.Duration) error {
	if err := limiter.ValidateOverride(c.Rule, limit, window); err != nil {
		return err
	}
	s.change(c, func(sh *shard, ck counterKey) { sh.overrides[ck] = override{limit: limit, window: window} })
	return nil
}

// DeleteOverride returns c's key to its rule's own limit.
func (s *Store) DeleteOverride(_ context.Context, c limiter.Check) error {
	s.change(c, func(sh *shard, ck counterKey) { delete(sh.overrides, ck) })
	return nil
}

// Reset deletes c's counter: its next request starts from a full limit.
func (s *Store) Reset(_ context.Context, c limiter.Check) error {
	s.change(c, s.drop)
	return nil
}

// change applies f to c's counter key in its shard, under the shard's
// lock, and then tells Forget of the change, with the store's time of it.
func (s *Store) change(c limiter.Check, f func(sh *shard, ck counterKey)) {
	sh := &s.shards[s.shardOf(c.Rule.Name, c.Key)]
	sh.mu.Lock()
	f(sh, counterKey{c.Rule.Name, c.Key})
	at := s.now()
	sh.mu.Unlock()
	s.forget(c.Rule.Name, c.Key, at)
}

// drop deletes the counter ck of sh, if any. The caller holds sh.mu.
func (s *Store) drop(sh *shard, ck counterKey) {
	if _, ok := sh.counters[ck]; ok {
		delete(sh.counters, ck)
		if ck.key != overflowKey {
			s.keys.Add(-1)
		}
	}
}

// Len returns the number of counters held, expired or not, overflow
// counters included.
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

// Overflowed returns how many checks were counted in an overflow counter
// because the store was full.
func (s *Store) Overflowed() uint64 { return s.overflow.Load() }

// Collectors returns Prometheus metrics of the store, labelled
// store=name: sluice_memory_counters (counters held, overflow counters
// included) and sluice_memory_overflowed_total (checks counted in an
// overflow counter because the store was full: new keys sharing a limit).
func (s *Store) Collectors(name string) []prometheus.Collector {
	labels := prometheus.Labels{"store": name}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "sluice_memory_counters",
			Help:        "Counters held by an in-memory store (store=memory: the store without a database; store=local: the fail=local limiter).",
			ConstLabels: labels,
		}, func() float64 { return float64(s.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "sluice_memory_overflowed_total",
			Help:        "Checks an in-memory store counted in a shared overflow counter because it held SLUICE_MEMORY_MAX_KEYS counters.",
			ConstLabels: labels,
		}, func() float64 { return float64(s.Overflowed()) }),
	}
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
	s.keys.Add(-int64(n))
	return n
}

// Run calls Sweep with the store's clock every sweep interval (see
// WithSweepInterval) until ctx is done. It is how a long-lived store gives
// back the memory of keys that are never seen again, and makes room when
// it is full. It is the store's only goroutine.
func (s *Store) Run(ctx context.Context) {
	tick := time.NewTicker(s.sweep)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.Sweep(s.now())
		}
	}
}

// sweep deletes expired counters, inspecting at most limit of them (all
// when limit < 0), and returns how many of the store's own keys it
// deleted (overflow counters are not counted as keys). Go's map iteration
// starts at a random place, so small limits sample the shard. The caller
// holds sh.mu.
func (sh *shard) sweep(now int64, limit int) int {
	n := 0
	for k, c := range sh.counters {
		if limit == 0 {
			break
		}
		limit--
		if c.expires <= now {
			delete(sh.counters, k)
			if k.key != overflowKey {
				n++
			}
		}
	}
	return n
}

// Settle applies charges (limiter.Settler), all under the locks of their
// shards at once. A key with no counter of its own in a full store is
// charged in its rule's overflow counter, as it was counted.
func (s *Store) Settle(ctx context.Context, ss []limiter.Settlement) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := limiter.ValidateSettlements(ss); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	var mask uint64
	for _, st := range ss {
		mask |= 1 << s.shardOf(st.Check.Rule.Name, st.Check.Key)
	}
	s.lockShards(mask)
	defer s.unlockShards(mask)
	now := s.now().UnixMicro()
	for _, st := range ss {
		r := st.Check.Rule
		sh := &s.shards[s.shardOf(r.Name, st.Check.Key)]
		ck := counterKey{r.Name, st.Check.Key}
		p, err := sh.params(r, ck)
		if err != nil {
			return fmt.Errorf("memory: rule %q: %w", r.Name, err)
		}
		ctr := sh.counters[ck]
		if ctr == nil && s.keys.Load() >= s.maxKeys {
			ck = counterKey{r.Name, overflowKey}
			ctr = sh.counters[ck]
		}
		if ctr != nil && ctr.algo != r.Algorithm {
			s.drop(sh, ck)
			ctr = nil
		}
		if ctr == nil {
			ctr = &counter{algo: r.Algorithm}
			sh.counters[ck] = ctr
			if ck.key != overflowKey {
				s.keys.Add(1)
			}
		}
		settle(&p, r.Algorithm, ctr, now, st.Reserved, st.Charge, st.Admitted.UnixMicro())
	}
	return nil
}
