package limiter

import (
	"cmp"
	"context"
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
	// BreakerClosed: the store works; every decision calls it.
	BreakerClosed BreakerState = iota
	// BreakerHalfOpen: the breaker's own probe is checking the store; no
	// decision calls it.
	BreakerHalfOpen
	// BreakerOpen: the store is not known to work (it failed, or it has not
	// been checked yet); no decision calls it until a probe succeeds.
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
// means its default (see Off for the convention).
type BreakerConfig struct {
	// Failures is the number of consecutive failed store calls that open
	// the breaker. Zero means DefaultBreakerFailures. It catches an outage fast, whatever the
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
	// row. Zero means DefaultBreakerRatio; Off turns the ratio off.
	Ratio float64
	// MinCalls is the least number of calls in the Window for the Ratio
	// to count. Zero means DefaultBreakerMinCalls.
	MinCalls int
	// Window is the span over which the Ratio is counted, in ten rolling
	// buckets. Zero means DefaultBreakerWindow.
	Window time.Duration
	// Cooldown is the pause between two probes while the breaker is open,
	// counted from the opening or from the end of the failed probe. Zero
	// means DefaultBreakerCooldown.
	Cooldown time.Duration
	// StartOpen makes the breaker start open, as a store that has not been
	// checked yet: decisions apply their fail modes until Run's first
	// probe succeeds, which Run makes at once. A durable store starts so,
	// so that no decision meets a store that is not ready (unmigrated,
	// unreachable, cold) and that readiness and the breaker are one state.
	StartOpen bool
	// Now is the breaker's clock. Nil means time.Now.
	Now func() time.Time
	// Logger receives one line per change of state: Warn when the breaker
	// opens (and when the first probe of a starting breaker fails), Info
	// when it closes, Debug for the probes in between. Nil means no
	// logging.
	Logger *zap.Logger
	// Metrics records the state and the transitions. Nil records nothing.
	Metrics *Metrics
}

// CircuitBreaker is the Breaker of a store that may go down, and the
// store's readiness: the store decides exactly when, and only when, the
// breaker is closed.
//
// It counts the outcomes of store calls and opens when Failures calls in a
// row failed, or when the failure ratio over the Window reached Ratio; the
// store's background work, which sees an outage even without traffic,
// opens it at once with Trip. While it is not closed, Allow reports false
// without waiting for anything, so that decisions apply their fail modes
// at once instead of each waiting for the decision's timeout.
//
// Only a probe closes it, and decisions never probe: Run, the breaker's
// one goroutine, calls the store's probe every Cooldown while the breaker
// is open (half-open while a probe runs), and closes the breaker when one
// succeeds. A probe can therefore prepare everything a decision needs
// (connections made and warmed, the schema checked) before the first
// decision is let through, and recovery needs neither traffic nor a
// restart. Without Run, an open breaker stays open.
//
// A cancelled call (ErrorCanceled: the client went away) and one the
// store's own queue refused (ErrorOverload) say nothing about the store
// and are not counted. Calls that were in flight when the
// breaker opened are ignored when they end.
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
	changed     chan struct{} // closed and replaced at every change of state
	consecutive int
	lastFailed  time.Time // when the last failure counted in consecutive ended
	buckets     [breakerBuckets]bucket
	openedAt    time.Time // when the breaker last opened, or its last probe failed
	outageStart time.Time // when it opened from closed, or was made
	starting    bool      // open since it was made: never closed yet
	probes      int       // failed probes of this outage
}

// bucket counts the calls that ended within one slice of the Window.
type bucket struct {
	index      int64 // the bucket's start, in bucket widths since the epoch
	ok, failed int
}

var _ Breaker = (*CircuitBreaker)(nil)

// NewBreaker returns a CircuitBreaker, closed unless cfg.StartOpen, or an
// error that names every invalid field of cfg.
func NewBreaker(cfg BreakerConfig) (*CircuitBreaker, error) {
	var errs []error
	if cfg.Failures < 0 {
		errs = append(errs, fmt.Errorf("breaker: Failures %d: must not be negative", cfg.Failures))
	}
	if cfg.Ratio < 0 && cfg.Ratio != Off {
		errs = append(errs, fmt.Errorf("breaker: Ratio %v: must be Off or not negative", cfg.Ratio))
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
		changed:  make(chan struct{}),
	}
	if b.now == nil {
		b.now = time.Now
	}
	if b.log == nil {
		b.log = zap.NewNop()
	}
	b.width = max(b.width, time.Nanosecond)
	if cfg.StartOpen {
		// Opened "long ago": Run probes at once.
		b.state.Store(uint32(BreakerOpen))
		b.starting, b.outageStart = true, b.now()
	}
	b.metrics.breakerState(b.State())
	return b, nil
}

// State returns the breaker's current state.
func (b *CircuitBreaker) State() BreakerState {
	return BreakerState(b.state.Load())
}

// Ready reports whether the store decides: the breaker is closed.
func (b *CircuitBreaker) Ready() bool {
	return b.State() == BreakerClosed
}

// Changed returns a channel that is closed at the breaker's next change
// of state. Read State after it is closed, and call Changed again to wait
// for the change after that.
func (b *CircuitBreaker) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changed
}

// Allow reports whether a decision may call the store: only when the
// breaker is closed.
func (b *CircuitBreaker) Allow() bool {
	return BreakerState(b.state.Load()) == BreakerClosed
}

// Record counts the outcome of a store call that Allow let through and
// that took took: nil for success. See CircuitBreaker for what it does
// with it. The call's start is now less took, both on the breaker's own
// clock.
func (b *CircuitBreaker) Record(took time.Duration, err error) {
	if BreakerState(b.state.Load()) != BreakerClosed {
		return // a call that was in flight when the breaker opened
	}
	kind := ""
	if err != nil {
		kind = ErrorKind(err)
		if kind == ErrorCanceled || kind == ErrorOverload {
			return // the client's doing, or the gateway's own queue: not the store's
		}
	}
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if BreakerState(b.state.Load()) != BreakerClosed {
		return
	}
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
		(b.ratio != Off && calls >= b.minCalls && float64(failed) >= b.ratio*float64(calls))
	if !tripped {
		return
	}
	b.openFromClosed(now)
	b.log.Warn("store circuit breaker opened: decisions apply their fail modes without waiting for the store",
		zap.String("kind", kind), zap.Error(err),
		zap.Int("consecutive_failures", b.consecutive),
		zap.Int("window_calls", calls), zap.Int("window_failures", failed),
		zap.Duration("cooldown", b.cooldown))
}

// Trip opens a closed breaker at once: the store's background work saw err,
// a failure that says the store is gone (a connection refused or dropped,
// a server shutting down), whether or not decisions have failed yet. An
// idle instance thus stops trusting its pooled connections the moment the
// store goes away, instead of failing its first decisions after the store
// is back. A cancelled err and a breaker that is not closed are ignored.
func (b *CircuitBreaker) Trip(err error) {
	if err == nil || BreakerState(b.state.Load()) != BreakerClosed {
		return
	}
	kind := ErrorKind(err)
	if kind == ErrorCanceled {
		return
	}
	b.metrics.storeError(err)
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if BreakerState(b.state.Load()) != BreakerClosed {
		return
	}
	b.openFromClosed(now)
	b.log.Warn("store circuit breaker opened by the store's background work: decisions apply their fail modes without waiting for the store",
		zap.String("kind", kind), zap.Error(err), zap.Duration("cooldown", b.cooldown))
}

// Run probes the store with probe while the breaker is open, every
// Cooldown, until ctx is done, and closes the breaker when a probe
// succeeds. It is the only way the breaker closes. probe should prove that
// the next decisions will be decided by the store within their deadline
// (see CircuitBreaker); it is not called while the breaker is closed.
func (b *CircuitBreaker) Run(ctx context.Context, probe func(context.Context) error) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		b.mu.Lock()
		state, changed := BreakerState(b.state.Load()), b.changed
		wait := b.openedAt.Add(b.cooldown).Sub(b.now())
		b.mu.Unlock()
		if state == BreakerClosed {
			select {
			case <-ctx.Done():
				return
			case <-changed:
				continue
			}
		}
		if wait > 0 {
			t.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		b.mu.Lock()
		b.setState(BreakerHalfOpen)
		b.mu.Unlock()
		err := probe(ctx)
		if ctx.Err() != nil {
			return
		}
		b.probed(err)
	}
}

// probed ends a probe: err == nil closes the breaker, anything else opens
// it for another Cooldown.
func (b *CircuitBreaker) probed(err error) {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.metrics.storeError(err)
		b.probes++
		b.setState(BreakerOpen)
		b.openedAt = now
		if b.starting && b.probes == 1 {
			b.log.Warn("store not ready yet: decisions apply their fail modes; retrying in the background",
				zap.String("kind", ErrorKind(err)), zap.Error(err), zap.Duration("retry_every", b.cooldown))
			return
		}
		b.log.Debug("store probe failed; the breaker stays open",
			zap.String("kind", ErrorKind(err)), zap.Error(err), zap.Int("failed_probes", b.probes))
		return
	}
	b.setState(BreakerClosed)
	b.consecutive = 0
	b.buckets = [breakerBuckets]bucket{}
	if b.starting {
		b.starting = false
		b.log.Info("store ready: the store decides",
			zap.Duration("after", now.Sub(b.outageStart)), zap.Int("failed_probes", b.probes))
		return
	}
	b.log.Info("store circuit breaker closed: the store decides again",
		zap.Duration("outage", now.Sub(b.outageStart)), zap.Int("failed_probes", b.probes))
}

// openFromClosed opens the breaker at now, starting an outage. Callers
// hold mu.
func (b *CircuitBreaker) openFromClosed(now time.Time) {
	b.setState(BreakerOpen)
	b.openedAt, b.outageStart, b.probes = now, now, 0
}

// setState changes the state, wakes Changed's waiters and records the
// transition. Callers hold mu.
func (b *CircuitBreaker) setState(s BreakerState) {
	b.state.Store(uint32(s))
	close(b.changed)
	b.changed = make(chan struct{})
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
