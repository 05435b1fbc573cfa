package limiter

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// BreakerState is the state of a CircuitBreaker.
type BreakerState uint32

const (
	// BreakerClosed: the store is called for every decision.
	BreakerClosed BreakerState = iota
	// BreakerHalfOpen: the cool-down is over and one decision, the probe,
	// is calling the store; the others apply their fail modes at once.
	BreakerHalfOpen
	// BreakerOpen: the store is known to be failing; no decision calls it
	// until the cool-down is over.
	BreakerOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half_open"
	case BreakerOpen:
		return "open"
	}
	return "unknown"
}

// Defaults for the zero values of BreakerConfig.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerRatio    = 0.5
	DefaultBreakerMinCalls = 20
	DefaultBreakerWindow   = 10 * time.Second
	DefaultBreakerCooldown = time.Second
)

// breakerBuckets is the number of buckets of the rolling window over which
// the failure ratio is counted.
const breakerBuckets = 10

// BreakerConfig configures a CircuitBreaker. The zero value of every field
// means its default.
type BreakerConfig struct {
	// Failures is the number of consecutive failed store calls that open
	// the breaker. Default 5. It catches an outage fast, whatever the
	// traffic. Failed calls that overlapped count as one: a call counts
	// only if it began after the last counted failure ended. So a single
	// slow moment of the store, which fails every decision waiting on it
	// at once (a statement that outlived the decision timeout, and the
	// decisions queued behind it), is one failure, not dozens; an outage
	// is failure after failure of calls made one after another. A store
	// that hangs therefore opens the breaker after Failures timeouts in a
	// row (250 ms with a 50 ms timeout); one that fails only some calls
	// while others succeed is the Ratio's to catch.
	Failures int
	// Ratio opens the breaker when at least MinCalls calls ended within
	// the last Window and at least this fraction of them failed. It
	// catches a store that fails often without failing five times in a
	// row. Default 0.5; a value above 1 turns the ratio off.
	Ratio float64
	// MinCalls is the least number of calls in the Window for the Ratio
	// to count. Default 20.
	MinCalls int
	// Window is the span over which the Ratio is counted, in ten rolling
	// buckets. Default 10s.
	Window time.Duration
	// Cooldown is how long the breaker stays open before it lets one
	// decision probe the store. It is also how long a probe may take
	// before another decision may probe instead. It should exceed the
	// decision Timeout. Default 1s.
	Cooldown time.Duration
	// Now is the breaker's clock. Nil means time.Now.
	Now func() time.Time
	// Logger receives one line per change of state: Warn when the breaker
	// opens, Info when it closes, Debug for the probes in between. Nil
	// means no logging.
	Logger *zap.Logger
	// Metrics records the state and the transitions. Nil records nothing.
	Metrics *Metrics
}

// CircuitBreaker is the Breaker of a store that may go down. It counts the
// outcomes of store calls and opens when Failures calls in a row failed,
// or when the failure ratio over the Window reached Ratio. While open,
// Allow reports false without waiting for anything, so that decisions
// apply their fail modes at once instead of each waiting for the
// decision's timeout. After the Cooldown the next Allow lets one decision
// through as a probe (half-open); its success closes the breaker, its
// failure opens it for another Cooldown. Recovery needs no restart and no
// background work: traffic itself probes.
//
// A cancelled call (ErrorCanceled: the client went away) says nothing
// about the store and is not counted. Calls that were already in flight
// when the breaker opened are ignored when they end while it is open; so
// that none is still in flight when it turns half-open (and taken for the
// probe), the Cooldown should exceed the decision Timeout.
//
// The zero value is not usable; use NewBreaker. A CircuitBreaker is safe
// for simultaneous use by multiple goroutines; a closed breaker's Allow
// takes no lock.
type CircuitBreaker struct {
	failures int
	ratio    float64
	minCalls int
	width    time.Duration // of one bucket
	cooldown time.Duration
	now      func() time.Time
	log      *zap.Logger
	metrics  *Metrics

	state atomic.Uint32 // a BreakerState; written under mu

	mu          sync.Mutex
	consecutive int
	lastFailed  time.Time // when the last failure counted in consecutive ended
	buckets     [breakerBuckets]bucket
	openedAt    time.Time // when the breaker last opened
	outageStart time.Time // when it opened from closed
	probing     bool      // half-open: a probe is in flight
	probeAt     time.Time // when it started
	probes      int       // failed probes of this outage
}

// bucket counts the calls that ended within one slice of the Window.
type bucket struct {
	index      int64 // the bucket's start, in bucket widths since the epoch
	ok, failed int
}

var _ Breaker = (*CircuitBreaker)(nil)

// NewBreaker returns a closed CircuitBreaker, or an error that names every
// invalid field of cfg.
func NewBreaker(cfg BreakerConfig) (*CircuitBreaker, error) {
	var errs []error
	if cfg.Failures < 0 {
		errs = append(errs, fmt.Errorf("breaker: Failures %d: must not be negative", cfg.Failures))
	}
	if cfg.Ratio < 0 {
		errs = append(errs, fmt.Errorf("breaker: Ratio %v: must not be negative", cfg.Ratio))
	}
	if cfg.MinCalls < 0 {
		errs = append(errs, fmt.Errorf("breaker: MinCalls %d: must not be negative", cfg.MinCalls))
	}
	if cfg.Window < 0 {
		errs = append(errs, fmt.Errorf("breaker: Window %v: must not be negative", cfg.Window))
	}
	if cfg.Cooldown < 0 {
		errs = append(errs, fmt.Errorf("breaker: Cooldown %v: must not be negative", cfg.Cooldown))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	b := &CircuitBreaker{
		failures: cmp.Or(cfg.Failures, DefaultBreakerFailures),
		ratio:    cmp.Or(cfg.Ratio, DefaultBreakerRatio),
		minCalls: cmp.Or(cfg.MinCalls, DefaultBreakerMinCalls),
		width:    cmp.Or(cfg.Window, DefaultBreakerWindow) / breakerBuckets,
		cooldown: cmp.Or(cfg.Cooldown, DefaultBreakerCooldown),
		now:      cfg.Now,
		log:      cfg.Logger,
		metrics:  cfg.Metrics,
	}
	if b.now == nil {
		b.now = time.Now
	}
	if b.log == nil {
		b.log = zap.NewNop()
	}
	b.width = max(b.width, time.Nanosecond)
	b.metrics.breakerState(BreakerClosed)
	return b, nil
}

// State returns the breaker's current state. An open breaker whose
// cool-down is over still reports BreakerOpen until a decision probes.
func (b *CircuitBreaker) State() BreakerState {
	return BreakerState(b.state.Load())
}

// Allow reports whether a decision may call the store: always when
// closed; when open, only once the Cooldown has passed, and then for one
// decision, the probe, which makes the breaker half-open; when half-open,
// only if the probe has taken longer than the Cooldown (it is presumed
// lost, and this decision probes instead).
func (b *CircuitBreaker) Allow() bool {
	if BreakerState(b.state.Load()) == BreakerClosed {
		return true
	}
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	switch BreakerState(b.state.Load()) {
	case BreakerClosed:
		return true
	case BreakerOpen:
		if now.Before(b.openedAt.Add(b.cooldown)) {
			return false
		}
		b.setState(BreakerHalfOpen)
		b.log.Debug("store circuit breaker half-open: one decision probes the store",
			zap.Duration("open_for", now.Sub(b.openedAt)))
	case BreakerHalfOpen:
		if b.probing && now.Before(b.probeAt.Add(b.cooldown)) {
			return false
		}
	}
	b.probing, b.probeAt = true, now
	return true
}

// Record counts the outcome of a store call that Allow let through and
// that took took: nil for success. See CircuitBreaker for what it does
// with it. The call's start is now less took, both on the breaker's own
// clock.
func (b *CircuitBreaker) Record(took time.Duration, err error) {
	kind := ""
	if err != nil {
		kind = ErrorKind(err)
	}
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	state := BreakerState(b.state.Load())
	if kind == ErrorCanceled {
		if state == BreakerHalfOpen {
			b.probing = false // the probe proved nothing; let the next decision probe
		}
		return
	}
	switch state {
	case BreakerClosed:
		b.count(now, err != nil)
		if err == nil {
			b.consecutive = 0
			return
		}
		if began := now.Add(-took); !began.Before(b.lastFailed) {
			b.consecutive++
			b.lastFailed = now
		}
		calls, failed := b.window(now)
		tripped := b.consecutive >= b.failures ||
			(b.ratio <= 1 && calls >= b.minCalls && float64(failed) >= b.ratio*float64(calls))
		if !tripped {
			return
		}
		b.open(now)
		b.outageStart, b.probes = now, 0
		b.log.Warn("store circuit breaker opened: decisions apply their fail modes without waiting for the store",
			zap.String("kind", kind), zap.Error(err),
			zap.Int("consecutive_failures", b.consecutive),
			zap.Int("window_calls", calls), zap.Int("window_failures", failed),
			zap.Duration("cooldown", b.cooldown))
	case BreakerHalfOpen:
		if err != nil {
			b.probes++
			b.open(now)
			b.log.Debug("store circuit breaker probe failed; open again",
				zap.String("kind", kind), zap.Error(err), zap.Int("failed_probes", b.probes))
			return
		}
		b.setState(BreakerClosed)
		b.probing = false
		b.consecutive = 0
		b.buckets = [breakerBuckets]bucket{}
		b.log.Info("store circuit breaker closed: the store decides again",
			zap.Duration("outage", now.Sub(b.outageStart)), zap.Int("failed_probes", b.probes))
	case BreakerOpen:
		// A call that was in flight when the breaker opened: it says
		// nothing the breaker does not know yet.
	}
}

// open opens the breaker at now. Callers hold mu.
func (b *CircuitBreaker) open(now time.Time) {
	b.setState(BreakerOpen)
	b.openedAt = now
	b.probing = false
}

// setState changes the state and records the transition. Callers hold mu.
func (b *CircuitBreaker) setState(s BreakerState) {
	b.state.Store(uint32(s))
	b.metrics.breakerTransition(s)
}

// count adds a call that ended at now to the rolling window. Callers hold
// mu.
func (b *CircuitBreaker) count(now time.Time, failed bool) {
	i := now.UnixNano() / int64(b.width)
	bk := &b.buckets[mod(i, breakerBuckets)]
	if bk.index != i {
		*bk = bucket{index: i}
	}
	if failed {
		bk.failed++
	} else {
		bk.ok++
	}
}

// window returns the calls and failures that ended within the Window
// before now. Callers hold mu.
func (b *CircuitBreaker) window(now time.Time) (calls, failed int) {
	i := now.UnixNano() / int64(b.width)
	for _, bk := range b.buckets {
		if bk.index > i-breakerBuckets && bk.index <= i {
			calls += bk.ok + bk.failed
			failed += bk.failed
		}
	}
	return calls, failed
}

// mod is i modulo n, never negative.
func mod(i, n int64) int64 {
	return ((i % n) + n) % n
}
