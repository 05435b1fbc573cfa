package storetest

import (
	"sync"
	"testing"
	"time"
)

func TestClock(t *testing.T) {
	c := NewClock(Base)
	if !c.Now().Equal(Base) {
		t.Fatalf("Now = %v, want %v", c.Now(), Base)
	}
	c.Advance(time.Second)
	c.Advance(time.Microsecond)
	if want := Base.Add(time.Second + time.Microsecond); !c.Now().Equal(want) {
		t.Errorf("after Advance: %v, want %v", c.Now(), want)
	}
	c.Set(Base.Add(-time.Hour))
	if want := Base.Add(-time.Hour); !c.Now().Equal(want) {
		t.Errorf("after Set: %v, want %v", c.Now(), want)
	}

	// Safe for concurrent use: 100 goroutines advance it by 1µs each.
	c.Set(Base)
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			c.Advance(time.Microsecond)
			_ = c.Now()
		})
	}
	wg.Wait()
	if want := Base.Add(100 * time.Microsecond); !c.Now().Equal(want) {
		t.Errorf("after concurrent Advance: %v, want %v", c.Now(), want)
	}
}

// TestClockAfter: After's channel fires when the clock is moved to its
// instant, not before, and at once for a duration already past.
func TestClockAfter(t *testing.T) {
	c := NewClock(Base)
	ch := c.After(time.Second)
	if c.Waiting() != 1 {
		t.Fatalf("%d waiting, want 1", c.Waiting())
	}
	c.Advance(time.Second - time.Nanosecond)
	select {
	case <-ch:
		t.Fatal("fired before its instant")
	default:
	}
	c.Advance(time.Nanosecond)
	select {
	case got := <-ch:
		if !got.Equal(Base.Add(time.Second)) {
			t.Errorf("fired with %v, want %v", got, Base.Add(time.Second))
		}
	default:
		t.Fatal("did not fire at its instant")
	}
	if c.Waiting() != 0 {
		t.Errorf("%d waiting after firing, want 0", c.Waiting())
	}
	select {
	case <-c.After(0):
	default:
		t.Error("After(0) did not fire at once")
	}
}
