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
