//go:build unix

package faults

// Background traffic that keeps every rule busy through a fault.

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// traffic keeps requests flowing to every rule, each with a key of its
// own (so that no limit is ever reached), until stopped, and checks that
// each one is answered with a status its rule's fail mode allows.
type traffic struct {
	loops
	n atomic.Int64
}

// loops are goroutines that run until stopped, and what they saw go
// wrong (up to max reports), for one report at the end.
type loops struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	max   int
	mu    sync.Mutex
	bad   []string
}

func newLoops(max int) loops { return loops{stopc: make(chan struct{}), max: max} }

// loop runs f in a goroutine of its own again and again, until stop or
// until f returns false.
func (l *loops) loop(f func() bool) {
	l.wg.Go(func() {
		for {
			select {
			case <-l.stopc:
				return
			default:
			}
			if !f() {
				return
			}
		}
	})
}

func (l *loops) fail(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.bad) < l.max {
		l.bad = append(l.bad, s)
	}
}

// stop stops the loops, waits for them and returns what went wrong.
func (l *loops) stop() []string {
	close(l.stopc)
	l.wg.Wait()
	return l.bad
}

// allowedStatus lists, per path, the statuses a request with a fresh key
// may get, whatever the database does.
var allowedStatus = map[string][]int{
	"/open":   {200},      // fail=open: always forwarded
	"/closed": {200, 503}, // fail=closed: decided, or unavailable
	"/local":  {200},      // fail=local: a fresh key is under any limit
}

// trafficRuns numbers the runs of startTraffic, so that each uses keys of
// its own.
var trafficRuns atomic.Int64

func startTraffic(gws []*faultGateway, workers int) *traffic {
	tr := &traffic{loops: newLoops(20)}
	run := trafficRuns.Add(1)
	paths := []string{"/open", "/closed", "/local"}
	for w := range workers {
		i := 0
		tr.loop(func() bool {
			path := paths[i%len(paths)]
			g := gws[(w+i)%len(gws)]
			r, err := g.post(path, fmt.Sprintf("bg-%d-%d-%d", run, w, i))
			i++
			tr.n.Add(1)
			switch {
			case err != nil:
				tr.fail(fmt.Sprintf("%s: %v", path, err))
			case !slices.Contains(allowedStatus[path], r.status):
				tr.fail(fmt.Sprintf("%s: status %d", path, r.status))
			}
			return true
		})
	}
	return tr
}

// stop stops the traffic and fails t if any request was not answered as
// its fail mode says; it returns the number of requests sent.
func (tr *traffic) stop(t *testing.T) int64 {
	t.Helper()
	if bad := tr.loops.stop(); len(bad) > 0 {
		t.Errorf("background requests not answered as their fail modes say: %v", bad)
	}
	return tr.n.Load()
}
