package memory

import (
	"math/bits"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// This file is docs/algorithms.md in code. Every instant and duration is an
// int64 count of microseconds, as the document prescribes, so that this
// store and the Postgres store agree to the microsecond.

// params are limiter.Params in microseconds, with the derived quantities
// of each algorithm.
type params struct {
	limit, cost   int64
	window        int64 // W
	windowD       time.Duration
	bucket, k     int64            // sliding: b and W / b
	interval, tau int64            // token: T and τ = B·T
	cal           *policy.Calendar // fixed: a calendar window's periods, or nil
}

func makeParams(lp limiter.Params) params {
	p := params{
		limit:   lp.Limit,
		cost:    lp.Cost,
		window:  lp.Window.Microseconds(),
		windowD: lp.Window,
		bucket:  lp.Bucket.Microseconds(),
		cal:     lp.Calendar,
	}
	if p.bucket > 0 {
		p.k = p.window / p.bucket
	}
	p.interval = max(1, p.window/p.limit)
	p.tau = mulSat(lp.Burst, p.interval)
	return p
}

// counter is the state of one (rule, key). Which fields are used depends
// on algo; the zero state reads like an absent counter.
type counter struct {
	algo     policy.Algorithm
	start, n int64    // fixed: window start and count; reset: the same
	tat      int64    // token: theoretical arrival time
	buckets  []bucket // sliding: the non-empty buckets, oldest first
	// expires is the instant from which the state reads exactly like an
	// absent counter, so that it can be dropped.
	expires int64
}

type bucket struct {
	idx, n int64
}

// verdict reports whether a request passes the counter c (nil when
// absent) at now: step 1 of a decision.
func verdict(p *params, a policy.Algorithm, c *counter, now int64) bool {
	switch a {
	case policy.Fixed:
		return fixedCount(p, c, now)+p.cost <= p.limit
	case policy.Reset:
		_, n := resetWindow(p, c, now)
		return n+p.cost <= p.limit
	case policy.Sliding:
		count, _ := slidingCount(p, c, floorDiv(now, p.bucket))
		return count+p.cost <= p.limit
	case policy.Token:
		next := addSat(tokenStart(c, now), mulSat(p.cost, p.interval))
		return next-now <= p.tau
	}
	return false
}

// consume adds one request's cost to c at now: step 3 of a decision.
func consume(p *params, a policy.Algorithm, c *counter, now int64) {
	switch a {
	case policy.Fixed:
		ws, we := p.period(now)
		if c.start != ws {
			c.start, c.n = ws, 0
		}
		c.n += p.cost
		c.expires = we
	case policy.Reset:
		c.start, c.n = resetWindow(p, c, now)
		c.n += p.cost
		c.expires = c.start + p.window
	case policy.Sliding:
		i := floorDiv(now, p.bucket)
		c.prune(i - p.k + 1)
		c.add(i, p.cost)
		c.expires = (c.buckets[len(c.buckets)-1].idx + p.k) * p.bucket
	case policy.Token:
		c.tat = addSat(tokenStart(c, now), mulSat(p.cost, p.interval))
		c.expires = c.tat
	}
}

// result is a check's Result on the state c (nil when absent) after
// consuming: step 4 of a decision. ok is the check's own verdict.
func result(p *params, a policy.Algorithm, c *counter, now int64, ok bool) limiter.Result {
	var remaining, reset, retry int64
	window := p.windowD
	switch a {
	case policy.Fixed:
		var start int64
		start, reset = p.period(now)
		remaining = p.limit - fixedCount(p, c, now)
		retry = reset - now
		window = time.Duration(reset-start) * time.Microsecond
	case policy.Reset:
		start, n := resetWindow(p, c, now)
		remaining = p.limit - n
		reset = start + p.window
		retry = reset - now
	case policy.Sliding:
		i := floorDiv(now, p.bucket)
		count, newest := slidingCount(p, c, i)
		remaining = p.limit - count
		reset = now
		if newest >= 0 {
			reset = (c.buckets[newest].idx + p.k) * p.bucket
		}
		retry = reset - now
		if !ok && p.cost <= p.limit {
			retry = slidingRetry(p, c, i, count+p.cost-p.limit) - now
		}
	case policy.Token:
		tat := tokenStart(c, now)
		remaining = floorDiv(now+p.tau-tat, p.interval)
		reset = tat
		retry = addSat(tat, mulSat(p.cost, p.interval)) - p.tau - now
	}
	if ok {
		retry = 0
	}
	return limiter.Result{
		Allowed:    ok,
		Limit:      p.limit,
		Window:     window,
		Remaining:  max(0, remaining),
		Count:      max(0, p.limit-remaining),
		Reset:      time.UnixMicro(reset).UTC(),
		ResetAfter: time.Duration(max(0, reset-now)) * time.Microsecond,
		RetryAfter: time.Duration(max(0, retry)) * time.Microsecond,
	}
}

// period is the fixed window that holds now (see limiter.Period).
func (p *params) period(now int64) (start, end int64) {
	return limiter.Period(p.cal, p.window, now)
}

// fixedCount is the count of the fixed window that holds now.
func fixedCount(p *params, c *counter, now int64) int64 {
	if c == nil {
		return 0
	}
	if start, _ := p.period(now); c.start != start {
		return 0
	}
	return c.n
}

// resetWindow is the reset algorithm's window as of now: the stored one,
// or a new one starting at now when there is none or it has expired.
func resetWindow(p *params, c *counter, now int64) (start, n int64) {
	if c == nil || c.n == 0 || now >= c.start+p.window {
		return now, 0
	}
	return c.start, c.n
}

// tokenStart is max(tat, now), with an absent tat reading as now.
func tokenStart(c *counter, now int64) int64 {
	if c == nil {
		return now
	}
	return max(c.tat, now)
}

// slidingCount sums the buckets i−k+1 … i and returns the index in
// c.buckets of the newest non-empty one among them (−1 when none is).
func slidingCount(p *params, c *counter, i int64) (count int64, newest int) {
	newest = -1
	if c == nil {
		return 0, newest
	}
	lo := i - p.k + 1
	for j, b := range c.buckets {
		if b.idx < lo || b.idx > i {
			continue
		}
		count += b.n
		newest = j
	}
	return count, newest
}

// slidingRetry walks the counted buckets from the oldest and returns the
// instant at which the first bucket leaves the window at which the buckets
// walked so far add up to need.
func slidingRetry(p *params, c *counter, i, need int64) int64 {
	lo := i - p.k + 1
	sum := int64(0)
	for _, b := range c.buckets {
		if b.idx < lo || b.idx > i {
			continue
		}
		if sum += b.n; sum >= need {
			return (b.idx + p.k) * p.bucket
		}
	}
	// Unreachable when cost ≤ limit: need never exceeds the count.
	return (i + p.k) * p.bucket
}

// prune drops the buckets older than lo, reusing the slice's storage.
func (c *counter) prune(lo int64) {
	drop := 0
	for drop < len(c.buckets) && c.buckets[drop].idx < lo {
		drop++
	}
	if drop > 0 {
		n := copy(c.buckets, c.buckets[drop:])
		c.buckets = c.buckets[:n]
	}
}

// add adds n to bucket i, keeping the buckets in order. Only a clock that
// went backwards puts i anywhere but last.
func (c *counter) add(i, n int64) {
	j := len(c.buckets)
	for j > 0 && c.buckets[j-1].idx > i {
		j--
	}
	if j > 0 && c.buckets[j-1].idx == i {
		c.buckets[j-1].n += n
		return
	}
	c.buckets = append(c.buckets, bucket{})
	copy(c.buckets[j+1:], c.buckets[j:])
	c.buckets[j] = bucket{idx: i, n: n}
}

// floorDiv is a / b rounded towards minus infinity; b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// maxMicros bounds products and sums of microseconds well inside int64, so
// that the arithmetic of an absurd rule saturates instead of wrapping.
const maxMicros = 1 << 62

// mulSat is a·b for non-negative a and b, saturated at maxMicros.
func mulSat(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > maxMicros {
		return maxMicros
	}
	return int64(lo)
}

// addSat is a+b for non-negative b, saturated at maxMicros.
func addSat(a, b int64) int64 {
	if a > maxMicros-b {
		return maxMicros
	}
	return a + b
}

// settle applies a charge to c at now (decide_function.sql's c_settle, to
// the microsecond): the difference to the reservation while the window
// (or the sliding span, or for a token bucket always) that counted the
// reservation at admitted is current, else the whole charge; never below
// zero, and past the limit if so it comes.
func settle(p *params, a policy.Algorithm, c *counter, now, reserved, charge, admitted int64) {
	switch a {
	case policy.Token:
		if delta := charge - reserved; delta >= 0 {
			c.tat = addSat(tokenStart(c, now), mulSat(delta, p.interval))
		} else {
			c.tat = max(now, tokenStart(c, now)-mulSat(-delta, p.interval))
		}
		c.expires = c.tat
	case policy.Sliding:
		i := floorDiv(now, p.bucket)
		c.prune(i - p.k + 1)
		delta := charge
		if floorDiv(admitted, p.bucket) > i-p.k {
			delta -= reserved
		}
		cur := int64(0)
		if n := len(c.buckets); n > 0 && c.buckets[n-1].idx == i {
			cur = c.buckets[n-1].n
		}
		c.add(i, max(0, cur+delta)-cur)
		c.expires = (c.buckets[len(c.buckets)-1].idx + p.k) * p.bucket
	case policy.Reset:
		start, n := resetWindow(p, c, now)
		if admitted >= start {
			charge -= reserved
		}
		c.start, c.n = start, max(0, n+charge)
		c.expires = c.start + p.window
	default:
		start, end := p.period(now)
		if c.start != start {
			c.start, c.n = start, 0
		}
		if admitted >= start {
			charge -= reserved
		}
		c.n = max(0, c.n+charge)
		c.expires = end
	}
}
