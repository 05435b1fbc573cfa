package limiter

import (
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/sluicehq/sluice/policy"
)

// fastPath is the over-limit cache: it remembers checks that the store
// denied until the instant a retry would be allowed, so that repeat
// offenders are answered without a store round trip. It is safe for
// simultaneous use by multiple goroutines.
//
// Rules can be replaced while the process runs (a reload makes new
// *policy.Rule values of the same names). An entry remembers the rule it
// was decided under, and answers only a check whose rule counts the same
// way (see countsAlike): a denial made under an old limit, window or
// algorithm is dropped at its next lookup, never kept until its old reset,
// even when a request still in flight under the old rule remembers it
// after the new rules took over.
//
// Deadlines are on the local clock. A denial is remembered from the local
// instant taken before the store was asked plus the store's RetryAfter:
// the store decided no earlier than that instant, so the cache never
// outlives the store's own verdict (up to clock rate differences).
type fastPath struct {
	cache *lru.Cache[cacheKey, overLimit]
}

type cacheKey struct {
	rule, key string
}

// overLimit is one remembered denial: until when, the limit and window
// the store applied (which may be a key's override), and when the store
// decided it, on the store's clock.
type overLimit struct {
	rule    *policy.Rule // the rule the store decided under
	until   time.Time    // when a retry may pass, on the local clock
	limit   int64
	window  time.Duration
	decided time.Time
	// reset is the counter's Reset as the store gave it (its clock), and
	// resetAt the same instant on the local clock: a denial from the
	// cache reports the key's reset, as the store's answers and /v1/keys
	// do, not when a retry may pass.
	reset, resetAt time.Time
	count          int64
}

func newFastPath(size int) (*fastPath, error) {
	c, err := lru.New[cacheKey, overLimit](size)
	if err != nil {
		return nil, err
	}
	return &fastPath{cache: c}, nil
}

// deny reports whether the request made of checks can be denied at now
// from the cache alone, the analogue of envoy's
// IsOverLimitWithLocalCache. It can when some non-shadow check is
// remembered as over its limit and not yet expired, and no check has
// count=all (a denied request must still be counted by those rules, which
// only the store can do).
//
// On a hit, it fills results and sources: a remembered check gets
// Allowed=false, Remaining 0, the counter's Reset and Count as the store
// gave them, ResetAfter the time left until that reset and RetryAfter
// the time left until its deadline (SourceFastPath); every other check is
// SourceNotEvaluated with only Limit and Window set. It returns the longest
// RetryAfter among the remembered checks. Without a hit, results and
// sources hold nothing meaningful. Expired entries it meets are removed.
func (f *fastPath) deny(checks []Check, now time.Time, results []Result, sources []Source) (hit bool, wait time.Duration) {
	for _, c := range checks {
		if c.Rule.CountAll {
			return false, 0
		}
	}
	for i, c := range checks {
		results[i] = Result{Limit: c.Rule.Limit, Window: c.Rule.Window}
		sources[i] = SourceNotEvaluated
		if c.Rule.Shadow {
			continue
		}
		k := cacheKey{c.Rule.Name, c.Key}
		e, ok := f.cache.Peek(k)
		if !ok {
			continue
		}
		if !now.Before(e.until) || (e.rule != c.Rule && !countsAlike(e.rule, c.Rule)) {
			// Expired, or decided under another definition of the rule:
			// absent. A concurrent Add of a fresh entry for the same key
			// may be removed too, which only costs a store call.
			f.cache.Remove(k)
			continue
		}
		left := e.until.Sub(now)
		results[i] = Result{
			Allowed: false, Limit: e.limit, Window: e.window, Remaining: 0, Count: e.count,
			Reset: e.reset, ResetAfter: max(0, e.resetAt.Sub(now)), RetryAfter: left,
		}
		sources[i] = SourceFastPath
		hit = true
		wait = max(wait, left)
	}
	return hit, wait
}

// remember records every non-shadow check without count=all that the
// store denied, until start plus its RetryAfter. A denial by a counter
// shared with other keys (Result.Shared) is not remembered: it says
// nothing of the key, and a flood of fresh keys into a full memory store
// would otherwise fill the cache with keys never seen again. Nor is a
// Provisional denial (units out on leases may come back, within a second
// when asked for, or reach this gateway in a lease it asked for before):
// remembering it would leave those units unspent. start is the local
// instant taken before the store was asked.
func (f *fastPath) remember(checks []Check, results []Result, start time.Time) {
	for i, c := range checks {
		r := &results[i]
		if c.Rule.Shadow || c.Rule.CountAll || r.Allowed || r.RetryAfter <= 0 || r.Shared || r.Provisional {
			continue
		}
		f.cache.Add(cacheKey{c.Rule.Name, c.Key}, overLimit{
			rule:  c.Rule,
			until: start.Add(r.RetryAfter), limit: r.Limit, window: r.Window,
			decided: r.Reset.Add(-r.ResetAfter), // the store's clock at the decision
			reset:   r.Reset, resetAt: start.Add(r.ResetAfter), count: r.Count,
		})
	}
}

// forget drops the denial of (rule, key) unless the store decided it after
// at, on the store's clock: a reset or override change at at made it
// stale, but a denial decided after it is the store's word on the new
// state, and must stay even when the news of the change arrives late. (At
// the same instant the order is unknown; the denial goes, which costs a
// store call.)
func (f *fastPath) forget(rule, key string, at time.Time) {
	k := cacheKey{rule, key}
	if e, ok := f.cache.Peek(k); ok && !e.decided.After(at) {
		// A denial remembered between the Peek and the Remove is dropped
		// too; that costs a store call, and needs the two within
		// nanoseconds of each other.
		f.cache.Remove(k)
	}
}

// countsAlike reports whether a denial decided under rule a stands for
// rule b of the same name: whether both count the same identity with the
// same limit, window, algorithm, bucket, burst and cost. Methods, path and
// fail mode do not change a counter's verdict. A nil a (unknown) never
// does.
func countsAlike(a, b *policy.Rule) bool {
	return a != nil && a.Identity == b.Identity && a.Limit == b.Limit && a.Window == b.Window &&
		a.Algorithm == b.Algorithm && a.Bucket == b.Bucket && a.Burst == b.Burst && a.Cost == b.Cost
}
