package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Settlement settles what a request of a charge rule (charge=) reserved
// at admission to what its response said it cost. Settlements always
// apply: a charge may take a counter past its limit, and later requests
// are then denied until the window gives room.
type Settlement struct {
	Check Check
	// Reserved is what the admission counted in the store: the rule's
	// cost when the store decided it, 0 when it did not (a fail mode
	// decided, so the store never saw the request).
	Reserved int64
	// Charge is what the response said the request cost, at least 0, or
	// the reservation when it said nothing usable.
	Charge int64
	// Read is how the charge was read, a value of sluice_charges_total's
	// result label: ChargeCharged, ChargeMissing or ChargeInvalid.
	Read string
	// Admitted is the store's clock at the admission (Result.Reset minus
	// Result.ResetAfter): while the counter's current window (or, for a
	// sliding rule, the span of buckets) still holds it, the store adds
	// Charge - Reserved; once it has moved on, the whole Charge lands in
	// the current window, so that a response that outlives its window is
	// not free.
	Admitted time.Time
}

// Settler is implemented by stores that settle charges. Settle applies
// every settlement of ss in one atomic step, as durably as a decision.
type Settler interface {
	Settle(ctx context.Context, ss []Settlement) error
}

// Results of sluice_charges_total.
const (
	ChargeCharged = "charged" // the response said what the request cost
	ChargeMissing = "missing" // it said nothing: the reservation stands
	ChargeInvalid = "invalid" // it said something that is not a count: the reservation stands
	ChargeRetried = "retried" // the store could not take the charge at once
)

// Admitted returns the Settlement.Admitted of a check decided with r at
// now on the limiter's clock: the store's clock at the decision when the
// store decided (source SourceStore), else now.
func Admitted(r Result, source Source, now time.Time) time.Time {
	if source == SourceStore && !r.Reset.IsZero() {
		return r.Reset.Add(-r.ResetAfter)
	}
	return now
}

// maxPendingCharges bounds the settlements kept for a store that cannot
// take them: about 200 bytes each, so some 200 MB at most. Beyond it a
// settlement is logged and counted as lost, the only way one is dropped.
const maxPendingCharges = 1_000_000

// charges keeps the settlements the store could not take, and retries
// them in order, one goroutine at a time, until it does.
type charges struct {
	mu       sync.Mutex
	pending  []Settlement
	retrying bool
}

// Settle settles ss against the store, waiting up to settleTimeout; what the store cannot take is kept and retried in the
// background until it does (sluice_charges_total{result="retried"}),
// never dropped while the process lives. It reports whether ss was
// committed before Settle returned. A store that does not settle (no
// Settler) keeps its reservations.
func (l *Limiter) Settle(ctx context.Context, ss []Settlement) bool {
	st, ok := l.store.(Settler)
	if !ok || len(ss) == 0 {
		return ok
	}
	for _, s := range ss {
		l.metrics.charged(s.Check.Rule.Name, s.Read, s.Charge)
	}
	err := l.settle(context.WithoutCancel(ctx), st, ss)
	if err == nil {
		return true
	}
	l.log.Warn("store could not take a charge; keeping it to retry", zap.Int("settlements", len(ss)), zap.Error(err))
	l.keep(st, ss)
	return false
}

// settle sends ss under the settlement deadline.
func (l *Limiter) settle(ctx context.Context, st Settler, ss []Settlement) error {
	if !l.breaker.Allow() {
		return ErrBreakerOpen
	}
	ctx, cancel := context.WithTimeout(ctx, l.settleTimeout())
	defer cancel()
	err := st.Settle(ctx, ss)
	if err != nil {
		l.metrics.storeError(err)
	}
	return err
}

// settleTimeout is how long one settlement may take. A settlement whose
// deadline passes as the database commits it has an unknown outcome, and
// sending it again may count it twice; so it gets far longer than a
// decision: load makes it wait, only an outage (which the breaker soon
// answers at once) makes it fail. The client waits for it at the end of
// its response, as it waits for a decision at the start.
func (l *Limiter) settleTimeout() time.Duration {
	return max(settleTimeout, 4*l.timeout)
}

// settleTimeout is the least a settlement may take (see
// Limiter.settleTimeout).
const settleTimeout = 10 * time.Second

// keep queues ss for the retry goroutine, starting it when none runs.
func (l *Limiter) keep(st Settler, ss []Settlement) {
	c := &l.charges
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range ss {
		l.metrics.chargeResult(s.Check.Rule.Name, ChargeRetried)
		if len(c.pending) >= maxPendingCharges {
			l.log.Error("too many charges waiting for the store; one is lost",
				zap.String("rule", s.Check.Rule.Name), zap.Int64("charge", s.Charge))
			continue
		}
		c.pending = append(c.pending, s)
	}
	if !c.retrying {
		c.retrying = true
		go l.retryCharges(st)
	}
}

// retryCharges sends the kept settlements, oldest first and in batches,
// backing off while the store refuses them, until none is left.
func (l *Limiter) retryCharges(st Settler) {
	c := &l.charges
	wait := 100 * time.Millisecond
	for {
		c.mu.Lock()
		n := min(len(c.pending), 256)
		if n == 0 {
			c.retrying = false
			c.mu.Unlock()
			return
		}
		batch := append([]Settlement(nil), c.pending[:n]...)
		c.mu.Unlock()
		if err := l.settle(context.Background(), st, batch); err != nil {
			time.Sleep(wait)
			wait = min(2*wait, 5*time.Second)
			continue
		}
		wait = 100 * time.Millisecond
		c.mu.Lock()
		c.pending = append(c.pending[:0], c.pending[n:]...)
		c.mu.Unlock()
	}
}

// PendingCharges reports how many settlements wait for the store.
func (l *Limiter) PendingCharges() int {
	l.charges.mu.Lock()
	defer l.charges.mu.Unlock()
	return len(l.charges.pending)
}

// ErrNegativeCharge is the error of a settlement with a negative charge.
var ErrNegativeCharge = errors.New("a charge must not be negative")

// ValidateSettlements reports the first settlement a store must refuse:
// one without a rule, or with a negative charge or reservation.
func ValidateSettlements(ss []Settlement) error {
	for _, s := range ss {
		switch {
		case s.Check.Rule == nil:
			return errors.New("settlement without a rule")
		case s.Charge < 0 || s.Reserved < 0:
			return fmt.Errorf("rule %q: charge %d, reserved %d: %w", s.Check.Rule.Name, s.Charge, s.Reserved, ErrNegativeCharge)
		}
	}
	return nil
}
