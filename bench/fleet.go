package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/policy"
)

// The fleet: how many gateways one Postgres serves. Several simulated
// gateways, each a postgres.Store on a pool of its own as a separate
// instance has them (made as the gateway's newBackend makes them), decide
// against one database with no HTTP in front, each driven by a closed
// loop of callers. For N = 1, 2, 4, 8 gateways it measures decisions per
// second, their latency, the Postgres CPU they cost and the transactions
// per decision, and prints one Markdown table. See bench/README.md, "Fleet
// capacity".
//
//	go -C bench run . fleet [-gateways 1,2,4,8] [-callers 64] [-keys 10000] [-hot] [-warmup 2s] [-duration 5s]

// fleetOptions are the fleet's flags.
type fleetOptions struct {
	databaseURL      string
	gateways         []int
	callers          int // per gateway
	rate             int // decisions/s per gateway, paced; 0: closed loop
	keys             int
	hot              bool
	warmup, duration time.Duration
	decisionTimeout  time.Duration
	syncCommit       bool // false: synchronous_commit off (SLUICE_DB_SYNCHRONOUS_COMMIT=off)
	leases           bool
	deadline         time.Duration
}

// maxFleetKeys is the number of addresses in 198.18.0.0/15, the
// benchmark range the keys' client IPs come from.
const maxFleetKeys = 1 << 17

func parseFleetFlags(args []string) (fleetOptions, error) {
	fs := flag.NewFlagSet("bench fleet", flag.ContinueOnError)
	var o fleetOptions
	defaultURL := defaultDatabaseURL()
	var gateways, syncCommit string
	fs.StringVar(&o.databaseURL, "database-url", defaultURL, "Postgres to measure (default $SLUICE_TEST_DATABASE_URL); the fleet creates and drops a database of its own there")
	fs.StringVar(&gateways, "gateways", "1,2,4,8", "numbers of gateways to measure, comma-separated")
	fs.IntVar(&o.callers, "callers", 64, "concurrent callers per gateway, each in a closed loop (wrk's 64 connections on one gateway)")
	fs.IntVar(&o.rate, "rate", 0, "decisions per second per gateway, spread evenly over its callers; 0: each caller calls again as soon as it has its answer")
	fs.IntVar(&o.keys, "keys", 10000, "distinct client IPs the callers pick from at random (at most 131072)")
	fs.BoolVar(&o.hot, "hot", false, "every decision on the one key of scenario 2's global rule instead")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured load per number of gateways")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured load per number of gateways")
	fs.DurationVar(&o.decisionTimeout, "decision-timeout", postgres.DefaultDecisionTimeout, "deadline of one decision, as SLUICE_DB_TIMEOUT")
	fs.StringVar(&syncCommit, "synchronous-commit", "", "as SLUICE_DB_SYNCHRONOUS_COMMIT: empty (the server's own, durable, the default) or off")
	fs.BoolVar(&o.leases, "leases", true, "as SLUICE_DB_LEASES: spend slices of the limits in memory")
	fs.DurationVar(&o.deadline, "timeout", 10*time.Minute, "give up (and clean up) after this long")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var problems []string
	for g := range strings.SplitSeq(gateways, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(g))
		if err != nil || n < 1 {
			problems = append(problems, fmt.Sprintf("-gateways: %q is not a positive number", g))
			continue
		}
		o.gateways = append(o.gateways, n)
	}
	if o.callers < 1 {
		problems = append(problems, "-callers must be at least 1")
	}
	if o.rate < 0 {
		problems = append(problems, "-rate must not be negative")
	}
	if o.keys < 1 || o.keys > maxFleetKeys {
		problems = append(problems, fmt.Sprintf("-keys must be between 1 and %d", maxFleetKeys))
	}
	if o.warmup < 0 || o.duration <= 0 || o.decisionTimeout <= 0 || o.deadline <= 0 {
		problems = append(problems, "-duration, -decision-timeout and -timeout must be positive, -warmup not negative")
	}
	switch syncCommit {
	case "", "on", "off":
		o.syncCommit = syncCommit != "off"
	default:
		problems = append(problems, fmt.Sprintf("-synchronous-commit: expected empty or off, got %q", syncCommit))
	}
	if len(problems) > 0 {
		return o, errors.New(strings.Join(problems, "\n"))
	}
	return o, nil
}

// runFleet is `go -C bench run . fleet`: it prints the table when fleet
// succeeds.
func runFleet(ctx context.Context, opts fleetOptions) error {
	ctx, cancel := context.WithTimeout(ctx, opts.deadline)
	defer cancel()
	r, err := fleet(ctx, opts, os.Stderr)
	if err != nil {
		return err
	}
	r.writeTable(os.Stdout)
	return nil
}

// fleetRun is what fleet measured.
type fleetRun struct {
	opts      fleetOptions
	rule      *policy.Rule
	pgVersion string
	database  string // the database it created (and dropped)
	// cpuErr says why Postgres's CPU was not measured; nil when it was.
	cpuErr error
	rows   []fleetRow
}

// fleetRow is one number of gateways.
type fleetRow struct {
	gateways int
	elapsed  time.Duration // the measured window
	// decided and failed count the decisions of the measured window:
	// made by the store, or failed (deadline passed, breaker open, queue
	// full).
	decided, failed int64
	p50, p99        time.Duration // of every decision of the window, failed ones too
	// xacts are the database's transactions over the gateways' whole
	// life, and lifeDecided the decisions the store made in it.
	xacts, lifeDecided int64
	// The CPU time of the measured window: Postgres's backends serving
	// the gateways, the whole server, and this process (the gateways' Go
	// side). lostBackends counts backends that exited in the window,
	// whose time is missing from backendCPU.
	backendCPU, serverCPU, selfCPU time.Duration
	lostBackends                   int
}

// fleet measures every number of gateways of o in turn, on a database it
// creates and drops.
func fleet(ctx context.Context, o fleetOptions, progress io.Writer) (run *fleetRun, err error) {
	src := scenarios[0].rules // scenario 1's rule: by ip, far above what a run sends
	if o.hot {
		src = scenarios[1].rules // scenario 2's: one global key
	}
	p, err := policy.Parse(src)
	if err != nil {
		return nil, err
	}
	if p.Len() != 1 {
		return nil, fmt.Errorf("fleet: expected one rule in %q", src)
	}
	rule := p.Rules()[0]
	keys, err := fleetKeys(rule, o.keys)
	if err != nil {
		return nil, err
	}

	db, err := createBenchDB(ctx, o.databaseURL)
	if err != nil {
		return nil, err
	}
	defer func() {
		dropCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = errors.Join(err, db.drop(dropCtx))
	}()
	run = &fleetRun{opts: o, rule: rule, pgVersion: db.version(ctx), database: db.name}

	postmaster := 0
	var backend int
	if err := db.admin.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return nil, err
	}
	if postmaster, run.cpuErr = postmasterOf(backend); run.cpuErr != nil {
		fmt.Fprintln(progress, "  note: Postgres CPU not measured:", run.cpuErr)
	}

	fmt.Fprintf(progress, "fleet: making the counters of %d key(s)\n", len(keys))
	if err := seedKeys(ctx, db, o, rule, keys); err != nil {
		return nil, fmt.Errorf("make the counters: %w", err)
	}
	for _, n := range o.gateways {
		fmt.Fprintf(progress, "fleet: %d gateway(s) × %d callers\n", n, o.callers)
		row, err := fleetStep(ctx, db, o, n, rule, keys, postmaster, progress)
		if err != nil {
			return nil, fmt.Errorf("%d gateways: %w", n, err)
		}
		run.rows = append(run.rows, row)
	}
	return run, nil
}

// fleetKeys returns the keys the callers pick from: n client IPs of
// 198.18.0.0/15 hashed as sluice hashes them (HMAC under a random key,
// domain "ip"), or the one key of a global rule.
func fleetKeys(rule *policy.Rule, n int) ([]string, error) {
	h, err := hashing.New([]byte(randomHex(32)))
	if err != nil {
		return nil, err
	}
	if rule.Identity.Kind == policy.ByGlobal {
		return []string{h.Key(policy.ByGlobal.String(), "")}, nil
	}
	keys := make([]string, n)
	const first = 198<<24 | 18<<16 // 198.18.0.0
	for i := range keys {
		a := first + uint32(i)
		ip := netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)})
		keys[i] = h.Key(policy.ByIP.String(), hashing.IPGroup(ip))
	}
	return keys, nil
}

// seedKeys decides every key once from one gateway, so that every row
// measures a fleet that has been running: each decision updates its
// counter. Without it the first row would insert them, which costs
// Postgres ten times as much per decision.
func seedKeys(ctx context.Context, db *benchDB, o fleetOptions, rule *policy.Rule, keys []string) error {
	g, err := startGateway(db.url, o)
	if err != nil {
		return err
	}
	defer g.close()
	if err := g.waitReady(ctx); err != nil {
		return err
	}
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range o.callers {
		wg.Go(func() {
			checks := []limiter.Check{{Rule: rule}}
			results := make([]limiter.Result, 1)
			for i := next.Add(1) - 1; i < int64(len(keys)) && ctx.Err() == nil; i = next.Add(1) - 1 {
				checks[0].Key = keys[i]
				// Set-up, not load: the decision's deadline need not hold
				// on a busy machine, but every key must be made.
				var err error
				for range 5 {
					dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, err = g.store.Decide(dctx, checks, results)
					cancel()
					if err == nil || ctx.Err() != nil {
						break
					}
				}
				if err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("%d of %d decisions failed", n, len(keys))
	}
	return ctx.Err()
}

// fleetGateway is one simulated gateway: a store on a pool of its own,
// with its breaker, its background work running.
type fleetGateway struct {
	pool    *pgxpool.Pool
	store   *postgres.Store
	breaker *limiter.CircuitBreaker
	timeout time.Duration
	stop    context.CancelFunc
	done    chan struct{}
}

// startGateway makes a gateway's store as newBackend and openPool make it
// with the gateway's default settings, and starts its background work
// (Run), which probes the database and closes the breaker when ready.
func startGateway(url string, o fleetOptions) (*fleetGateway, error) {
	breaker, err := limiter.NewBreaker(limiter.BreakerConfig{StartOpen: true})
	if err != nil {
		return nil, err
	}
	opts := postgres.Options{
		Schema:             postgres.DefaultSchema,
		Migrate:            true,
		Breaker:            breaker,
		DecisionTimeout:    o.decisionTimeout,
		BatchWait:          min(postgres.DefaultBatchWait, o.decisionTimeout/4), // as batchWait
		AsynchronousCommit: !o.syncCommit,
		Leasing:            postgres.Unleased,
	}
	if o.leases {
		opts.Leasing = postgres.Leased
	}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "sluice"
	if err := postgres.ConfigurePool(pc, opts); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, err
	}
	store, err := postgres.New(pool, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &fleetGateway{pool: pool, store: store, breaker: breaker, timeout: o.decisionTimeout, stop: cancel, done: make(chan struct{})}
	go func() { store.Run(ctx); close(g.done) }()
	return g, nil
}

// close stops the gateway's background work and closes its pool, whose
// backends then exit (and publish their statistics).
func (g *fleetGateway) close() {
	g.stop()
	<-g.done
	g.pool.Close()
}

// waitReady waits until the gateway's breaker has closed.
func (g *fleetGateway) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		changed := g.breaker.Changed()
		if g.breaker.Ready() {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("gateway not ready (its store's probe did not pass): %w", ctx.Err())
		}
	}
}

// decide asks the store as the limiter does (limiter.callStore): through
// the breaker, under the decision deadline, recording the outcome.
func (g *fleetGateway) decide(ctx context.Context, checks []limiter.Check, results []limiter.Result) error {
	if !g.breaker.Allow() {
		return limiter.ErrBreakerOpen
	}
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, g.timeout)
	_, err := g.store.Decide(dctx, checks, results)
	cancel()
	g.breaker.Record(time.Since(start), err)
	return err
}

// pacer spaces one caller's calls so that a gateway's callers together
// call rate times a second: each caller's calls are callers/rate apart, on
// a schedule of its own from a random start, so the gateway's calls are
// spread evenly. A caller that falls behind its schedule (its decision took
// longer) calls at once and does not catch up with a burst: the load is
// what a gateway meets at that rate, not what a backlog would add.
type pacer struct {
	every time.Duration // 0: no pacing
	next  time.Time
}

func newPacer(rate, callers int, rng *rand.Rand) *pacer {
	if rate <= 0 {
		return &pacer{}
	}
	every := time.Duration(float64(time.Second) * float64(callers) / float64(rate))
	return &pacer{every: every, next: time.Now().Add(time.Duration(rng.Int64N(int64(every))))}
}

// wait sleeps until the caller's next call is due; false when ctx ended.
func (p *pacer) wait(ctx context.Context) bool {
	if p.every == 0 {
		return true
	}
	now := time.Now()
	if p.next.Before(now) {
		p.next = now
	}
	ok := wait(ctx, p.next.Sub(now))
	p.next = p.next.Add(p.every)
	return ok
}

// fleetCaller is one caller's tally.
type fleetCaller struct {
	lat             []time.Duration // measured window only
	decided, failed int64           // measured window only
	lifeDecided     int64
}

// Phases of a fleet step, as the callers see them.
const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseStop
)

// fleetStep measures n gateways: it starts them, waits until each is
// ready, loads them for the warm-up and the measured window, stops them
// and reads the transactions of their whole life.
func fleetStep(ctx context.Context, db *benchDB, o fleetOptions, n int, rule *policy.Rule, keys []string, postmaster int, progress io.Writer) (fleetRow, error) {
	row := fleetRow{gateways: n}
	// No backend of the previous step is left: every one has published
	// its counts on exit.
	xactsBefore, err := db.settledXacts(ctx)
	if err != nil {
		return row, err
	}
	var gws []*fleetGateway
	stopAll := func() {
		for _, g := range gws {
			g.close()
		}
		gws = nil
	}
	defer stopAll()
	for range n {
		g, err := startGateway(db.url, o)
		if err != nil {
			return row, err
		}
		gws = append(gws, g)
	}
	for _, g := range gws {
		if err := g.waitReady(ctx); err != nil {
			return row, err
		}
	}

	var phase atomic.Int32
	callers := make([]fleetCaller, n*o.callers)
	seed := uint64(time.Now().UnixNano())
	var wg sync.WaitGroup
	for i := range callers {
		g, c := gws[i%n], &callers[i]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			checks := []limiter.Check{{Rule: rule}}
			results := make([]limiter.Result, 1)
			pace := newPacer(o.rate, o.callers, rng)
			for ctx.Err() == nil {
				p := phase.Load()
				if p == phaseStop {
					return
				}
				if !pace.wait(ctx) {
					return
				}
				checks[0].Key = keys[rng.IntN(len(keys))]
				start := time.Now()
				err := g.decide(ctx, checks, results)
				took := time.Since(start)
				if err == nil {
					c.lifeDecided++
				}
				if p == phaseMeasure {
					c.lat = append(c.lat, took)
					if err != nil {
						c.failed++
					} else {
						c.decided++
					}
				}
				if err != nil {
					// A failed decision costs its caller the whole
					// decision deadline, also when it failed at once (an
					// open breaker): callers then never load the machine,
					// which Postgres shares with them, more while the
					// store fails than while it keeps up, and the failed
					// column counts decisions that could not be made, not
					// how fast a caller can spin.
					wait(ctx, g.timeout-took)
				}
			}
		})
	}
	stopCallers := func() { phase.Store(phaseStop); wg.Wait() }
	defer stopCallers()

	if !wait(ctx, o.warmup) {
		return row, ctx.Err()
	}
	before, err := sampleCPU(ctx, db, postmaster)
	if err != nil {
		return row, err
	}
	t0 := time.Now()
	phase.Store(phaseMeasure)
	if !wait(ctx, o.duration) {
		return row, ctx.Err()
	}
	phase.Store(phaseStop)
	row.elapsed = time.Since(t0)
	after, err := sampleCPU(ctx, db, postmaster)
	if err != nil {
		return row, err
	}
	stopCallers()
	fmt.Fprintf(progress, "  stopping the gateways\n")
	stopAll()
	xactsAfter, err := db.settledXacts(ctx)
	if err != nil {
		return row, err
	}

	var lat []time.Duration
	for _, c := range callers {
		row.decided += c.decided
		row.failed += c.failed
		row.lifeDecided += c.lifeDecided
		lat = append(lat, c.lat...)
	}
	slices.Sort(lat)
	row.p50, row.p99 = percentile(lat, 50), percentile(lat, 99)
	row.xacts = xactsAfter - xactsBefore
	var backendTicks int64
	backendTicks, row.lostBackends = cpuDelta(before.backends, after.backends)
	row.backendCPU = ticks(backendTicks)
	row.serverCPU = ticks(after.server - before.server)
	row.selfCPU = ticks(after.self - before.self)
	return row, nil
}

// wait waits for d or until ctx is done, and reports whether ctx is not.
func wait(ctx context.Context, d time.Duration) bool {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	return ctx.Err() == nil
}

// percentile is the p-th percentile of sorted (nearest rank), 0 when it
// is empty.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100 // rank ⌈n·p/100⌉, 1-based
	return sorted[max(i, 1)-1]
}

// cpuSample is the CPU time used so far, in clock ticks: by each backend
// connected to the fleet's database, by the whole Postgres server, and by
// this process.
type cpuSample struct {
	backends     map[int]int64
	server, self int64
}

// sampleCPU reads a cpuSample; without a postmaster (Postgres is not
// local) only this process's time.
func sampleCPU(ctx context.Context, db *benchDB, postmaster int) (cpuSample, error) {
	var s cpuSample
	self, err := readProcStat(os.Getpid())
	if err != nil {
		return s, err
	}
	s.self = self.own()
	if postmaster == 0 {
		return s, nil
	}
	rows, err := db.admin.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'", db.name)
	if err != nil {
		return s, fmt.Errorf("list the backends: %w", err)
	}
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return s, err
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		return s, fmt.Errorf("list the backends: %w", err)
	}
	s.backends = pidsCPU(pids)
	if s.server, err = treeCPU(postmaster); err != nil {
		return s, fmt.Errorf("read the server's CPU time: %w", err)
	}
	return s, nil
}

// writeTable prints the run as a Markdown table with what its columns mean.
func (r *fleetRun) writeTable(w io.Writer) {
	o := r.opts
	keys := fmt.Sprintf("%d keys", o.keys)
	if o.hot {
		keys = "one hot key"
	}
	commit := "off"
	if o.syncCommit {
		commit = "the server's (on)"
	}
	if o.leases {
		commit += ", leases on"
	} else {
		commit += ", leases off"
	}
	where := " on the same machine"
	if r.cpuErr != nil {
		where = " elsewhere"
	}
	load := "in a closed loop"
	if o.rate > 0 {
		load = fmt.Sprintf("paced to %d decisions/s per gateway", o.rate)
	}
	fmt.Fprintf(w, "Fleet: each gateway a postgres.Store on a pool of its own, %d callers per gateway %s, %s, rule `%s`; decision deadline %s, synchronous commit %s. Per row %s warm-up, then %s measured. Machine: %s. Go %s, PostgreSQL %s%s.\n\n",
		o.callers, load, keys, r.rule, o.decisionTimeout, commit, o.warmup, o.duration,
		machine(), strings.TrimPrefix(runtime.Version(), "go"), r.pgVersion, where)
	fmt.Fprintln(w, "| gateways | decisions/s | per gateway | p50 | p99 | failed | pg xact/decision | pg CPU/decision (backends) | pg CPU/decision (server) | pg cores busy | decisions/s per pg core | gateway CPU/decision |")
	fmt.Fprintln(w, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	var failing, lost []string
	for _, row := range r.rows {
		secs := row.elapsed.Seconds()
		rate := float64(row.decided) / secs
		xact, backend, server, busy, perCore, self := "–", "–", "–", "–", "–", "–"
		if row.lifeDecided > 0 {
			xact = fmt.Sprintf("%.3f", float64(row.xacts)/float64(row.lifeDecided))
		}
		if row.decided > 0 {
			self = perDecision(row.selfCPU, row.decided)
			if r.cpuErr == nil {
				backend = perDecision(row.backendCPU, row.decided)
				server = perDecision(row.serverCPU, row.decided)
			}
		}
		if r.cpuErr == nil && row.backendCPU > 0 {
			busy = fmt.Sprintf("%.2f", row.backendCPU.Seconds()/secs)
			perCore = fmt.Sprintf("%.0f", float64(row.decided)/row.backendCPU.Seconds())
		}
		fmt.Fprintf(w, "| %d | %.0f | %.0f | %s | %s | %d | %s | %s | %s | %s | %s | %s |\n",
			row.gateways, rate, rate/float64(row.gateways), millis(float64(row.p50.Microseconds())), millis(float64(row.p99.Microseconds())),
			row.failed, xact, backend, server, busy, perCore, self)
		if row.failed > (row.decided+row.failed)/100 {
			failing = append(failing, strconv.Itoa(row.gateways))
		}
		if row.lostBackends > 0 {
			lost = append(lost, fmt.Sprintf("%d gateways: %d", row.gateways, row.lostBackends))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "decisions/s: decisions the store made in the measured window, all gateways; per gateway: the same ÷ gateways. p50, p99: latency of a decision as the limiter calls the store (breaker, deadline), failed ones too."+
		" failed: decisions past their deadline, refused by an open breaker or a full queue."+
		" pg xact/decision: transactions in pg_stat_database of the fleet's own database over the gateways' whole life (warm-up, probes and the poll every second included), per decision made."+
		" pg CPU/decision: CPU time (utime+stime in /proc) in the measured window of the Postgres backends connected to the fleet's database, and of the whole server (every postgres process: also the WAL writer, checkpointer, autovacuum, and whatever else uses the server), per decision."+
		" pg cores busy: the backends' CPU seconds per second. decisions/s per pg core: decisions per CPU second of the backends, the rate one Postgres core sustains; divide by a gateway's decision rate for the gateways one core serves."+
		" gateway CPU/decision: this process's CPU time (every simulated gateway and its callers) per decision.")
	if r.cpuErr != nil {
		fmt.Fprintf(w, "\nNote: Postgres CPU not measured: %v.\n", r.cpuErr)
	}
	if len(failing) > 0 {
		fmt.Fprintf(w, "\nWarning: more than 1%% of the decisions failed with %s gateways: their rows describe an overloaded store.\n", strings.Join(failing, ", "))
	}
	if len(lost) > 0 {
		fmt.Fprintf(w, "\nNote: backends exited during the measured window (%s); their CPU time is missing from the backends' column, not from the server's.\n", strings.Join(lost, "; "))
	}
}

// perDecision formats d ÷ n in µs.
func perDecision(d time.Duration, n int64) string {
	return fmt.Sprintf("%.1f µs", float64(d.Microseconds())/float64(n))
}
