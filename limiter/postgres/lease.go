package postgres

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// Leases: spending part of a limit in memory, exactly.
//
// A decision that goes to the database may ask, for any of its counters, to
// lease units beyond its own cost. The database grants them in the same
// transaction as the decision, only to a check of an allowed request, at
// most a quarter of the room left, and counts them in the counter at once
// (decide_function.sql). This gateway then answers later requests of that
// counter from the units in memory, without a round trip, until they run
// out, the window (or, for a sliding counter, the bucket) they belong to
// ends, or the lease is given up. It is escrow: a granted unit is a unit
// used, as far as every other gateway can tell, until its holder gives it
// back. So:
//
//   - Never more than the limit per window, through any crash. Units are
//     counted when granted, in the decision's durable commit; a grant whose
//     commit is not known to have happened (a lost connection, a cancelled
//     wait for a synchronous standby) is never spent. A holder that dies
//     wastes what it held, never more.
//   - Tiers stay all or nothing. A request is answered from memory only
//     when every one of its checks has units enough; otherwise the checks
//     that have are reserved and the rest go to the database, and the
//     reservation is kept only if the database allows the rest (a count=all
//     check keeps its units either way, since it counts denied requests).
//   - Units come back when someone needs them. A check denied while other
//     gateways hold units of its counter is Provisional (the over-limit
//     cache keeps it for a second at most), and the database records a key
//     event asking for the units back. Every gateway reads key events in its
//     background poll, gives up the leases of those keys and returns what it
//     did not spend, in one statement (return_leases). Resets and override
//     changes are key events too, and invalidate leases the same way; so do
//     a clean shutdown and, on another rule definition after a reload, the
//     next request.
//   - Exactly the limit under contention. Leases are sized from the rate a
//     gateway sees for the key (a second of it, and a small floor
//     for quiet keys of roomy fixed windows) and the room left (a quarter at
//     most, so they shrink as the window fills, and end when it is nearly
//     full: the last units are decided one request at a time). A gateway
//     that keeps seeing demand spends what it holds within about a second;
//     one that stops gives it back when someone asks.
//
// Which algorithms lease: fixed and reset windows, whose units belong to a
// window that only the database clock ends; sliding windows, within one
// bucket (units spent in the bucket they were counted in are exactly what
// the bucketed window counts; the unspent ones are returned to that bucket
// when it ends). Token buckets never lease: a token counted now and spent
// later has let the bucket refill meanwhile, so the holder's late spending
// and the refilled tokens together could pass the burst; every token
// decision is made in the database, as before.
//
// The local clock only ever shortens a lease: its deadline is the instant
// this gateway sent the decision plus what the database said was left of
// the window (or bucket), so a lease ends before the database's window does
// whatever the two clocks say.

// Sizing.
const (
	// leaseShare: a gateway holds at most 1/leaseShare of a counter's
	// limit (leaseCap), which bounds what its death wastes of a window.
	leaseShare = 16
	// leaseHorizon: a lease covers about this much of the rate this
	// gateway sees for the counter, so a busy counter costs each gateway
	// about two renewals a second (renewAt), whatever its rate. The
	// renewals of every gateway that shares a hot counter queue on its row
	// through each one's commit, so this is what bounds how many gateways
	// one hot key serves. Measured (bench fleet -hot, 10,000 decisions/s
	// split over the gateways): Postgres CPU per decision 0.1 us with one
	// gateway, 1.9 with 16 and 3.6 with 32, against 0.9, 10.1 and 10.3
	// with a tenth of a second in the same session. A longer horizon holds
	// more in escrow, within leaseCap and given back on a recall; what a
	// dead gateway can waste stays leaseCap.
	leaseHorizon = time.Second
	// leaseFloor: a fixed or reset counter with room leases at least this
	// many requests' worth (limit permitting), so that a key seen every
	// second or two still costs one transaction per many requests.
	leaseFloor = 16
	// leaseFloorFixed is the floor of a fixed counter: its window ends
	// where the epoch says whoever holds its units, so a larger floor only
	// holds more in escrow (within leaseCap, given back on a recall), and
	// makes a quiet key renew every 32 of its requests rather than every
	// 8. (A reset counter's window starts at a request, and a renewal's
	// phantom request can be that request: its leases stay small.)
	// Measured: at 10,000 keys seen once a second, Postgres CPU per
	// decision 7.8 us with 16, 1.4 us with 64 (bench fleet).
	leaseFloorFixed = 64
	// leaseMinRequests: a lease smaller than this many requests is not
	// worth its bookkeeping; the counter is decided per request. A small
	// limit's lease (leaseSmall) is the exception.
	leaseMinRequests = 2
	// leaseSmall: a gateway may hold this many requests of a counter
	// whose sixteenth is less (a limit below 32 requests: logins, password
	// resets, daily quotas per client), so that a key seen every few
	// seconds is answered from memory but for its first request, and its
	// renewals, one per two requests, wait for one another's company (renewGather)
	// in the background (a fixed window's). The database's quarter of the
	// room left bounds it further: a limit of 5 leases one request at a
	// time, and a limit below 5 nothing. It is what a dead gateway can
	// waste of such a counter. Measured (bench, scenario 4: a limit of 10
	// a day on 10,000 client IPs beside 1,000 IPs over it): with every
	// allowed request a durable decision, a few to a transaction (0.011
	// transactions per request), the durable store made 0.85-0.96x the
	// memory store's throughput, the flushes' CPU on the two cores it
	// shares being the gap; with leases of two requests, 0.003
	// transactions per request (docs/performance.md).
	leaseSmall = 2
	// leaseSmallMin: a counter that allows fewer than this many requests
	// is never leased: the quarter of the room its first request leaves is
	// less than one request.
	leaseSmallMin = 5
	// renewAt: a lease asks for more, in the background, once fewer than
	// this fraction of its last grant is left, so that a busy key rarely
	// runs dry.
	renewAt = 2 // left*renewAt < grant
)

// leaseWant is how many units to ask for a counter of algorithm alg with
// parameters p, given the requests per second this gateway sees for it
// (0: unknown) and the time left of the window or bucket the lease would
// belong to. 0 means ask for nothing.
func leaseWant(alg policy.Algorithm, p limiter.Params, rate float64, left time.Duration) int64 {
	if !mayLease(alg, p) || left <= 0 {
		return 0
	}
	c := max(1, p.Cost)
	capUnits := leaseCap(p)
	var reqs float64
	switch alg {
	case policy.Fixed, policy.Reset:
		floor := float64(leaseFloor)
		if alg == policy.Fixed {
			floor = leaseFloorFixed
		}
		reqs = floor
		if rate > 0 {
			// No more than the rest of the window can use: units
			// leased that this gateway cannot spend before the window
			// ends only make the others wait on a recall.
			reqs = min(max(rate*leaseHorizon.Seconds(), floor), rate*left.Seconds())
		}
	case policy.Sliding:
		// Only for a rate seen, and no more than the rest of the bucket
		// can use: what is left at its end has to be returned.
		reqs = min(rate*leaseHorizon.Seconds(), rate*left.Seconds())
	default:
		return 0
	}
	want := int64(reqs) * c
	if want < leaseMinRequests*c {
		return 0
	}
	return min(want, capUnits)
}

// leaseCap is the most units a gateway holds of a counter with parameters
// p: a sixteenth of the limit in whole requests, or leaseSmall requests
// when that is more. It is what a gateway that dies can waste of the
// counter's window.
func leaseCap(p limiter.Params) int64 {
	c := max(1, p.Cost)
	return max(p.Limit/leaseShare/c, leaseSmall) * c
}

// leaseMin is the smallest ask worth sending for a counter with
// parameters p: leaseMinRequests, or, for a small limit's lease, the one
// request its holder can ask for beside a renewal's phantom request.
func leaseMin(p limiter.Params) int64 {
	c := max(1, p.Cost)
	return min(leaseMinRequests*c, leaseCap(p)-c)
}

// leasable reports whether rule's requests may ever be answered from a
// lease, whatever its parameters. Not a rule with charge= (its cost is
// known only after the response), nor one with count=all: it counts
// denied requests too, and a request denied while other gateways held
// units (a provisional denial, asked again once they are back) counted a
// unit that the holders then gave back as room, so a burst over three
// gateways let 85 to 99 of a limit of 100 through
// (TestCountAllBurstAcrossGateways); decided in the database, each request
// is counted once, in order.
func leasable(rule *policy.Rule) bool {
	return rule.Charge == nil && !rule.CountAll
}

// mayLease reports whether a counter of algorithm alg with parameters p
// can ever be leased: whether leaseWant can be more than 0. Token buckets
// and calendar windows never are: a lease belongs to a window of Window
// aligned to the epoch, and a calendar rule's day, week or month gains
// nothing from units held for a few seconds. Rules with charge= or
// count=all are kept out whatever their parameters (leasable).
func mayLease(alg policy.Algorithm, p limiter.Params) bool {
	c := max(1, p.Cost)
	switch {
	case alg == policy.Token || p.Calendar != nil:
		return false
	case alg == policy.Sliding:
		// The unspent units of a bucket are returned after it ends, and
		// the window counts them until then: a small limit's remaining
		// would be short by what its gateways held.
		return p.Limit/leaseShare/c >= leaseMinRequests
	}
	return p.Limit/c >= leaseSmallMin
}

// lease is this gateway's state of one counter: its units, and the rate it
// sees. Guarded by its shard's mutex.
type lease struct {
	rule *policy.Rule   // the rule it was granted under
	p    limiter.Params // the parameters it was granted under (overrides applied)

	mark    int64 // window start (fixed, reset) or bucket index (sliding), database µs
	granted int64 // units granted under mark and not settled with the database
	left    int64 // units granted and not yet spent
	// reserved are units taken from left by requests whose other checks
	// the database is deciding: spent if it allows them, else given back.
	// When the lease is given up meanwhile they are the requests' to
	// settle (decideLeased), not the return's.
	reserved int64
	grant    int64 // the last grant, for renewAt
	firstUS  int64 // database time of the first grant under mark (µs)
	// grants are the last grantsKept grants under mark, oldest first: when
	// (database µs) and the units granted under mark up to and with it.
	grants  [grantsKept]datedGrant
	ngrant  int // grants under mark, of which the last grantsKept are kept
	until   time.Time
	offset  time.Duration // database clock minus local clock, as of the last grant
	resetUS int64         // the Reset a decision answered from the lease reports
	room    int64         // the database's room left after the last grant

	gen      uint64    // changes whenever the units are given up or expire
	returned uint64    // returns queued (settle): a claim to hold units made before one is stale
	asking   bool      // a decision that asks for units is in flight
	dryUntil time.Time // the database granted nothing: ask no more before this

	hits  int64 // requests seen since since
	since time.Time
	rate  float64 // requests per second, smoothed
	used  time.Time
}

// live reports whether l has units to spend at now.
func (l *lease) live(now time.Time) bool { return l.left > 0 && now.Before(l.until) }

// observe counts one request of the counter at now.
func (l *lease) observe(now time.Time) {
	l.hits++
	l.used = now
}

// measureMin is the shortest span a rate is measured over: shorter ones
// are too few requests to tell a rate.
const measureMin = 50 * time.Millisecond

// measure folds the requests seen since the last measure into the rate,
// once they span measureMin.
func (l *lease) measure(now time.Time) {
	d := now.Sub(l.since)
	if d < measureMin {
		return
	}
	inst := float64(l.hits) / d.Seconds()
	if l.rate == 0 {
		l.rate = inst
	} else {
		l.rate = (l.rate + inst) / 2
	}
	l.hits, l.since = 0, now
}

// leaseReturn is a lease given up: its unspent units go back to the count,
// and its granted units leave the counter's leased.
type leaseReturn struct {
	rule, key       string
	alg             policy.Algorithm
	mark, bucketUS  int64
	unused, settled int64
	// The lease's dated grants, for a reset heard while the return waits
	// to be sent (leaseTable.forgiveQueued), and whether a reset forgave
	// it already (a reset is heard more than once: its notification, its
	// poll).
	grants   [grantsKept]datedGrant
	ngrant   int
	forgiven bool
}

const leaseShards = 64

type leaseShard struct {
	mu sync.Mutex
	m  map[slotKey]*lease
}

// leaseTable is every lease of one Store. It is safe for simultaneous use.
type leaseTable struct {
	shards [leaseShards]leaseShard
	max    int64
	n      atomic.Int64 // entries

	retMu   sync.Mutex
	returns []leaseReturn

	// Metrics.
	local, grants, unitsGranted, unitsReturned, returnsLost atomic.Uint64
	held                                                    atomic.Int64 // units held (left), all leases
}

func newLeaseTable(maxEntries int) *leaseTable {
	t := &leaseTable{max: int64(maxEntries)}
	for i := range t.shards {
		t.shards[i].m = make(map[slotKey]*lease)
	}
	return t
}

// shard returns the index of k's shard: FNV-1a of rule and key.
func shardOf(k slotKey) int {
	h := uint32(2166136261)
	for i := 0; i < len(k.rule); i++ {
		h = (h ^ uint32(k.rule[i])) * 16777619
	}
	h *= 16777619 // a zero byte between rule and key
	for i := 0; i < len(k.key); i++ {
		h = (h ^ uint32(k.key[i])) * 16777619
	}
	return int(h % leaseShards)
}

// settle queues the return of what l holds under its mark and empties it.
// The caller holds l's shard.
func (t *leaseTable) settle(k slotKey, l *lease) { t.settleAs(k, l, false) }

// settleAs is settle, of a return that a reset forgave already (forgiven)
// or not.
func (t *leaseTable) settleAs(k slotKey, l *lease, forgiven bool) {
	if l.granted > 0 {
		t.queueReturn(leaseReturn{
			rule: k.rule, key: k.key, alg: l.rule.Algorithm,
			mark: l.mark, bucketUS: l.p.Bucket.Microseconds(),
			unused: l.left, settled: l.granted,
			grants: l.grants, ngrant: l.ngrant, forgiven: forgiven,
		})
		l.returned++
	}
	t.empty(l)
}

// unspent returns the units this gateway holds of c's counter under mark
// and has not spent, and how many it was granted under it.
func (t *leaseTable) unspent(c limiter.Check, mark int64) (left, granted int64) {
	k := slotKey{c.Rule.Name, c.Key}
	sh := &t.shards[shardOf(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l, ok := sh.m[k]
	if !ok || l.mark != mark {
		return 0, 0
	}
	return max(0, l.left), l.granted
}

// leaseVersion identifies the units a lease holds, but for spending:
// it changes with every grant and every time the units are given up.
type leaseVersion struct {
	gen     uint64
	granted int64
}

// version returns the version of k's lease (zero when there is none).
func (t *leaseTable) version(k slotKey) leaseVersion {
	sh := &t.shards[shardOf(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if l, ok := sh.m[k]; ok {
		return leaseVersion{l.gen, l.granted}
	}
	return leaseVersion{}
}

// peekMark is the mark leases of a counter with parameters p carry when a
// Peek at nowUS answered res: the window's start (fixed, reset) or the
// bucket's index (sliding).
func peekMark(alg policy.Algorithm, p limiter.Params, res limiter.Result, nowUS int64) int64 {
	if alg == policy.Sliding {
		return nowUS / p.Bucket.Microseconds()
	}
	return res.Reset.UnixMicro() - p.Window.Microseconds()
}

// empty forgets l's units. The caller holds l's shard.
func (t *leaseTable) empty(l *lease) {
	t.held.Add(-l.left)
	l.granted, l.left, l.grant, l.reserved = 0, 0, 0, 0
	l.gen++
}

func (t *leaseTable) queueReturn(r leaseReturn) {
	t.retMu.Lock()
	t.returns = append(t.returns, r)
	t.retMu.Unlock()
}

// takeReturns returns the queued returns and empties the queue.
func (t *leaseTable) takeReturns() []leaseReturn {
	t.retMu.Lock()
	defer t.retMu.Unlock()
	r := t.returns
	t.returns = nil
	return r
}

// invalidate gives up the lease of (rule, key) if any unit of it was
// granted at or before at (database clock): a reset, an override change or
// another gateway's need at at makes it stale. It reports whether it did.
//
// With forgive (an admin reset at at), the units it spent are given back
// too, as far as they were granted before the reset: the reset left every
// unit out on a lease counted (reset_counter), the spent ones included,
// and what was spent before a reset is what the reset forgets. Units of a
// grant after at are not forgiven (spent after the reset, they count);
// the last grantsKept grants are dated, and when all of them came after
// the reset nothing spent is forgiven. What this gateway spent of the units
// granted before the reset between the reset and hearing of it (the
// milliseconds a notification takes, a poll's interval without it) is
// forgiven with the rest: at most what it held at the reset.
func (t *leaseTable) invalidate(rule, key string, at time.Time, forgive bool) bool {
	k := slotKey{rule, key}
	sh := &t.shards[shardOf(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l, ok := sh.m[k]
	if !ok {
		return false
	}
	if forgive {
		// The database's answer that there was no room for a lease
		// (dryUntil) is stale: the reset made room.
		l.dryUntil = time.Time{}
	}
	atUS := at.UnixMicro()
	if l.granted == 0 || l.firstUS > atUS {
		return false
	}
	if forgive {
		before := l.grantedBy(atUS)
		// The units it did not spend are given back in any case. Of those
		// it spent, the ones granted before the reset are forgiven: units
		// are spent in the order they were granted, so that is all it
		// spent, up to what was granted before.
		spent := l.granted - l.left - l.reserved
		t.held.Add(min(before, spent))
		l.left += min(before, spent)
	}
	t.settleAs(k, l, forgive)
	return true
}

// grantsKept is how many of a lease's grants are dated: enough for the
// renewals between a reset and a gateway hearing of it (milliseconds, or
// a poll's half second).
const grantsKept = 4

// datedGrant is one grant of a lease: when (database µs), and the units
// granted under the lease's mark up to and with it.
type datedGrant struct{ us, upTo int64 }

// addGrant dates a grant of units at nowUS (database µs), the first under
// a new mark when the lease holds nothing. The caller has added units to
// granted.
func (l *lease) addGrant(nowUS int64, first bool) {
	if first {
		l.ngrant = 0
	}
	if l.ngrant >= grantsKept {
		copy(l.grants[:], l.grants[1:])
	}
	l.grants[min(l.ngrant, grantsKept-1)] = datedGrant{nowUS, l.granted}
	l.ngrant++
}

// grantedBy returns the units l was granted at or before atUS (database
// µs) under its mark: 0 when every grant it still dates came later and
// older ones were not kept, so that a reset never forgives a unit it
// cannot date before it.
func (l *lease) grantedBy(atUS int64) int64 { return grantedBy(l.grants, l.ngrant, atUS) }

func grantedBy(grants [grantsKept]datedGrant, ngrant int, atUS int64) int64 {
	var by int64
	for _, g := range grants[:min(ngrant, grantsKept)] {
		if g.us <= atUS {
			by = g.upTo
		}
	}
	return by
}

// forgiveQueued applies a reset of (rule, key) at atUS (database µs) to
// the returns of its leases queued and not yet sent: given up before
// this gateway heard of the reset (a recall's, say), they will reach the
// database after it, where the reset counted all their units; what they
// spent of the units granted before the reset goes back with what they
// did not, as invalidate gives it back for a lease still held. (A return
// already sent when the reset came is not reached: its spent units stay
// counted.) Call it before invalidate, whose own return is forgiving.
func (t *leaseTable) forgiveQueued(rule, key string, atUS int64) {
	t.retMu.Lock()
	defer t.retMu.Unlock()
	for i := range t.returns {
		r := &t.returns[i]
		if r.rule != rule || r.key != key || r.forgiven || r.settled <= r.unused {
			continue
		}
		r.unused += min(grantedBy(r.grants, r.ngrant, atUS), r.settled-r.unused)
		r.forgiven = true
	}
}

// dropAll gives up every lease. With giveBack, what they hold is queued
// for return; without (the database may have lost the grants), it is
// forgotten.
func (t *leaseTable) dropAll(giveBack bool) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, l := range sh.m {
			if giveBack {
				t.settle(k, l)
			} else {
				t.empty(l)
			}
			l.asking = false
		}
		sh.mu.Unlock()
	}
}

// sweep ends what time has ended, at now: a lease past its deadline keeps
// nothing (a sliding lease's unspent units are returned to their bucket;
// a fixed or reset window's are simply gone with their window), and an
// entry unused for idle is removed.
func (t *leaseTable) sweep(now time.Time, idle time.Duration) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, l := range sh.m {
			t.expire(k, l, now)
			if !l.asking && l.granted == 0 && now.Sub(l.used) > idle {
				delete(sh.m, k)
				t.n.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}

// expire ends l if its deadline passed. The caller holds its shard.
func (t *leaseTable) expire(k slotKey, l *lease, now time.Time) {
	if l.granted == 0 || now.Before(l.until) {
		return
	}
	if l.rule.Algorithm == policy.Sliding && l.left > 0 {
		// The bucket's count holds the unspent units until they are
		// returned; the window would count them for its whole length.
		t.settle(k, l)
		return
	}
	// The window has ended for the database too: its units, and the
	// counter's leased, mean nothing any more.
	t.empty(l)
}
