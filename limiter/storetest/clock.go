package storetest

import (
	"sync"
	"time"
)

// Clock is a settable clock for stores under test. It is safe for
// simultaneous use by multiple goroutines; its zero value reads as the zero
// time.
type Clock struct {
	mu  sync.Mutex
	now time.Time
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

// Set moves the clock to t, forwards or backwards.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Advance moves the clock forwards by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
