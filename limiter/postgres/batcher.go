package postgres

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// The batcher turns many concurrent Decide calls into few statements.
//
// Every decision joins a FIFO queue. When fewer than MaxInFlight
// statements are in flight, the decision also starts a drain goroutine at
// once, which takes everything queued (up to MaxBatch decisions) and
// decides it in one statement (see run), then takes what queued up
// meanwhile, and so on until the queue is empty, when it gives its slot up.
// An idle gateway therefore sends a lone decision straight away, alone, in
// one round trip: no timer, no waiting for company. Under load each
// statement carries whatever arrived while the previous one was in flight,
// so the batch size follows the load by itself.
//
// Gathering. Under heavy load a statement also waits a little for company:
// when the previous statement carried at least busyBatch decisions, the
// next one is sent once MaxBatch decisions are queued or the oldest queued
// decision has waited BatchWait, whichever comes first. Each transaction
// has a fixed cost (a WAL flush at commit, executor start-up, two process
// wake-ups) that its decisions share, and when the database shares its
// cores with the gateway, as on the benchmark machine, that cost is
// throughput lost; a statement that returned quickly otherwise leaves the
// next one only the few decisions that arrived meanwhile. A decision never
// waits more than BatchWait for the gathering (often less: it waited
// while the previous statement was in flight too), and the wait is only
// taken by a busy drain: an idle gateway, or one whose statements carry a
// few decisions each, sends at once as before.
//
// Exactness is the database's: a batch is one transaction that locks its
// counters in (rule, key) order and applies its decisions one after
// another in arrival order, each seeing the state the previous one left,
// so a batch is equivalent to its decisions made one by one, and
// concurrent statements (up to MaxInFlight of them per instance, from any
// number of instances) serialise on the row locks as any transactions do,
// without deadlock because every one locks in the same order. Nothing is
// counted on the Go side.
//
// Load is not an outage. A decision waits in the queue as long as the
// statements ahead of it are being answered: the decision deadline
// (Options.DecisionTimeout, SLUICE_DB_TIMEOUT) bounds each statement from
// the moment it is sent, not the wait of the decisions behind it, so a
// burst that queues for longer than the deadline is decided by the
// database like any other traffic. When a statement in flight passes the
// deadline, the database is not answering in time: every decision waiting
// on it (in that statement or queued behind it) fails at once with a
// timeout, and so does every decision that arrives while it is still
// overdue, so that a database that hangs costs no request more than the
// deadline and the breaker sees it. The queue's bound (MaxQueued) keeps
// memory flat: a decision that finds it full is not queued and fails with
// limiter.ErrorOverload, which applies its fail mode without the store and
// which the breaker does not count.
//
// Contexts: a decision whose context ends while it is queued is dropped
// from the queue, never sent, and counts nothing; its caller gets the
// context's error at once. A decision whose statement is already in flight
// also returns the context's error at once, but the statement goes on: the
// decision may have been counted, as with any network call that times
// out. Statements run under a context of their own, bounded by
// StatementTimeout, rather than under their callers' deadlines: cancelling
// a statement makes pgx close its connection, and a new connection's first
// decide (connecting, compiling the function, planning) costs more than a
// decision's deadline on a loaded machine, so deadline-bound statements
// turned one slow moment into a lasting storm of reconnections and
// timeouts. A slow database now only holds its slot until the statement
// ends, on a connection that stays warm.

// call is one queued decision. The batcher owns checks and results (copies
// of the caller's), so a caller that gives up may reuse its own slices at
// once while its call is still in a statement.
type call struct {
	queued  time.Time // when it joined the queue
	checks  []limiter.Check
	results []limiter.Result
	leases  []leaseIO // nil: the call asks for no units
	renewal bool      // a lease renewal's phantom request (Decision.Renewal)
	allowed bool
	nowUS   int64
	sent    time.Time // when its statement was sent (Decision.Sent)
	err     error
	state   atomic.Uint32
	done    chan struct{} // receives one token when state becomes callDone
	// onDone, when set, receives the answer instead of a waiting caller
	// (a background lease renewal); the drain calls it and recycles the
	// call.
	onDone func(*call)
	// leaseBuf is leases' storage, kept across recycling.
	leaseBuf []leaseIO
	// refs, when not nil, are the leases of the checks as planned at
	// planned: the drain settles the answer in them (settleCall) before
	// it wakes the caller. refBuf is their storage.
	refs    []leaseRef
	refBuf  []leaseRef
	planned time.Time
}

// Call states. A call moves from callQueued to callTaken (a drain took it)
// and then to callDone (its answer is in place), or to callAbandoned (its
// caller gave up) from either of the first two. A done call belongs to its
// caller again; an abandoned one to the drain that finds it.
const (
	callQueued uint32 = iota
	callTaken
	callDone
	callAbandoned
)

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func newCall(checks []limiter.Check, leases []leaseIO, now time.Time) *call {
	c := callPool.Get().(*call)
	c.checks = append(c.checks[:0], checks...)
	c.results = resize(c.results, len(checks))
	c.leases = nil
	if leases != nil {
		c.leases = append(c.leaseBuf[:0], leases...)
		c.leaseBuf = c.leases
	}
	c.refs = nil
	c.state.Store(callQueued)
	c.queued = now
	return c
}

// recycle returns c to the pool. Only the call's owner calls it, and only
// when no token is left in c.done.
func (c *call) recycle() {
	clear(c.checks) // drop the rule pointers and key strings
	c.checks = c.checks[:0]
	c.err, c.allowed, c.nowUS, c.sent = nil, false, 0, time.Time{}
	c.leases, c.renewal, c.onDone = nil, false, nil
	clear(c.refBuf) // drop the lease pointers
	c.refs, c.planned = nil, time.Time{}
	callPool.Put(c)
}

// batcher is the queue and the slots. Its zero value is not usable; see
// newBatcher.
type batcher struct {
	maxInFlight int
	maxBatch    int
	maxQueued   int
	wait        time.Duration // Options.BatchWait
	timeout     time.Duration // Options.DecisionTimeout: a statement's deadline once sent
	clock       batchClock
	// recent are how long the database took over its latest answers
	// (statements and progress questions); see progress.go.
	recent answerTimes

	mu        sync.Mutex
	queue     []*call
	inFlight  int
	gathering int           // drains waiting in gather
	full      chan struct{} // wakes gathering drains when the queue is full
	// overdue counts the statements in flight that have passed their
	// deadline; late is closed while it is above zero, and made anew when
	// it falls back to zero.
	overdue int
	late    chan struct{}
	// unanswered counts the statements sent and not answered yet.
	unanswered int
	// base is the context every statement runs under (bounded by
	// StatementTimeout); abort cancels it and makes a new one.
	base   context.Context
	cancel context.CancelFunc
	// drains counts the drain goroutines, which live while there is work
	// and end when the queue is empty; Run waits for them when it ends,
	// having set stopped, after which none starts (see stopBatch).
	drains  sync.WaitGroup
	stopped bool
}

// busyBatch is the batch size from which a drain gathers before its next
// statement (or MaxBatch, if smaller): a drain whose statements carry
// fewer decisions is not busy enough for a wait to pay, and sends at once.
const busyBatch = 8

// batchClock is the batcher's time for gathering: the wall clock, or a
// test's clock, which tests move instead of sleeping.
type batchClock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// wallClock is the batchClock of production.
type wallClock struct{}

func (wallClock) Now() time.Time                         { return time.Now() }
func (wallClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

func newBatcher(maxInFlight, maxBatch, maxQueued int, wait, timeout time.Duration) *batcher {
	b := &batcher{
		maxInFlight: maxInFlight,
		maxBatch:    maxBatch,
		maxQueued:   maxQueued,
		wait:        wait,
		timeout:     timeout,
		clock:       wallClock{},
		full:        make(chan struct{}, maxInFlight),
		late:        make(chan struct{}),
	}
	b.base, b.cancel = context.WithCancel(context.Background())
	return b
}

// statementContext returns the context of a statement about to be sent.
func (b *batcher) statementContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	b.mu.Lock()
	base := b.base
	b.mu.Unlock()
	return context.WithTimeout(base, timeout)
}

// abort cancels every statement in flight: their connections are closed
// and their decisions fail. Statements sent afterwards run normally.
func (b *batcher) abort() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cancel()
	b.base, b.cancel = context.WithCancel(context.Background())
}

// inFlight is one statement on its way: sent, and not answered yet.
type inFlight struct {
	sent     time.Time
	pid      atomic.Uint32          // its connection's server process, once it has one
	timer    *time.Timer            // fires at the deadline; nil without one
	done     chan struct{}          // closed when it is answered
	answered bool                   // guarded by the batcher's mu
	late     bool                   // it passed its deadline unanswered; guarded by mu
	waiting  atomic.Pointer[string] // what its server process waited for when last asked
}

// send starts the deadline of a statement about to be sent: when it
// passes unanswered, watch decides whether the database is still answering
// (see Store.watch).
func (b *batcher) send(watch func(*inFlight)) *inFlight {
	st := &inFlight{sent: time.Now(), done: make(chan struct{})}
	b.mu.Lock()
	b.unanswered++
	b.mu.Unlock()
	if b.timeout > 0 {
		st.timer = time.AfterFunc(b.timeout, func() { watch(st) })
	}
	return st
}

// miss marks st overdue, unless it was answered meanwhile: every decision
// waiting on the batcher fails (see the top of this file).
func (b *batcher) miss(st *inFlight) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st.answered {
		return
	}
	st.late = true
	if b.overdue++; b.overdue == 1 {
		close(b.late)
	}
}

// answered ends st's deadline: the database answered it, in time or late,
// or it failed (ok false; then its time says nothing of the database's
// answers).
func (b *batcher) answered(st *inFlight, ok bool) {
	if st.timer != nil {
		st.timer.Stop()
	}
	if ok {
		b.recent.add(time.Since(st.sent))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	st.answered = true
	b.unanswered--
	close(st.done)
	if st.late {
		if b.overdue--; b.overdue == 0 {
			b.late = make(chan struct{})
		}
	}
}

// errQueueFull is the error of a decision that found MaxQueued decisions
// already waiting: the gateway's own overload, not the database's fault.
var errQueueFull = &faultError{kind: limiter.ErrorOverload, err: errors.New("postgres decide: the queue of decisions waiting for the database is full (MaxQueued)")}

// errLate is the error of a decision that waited on a statement (its own,
// or one ahead of it in the queue) that the database has not answered
// within the decision deadline, or that arrived while one was overdue.
var errLate = &faultError{kind: limiter.ErrorTimeout, err: errors.New("postgres decide: the database has not answered a statement within the decision deadline (SLUICE_DB_TIMEOUT)")}

// errStopped is the error of a decision asked of a store whose Run has
// ended (or is ending): no statement starts any more.
var errStopped = &faultError{kind: limiter.ErrorOther, err: errors.New("postgres decide: the store has stopped (its Run ended)")}

// stopBatch makes every later decision and gathered renewal fail with
// errStopped instead of starting a drain, and answers the renewals
// gathered so far: Run then waits for the drains in flight, knowing that
// no renewal timer starts one meanwhile (which would race with the wait,
// and could grant units after returnAll gave the leases back).
func (s *Store) stopBatch() {
	r := &s.renewals
	r.mu.Lock()
	s.batch.mu.Lock()
	s.batch.stopped = true
	s.batch.mu.Unlock()
	r.mu.Unlock()
	s.flushRenewals()
}

// decideBatched is Decide through the batcher, with the lease requests io
// (nil: none), which it fills with the answers, and the leases refs as
// planned at planned (nil: none), in which the drain settles them.
func (s *Store) decideBatched(ctx context.Context, checks []limiter.Check, results []limiter.Result, io []leaseIO, refs []leaseRef, planned time.Time) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, decideErr(err)
	}
	c, late, err := s.enqueueCall(checks, io, func(c *call) {
		if refs != nil {
			c.refs = append(c.refBuf[:0], refs...)
			c.refBuf = c.refs
			c.planned = planned
		}
	})
	if err != nil {
		return false, err
	}

	var gaveUp error
	select {
	case <-c.done:
	case <-ctx.Done():
		gaveUp = decideErr(ctx.Err())
	case <-late:
		gaveUp = errLate
	}
	if gaveUp != nil {
		if c.state.CompareAndSwap(callQueued, callAbandoned) ||
			c.state.CompareAndSwap(callTaken, callAbandoned) {
			// Still queued: it will never be sent. Or in a statement
			// already: the statement decides it anyway (and its grants
			// are lost: counted, never spent). Either way the drain that
			// meets it recycles it.
			return false, gaveUp
		}
		<-c.done // callDone: the answer is there, take it
	}
	copy(results, c.results)
	copy(io, c.leases)
	allowed, err := c.allowed, c.err
	c.recycle()
	return allowed, err
}

// renewGather is how long a background lease renewal waits for others to
// join it before they are queued together, so that they share statements:
// the renewals of many quiet keys, each due every few seconds, otherwise
// go one to four per transaction, each transaction a durable commit. A
// renewal is asked for while half of a lease is left, which lasts far
// longer than this for any key that is not hot; a small limit's lease of
// one or two requests (leaseSmall) renews once it is spent, and its next
// request meanwhile is decided in the database as it would be unleased.
// Gathered renewals that fill a statement (maxBatch) go at once.
//
// Measured against 20 ms, both builds in the same two runs of scenario 4
// (bench -targets ...,before-postgres): 0.003 transactions per request
// against 0.004, and 0.97-1.00x the memory store's throughput against
// 0.87-0.89x. The paced fleet's one gateway on 10,000 keys costs Postgres
// 1.8 us per decision, where it cost 2.8-3.2 (docs/performance.md).
const renewGather = 50 * time.Millisecond

// renewals are the background lease renewals gathering (see renewGather).
type renewals struct {
	gather  time.Duration // renewGather; tests set it
	mu      sync.Mutex
	pending []renewal
	timer   *time.Timer // the flush due, nil when none is
}

type renewal struct {
	check  limiter.Check
	io     leaseIO
	onDone func(*call)
}

// enqueueRenewal gathers a background lease renewal for check c asking
// for io, whose answer goes to onDone. It reports false when too many
// wait already.
func (s *Store) enqueueRenewal(c limiter.Check, io leaseIO, onDone func(*call)) bool {
	if c.Rule.Algorithm != policy.Fixed {
		// A renewal's phantom request is counted when it is sent: in a
		// reset window it can be the request that starts the window, and
		// in a sliding one it lands in the bucket of that moment. Only a
		// fixed window, which the epoch starts, lets it wait.
		_, _, err := s.enqueueCall([]limiter.Check{c}, []leaseIO{io}, func(cl *call) {
			cl.renewal = true
			cl.onDone = onDone
		})
		return err == nil
	}
	r := &s.renewals
	r.mu.Lock()
	if len(r.pending) >= s.batch.maxQueued {
		r.mu.Unlock()
		return false
	}
	r.pending = append(r.pending, renewal{c, io, onDone})
	full := len(r.pending) >= s.batch.maxBatch
	if r.timer == nil && !full {
		r.timer = time.AfterFunc(r.gather, s.flushRenewals)
	}
	r.mu.Unlock()
	if full {
		s.flushRenewals()
	}
	return true
}

// flushRenewals queues the gathered renewals at once, so that a drain
// takes them into as few statements as maxBatch allows. A renewal the
// queue has no room for is answered with the error at once (its lease
// stops asking, and asks again on its next request).
func (s *Store) flushRenewals() {
	r := &s.renewals
	r.mu.Lock()
	pending := r.pending
	r.pending = nil
	if r.timer != nil {
		r.timer.Stop() // a flush that fires anyway finds nothing, or the next gathering
		r.timer = nil
	}
	if len(pending) == 0 {
		r.mu.Unlock()
		return
	}
	b := s.batch
	var refused []*call
	// Both locks, r.mu first (as BatchStats takes them): a renewal is
	// always in one of the two queues until a statement takes it.
	b.mu.Lock()
	now := b.clock.Now()
	for _, rn := range pending {
		c := newCall([]limiter.Check{rn.check}, []leaseIO{rn.io}, now)
		c.renewal, c.onDone = true, rn.onDone
		if b.stopped || b.overdue > 0 || len(b.queue) >= b.maxQueued {
			c.err = errQueueFull
			if b.stopped {
				c.err = errStopped
			}
			refused = append(refused, c)
			continue
		}
		b.queue = append(b.queue, c)
	}
	starts := 0
	for queued := len(b.queue); !b.stopped && queued > 0 && b.inFlight < b.maxInFlight; queued -= b.maxBatch {
		b.inFlight++
		starts++
	}
	b.drains.Add(starts) // under mu: see startDrains
	if b.gathering > 0 && len(b.queue) >= b.maxBatch {
		for ; b.gathering > 0; b.gathering-- {
			b.full <- struct{}{} // room for every drain: never blocks
		}
	}
	b.mu.Unlock()
	r.mu.Unlock()
	s.startDrains(starts)
	for _, c := range refused {
		c.onDone(c)
		c.recycle()
	}
}

// enqueueCall queues a call for checks and io, set up by prepare (if not
// nil) before any drain can see it, and starts a drain when a slot is
// free. It also returns the channel that is closed when a statement in
// flight passes its deadline. It queues nothing, and returns errQueueFull,
// when the queue is full, or errLate while a statement is overdue.
func (s *Store) enqueueCall(checks []limiter.Check, io []leaseIO, prepare func(*call)) (*call, <-chan struct{}, error) {
	b := s.batch
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return nil, nil, errStopped
	}
	if b.overdue > 0 {
		b.mu.Unlock()
		return nil, nil, errLate
	}
	if len(b.queue) >= b.maxQueued {
		b.mu.Unlock()
		return nil, nil, errQueueFull
	}
	late := b.late
	c := newCall(checks, io, b.clock.Now())
	if prepare != nil {
		prepare(c)
	}
	b.queue = append(b.queue, c)
	start := b.inFlight < b.maxInFlight
	if start {
		b.inFlight++
		b.drains.Add(1) // under mu: see startDrains
	}
	if b.gathering > 0 && len(b.queue) >= b.maxBatch {
		for ; b.gathering > 0; b.gathering-- {
			b.full <- struct{}{} // room for every drain: never blocks
		}
	}
	b.mu.Unlock()
	if start {
		s.startDrains(1)
	}
	return c, late, nil
}

// startDrains starts n drains, which the caller has added to b.drains
// while holding b.mu and seeing stopped false. Added under the lock that
// stopBatch sets stopped with, every drain is counted before Run waits
// for them; added here, after the unlock, one could be counted while Run
// waits with none, and run after Run returned (the race detector reports
// it as a WaitGroup's Add racing its Wait).
func (s *Store) startDrains(n int) {
	for range n {
		go func() {
			defer s.batch.drains.Done()
			s.drain()
		}()
	}
}

// drain decides queued calls, a batch per statement, until the queue is
// empty, then gives its slot up.
func (s *Store) drain() {
	var (
		calls []*call
		ds    []Decision
	)
	for {
		if len(calls) >= min(busyBatch, s.batch.maxBatch) && s.batch.wait > 0 {
			s.gather()
		}
		calls = s.take(calls[:0])
		if len(calls) == 0 {
			return // take gave the slot up
		}
		if !s.ready() {
			// The breaker opened while these waited: the database is not
			// to be asked; their fail modes apply at once.
			s.finish(calls, nil, limiter.ErrBreakerOpen)
			continue
		}
		ds = ds[:0]
		for _, c := range calls {
			ds = append(ds, Decision{Checks: c.checks, Results: c.results, Leases: c.leases, Renewal: c.renewal})
		}
		ctx, cancel := s.batch.statementContext(s.opts.StatementTimeout)
		st := s.batch.send(s.watch)
		err := s.runWatched(ctx, ds, false, st)
		s.batch.answered(st, err == nil)
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			s.logOverBound(st)
		}
		var be *errBuild
		if errors.As(err, &be) && len(ds) > 1 {
			// One malformed decision must not fail the others.
			for i, c := range calls {
				one := ds[i : i+1]
				c.err = s.run(ctx, one, false)
			}
		} else {
			for _, c := range calls {
				c.err = err
			}
		}
		cancel()
		s.finish(calls, ds, nil)
		clear(ds)
	}
}

// finish hands the taken calls their answers: ds[i].Allowed, or err for
// every one when ds is nil (each call's own err is kept otherwise).
func (s *Store) finish(calls []*call, ds []Decision, err error) {
	for i, c := range calls {
		if ds != nil {
			c.allowed, c.nowUS, c.sent = ds[i].Allowed, ds[i].NowUS, ds[i].Sent
		} else {
			c.allowed, c.err = false, err
		}
		if c.onDone != nil {
			c.onDone(c)
			c.recycle()
		} else if c.state.CompareAndSwap(callTaken, callDone) {
			if c.refs != nil && c.err == nil {
				s.settleCall(c.checks, c.results, c.leases, c.refs, &c.allowed, c.planned, c.nowUS, c.sent)
			}
			c.done <- struct{}{}
		} else {
			c.recycle() // abandoned: its caller is gone
		}
		calls[i] = nil
	}
}

// gather waits, before a busy drain's next statement, until MaxBatch
// decisions are queued or the oldest queued one has waited BatchWait. It
// returns at once when the queue is empty (take then gives the slot up).
func (s *Store) gather() {
	b := s.batch
	b.mu.Lock()
	if len(b.queue) == 0 || len(b.queue) >= b.maxBatch {
		b.mu.Unlock()
		return
	}
	d := b.wait - b.clock.Now().Sub(b.queue[0].queued)
	if d <= 0 {
		b.mu.Unlock()
		return
	}
	b.gathering++
	b.mu.Unlock()

	select {
	case <-b.clock.After(d):
		b.mu.Lock()
		if b.gathering > 0 {
			b.gathering-- // not woken: our token was not sent
		} else {
			<-b.full // woken as the timer fired: take the token
		}
		b.mu.Unlock()
	case <-b.full:
	}
}

// take moves up to maxBatch queued calls into calls, recycling abandoned
// ones on the way. When the queue is empty it gives the drain's slot up
// instead, under the same lock, so that a call queued later always finds
// a free slot or a drain that will take it.
func (s *Store) take(calls []*call) []*call {
	b := s.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for n < len(b.queue) && len(calls) < b.maxBatch {
		c := b.queue[n]
		n++
		if !c.state.CompareAndSwap(callQueued, callTaken) {
			c.recycle() // abandoned while queued
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
	// flight, or drains about to send one or done with one.
	InFlight int
	// Unanswered is the number of statements sent and not answered yet.
	Unanswered int
	// Queued is the number of decisions waiting for a statement now,
	// including any whose callers gave up and that the next statement will
	// drop.
	Queued int
	// Gathering is the number of busy drains waiting for more decisions
	// before their next statement now (see Options.BatchWait).
	Gathering int
}

// BatchStats returns the Store's counters and the batcher's state.
func (s *Store) BatchStats() BatchStats {
	st := BatchStats{Decisions: s.nDecisions.Load(), Statements: s.nStatements.Load()}
	if b := s.batch; b != nil {
		s.renewals.mu.Lock()
		b.mu.Lock()
		st.InFlight, st.Unanswered, st.Queued, st.Gathering = b.inFlight, b.unanswered, len(b.queue), b.gathering
		st.Queued += len(s.renewals.pending) // gathering renewals wait too
		b.mu.Unlock()
		s.renewals.mu.Unlock()
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
