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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/policy"
	"go.uber.org/zap"
)

// The fleet: how many gateways one Postgres serves. Several simulated
// gateways, each a postgres.Store on a pool of its own as a separate
// instance has them (made as the gateway's newBackend makes them), decide
// against one database with no HTTP in front, each driven by a closed
// loop of callers or paced. For N = 1, 2, 4, 8 gateways (or up to 64, on a
// private cluster when the server's connections do not suffice) it
// measures decisions per second, their latency, the Postgres CPU they cost
// and the transactions per decision, and prints one Markdown table. See
// bench/README.md, "Fleet capacity".
//
//	go -C bench run . fleet [-gateways 1,2,4,8] [-callers 64] [-keys 10000] [-hot] [-warmup 2s] [-duration 5s]
//	go -C bench run . fleet -gateways 1,2,4,8,16,32,64 -total-rate 20000 -keys 1000000 [-private-cluster]

// fleetOptions are the fleet's flags.
type fleetOptions struct {
	databaseURL      string
	gateways         []int
	callers          int // per gateway
	rate             int // decisions/s per gateway, paced; 0: closed loop
	totalRate        int // decisions/s of the whole fleet, split over its gateways; 0: rate
	keys             int
	privateCluster   clusterMode
	hot              bool
	warmup, duration time.Duration
	decisionTimeout  time.Duration
	syncCommit       bool // false: synchronous_commit off (SLUICE_DB_SYNCHRONOUS_COMMIT=off)
	leases           bool
	deadline         time.Duration
	log              bool        // the stores' and breakers' changes of state to stderr
	logger           *zap.Logger // made by fleet when log is set
	// maxBatch and maxInFlight are the store's MaxBatch and MaxInFlight,
	// 0 for the defaults: only seedKeys's gateway sets them.
	maxBatch, maxInFlight int
}

// The keys' client IPs: up to maxIPv4Keys, addresses of 198.18.0.0/15,
// the IPv4 benchmark range; more, IPv6 addresses of 2001:db8::/32, the
// documentation range, each in a /64 of its own (hashing.IPGroup's group
// of an IPv6 client). maxFleetKeys bounds what the harness holds and
// seeds.
const (
	maxIPv4Keys  = 1 << 17
	maxFleetKeys = 1 << 21
)

// clusterMode is -private-cluster: whether the fleet runs on a private
// cluster of its own instead of -database-url's server.
type clusterMode int

const (
	clusterAuto clusterMode = iota // when the gateways' connections do not fit in the server's
	clusterOn
	clusterOff
)

func (m *clusterMode) String() string {
	switch *m {
	case clusterOn:
		return "true"
	case clusterOff:
		return "false"
	}
	return "auto"
}

func (m *clusterMode) Set(s string) error {
	if s == "auto" {
		*m = clusterAuto
		return nil
	}
	on, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("expected auto, true or false, got %q", s)
	}
	*m = clusterOff
	if on {
		*m = clusterOn
	}
	return nil
}

// IsBoolFlag lets -private-cluster stand alone for true.
func (m *clusterMode) IsBoolFlag() bool { return true }

func parseFleetFlags(args []string) (fleetOptions, error) {
	fs := flag.NewFlagSet("bench fleet", flag.ContinueOnError)
	var o fleetOptions
	defaultURL := defaultDatabaseURL()
	var gateways, syncCommit string
	fs.StringVar(&o.databaseURL, "database-url", defaultURL, "Postgres to measure (default $SLUICE_TEST_DATABASE_URL); the fleet creates and drops a database of its own there")
	fs.StringVar(&gateways, "gateways", "1,2,4,8", "numbers of gateways to measure, comma-separated")
	fs.IntVar(&o.callers, "callers", 64, "concurrent callers per gateway, each in a closed loop (wrk's 64 connections on one gateway)")
	fs.IntVar(&o.rate, "rate", 0, "decisions per second per gateway, spread evenly over its callers; 0: each caller calls again as soon as it has its answer")
	fs.IntVar(&o.totalRate, "total-rate", 0, "decisions per second of the whole fleet, split evenly over its gateways (instead of -rate); 0: -rate")
	fs.IntVar(&o.keys, "keys", 10000, "distinct client IPs the callers pick from at random (IPv4 up to 131072, IPv6 beyond; at most 2097152)")
	fs.Var(&o.privateCluster, "private-cluster", "run on a private PostgreSQL cluster of its own (initdb, on a free loopback port, removed after): true, false or auto (when the most gateways' connections do not fit in -database-url's server)")
	fs.BoolVar(&o.hot, "hot", false, "every decision on the one key of scenario 2's global rule instead")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured load per number of gateways")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured load per number of gateways")
	fs.DurationVar(&o.decisionTimeout, "decision-timeout", postgres.DefaultDecisionTimeout, "deadline of one decision, as SLUICE_DB_TIMEOUT")
	fs.StringVar(&syncCommit, "synchronous-commit", "", "as SLUICE_DB_SYNCHRONOUS_COMMIT: empty (the server's own, durable, the default) or off")
	fs.BoolVar(&o.leases, "leases", true, "as SLUICE_DB_LEASES: spend slices of the limits in memory")
	fs.DurationVar(&o.deadline, "timeout", 10*time.Minute, "give up (and clean up) after this long")
	fs.BoolVar(&o.log, "log", false, "log the stores' and breakers' changes of state to stderr (why decisions fail)")
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
	if o.rate < 0 || o.totalRate < 0 {
		problems = append(problems, "-rate and -total-rate must not be negative")
	}
	if o.rate > 0 && o.totalRate > 0 {
		problems = append(problems, "-rate and -total-rate: give one of them")
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
	// cluster is the private cluster the run made, nil when it ran on
	// -database-url's server; gatewayConns the connections one gateway
	// may hold.
	cluster      *privateCluster
	gatewayConns int
	// cpuErr says why Postgres's CPU was not measured; nil when it was.
	cpuErr error
	rows   []fleetRow
}

// fleetRow is one number of gateways.
type fleetRow struct {
	gateways int
	elapsed  time.Duration // the measured window
	// offered is the decisions/s the callers were paced to, all gateways;
	// 0 in a closed loop.
	offered float64
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
	// backends is how many backends were connected to the fleet's
	// database at the end of the window (0 when not measured).
	backends int
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

	if o.log {
		c := zap.NewDevelopmentConfig()
		c.DisableStacktrace = true
		if o.logger, err = c.Build(); err != nil {
			return nil, err
		}
	}
	url, cluster, conns, err := fleetServer(ctx, o, progress)
	if err != nil {
		return nil, err
	}
	if cluster != nil {
		defer func() { err = errors.Join(err, cluster.close()) }()
	}
	db, err := createBenchDB(ctx, url)
	if err != nil {
		return nil, err
	}
	defer func() {
		dropCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = errors.Join(err, db.drop(dropCtx))
	}()
	run = &fleetRun{opts: o, rule: rule, pgVersion: db.version(ctx), database: db.name, cluster: cluster, gatewayConns: conns}

	postmaster := 0
	var backend int
	if err := db.admin.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return nil, err
	}
	if postmaster, run.cpuErr = postmasterOf(backend); run.cpuErr != nil {
		fmt.Fprintln(progress, "  note: Postgres CPU not measured:", run.cpuErr)
	}

	fmt.Fprintf(progress, "fleet: making the counters of %d key(s)\n", len(keys))
	start := time.Now()
	if err := seedKeys(ctx, db, o, rule, keys, progress); err != nil {
		return nil, fmt.Errorf("make the counters: %w", err)
	}
	fmt.Fprintf(progress, "  made in %s\n", time.Since(start).Round(100*time.Millisecond))
	for _, n := range o.gateways {
		fmt.Fprintf(progress, "fleet: %d gateway(s) × %d callers\n", n, o.callers)
		row, err := fleetStep(ctx, db, o, n, rule, keys, postmaster, progress)
		if err != nil {
			return nil, fmt.Errorf("%d gateways: %w", n, err)
		}
		secs := row.elapsed.Seconds()
		fmt.Fprintf(progress, "  %.0f decisions/s (offered %s), %d failed, %d backends connected\n",
			float64(row.decided)/secs, offeredRate(row.offered), row.failed, row.backends)
		run.rows = append(run.rows, row)
	}
	return run, nil
}

// gatewayRate is the decisions/s each of n gateways is paced to; 0: a
// closed loop.
func (o fleetOptions) gatewayRate(n int) float64 {
	if o.totalRate > 0 {
		return float64(o.totalRate) / float64(n)
	}
	return float64(o.rate)
}

// offeredRate formats a row's offered rate.
func offeredRate(r float64) string {
	if r == 0 {
		return "closed loop"
	}
	return fmt.Sprintf("%.0f", r)
}

// gatewayConns is the most connections one simulated gateway holds at once
// on the server of url: its pool's MaxConns (pgxpool's default, the
// greater of 4 and the CPUs, unless url sets pool_max_conns; ConfigurePool
// keeps MinConns of them, MaxInFlight+1, open while idle), the connection
// its progress checks ask over (keepChecker, progress.go) and, with
// leases, the one that listens for recalls (recall.go). Both are opened
// only once the store is ready; before, setup's migration pool holds one
// instead (health.go).
func gatewayConns(url string, leases bool) (int, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return 0, err
	}
	n := int(pc.MaxConns) + 1
	if leases {
		n++
	}
	return n, nil
}

// fleetServer returns the connection string of the server the fleet runs
// on and the connections a gateway holds there: -database-url's, or a
// private cluster that the caller closes, made when o asks for one or, by
// default, when the most gateways' connections do not fit in the
// connections -database-url's server has free.
func fleetServer(ctx context.Context, o fleetOptions, progress io.Writer) (string, *privateCluster, int, error) {
	most := slices.Max(o.gateways)
	conns, err := gatewayConns(o.databaseURL, o.leases)
	if err != nil {
		return "", nil, 0, err
	}
	need := most * conns
	if o.privateCluster != clusterOn {
		free, limit, err := freeConnections(ctx, o.databaseURL)
		if err != nil {
			return "", nil, 0, err
		}
		if need <= free {
			return o.databaseURL, nil, conns, nil
		}
		if o.privateCluster == clusterOff {
			return "", nil, 0, fmt.Errorf("%d gateways hold up to %d connections each, %d in all, and the server has %d of its max_connections %d free: use -private-cluster, or fewer gateways", most, conns, need, free, limit)
		}
		fmt.Fprintf(progress, "fleet: %d gateways hold up to %d connections each, %d in all; the server has %d of %d free\n", most, conns, need, free, limit)
	}
	// The harness's own connection, the superuser's reserved ones and some
	// room.
	c, err := startPrivateCluster(ctx, max(100, need+20), progress)
	if err != nil {
		return "", nil, 0, err
	}
	// The pool settings of -database-url do not carry over: count again.
	if conns, err = gatewayConns(c.url(), o.leases); err != nil {
		return "", nil, 0, errors.Join(err, c.close())
	}
	return c.url(), c, conns, nil
}

// freeConnections returns how many more connections the server of url
// accepts from an ordinary user, and its max_connections.
func freeConnections(ctx context.Context, url string) (free, limit int, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, 0, fmt.Errorf("connect to -database-url: %w", err)
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
		current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int
		- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int`).Scan(&limit, &free)
	if err != nil {
		return 0, 0, fmt.Errorf("read max_connections: %w", err)
	}
	return free, limit, nil
}

// fleetKeys returns the keys the callers pick from: n client IPs (see
// fleetIP) hashed as sluice hashes them (HMAC under a random key, domain
// "ip"), or the one key of a global rule.
func fleetKeys(rule *policy.Rule, n int) ([]string, error) {
	h, err := hashing.New([]byte(randomHex(32)))
	if err != nil {
		return nil, err
	}
	if rule.Identity.Kind == policy.ByGlobal {
		return []string{h.Key(policy.ByGlobal.String(), "")}, nil
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = h.Key(policy.ByIP.String(), hashing.IPGroup(fleetIP(i, n)))
	}
	return keys, nil
}

// fleetIP is the i-th of n client IPs: 198.18.0.0 + i when n fits in
// 198.18.0.0/15, else 2001:db8:hhhh:llll::1, one per /64, where hhhh:llll
// is i.
func fleetIP(i, n int) netip.Addr {
	a := uint32(i)
	if n <= maxIPv4Keys {
		a += 198<<24 | 18<<16 // 198.18.0.0
		return netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)})
	}
	return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a), 15: 1})
}

// The seeding gateway's batches: seedInFlight statements of seedBatch
// decisions at once (a core of Postgres each, on the 2-core machine), and
// callers enough to fill the next ones while those are in flight.
const (
	seedBatch    = 1024
	seedInFlight = 2
	seedCallers  = 2 * seedInFlight * seedBatch
)

// seedKeys decides every key once from one gateway, so that every row
// measures a fleet that has been running: each decision updates its
// counter. Without it the first row would insert them, which costs
// Postgres ten times as much per decision. The gateway is set up for
// set-up, not for measuring: it takes no leases (each row's gateways start
// without any anyway), so that it has none to give back, one per key, when
// it stops; its statements are larger, two in flight, and may take as long
// as a seeding decision's deadline.
func seedKeys(ctx context.Context, db *benchDB, o fleetOptions, rule *policy.Rule, keys []string, progress io.Writer) error {
	const timeout = 5 * time.Second
	seed := o
	seed.leases, seed.decisionTimeout = false, timeout
	seed.maxBatch, seed.maxInFlight = seedBatch, seedInFlight
	g, err := startGateway(db.url, seed)
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
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				fmt.Fprintf(progress, "  %d of %d\n", min(next.Load(), int64(len(keys))), len(keys))
			case <-stop:
				return
			}
		}
	}()
	defer func() { close(stop); <-stopped }()
	for range min(max(o.callers, seedCallers), len(keys)) {
		wg.Go(func() {
			checks := []limiter.Check{{Rule: rule}}
			results := make([]limiter.Result, 1)
			for i := next.Add(1) - 1; i < int64(len(keys)) && ctx.Err() == nil; i = next.Add(1) - 1 {
				checks[0].Key = keys[i]
				// Set-up, not load: the decision's deadline need not hold
				// on a busy machine, but every key must be made.
				var err error
				for range 5 {
					dctx, cancel := context.WithTimeout(ctx, timeout)
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
	lg := o.logger
	if lg == nil {
		lg = zap.NewNop()
	}
	breaker, err := limiter.NewBreaker(limiter.BreakerConfig{StartOpen: true, Logger: lg})
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
		Logger:             lg,
		MaxBatch:           o.maxBatch,
		MaxInFlight:        o.maxInFlight,
		MaxQueued:          max(o.maxBatch*8, postgres.DefaultMaxQueued),
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
// the breaker, recording the outcome, and under the decision deadline
// only when the store does not apply it itself. The Postgres store with
// batching times each statement from when it is sent (limiter.SelfTimed):
// a deadline here would also count the wait in the gateway's own queue,
// and a burst of 64 gateways meeting on a hot key would open their
// breakers on a healthy database, which the gateway never does.
func (g *fleetGateway) decide(ctx context.Context, checks []limiter.Check, results []limiter.Result) error {
	if !g.breaker.Allow() {
		return limiter.ErrBreakerOpen
	}
	start := time.Now()
	dctx, cancel := ctx, context.CancelFunc(func() {})
	if !g.store.TimesItself() {
		dctx, cancel = context.WithTimeout(ctx, g.timeout)
	}
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

func newPacer(rate float64, callers int, rng *rand.Rand) *pacer {
	if rate <= 0 {
		return &pacer{}
	}
	every := time.Duration(float64(time.Second) * float64(callers) / rate)
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
	rate := o.gatewayRate(n)
	row := fleetRow{gateways: n, offered: rate * float64(n)}
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
	// One after the other, as a fleet is rolled out: dozens of gateways
	// probing at once on the 2-core machine miss the probe's deadlines and
	// back off for longer than they would take in turn.
	started := time.Now()
	for range n {
		g, err := startGateway(db.url, o)
		if err != nil {
			return row, err
		}
		gws = append(gws, g)
		if err := g.waitReady(ctx); err != nil {
			return row, err
		}
	}
	if n > 8 {
		fmt.Fprintf(progress, "  %d gateways ready in %s\n", n, time.Since(started).Round(100*time.Millisecond))
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
			pace := newPacer(rate, o.callers, rng)
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
	row.backends = len(after.backends)
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
	if c := r.cluster; c != nil {
		where += fmt.Sprintf(", a private cluster of the run's own (initdb's settings, durable: fsync and synchronous_commit on; max_connections %d)", c.maxConnections)
	}
	load := "in a closed loop"
	switch {
	case o.totalRate > 0:
		load = fmt.Sprintf("paced to %d decisions/s for the whole fleet, split evenly over its gateways", o.totalRate)
	case o.rate > 0:
		load = fmt.Sprintf("paced to %d decisions/s per gateway", o.rate)
	}
	fmt.Fprintf(w, "Fleet: each gateway a postgres.Store on a pool of its own (up to %d connections), %d callers per gateway %s, %s, rule `%s`; decision deadline %s, synchronous commit %s. Per row %s warm-up, then %s measured. Machine: %s. Go %s, PostgreSQL %s%s.\n\n",
		r.gatewayConns, o.callers, load, keys, r.rule, o.decisionTimeout, commit, o.warmup, o.duration,
		machine(), strings.TrimPrefix(runtime.Version(), "go"), r.pgVersion, where)
	fmt.Fprintln(w, "| gateways | decisions/s | per gateway | p50 | p99 | failed | pg xact/decision | pg CPU/decision (backends) | pg CPU/decision (server) | pg cores busy | decisions/s per pg core | gateway CPU/decision | offered/s | machine cores busy |")
	fmt.Fprintln(w, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	var failing, lost []string
	for _, row := range r.rows {
		secs := row.elapsed.Seconds()
		rate := float64(row.decided) / secs
		xact, backend, server, busy, perCore, self, offered := "–", "–", "–", "–", "–", "–", "–"
		if row.offered > 0 {
			offered = fmt.Sprintf("%.0f", row.offered)
		}
		machineBusy := fmt.Sprintf("%.2f of %d", (row.serverCPU+row.selfCPU).Seconds()/secs, runtime.NumCPU())
		if r.cpuErr != nil {
			machineBusy = "–"
		}
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
		fmt.Fprintf(w, "| %d | %.0f | %.0f | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			row.gateways, rate, rate/float64(row.gateways), millis(float64(row.p50.Microseconds())), millis(float64(row.p99.Microseconds())),
			row.failed, xact, backend, server, busy, perCore, self, offered, machineBusy)
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
		" gateway CPU/decision: this process's CPU time (every simulated gateway and its callers) per decision."+
		" offered/s: the decisions/s the callers were paced to, all gateways (– in a closed loop); decisions/s below it means the callers fell behind their schedule."+
		" machine cores busy: the whole Postgres server's and this process's CPU seconds per second, of the machine's cores: near all of them, the machine, not Postgres, is what limits the row.")
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
