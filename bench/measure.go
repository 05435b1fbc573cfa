package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// result is one cell of the table: one scenario against one target.
type result struct {
	scenario scenario
	target   string
	rounds   []wrkResult // one per round, in round order
	xacts    int64       // Postgres transactions during the rounds; -1: not measured
	requests int64       // requests the xacts were spent on
	// coldXacts are the Postgres transactions of the warm-up, the first
	// load on a fresh sluice (leases not yet granted); coldRequests its
	// requests. -1: not measured.
	coldXacts, coldRequests int64
	failed                  int64 // checks the store could not decide (fail modes); -1: not measured
	spans                   int64 // spans the OTLP sink received during the rounds; -1: not measured
	cpu                     int64 // clock ticks of CPU the target's process used in the rounds; -1: not measured
}

// cell is a target being measured in one scenario.
type cell struct {
	result
	url    string
	server *server // nil for the baseline
}

// runScenario measures every target in scenario s. The sluices are
// started for s (the baseline serves every scenario), pre-exhausted if s
// asks, and warmed up; then the targets take turns, one wrk run each per
// round, so that every target sees the same stretch of a noisy machine.
func (b *bench) runScenario(ctx context.Context, s scenario, script string) ([]result, error) {
	var cells []*cell
	for _, t := range b.opts.targets {
		c := &cell{result: result{scenario: s, target: t, xacts: -1, coldXacts: -1, failed: -1, spans: -1, cpu: -1}, url: b.baseline}
		if t != targetBaseline {
			start := b.startSluice
			if t == targetRedis {
				start = b.startRedis
			}
			sl, err := start(ctx, s, t, 0)
			if err != nil {
				return nil, err
			}
			defer b.procs.stop(sl.proc)
			c.server, c.url, c.failed, c.cpu = sl, sl.url, 0, 0
			if s.exhaust > 0 {
				n, err := exhaust(ctx, sl.url, s)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", t, err)
				}
				if n > 0 {
					// The table still means something (the warm-up and
					// the rounds deny them later), but say so.
					b.note("scenario %s, %s: %d of %d bad IPs were still allowed after %d requests each before the warm-up (their decisions failed open)",
						s.id, targetName(t), n, s.mix.BadIPs, exhaustTries(s))
				}
			}
		}
		cells = append(cells, c)
	}
	// The targets on Postgres: their transactions are counted in their own
	// databases, the warm-up (the first load on a fresh sluice) apart, as
	// "cold".
	var pgs []*cell
	for _, c := range cells {
		if onPostgres(c.target) {
			pgs = append(pgs, c)
		}
	}
	coldBefore, err := b.publishedXacts(ctx, pgs)
	if err != nil {
		return nil, err
	}
	for _, c := range cells {
		fmt.Fprintf(b.log, "  warm-up %s\n", c.target)
		n, err := b.warmUp(ctx, script, c.url)
		if err != nil {
			return nil, err
		}
		c.coldRequests = n
	}
	// The snapshot holds all of the warm-up's transactions and none of the
	// rounds'.
	xactsBefore, err := b.publishedXacts(ctx, pgs)
	if err != nil {
		return nil, err
	}
	for i, c := range pgs {
		if c.coldRequests > 0 {
			c.coldXacts = xactsBefore[i] - coldBefore[i]
		}
	}

	for round := range b.opts.rounds {
		for _, i := range roundOrder(round, len(cells)) {
			c := cells[i]
			fmt.Fprintf(b.log, "  round %d/%d %s\n", round+1, b.opts.rounds, c.target)
			if err := b.measureRound(ctx, c, script); err != nil {
				return nil, fmt.Errorf("%s: %w", c.target, err)
			}
		}
	}

	for i, c := range pgs {
		// Stopping sluice closes its connections, and exiting backends
		// publish their counts at once.
		b.procs.stop(c.server.proc)
		xactsAfter, err := b.dbs[c.target].settledXacts(ctx)
		if err != nil {
			return nil, err
		}
		c.xacts = xactsAfter - xactsBefore[i]
		for _, r := range c.rounds {
			c.requests += r.Requests
		}
	}
	results := make([]result, len(cells))
	for i, c := range cells {
		results[i] = c.result
	}
	return results, nil
}

// roundOrder is the order in which round measures n targets. Each round
// starts with a different target, so that none is always the one measured
// first, and every other round goes backwards, so that no target is always
// measured right after the same one: what a target leaves behind (a
// database's autovacuum and checkpoints, a collector's garbage) falls on
// its neighbours in turn. Measured with the order fixed (-targets
// baseline,redis,memory,before-postgres,postgres -before 0809fe6), sluice
// on Postgres, always right after the older build on Postgres, made
// 0.86-1.00 of the memory store on 10,000 keys with a p99 1.11-1.30 of
// its, where beside the memory store alone it made 0.92-1.12.
func roundOrder(round, n int) []int {
	order := make([]int, n)
	for i := range order {
		if round%2 == 0 {
			order[i] = (round + i) % n
		} else {
			order[i] = ((round-i)%n + n) % n
		}
	}
	return order
}

// measureRound runs one measured wrk run against c and adds it to c's
// rounds, with the store failures sluice counted meanwhile.
func (b *bench) measureRound(ctx context.Context, c *cell, script string) error {
	var before outcomes
	var cpuBefore procStat
	if c.server != nil {
		var err error
		if before, err = c.server.scrape(ctx); err != nil {
			return err
		}
		if cpuBefore, err = readProcStat(c.server.proc.cmd.Process.Pid); err != nil {
			return err
		}
	}
	var spansBefore int64
	if c.target == targetTraced {
		spansBefore = b.otlp.spans.Load()
	}
	r, err := runWrk(ctx, b.opts.load, script, c.url, b.opts.duration)
	if err != nil {
		return err
	}
	c.rounds = append(c.rounds, r)
	if c.target == targetTraced {
		// Spans of the round still in the exporter's batch arrive with
		// the next one: over three rounds the count is near enough.
		c.spans = max(c.spans, 0) + b.otlp.spans.Load() - spansBefore
	}
	if c.server != nil {
		// The process's CPU first: the scrape below costs some.
		cpuAfter, err := readProcStat(c.server.proc.cmd.Process.Pid)
		if err != nil {
			return err
		}
		c.cpu += cpuAfter.own() - cpuBefore.own()
		after, err := c.server.scrape(ctx)
		if err != nil {
			return err
		}
		c.failed += after.failed() - before.failed()
	}
	return nil
}

// warmUp sends the scenario's load to baseURL for the warm-up time, so
// that connections, pools and caches are in their steady state when the
// measurement starts. Its numbers are thrown away.
func (b *bench) warmUp(ctx context.Context, script, baseURL string) (requests int64, err error) {
	if b.opts.warmup < time.Second {
		return 0, nil
	}
	r, err := runWrk(ctx, b.opts.load, script, baseURL, b.opts.warmup)
	return r.Requests, err
}

// publishedXacts waits until Postgres has published the transactions of
// its backends so far, and returns the count of each cell's database; it
// does nothing without cells.
func (b *bench) publishedXacts(ctx context.Context, cells []*cell) ([]int64, error) {
	if len(cells) == 0 {
		return nil, nil
	}
	fmt.Fprintf(b.log, "  waiting %s for Postgres to publish its counts\n", pgStatIdleFlush)
	select {
	case <-time.After(pgStatIdleFlush):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	n := make([]int64, len(cells))
	for i, c := range cells {
		var err error
		if n[i], err = b.dbs[c.target].xacts(ctx); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// server is one running target other than the baseline: sluice or the
// Redis peer.
type server struct {
	proc       *proc
	url, admin string // base URLs of the public and admin listeners
	// metric is the counter of checks by outcome at admin's /metrics.
	metric string
}

// startSluice starts sluice for scenario s on target t's store and waits
// until it is ready (its store reachable). Instances of one scenario and
// target share their store; instance numbers them (0 for the only one).
func (b *bench) startSluice(ctx context.Context, s scenario, t string, instance int) (*server, error) {
	public, admin, err := freeAddrs()
	if err != nil {
		return nil, err
	}
	env := []string{
		"SLUICE_UPSTREAM=" + b.upstream,
		"SLUICE_LISTEN=" + public,
		"SLUICE_ADMIN_LISTEN=" + admin,
		"SLUICE_RULES=" + s.rules,
		"SLUICE_TRUSTED_PROXIES=127.0.0.1/32", // wrk's X-Forwarded-For names the clients
		"SLUICE_LOG_LEVEL=warn",
	}
	exe := "sluice"
	if onPostgres(t) {
		env = append(env,
			"SLUICE_DATABASE_URL="+b.dbs[t].url,
			"SLUICE_DB_SCHEMA=bench_s"+s.id, // fresh counters for every scenario
			"SLUICE_HASH_KEY="+b.hashKey,
		)
	}
	switch t {
	case targetTraced:
		env = append(env,
			"OTEL_EXPORTER_OTLP_ENDPOINT="+b.otlp.url,
			"OTEL_TRACES_SAMPLER=always_on",
			"OTEL_SERVICE_NAME=sluice-bench",
		)
	case targetBefore, targetBeforePostgres:
		exe = "sluice-before"
	}
	env = append(env, b.opts.sluiceEnv...) // last, so that they win
	p, err := b.procs.start(procName("sluice-"+t+"-s"+s.id, instance), childEnv(env...), filepath.Join(b.dir, exe))
	if err != nil {
		return nil, err
	}
	sl := &server{proc: p, url: "http://" + public, admin: "http://" + admin, metric: "sluice_decisions_total"}
	if err := waitReady(ctx, p, sl.admin+"/readyz"); err != nil {
		b.procs.stop(p)
		return nil, err
	}
	return sl, nil
}

// exhaustTries bounds the requests exhaust sends one bad IP.
func exhaustTries(s scenario) int { return s.exhaust + 1 + 20 }

// exhaust brings the bad IPs of s over their limit: it sends each one
// request after another until one is denied, so that the measurement
// starts with them over their limit. A request the store could not decide
// in time (let through by fail=open) consumes nothing, so the number
// needed is not fixed: exhaust gives up on an IP after exhaustTries and
// returns how many it gave up on.
func exhaust(ctx context.Context, baseURL string, s scenario) (int64, error) {
	// As many workers as sluice has database connections by default: this
	// is set-up, not load, and should not time out.
	const workers = 4
	maxTries := exhaustTries(s)
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: workers},
	}
	defer client.CloseIdleConnections()
	var next, notDenied atomic.Int64
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for k := next.Add(1) - 1; k < int64(s.mix.BadIPs); k = next.Add(1) - 1 {
				ip := fmt.Sprintf("198.19.%d.%d", k/256, k%256) // as wrkScript's bad IPs
				denied := false
				for range maxTries {
					status, err := get(ctx, client, baseURL+benchPath, ip)
					if err != nil {
						errs <- fmt.Errorf("pre-exhaust: %w", err)
						return
					}
					if denied = status == http.StatusTooManyRequests; denied {
						break
					}
				}
				if !denied {
					notDenied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return notDenied.Load(), nil
}

// get sends one GET as client ip (through the trusted X-Forwarded-For)
// and returns the status.
func get(ctx context.Context, client *http.Client, url, ip string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Forwarded-For", ip)
	res, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, res.Body) //nolint:errcheck // only the status matters
	res.Body.Close()
	return res.StatusCode, nil
}

// outcomes are a target's checks by outcome (sluice_decisions_total
// summed over rules).
type outcomes map[string]int64

// failed counts the checks whose store could not decide, whatever the
// fail mode then did.
func (o outcomes) failed() int64 {
	return o["failed_open"] + o["failed_closed"] + o["local"]
}

// scrape reads the counter of checks by outcome from the server's admin
// listener.
func (s *server) scrape(ctx context.Context) (outcomes, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.admin+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	defer res.Body.Close()
	return parseDecisions(res.Body, s.metric)
}

// parseDecisions sums the samples of the counter metric in a Prometheus
// text exposition by their outcome label.
func parseDecisions(r io.Reader, metric string) (outcomes, error) {
	o := outcomes{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		labels, ok := strings.CutPrefix(sc.Text(), metric+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(labels, "} ")
		if !ok {
			return nil, fmt.Errorf("metrics: malformed line %q", sc.Text())
		}
		_, outcome, _ := strings.Cut(labels, `outcome="`)
		outcome, _, _ = strings.Cut(outcome, `"`)
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: %q: %w", sc.Text(), err)
		}
		o[outcome] += int64(v)
	}
	return o, sc.Err()
}

// randomHex returns n random bytes, hex-encoded.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
