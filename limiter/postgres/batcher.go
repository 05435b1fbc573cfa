package postgres

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/limiter"
)

// The batcher turns many concurrent Decide calls into few statements.
//
// A decision that finds a free slot (fewer than MaxInFlight statements in
// flight) and nobody queued is sent at once, on the caller's goroutine and
// under the caller's context, exactly as an unbatched store would send it:
// an idle gateway pays one round trip and no timer, no goroutine hand-off.
// A decision that finds every slot busy joins a FIFO queue. When a
// statement finishes, its slot is not given up while decisions are queued:
// a drain goroutine (one per slot at most, living only while there is
// work) takes every queued decision, up to MaxBatch, and decides them all
// in one DecideBatch statement. So the batch size adapts to the load by
// itself: at low load every decision goes alone, and under load each
// statement carries whatever arrived during the previous round trip.
//
// Exactness is the database's: a batch is one transaction that locks its
// counters in (rule, key) order and applies its decisions one after
// another in arrival order, each seeing the state the previous one left,
// so a batch is equivalent to its decisions made one by one, and
// concurrent statements (up to MaxInFlight of them, from any number of
// instances) serialise on the row locks as any transactions do, without
// deadlock because every one locks in the same order. Nothing is counted
// on the Go side.
//
// Contexts: a queued decision whose context is done before a drain took it
// is removed and never sent; its caller gets the context's error at once.
// A decision already sent when its context ends also returns the
// context's error at once, but the statement is not recalled for the
// others in it: the decision may have been counted, as with any network
// call that times out. The statement itself is cancelled only once every
// decision in it has been abandoned.

// call is one queued decision. The batcher owns checks and results (copies
// of the caller's), so a caller that gives up may reuse its own slices at
// once while its call is still in a statement.
type call struct {
	checks  []limiter.Check
	results []limiter.Result
	allowed bool
	err     error
	state   atomic.Uint32
	bt      *flight       // the statement that took the call; set before callTaken
	done    chan struct{} // receives one token when state becomes callDone
}

// Call states. A call moves from callQueued to callTaken (a drain took it)
// and then to callDone (its answer is in place), or to callAbandoned (its
// caller gave up) from either of the first two; whoever makes the last
// transition owns the call afterwards.
const (
	callQueued uint32 = iota
	callTaken
	callDone
	callAbandoned
)

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func newCall(checks []limiter.Check) *call {
	c := callPool.Get().(*call)
	c.checks = append(c.checks[:0], checks...)
	c.results = resize(c.results, len(checks))
	c.state.Store(callQueued)
	return c
}

// recycle returns c to the pool. Only the call's last owner calls it, and
// only when no token is left in c.done.
func (c *call) recycle() {
	clear(c.checks) // drop the rule pointers and key strings
	c.checks = c.checks[:0]
	c.bt, c.err, c.allowed = nil, nil, false
	callPool.Put(c)
}

// flight is one statement sent by a drain. Its context is cancelled once
// every call in it has been abandoned: nobody waits for the answer then.
type flight struct {
	ctx    context.Context
	cancel context.CancelFunc
	// live counts the calls still waiting, plus one held by the drain
	// until the statement is sent.
	live atomic.Int32
}

func (f *flight) unref() {
	if f.live.Add(-1) == 0 {
		f.cancel()
	}
}

// batcher is the queue and the slots. Its zero value is not usable; see
// newBatcher.
type batcher struct {
	maxInFlight int
	maxBatch    int

	mu       sync.Mutex
	queue    []*call
	inFlight int
}

func newBatcher(maxInFlight, maxBatch int) *batcher {
	return &batcher{maxInFlight: maxInFlight, maxBatch: maxBatch}
}

// decideBatched is Decide through the batcher.
func (s *Store) decideBatched(ctx context.Context, checks []limiter.Check, results []limiter.Result) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, decideErr(err)
	}
	b := s.batch
	b.mu.Lock()
	if b.inFlight < b.maxInFlight && len(b.queue) == 0 {
		// Idle enough: send it now, here, as the unbatched store would.
		b.inFlight++
		b.mu.Unlock()
		ok, err := s.decideOne(ctx, checks, results)
		s.releaseSlot()
		return ok, err
	}
	c := newCall(checks)
	b.queue = append(b.queue, c)
	start := b.inFlight < b.maxInFlight
	if start {
		b.inFlight++
	}
	b.mu.Unlock()
	if start {
		go s.drain()
	}

	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(callQueued, callAbandoned) {
			// Never sent: nothing was counted. The drain that finds it
			// in the queue recycles it.
			return false, decideErr(ctx.Err())
		}
		// Taken or done: bt is set and stays so until this caller lets
		// go of the call, since only an abandoned call is recycled by the
		// drain. Read it now; once abandoned, c may be reused at once.
		f := c.bt
		if c.state.CompareAndSwap(callTaken, callAbandoned) {
			// Sent, or about to be: the batch decides it anyway, and the
			// drain recycles it afterwards.
			f.unref()
			return false, decideErr(ctx.Err())
		}
		<-c.done // callDone: the answer is there, take it
	}
	copy(results, c.results)
	ok, err := c.allowed, c.err
	c.recycle()
	return ok, err
}

// releaseSlot gives up a slot after a direct decision, or hands it to a
// drain when decisions queued up meanwhile.
func (s *Store) releaseSlot() {
	b := s.batch
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inFlight--
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	go s.drain()
}

// drain decides queued calls, a batch per statement, until the queue is
// empty, then gives its slot up.
func (s *Store) drain() {
	var (
		calls []*call
		ds    []Decision
	)
	for {
		f := &flight{}
		f.ctx, f.cancel = context.WithCancel(context.Background())
		f.live.Store(1)
		calls = s.take(calls[:0], f)
		if len(calls) == 0 {
			f.cancel()
			return // take gave the slot up
		}
		ds = ds[:0]
		for _, c := range calls {
			ds = append(ds, Decision{Checks: c.checks, Results: c.results})
		}
		f.unref() // from here, only the callers keep the statement alive
		err := s.run(f.ctx, ds, false)
		var be *errBuild
		if errors.As(err, &be) && len(ds) > 1 {
			// One malformed decision must not fail the others.
			for i, c := range calls {
				ds[i].Allowed, c.err = s.decideOne(f.ctx, c.checks, c.results)
			}
		} else {
			for _, c := range calls {
				c.err = err
			}
		}
		f.cancel()
		for i, c := range calls {
			c.allowed = ds[i].Allowed
			if c.state.CompareAndSwap(callTaken, callDone) {
				c.done <- struct{}{}
			} else {
				c.recycle() // abandoned: its caller is gone
			}
			calls[i] = nil
		}
		clear(ds)
	}
}

// take moves up to maxBatch queued calls into calls (skipping and
// recycling abandoned ones) and marks them as taken by f. When the queue
// is empty it gives up the caller's slot instead, under the same lock, so
// that a call queued later always finds a free slot or a drain.
func (s *Store) take(calls []*call, f *flight) []*call {
	b := s.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for n < len(b.queue) && len(calls) < b.maxBatch {
		c := b.queue[n]
		n++
		f.live.Add(1)
		c.bt = f
		if !c.state.CompareAndSwap(callQueued, callTaken) {
			f.live.Add(-1) // cannot reach zero: the drain holds one
			c.bt = nil
			c.recycle()
			continue
		}
		calls = append(calls, c)
	}
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	if len(calls) == 0 {
		b.inFlight--
	}
	return calls
}

// BatchStats describe a Store's decisions and the statements it sent for
// them.
type BatchStats struct {
	// Decisions counts the decisions sent to the database since New.
	Decisions uint64
	// Statements counts the decide statements sent for them since New,
	// retries included: Statements/Decisions is the transactions per
	// decision.
	Statements uint64
	// InFlight is the number of batcher slots in use now: statements in
	// flight, or drains about to send one.
	InFlight int
	// Queued is the number of decisions waiting for a statement now,
	// including any whose callers gave up and that the next statement will
	// drop.
	Queued int
}

// BatchStats returns the Store's counters and the batcher's state.
func (s *Store) BatchStats() BatchStats {
	st := BatchStats{Decisions: s.nDecisions.Load(), Statements: s.nStatements.Load()}
	if b := s.batch; b != nil {
		b.mu.Lock()
		st.InFlight, st.Queued = b.inFlight, len(b.queue)
		b.mu.Unlock()
	}
	return st
}

// resize returns s with length n, reusing its storage when it can.
func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

// Collectors returns Prometheus metrics of the Store's statements, for the
// gateway to register: sluice_db_decisions_total (decisions sent to the
// database), sluice_db_decide_statements_total (decide statements, retries
// included; their ratio is the transactions per decision) and
// sluice_db_queued_decisions (decisions waiting for a statement now).
func (s *Store) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_db_decisions_total",
			Help: "Decisions sent to the database.",
		}, func() float64 { return float64(s.nDecisions.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_db_decide_statements_total",
			Help: "Decide statements (transactions) sent for them, retries included.",
		}, func() float64 { return float64(s.nStatements.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_db_queued_decisions",
			Help: "Decisions waiting for a statement while others are in flight.",
		}, func() float64 { return float64(s.BatchStats().Queued) }),
	}
}
