package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/limiter"
)

// Decision is one request's part of a batch: its checks, and room for their
// results. run fills Results (which must have len(Checks)) and Allowed.
type Decision struct {
	Checks  []limiter.Check
	Results []limiter.Result
	// Leases, when not nil, has one entry per check: what the check asks to
	// lease, and what it was granted (see lease.go). Nil asks for nothing.
	Leases []leaseIO
	// Renewal marks a decision made only to lease (lease.go): its checks
	// are phantom requests that never count as count=all.
	Renewal bool
	// Settlements, when not nil, makes the decision a settlement of
	// charges instead (limiter.Settler): one per check, in the order of
	// Checks.
	Settlements []limiter.Settlement
	// Allowed is the combined verdict, as limiter.Allowed computes it.
	Allowed bool
	// NowUS is the database's clock at the decision (µs).
	NowUS int64
	// Sent is the local instant the decision's statement was sent: before
	// the database read its clock (see lease.go).
	Sent time.Time
}

// leaseIO is one check's part in leasing: the units it asks for, the units
// this gateway holds on the counter under mark (so that the database does
// not count them as held by others), and the answer.
type leaseIO struct {
	want, held, mark int64
	// granted is the units the database granted beyond the check's cost.
	granted int64
}

// Decide decides one request against its checks, as limiter.Store
// documents, in one statement that it may share with concurrent decisions
// (see the batcher; Unbatched turns sharing off). When ctx ends
// first, Decide returns ctx's error at once; a decision that was already
// sent may still have been counted, as with any call over a network.
func (s *Store) Decide(ctx context.Context, checks []limiter.Check, results []limiter.Result) (bool, error) {
	if len(results) != len(checks) {
		return false, fmt.Errorf("postgres decide: %d results for %d checks", len(results), len(checks))
	}
	if len(checks) == 0 {
		return true, nil
	}
	if s.leases != nil {
		return s.decideRecalling(ctx, checks, results, s.decideLeased)
	}
	return s.decideRecalling(ctx, checks, results, func(ctx context.Context, checks []limiter.Check, results []limiter.Result) (bool, error) {
		return s.decideRemote(ctx, checks, results, nil)
	})
}

// decideErr wraps an error of a decision that never reached run.
func decideErr(err error) error {
	return fmt.Errorf("postgres decide: %w", err)
}

// errBuild marks errors of decisions that could not be turned into a
// statement (a malformed check, an invalid override): no statement was
// sent, and the batcher then decides a batch's members one by one so that
// only the malformed one fails.
type errBuild struct{ err error }

func (e *errBuild) Error() string { return e.err.Error() }
func (e *errBuild) Unwrap() error { return e.err }

// Peek returns what a request of c's rule would get from c's counter now,
// without consuming anything: the admin API's view of a key.
func (s *Store) Peek(ctx context.Context, c limiter.Check) (limiter.Result, error) {
	var res [1]limiter.Result
	d := [1]Decision{{Checks: []limiter.Check{c}, Results: res[:]}}
	if s.leases == nil {
		err := s.run(ctx, d[:], true)
		return res[0], err
	}
	p := s.overrides.Load().params(c.Rule, c.Key)
	if !mayLease(c.Rule.Algorithm, p) {
		err := s.run(ctx, d[:], true)
		return res[0], err
	}
	// Leased units are counted in the database as soon as they are
	// granted. Those this gateway has not spent are room; those other
	// gateways hold are recalled (as a provisional denial recalls them),
	// and the counter read again once they are back, so that a Peek reads
	// what requests used.
	var own int64
	for attempt := 0; ; attempt++ {
		var granted int64
		var err error
		if own, granted, err = s.peekLeased(ctx, d[:]); err != nil {
			return limiter.Result{}, err
		}
		mark := peekMark(c.Rule.Algorithm, p, res[0], d[0].NowUS)
		others, err := s.othersHold(ctx, c, mark, granted)
		if err != nil || !others || attempt == 2 {
			break
		}
		back := s.recall.wait(slotKey{c.Rule.Name, c.Key})
		if _, err := s.pool.Exec(ctx, "SELECT pg_notify($1, $2)", leaseChannel,
			strings.Join([]string{pgx.Identifier{s.schema}.Sanitize(), "r", c.Rule.Name, c.Key}, "\x1f")); err != nil {
			break
		}
		t := time.NewTimer(recallWait / 2)
		select {
		case <-back:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	if own > 0 {
		res[0].Remaining = min(res[0].Limit, res[0].Remaining+own)
		res[0].Count = max(0, res[0].Count-own)
	}
	return res[0], nil
}

// peekLeased reads d's one counter and the units of it this gateway holds
// unspent (own) and was granted, as of one moment: a grant that lands between the two readings
// would count units the counter, as read, did not hold yet, so the reading
// is taken again until no grant or return came between (spending only
// lowers what is held, which never makes the count too low).
func (s *Store) peekLeased(ctx context.Context, d []Decision) (own, granted int64, err error) {
	c := d[0].Checks[0]
	k := slotKey{c.Rule.Name, c.Key}
	p := s.overrides.Load().params(c.Rule, c.Key)
	for attempt := 0; ; attempt++ {
		before := s.leases.version(k)
		if err := s.run(ctx, d, true); err != nil {
			return 0, 0, err
		}
		own, granted = s.leases.unspent(c, peekMark(c.Rule.Algorithm, p, d[0].Results[0], d[0].NowUS))
		if s.leases.version(k) == before {
			return own, granted, nil
		}
		if attempt == 9 {
			// A counter renewed faster than it can be read: report none
			// held unspent, a count too high rather than too low.
			return 0, granted, nil
		}
	}
}

// othersHold reports whether gateways other than this one hold units of
// c's counter under mark (this one was granted own of them).
func (s *Store) othersHold(ctx context.Context, c limiter.Check, mark, own int64) (bool, error) {
	var leased, leaseMark int64
	err := s.pool.QueryRow(ctx, "SELECT leased, lease_mark FROM "+pgx.Identifier{s.schema, "counters"}.Sanitize()+
		" WHERE rule = $1 AND key = $2", c.Rule.Name, c.Key).Scan(&leased, &leaseMark)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return leaseMark == mark && leased > own, nil
}

// run sends ds to the database, retrying when decide gave up on counters
// that other transactions were creating at the same moment (see retryable:
// the transaction rolled back having changed nothing), and retrying once
// on a fresh connection when the connection was lost (see
// connectionLost). A second lost connection trips the breaker: the
// database is gone, not one connection.
func (s *Store) run(ctx context.Context, ds []Decision, peek bool) error {
	return s.runWatched(ctx, ds, peek, nil)
}

// runWatched is run for a statement whose deadline st watches (nil: none):
// st learns the server process of each connection the statement is sent
// on.
func (s *Store) runWatched(ctx context.Context, ds []Decision, peek bool, st *inFlight) error {
	b := batchPool.Get().(*batch)
	defer b.release()
	n, err := b.build(ds, s.overrides.Load(), s.localNow())
	if err != nil {
		return fmt.Errorf("postgres decide: %w", &errBuild{err})
	}
	if n == 0 {
		for i := range ds {
			ds[i].Allowed = true
		}
		return nil
	}
	if !peek {
		s.nDecisions.Add(uint64(len(ds)))
	}
	reconnected := false
	var sent time.Time
	for attempt := 1; ; attempt++ {
		if !peek {
			s.nStatements.Add(1)
		}
		// One reading of the test clock, when there is one, for both.
		sent = s.localNow()
		var now *int64
		if s.opts.Now != nil {
			us := sent.UnixMicro()
			now = &us
		}
		err = s.query(ctx, b, peek, now, st)
		if err == nil || ctx.Err() != nil || errors.Is(err, errUncertain) {
			break
		}
		var pgErr *pgconn.PgError
		if attempt < maxAttempts && errors.As(err, &pgErr) && retryable(pgErr.Code) {
			continue
		}
		if connectionLost(err) {
			// Whatever else the pool holds went the same way: drop it, so
			// that the retry and the decisions after it connect anew.
			s.dropPool(err)
			if !reconnected {
				reconnected = true
				continue
			}
			s.trip(err)
			return fmt.Errorf("postgres decide: %w", kinded(err))
		}
		break
	}
	if err != nil {
		return fmt.Errorf("postgres decide: %w", s.fault(err))
	}
	b.fill(ds)
	for i := range ds {
		ds[i].Sent = sent
	}
	return nil
}

// errUncertain is wrapped by the error of a decide statement that
// returned as if it had committed, but whose commit may not be durable: a
// wait for a synchronous standby that was cancelled (Postgres then commits
// locally, answers with success, and only warns), or a statement whose
// context ended while it ran (the cancel may have been what ended that
// wait). Its outcome counts as unknown: its decisions fail, so that no
// request is allowed and no leased unit spent on a count a failover could
// lose. It counts as a timeout.
var errUncertain = errors.New("the commit's outcome is unknown (a wait for a synchronous standby was cancelled, or the statement's deadline passed as it ended)")

// warnedKey marks, in a connection's CustomData, that the server sent a
// WARNING since it was last cleared (see ConfigurePool).
const warnedKey = "sluice.warned"

// query runs the built batch's decide statement on a pooled connection
// (telling st its server process, when st is not nil), at now (nil: the
// database clock; see nowParam), and
// reports the outcome as uncertain (errUncertain) when the server warned
// while it ran or ctx ended meanwhile (see errUncertain).
func (s *Store) query(ctx context.Context, b *batch, peek bool, now *int64, st *inFlight) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if st != nil {
		st.pid.Store(conn.Conn().PgConn().PID())
	}
	data := conn.Conn().PgConn().CustomData()
	delete(data, warnedKey)
	err = b.query(ctx, conn, s.q.decide, now, peek)
	if err != nil {
		return err
	}
	if _, warned := data[warnedKey]; warned {
		return &faultError{kind: limiter.ErrorTimeout, err: errUncertain}
	}
	if ctx.Err() != nil {
		return &faultError{kind: limiter.ErrorTimeout, err: fmt.Errorf("%w: %w", errUncertain, ctx.Err())}
	}
	return nil
}

// connectionLost reports whether err says the statement's connection or
// its server is gone, so that nothing was committed and a fresh connection
// may succeed: pgconn says it is safe to retry (nothing was sent), the
// connection broke (refused, reset, closed, ended mid-message), or the
// server is shutting down, starting up or no longer takes writes (then the
// transaction was rolled back). A deadline is never a lost connection: the
// statement may still be running.
func connectionLost(err error) bool {
	if pgconn.SafeToRetry(err) {
		return true
	}
	switch errorKind(err) {
	case limiter.ErrorConnection, limiter.ErrorReadOnly:
		return true
	}
	return false
}

// retryable reports whether a decide call that failed with SQLSTATE code
// changed nothing and may simply be sent again: 40001 and 55P03 are how
// decide gives up on counters created concurrently (see
// 0003_decide.up.sql).
func retryable(code string) bool {
	return code == "40001" || code == "55P03"
}

// batch holds the arguments and answers of one decide call. Batches are
// pooled so that a decision allocates little besides what pgx needs.
type batch struct {
	// Slots: the distinct counters, sorted by (rule, key).
	sRule, sKey                      []string
	sAlg                             []int16
	sLimit, sWindow, sBucket, sBurst []int64
	sBounds                          []int64 // four per slot
	// Checks, in the order of the decisions and their checks.
	cDecision, cSlot     []int32
	cCost                []int64
	cCountAll, cShadow   []bool
	cLease, cHeld, cMark []int64
	cRenewal             []bool
	cSettle              []int64
	params               []limiter.Params // per slot
	// Answers.
	nowUS                       int64
	allowed                     []bool
	remaining, resetUS, retryUS []int64
	granted                     []int64
	held                        []bool

	// Scratch for building: slots in first-seen order, each check's slot
	// in that order, and a map for large batches.
	raw   []rawSlot
	slot  []int32
	order []int32
	rank  []int32
	index map[slotKey]int32
}

type slotKey struct{ rule, key string }

type rawSlot struct {
	slotKey
	check limiter.Check
	p     limiter.Params
}

var batchPool = sync.Pool{New: func() any { return new(batch) }}

// linearLimit is the batch size up to which slots are found by a linear
// scan, cheaper than a map for the few checks of one request.
const linearLimit = 16

func (b *batch) release() {
	b.sRule, b.sKey = clear0(b.sRule), clear0(b.sKey)
	for i := range b.raw {
		b.raw[i] = rawSlot{}
	}
	b.raw = b.raw[:0]
	clear(b.index)
	batchPool.Put(b)
}

// clear0 empties a string slice without keeping its strings reachable.
func clear0(s []string) []string {
	clear(s)
	return s[:0]
}

// build fills the slot and check arrays from ds and returns the number of
// checks. Overrides come from ov; now, the gateway's clock, places the
// periods of calendar windows (see decide_function.sql's s_bounds).
func (b *batch) build(ds []Decision, ov *overrideSet, now time.Time) (int, error) {
	b.raw = b.raw[:0]
	b.slot = b.slot[:0]
	b.cDecision, b.cCost, b.cCountAll, b.cShadow = b.cDecision[:0], b.cCost[:0], b.cCountAll[:0], b.cShadow[:0]
	b.cLease, b.cHeld, b.cMark, b.cRenewal = b.cLease[:0], b.cHeld[:0], b.cMark[:0], b.cRenewal[:0]
	b.cSettle = b.cSettle[:0]
	total := 0
	for _, d := range ds {
		if len(d.Results) != len(d.Checks) {
			return 0, fmt.Errorf("%d results for %d checks", len(d.Results), len(d.Checks))
		}
		total += len(d.Checks)
	}
	useMap := total > linearLimit
	if useMap && b.index == nil {
		b.index = make(map[slotKey]int32)
	}
	for di, d := range ds {
		if d.Leases != nil && len(d.Leases) != len(d.Checks) {
			return 0, fmt.Errorf("%d lease entries for %d checks", len(d.Leases), len(d.Checks))
		}
		if d.Settlements != nil && (len(d.Settlements) != len(d.Checks) || d.Leases != nil) {
			return 0, fmt.Errorf("%d settlements for %d checks", len(d.Settlements), len(d.Checks))
		}
		for ci, c := range d.Checks {
			if c.Rule == nil {
				return 0, errors.New("check without a rule")
			}
			k := slotKey{c.Rule.Name, c.Key}
			idx := int32(-1)
			if useMap {
				if i, ok := b.index[k]; ok {
					idx = i
				}
			} else {
				for i := range b.raw {
					if b.raw[i].slotKey == k {
						idx = int32(i)
						break
					}
				}
			}
			if idx < 0 {
				p := ov.params(c.Rule, c.Key)
				if err := p.Validate(c.Rule.Algorithm); err != nil {
					return 0, fmt.Errorf("rule %q: %w", c.Rule.Name, err)
				}
				idx = int32(len(b.raw))
				b.raw = append(b.raw, rawSlot{slotKey: k, check: c, p: p})
				if useMap {
					b.index[k] = idx
				}
			} else if first := b.raw[idx].check.Rule; first != c.Rule && first.Algorithm != c.Rule.Algorithm {
				return 0, fmt.Errorf("rule %q appears with two algorithms in one batch", c.Rule.Name)
			}
			b.slot = append(b.slot, idx)
			b.cDecision = append(b.cDecision, int32(di))
			b.cCost = append(b.cCost, max(1, c.Rule.Cost))
			b.cCountAll = append(b.cCountAll, c.Rule.CountAll && !d.Renewal)
			b.cShadow = append(b.cShadow, c.Rule.Shadow)
			var l leaseIO
			if d.Leases != nil {
				l = d.Leases[ci]
			}
			settle := int64(-1)
			if d.Settlements != nil {
				st := &d.Settlements[ci]
				settle = st.Reserved
				b.cCost[len(b.cCost)-1] = st.Charge
				l.mark = st.Admitted.UnixMicro()
			}
			b.cLease = append(b.cLease, l.want)
			b.cHeld = append(b.cHeld, l.held)
			b.cMark = append(b.cMark, l.mark)
			b.cRenewal = append(b.cRenewal, d.Renewal)
			b.cSettle = append(b.cSettle, settle)
		}
	}

	// Sort the slots by (rule, key) in byte order, the "C" collation order
	// in which the database inserts and locks them.
	ns := len(b.raw)
	b.order = b.order[:0]
	for i := range ns {
		b.order = append(b.order, int32(i))
	}
	slices.SortFunc(b.order, func(x, y int32) int {
		if c := cmp.Compare(b.raw[x].rule, b.raw[y].rule); c != 0 {
			return c
		}
		return cmp.Compare(b.raw[x].key, b.raw[y].key)
	})
	b.rank = slices.Grow(b.rank[:0], ns)[:ns]
	b.sRule, b.sKey, b.sAlg = b.sRule[:0], b.sKey[:0], b.sAlg[:0]
	b.sLimit, b.sWindow, b.sBucket, b.sBurst = b.sLimit[:0], b.sWindow[:0], b.sBucket[:0], b.sBurst[:0]
	b.sBounds = b.sBounds[:0]
	b.params = b.params[:0]
	for pos, i := range b.order {
		r := &b.raw[i]
		b.rank[i] = int32(pos + 1) // the SQL arrays are 1-based
		b.sRule = append(b.sRule, r.rule)
		b.sKey = append(b.sKey, r.key)
		b.sAlg = append(b.sAlg, int16(r.check.Rule.Algorithm))
		b.sLimit = append(b.sLimit, r.p.Limit)
		b.sWindow = append(b.sWindow, r.p.Window.Microseconds())
		b.sBucket = append(b.sBucket, r.p.Bucket.Microseconds())
		b.sBurst = append(b.sBurst, r.p.Burst)
		b.sBounds = appendBounds(b.sBounds, &r.p, now)
		b.params = append(b.params, r.p)
	}
	b.cSlot = b.cSlot[:0]
	for _, idx := range b.slot {
		b.cSlot = append(b.cSlot, b.rank[idx])
	}
	return len(b.slot), nil
}

// appendBounds appends a slot's four s_bounds: for a calendar window, the
// starts of the period before the one that holds now, of that one, of the
// next and of the one after; zeros for any other window.
func appendBounds(bounds []int64, p *limiter.Params, now time.Time) []int64 {
	if p.Calendar == nil {
		return append(bounds, 0, 0, 0, 0)
	}
	b1, b2 := p.Period(now.UnixMicro())
	b0, _ := p.Period(b1 - 1)
	_, b3 := p.Period(b2)
	return append(bounds, b0, b1, b2, b3)
}

// querier is what a decide statement runs on: the pool, a connection or a
// transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// query sends the built batch as the decide statement sql on q and reads
// the answer into b. now is the clock parameter (nil: the database's).
func (b *batch) query(ctx context.Context, q querier, sql string, now *int64, peek bool) error {
	err := q.QueryRow(ctx, sql,
		now, peek,
		b.sRule, b.sKey, b.sAlg, b.sLimit, b.sWindow, b.sBucket, b.sBurst, b.sBounds,
		b.cDecision, b.cSlot, b.cCost, b.cCountAll, b.cShadow,
		b.cLease, b.cHeld, b.cMark, b.cRenewal, b.cSettle,
	).Scan(&b.nowUS, &b.allowed, &b.remaining, &b.resetUS, &b.retryUS, &b.granted, &b.held)
	if err != nil {
		return err
	}
	if n := len(b.slot); len(b.allowed) != n || len(b.remaining) != n || len(b.resetUS) != n ||
		len(b.retryUS) != n || len(b.granted) != n || len(b.held) != n {
		return fmt.Errorf("%d results for %d checks", len(b.allowed), n)
	}
	return nil
}

// fill turns the database's answer into the decisions' Results.
func (b *batch) fill(ds []Decision) {
	q := 0
	for di := range ds {
		d := &ds[di]
		for j := range d.Checks {
			p := &b.params[b.cSlot[q]-1]
			reset := b.resetUS[q]
			window := p.Window
			if p.Calendar != nil {
				start, _ := p.Period(reset - 1)
				window = time.Duration(reset-start) * time.Microsecond
			}
			d.Results[j] = limiter.Result{
				Allowed:    b.allowed[q],
				Limit:      p.Limit,
				Window:     window,
				Remaining:  max(0, b.remaining[q]),
				Count:      max(0, p.Limit-b.remaining[q]),
				Reset:      time.UnixMicro(reset).UTC(),
				ResetAfter: time.Duration(max(0, reset-b.nowUS)) * time.Microsecond,
				RetryAfter: time.Duration(max(0, b.retryUS[q])) * time.Microsecond,
				// Units leased to other gateways may come back: a denial
				// is not for the whole RetryAfter.
				Provisional: b.held[q],
			}
			if d.Leases != nil {
				d.Leases[j].granted = b.granted[q]
			}
			q++
		}
		d.Allowed = limiter.Allowed(d.Checks, d.Results)
		d.NowUS = b.nowUS
	}
}

// Settle settles charges (limiter.Settler) in one statement of their own,
// with the durability of a decision: a statement whose commit is uncertain
// is an error, and the limiter keeps the settlements to send again (a
// charge is then counted twice rather than lost).
func (s *Store) Settle(ctx context.Context, ss []limiter.Settlement) error {
	if err := limiter.ValidateSettlements(ss); err != nil {
		return fmt.Errorf("postgres settle: %w", err)
	}
	if len(ss) == 0 {
		return nil
	}
	checks := make([]limiter.Check, len(ss))
	for i := range ss {
		checks[i] = ss[i].Check
	}
	d := [1]Decision{{Checks: checks, Results: make([]limiter.Result, len(ss)), Settlements: ss}}
	if err := s.run(ctx, d[:], false); err != nil {
		return err
	}
	for _, st := range ss {
		if st.Charge < st.Reserved {
			// Room came back: a denial remembered before it is stale.
			s.forget(st.Check.Rule.Name, st.Check.Key, time.UnixMicro(d[0].NowUS))
		}
	}
	return nil
}
