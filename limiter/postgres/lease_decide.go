package postgres

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// The decision path with leases (see lease.go for the design).

// maxLeasedChecks bounds the checks of a request that the lease path
// handles; a request with more goes to the database as a whole.
const maxLeasedChecks = 16

// leasePlan is one request's use of the lease table, on the stack.
type leasePlan struct {
	n      int
	shards [maxLeasedChecks]int
	ns     int
	local  [maxLeasedChecks]bool    // answered (and reserved) from a lease
	io     [maxLeasedChecks]leaseIO // what the remote checks ask for
	asked  [maxLeasedChecks]bool    // this request marked the lease asking
	gen    [maxLeasedChecks]uint64  // the generation of a local check's lease
	// What a local check reserved: its units, and the window (or bucket)
	// they were counted in, to give back should the lease be gone when
	// the request is denied.
	reserved [maxLeasedChecks]leaseReturn
	// A remote check's lease as planned: the entry, and its count of
	// returns (see settleRemote).
	lease    [maxLeasedChecks]*lease
	returned [maxLeasedChecks]uint64
	renew    [maxLeasedChecks]leaseIO // background renewals to send, want > 0
}

// lockShards locks the distinct shards of checks in index order, the one
// order every request takes them in.
func (t *leaseTable) lockShards(p *leasePlan, checks []limiter.Check) {
	p.ns = 0
	for i, c := range checks {
		sh := shardOf(slotKey{c.Rule.Name, c.Key})
		p.shards[i] = sh
		if !slices.Contains(p.shards[len(checks):len(checks)+p.ns], sh) {
			p.shards[len(checks)+p.ns] = sh
			p.ns++
		}
	}
	set := p.shards[len(checks) : len(checks)+p.ns]
	slices.Sort(set)
	for _, sh := range set {
		t.shards[sh].mu.Lock()
	}
}

func (t *leaseTable) unlockShards(p *leasePlan, nchecks int) {
	for _, sh := range p.shards[nchecks : nchecks+p.ns] {
		t.shards[sh].mu.Unlock()
	}
}

// decideLeased is Decide with leases: checks that hold units enough are
// answered from memory, the others by the database in one decision that
// also asks for units where the rate and the room make it worth it.
func (s *Store) decideLeased(ctx context.Context, checks []limiter.Check, results []limiter.Result) (bool, error) {
	n := len(checks)
	// leasePlan.shards holds each check's shard, then the distinct ones.
	if n > maxLeasedChecks/2 || duplicateSlots(checks) {
		return s.decideRemote(ctx, checks, results, nil)
	}
	t := s.leases
	now := s.localNow()
	ov := s.overrides.Load()
	var p leasePlan
	p.n = n
	t.lockShards(&p, checks)
	all := true
	for i, c := range checks {
		k := slotKey{c.Rule.Name, c.Key}
		sh := &t.shards[p.shards[i]]
		l := sh.m[k]
		if l != nil && l.rule != c.Rule && !leasable(c.Rule) {
			// A reload made the rule one that does not lease: the lease
			// granted under its old definition is given up and forgotten.
			t.settle(k, l)
			delete(sh.m, k)
			t.n.Add(-1)
			l = nil
		}
		if l == nil {
			pp := ov.params(c.Rule, c.Key)
			if !leasable(c.Rule) || !mayLease(c.Rule.Algorithm, pp) || t.n.Load() >= t.max {
				all = false
				continue
			}
			l = &lease{rule: c.Rule, p: pp, since: now}
			sh.m[k] = l
			t.n.Add(1)
		}
		l.observe(now)
		if pp := ov.params(c.Rule, c.Key); l.rule != c.Rule || pp != l.p {
			if l.rule.Algorithm != c.Rule.Algorithm || pp != l.p {
				// Granted under another definition of the rule, or before
				// an override changed: give it up.
				t.settle(k, l)
				l.dryUntil = time.Time{}
			}
			l.rule, l.p = c.Rule, pp
		}
		t.expire(k, l, now)
		if l.live(now) && l.left >= l.p.Cost {
			p.local[i] = true
			continue
		}
		all = false
	}
	// Reserve the local checks' units: all of them when every check is
	// local (the request is allowed), else until the database has spoken.
	for i, c := range checks {
		if !p.local[i] {
			continue
		}
		k := slotKey{c.Rule.Name, c.Key}
		l := t.shards[p.shards[i]].m[k]
		l.left -= l.p.Cost
		t.held.Add(-l.p.Cost)
		p.gen[i] = l.gen
		if !all {
			l.reserved += l.p.Cost
			p.reserved[i] = leaseReturn{rule: k.rule, key: k.key, alg: l.rule.Algorithm,
				mark: l.mark, bucketUS: l.p.Bucket.Microseconds(), unused: l.p.Cost}
		}
		results[i] = l.result(now)
		if all && l.left*renewAt < l.grant && !l.asking && !now.Before(l.dryUntil) && s.batch != nil {
			l.asking = true
			p.renew[i] = s.leaseAsk(l, now)
		}
	}
	if all {
		t.unlockShards(&p, n)
		t.local.Add(1)
		for i, c := range checks {
			if p.renew[i].want > 0 {
				s.renew(c, p.renew[i])
			}
		}
		return true, nil
	}
	// Ask for units on the remote checks that may lease.
	for i, c := range checks {
		if p.local[i] {
			continue
		}
		l := t.shards[p.shards[i]].m[slotKey{c.Rule.Name, c.Key}]
		if l == nil {
			continue
		}
		if l.granted > 0 {
			p.io[i].held, p.io[i].mark = l.granted, l.mark
		}
		p.lease[i], p.returned[i] = l, l.returned
		if !l.asking && !now.Before(l.dryUntil) {
			if ask := s.leaseAsk(l, now); ask.want > 0 {
				l.asking = true
				p.asked[i] = true
				p.io[i].want = ask.want
			}
		}
	}
	t.unlockShards(&p, n)

	// The database decides the rest, in one decision, whose answers are
	// recorded in the leases (settleCall) before it returns.
	var (
		sub     [maxLeasedChecks]limiter.Check
		subRes  [maxLeasedChecks]limiter.Result
		subIO   [maxLeasedChecks]leaseIO
		subRefs [maxLeasedChecks]leaseRef
	)
	m := 0
	for i, c := range checks {
		if !p.local[i] {
			sub[m], subIO[m] = c, p.io[i]
			subRefs[m] = leaseRef{l: p.lease[i], returned: p.returned[i], asked: p.asked[i]}
			m++
		}
	}
	allowed, err := s.decideRemoteLeased(ctx, sub[:m], subRes[:m], subIO[:m], subRefs[:m], now)

	// Settle the reservations and the grants.
	t.lockShards(&p, checks)
	defer t.unlockShards(&p, n)
	j := 0
	for i, c := range checks {
		k := slotKey{c.Rule.Name, c.Key}
		l := t.shards[p.shards[i]].m[k]
		if p.local[i] {
			same := l != nil && l.gen == p.gen[i] && l.rule == c.Rule
			if same {
				l.reserved -= p.reserved[i].unused
			}
			if err != nil || (!allowed && !c.Rule.CountAll) {
				// Not consumed: back to the lease, if it is still the one
				// the units came from. If it was given up meanwhile (a
				// recall, a reset, another definition of the rule), its
				// return left these units out, as neither unspent nor
				// forgiven: they go back to the database on their own, to
				// the window they were counted in (one that has ended
				// takes nothing back), so that a denied request consumes
				// nothing of this rule.
				if same {
					l.left += l.p.Cost
					t.held.Add(l.p.Cost)
				} else {
					t.queueReturn(p.reserved[i])
					s.recall.flushNow()
				}
			}
			if l != nil && err == nil {
				results[i] = l.result(now)
			}
			continue
		}
		if err == nil {
			results[i] = subRes[j] // settled
		} else if l != nil && p.asked[i] {
			l.asking = false
		}
		j++
	}
	if err != nil {
		return false, err
	}
	return allowed, nil
}

// leaseRef is a remote check's lease as its decision was planned: the
// entry (nil: none), its count of returns then (see settleRemote), and
// whether the decision asked for units.
type leaseRef struct {
	l        *lease
	returned uint64
	asked    bool
}

// settleCall records the database's answers to the checks of one leased
// decision (refs: their leases as planned, io: what they asked and were
// granted) in the lease table, and makes its results agree with what this
// gateway holds. The batcher calls it for the decisions of a statement in
// the order the database made them, before their callers wake and before
// it sends the next statement, so that the answers to this gateway's
// decisions of a counter and the requests it answers from the counter's
// lease report Remaining as one sequence, each allowed request one less
// than the one before it (storetest's ConcurrentOneKey; with
// MaxInFlight above 1 the order between statements is not known, and
// Remaining may repeat). A decision of one check that the database denied
// takes its units from this gateway's own lease of the counter when it
// holds enough: a 429 means the limit is spent, not that this gateway
// holds what is left of it.
func (s *Store) settleCall(checks []limiter.Check, results []limiter.Result, io []leaseIO, refs []leaseRef, allowed *bool, planned time.Time, nowUS int64, sent time.Time) {
	t := s.leases
	for j, c := range checks {
		pl := refs[j].l
		if pl == nil {
			continue
		}
		k := slotKey{c.Rule.Name, c.Key}
		sh := &t.shards[shardOf(k)]
		sh.mu.Lock()
		l := sh.m[k]
		if l != nil && refs[j].asked {
			l.asking = false
		}
		r := &results[j]
		t.settleRemote(k, l, pl, c, r, r, io[j], refs[j].returned, refs[j].asked, planned, nowUS, sent)
		if len(checks) == 1 && !r.Allowed && !c.Rule.CountAll && l != nil && l.rule == c.Rule {
			now := s.localNow()
			t.expire(k, l, now)
			if l.live(now) && l.left >= l.p.Cost {
				l.left -= l.p.Cost
				t.held.Add(-l.p.Cost)
				t.local.Add(1)
				*r = l.result(now)
				*allowed = true
			}
		}
		sh.mu.Unlock()
	}
}

// settleRemote records the database's answer res to check c, which was
// planned with lease pl (returned its count of returns then) and asked
// io, in the lease now in the table, l (nil if the entry went away), and
// makes the caller's result r agree with what this gateway holds. The
// caller holds the shard.
func (t *leaseTable) settleRemote(k slotKey, l, pl *lease, c limiter.Check, r, res *limiter.Result, io leaseIO,
	returned uint64, asked bool, now time.Time, nowUS int64, sent time.Time) {
	mark, _, _ := pl.answerMark(res, nowUS)
	if !r.Allowed && !r.Provisional && io.held > 0 && io.mark == mark && (l != pl || l.returned != returned) {
		// The database judged "do others hold units?" by this gateway's
		// claim to hold io.held of this window, as of when the decision
		// was planned. The lease was given up meanwhile (a recall, a
		// reset) and its return may have reached the database first: the
		// claim then hid units other gateways hold, and the denial may be
		// wrong. It is provisional: asked again with a fresh claim, never
		// remembered by the fast path (which would deny the key locally
		// until its window ends).
		r.Provisional = true
	}
	if l == nil {
		return
	}
	t.merge(k, l, c, res, io.granted, asked, nowUS, sent)
	if l.rule != c.Rule || l.granted == 0 || l.mark != mark || !l.live(now) {
		return // no units of the answer's window here
	}
	// The room left includes the units this gateway holds, and the count
	// leaves them out. If a grant the database made after this decision
	// (a renewal's) merged first, the answer's room still counts its units
	// as room: the lease's room, the smallest answer of its window, is the
	// one to report, as answers served from the lease report it. (After
	// another gateway gives units back it is lower than a fresh answer's:
	// it under-reports, never over.)
	r.Remaining = min(r.Remaining, l.room)
	r.Remaining += l.left
	r.Count = max(0, r.Count-l.left)
	if r.Remaining > 0 {
		// Within the limit the count is what the room says: units of a
		// renewal on its way are counted in the database but not yet held
		// here.
		r.Count = r.Limit - r.Remaining
	}
}

// duplicateSlots reports whether two checks name one counter.
func duplicateSlots(checks []limiter.Check) bool {
	for i := range checks {
		for j := i + 1; j < len(checks); j++ {
			if checks[i].Key == checks[j].Key && checks[i].Rule.Name == checks[j].Rule.Name {
				return true
			}
		}
	}
	return false
}

// result is the Result of a decision answered from l at now: allowed, with
// the room the database had left at the last grant plus what l holds.
func (l *lease) result(now time.Time) limiter.Result {
	dbNow := now.Add(l.offset).UnixMicro()
	return limiter.Result{
		Allowed:    true,
		Limit:      l.p.Limit,
		Window:     l.p.Window,
		Remaining:  max(0, l.room+l.left),
		Count:      max(0, l.p.Limit-l.room-l.left),
		Reset:      time.UnixMicro(l.resetUS).UTC(),
		ResetAfter: time.Duration(max(0, l.resetUS-dbNow)) * time.Microsecond,
	}
}

// leaseAsk is what a request for units on l asks at now: how many, and
// what this gateway already holds under which mark.
func (s *Store) leaseAsk(l *lease, now time.Time) leaseIO {
	l.measure(now)
	left := l.p.Window
	if l.rule.Algorithm == policy.Sliding {
		left = l.p.Bucket
	}
	if l.offset != 0 || !l.until.IsZero() {
		// The rest of the window (or bucket), by the database's clock.
		dbNow := now.Add(l.offset).UnixMicro()
		if end := l.endUS(dbNow); end > dbNow {
			left = time.Duration(end-dbNow) * time.Microsecond
		}
	}
	io := leaseIO{want: leaseWant(l.rule.Algorithm, l.p, l.rate, left)}
	// What it holds and what it asks for (with a renewal's phantom
	// request) stay within leaseCap.
	c := max(1, l.p.Cost)
	if room := (leaseCap(l.p) - l.left - c) / c * c; io.want > room {
		io.want = room
	}
	if io.want < leaseMin(l.p) {
		io.want = 0
	}
	if l.granted > 0 {
		io.held, io.mark = l.granted, l.mark
	}
	return io
}

// endUS is when, on the database clock, a lease of l granted at dbNow would
// end: its window's end (fixed, reset) or its bucket's (sliding).
func (l *lease) endUS(dbNow int64) int64 {
	switch l.rule.Algorithm {
	case policy.Sliding:
		bw := l.p.Bucket.Microseconds()
		return (dbNow/bw + 1) * bw
	case policy.Fixed:
		w := l.p.Window.Microseconds()
		return (dbNow/w + 1) * w
	}
	// reset: the window of the last grant, if it still runs.
	if l.granted > 0 {
		return l.mark + l.p.Window.Microseconds()
	}
	return dbNow + l.p.Window.Microseconds()
}

// merge records the database's answer res for check c on l (the caller
// holds its shard): g units granted beyond the request (for an allowed
// renewal, its phantom request's cost included), at the
// database's nowUS; sent is the local instant the decision was started,
// before the database read its clock, so that the lease ends no later than
// its window does on the database's clock. asked says whether the decision
// asked for units: one that asked and got none marks the lease dry until
// its window (or bucket) ends.
func (t *leaseTable) merge(k slotKey, l *lease, c limiter.Check, res *limiter.Result, g int64, asked bool, nowUS int64, sent time.Time) {
	if l.rule != c.Rule {
		return // the rule changed meanwhile; its next request settles it
	}
	mark, end, ok := l.answerMark(res, nowUS)
	if !ok {
		return
	}
	until := sent.Add(time.Duration(end-nowUS) * time.Microsecond)
	// The room the database has left: within one window (or bucket) it
	// only shrinks but for units given back, so of answers that may arrive
	// out of order the smallest is the freshest.
	if l.granted > 0 && l.mark == mark {
		l.room = min(l.room, res.Remaining)
	} else {
		l.room = res.Remaining
	}
	got := g
	if got <= 0 {
		if asked {
			l.dryUntil = until
		}
		return
	}
	if l.granted > 0 && l.mark != mark {
		// Units of an earlier window or bucket: theirs has ended.
		t.expire(k, l, until) // until is after the old lease's end
		if l.granted > 0 {
			t.settle(k, l)
		}
	}
	first := l.granted == 0
	if first {
		l.firstUS = nowUS
	}
	l.mark = mark
	l.granted += got
	l.addGrant(nowUS, first)
	l.left += got
	l.grant = got
	t.held.Add(got)
	l.until = until
	l.offset = time.Duration(nowUS)*time.Microsecond - time.Duration(sent.UnixNano())
	l.resetUS = res.Reset.UnixMicro()
	if c.Rule.Algorithm == policy.Sliding {
		// A decision from the lease makes the current bucket the newest.
		l.resetUS = (mark + l.p.Window.Microseconds()/l.p.Bucket.Microseconds()) * l.p.Bucket.Microseconds()
	}
	l.dryUntil = time.Time{}
	t.grants.Add(1)
	t.unitsGranted.Add(uint64(got))
}

// answerMark returns the mark (window start or bucket index) and the end,
// database µs, of the window or bucket a database answer res for l's
// counter at nowUS belongs to; ok is false for an algorithm that never
// leases.
func (l *lease) answerMark(res *limiter.Result, nowUS int64) (mark, end int64, ok bool) {
	switch l.rule.Algorithm {
	case policy.Sliding:
		bw := l.p.Bucket.Microseconds()
		mark = nowUS / bw
		return mark, (mark + 1) * bw, true
	case policy.Fixed, policy.Reset:
		end = res.Reset.UnixMicro()
		return end - l.p.Window.Microseconds(), end, true
	}
	return 0, 0, false
}

// renew asks the database, in the background, for more units on c's
// counter: a phantom request of the rule's cost that leases io.want units
// beyond it; both are the lease's if it is allowed. Nobody waits for it.
func (s *Store) renew(c limiter.Check, io leaseIO) {
	done := func(cl *call) {
		t := s.leases
		k := slotKey{c.Rule.Name, c.Key}
		sh := &t.shards[shardOf(k)]
		sh.mu.Lock()
		defer sh.mu.Unlock()
		l := sh.m[k]
		if l == nil {
			return
		}
		l.asking = false
		if cl.err != nil {
			return
		}
		// An allowed renewal's grant includes its phantom request's cost
		// (decide_function.sql: c_renewal).
		t.merge(k, l, c, &cl.results[0], cl.leases[0].granted, true, cl.nowUS, cl.sent)
	}
	if !s.ready() || !s.enqueueRenewal(c, io, done) {
		t := s.leases
		k := slotKey{c.Rule.Name, c.Key}
		sh := &t.shards[shardOf(k)]
		sh.mu.Lock()
		if l := sh.m[k]; l != nil {
			l.asking = false
		}
		sh.mu.Unlock()
	}
}

// decideRemote decides checks in the database, with lease requests io
// (nil: none), through the batcher when there is one.
func (s *Store) decideRemote(ctx context.Context, checks []limiter.Check, results []limiter.Result, io []leaseIO) (bool, error) {
	return s.decideRemoteLeased(ctx, checks, results, io, nil, time.Time{})
}

// decideRemoteLeased is decideRemote for checks whose leases, as planned
// at planned, are refs (nil: none): their answers are settled in the
// leases (settleCall) when it returns without an error.
func (s *Store) decideRemoteLeased(ctx context.Context, checks []limiter.Check, results []limiter.Result, io []leaseIO, refs []leaseRef, planned time.Time) (bool, error) {
	if len(checks) == 0 {
		return true, nil
	}
	if s.batch != nil {
		return s.decideBatched(ctx, checks, results, io, refs, planned)
	}
	d := [1]Decision{{Checks: checks, Results: results, Leases: io}}
	if err := s.run(ctx, d[:], false); err != nil {
		return false, err
	}
	if refs != nil {
		s.settleCall(checks, results, io, refs, &d[0].Allowed, planned, d[0].NowUS, d[0].Sent)
	}
	return d[0].Allowed, nil
}

// Lease upkeep, run by Run: returns, and what time ends.
const (
	// returnInterval is how often queued returns are sent, when there
	// are any.
	returnInterval = 50 * time.Millisecond
	// sweepInterval is how often leases are checked for their deadline.
	sweepInterval = 250 * time.Millisecond
	// leaseIdle is how long an entry without units is kept for its rate.
	leaseIdle = 10 * time.Second
	// returnTimeout bounds one return statement.
	returnTimeout = 2 * time.Second
)

// runLeases sends the queued returns and sweeps the lease table until ctx
// ends.
func (s *Store) runLeases(ctx context.Context) {
	failing := newStateLog(s.log, "returning leased units")
	lastSweep := time.Now()
	t := time.NewTicker(returnInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.recall.kick: // a recall: give back at once
		}
		if now := s.localNow(); now.Sub(lastSweep) >= sweepInterval {
			s.leases.sweep(now, leaseIdle)
			lastSweep = now
		}
		failing.report(s.flushReturns(ctx))
	}
}

// returnAll gives every lease back, at a clean shutdown.
func (s *Store) returnAll(ctx context.Context) {
	if !s.ready() {
		return // nothing can be given back; the units expire with their windows
	}
	s.leases.dropAll(true)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), returnTimeout)
	defer cancel()
	if err := s.flushReturns(rctx); err != nil {
		s.log.Warn("could not give back leased units at shutdown; they expire with their windows", zap.Error(err))
	}
}

// flushReturns sends the queued returns in one statement. A return that
// may have been applied is never sent again (that would give units back
// twice); one that surely was not is queued again.
func (s *Store) flushReturns(ctx context.Context) error {
	rs := s.leases.takeReturns()
	if len(rs) == 0 || !s.ready() {
		if len(rs) > 0 {
			s.leases.lost(rs)
		}
		return nil
	}
	n := len(rs)
	var (
		rule, key             = make([]string, n), make([]string, n)
		alg                   = make([]int16, n)
		mark, bw, unused, set = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	)
	for i, r := range rs {
		rule[i], key[i], alg[i] = r.rule, r.key, int16(r.alg)
		mark[i], bw[i], unused[i], set[i] = r.mark, r.bucketUS, r.unused, r.settled
	}
	ctx, cancel := context.WithTimeout(ctx, returnTimeout)
	defer cancel()
	var changed int
	err := s.pool.QueryRow(ctx, s.q.leaseReturn, rule, key, alg, mark, bw, unused, set).Scan(&changed)
	if err != nil {
		if pgconn.SafeToRetry(err) {
			for _, r := range rs {
				s.leases.queueReturn(r)
			}
		} else {
			s.leases.lost(rs)
		}
		return fmt.Errorf("postgres store: return leased units: %w", s.fault(err))
	}
	var units uint64
	for _, r := range rs {
		units += uint64(r.unused)
	}
	s.leases.unitsReturned.Add(units)
	return nil
}

// lost counts returns that were dropped: their units stay counted until
// their windows end.
func (t *leaseTable) lost(rs []leaseReturn) {
	t.returnsLost.Add(uint64(len(rs)))
}
