package storetest

import (
	"sync"
	"time"
)

// Clock is a settable clock for stores under test. It is safe for
// simultaneous use by multiple goroutines; its zero value reads as the zero
// time.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

// waiter is a channel that After returned, and when it fires.
type waiter struct {
	at time.Time
	ch chan time.Time
}

// NewClock returns a Clock that reads t until it is moved.
func NewClock(t time.Time) *Clock {
	return &Clock{now: t}
}

// Now returns the clock's current instant. It is meant to be passed to a
// store as its clock (clock.Now).
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t, forwards or backwards, and fires the channels
// of After whose instant it reached.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
	c.fire()
}

// Advance moves the clock forwards by d, and fires the channels of After
// whose instant it reached.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fire()
}

// After returns a channel that receives the clock's time once the clock
// has been moved d past now (at once when d <= 0), as time.After does for
// the wall clock.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, waiter{at: c.now.Add(d), ch: ch})
	c.fire()
	return ch
}

// Waiting returns how many channels of After have not fired yet.
func (c *Clock) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// fire sends on the channels whose instant has come. Callers hold mu.
func (c *Clock) fire() {
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.ch <- c.now
	}
	clear(c.waiters[len(kept):])
	c.waiters = kept
}
