package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A burst scenario is not a steady load: it sends burstRequests requests
// at once, spread evenly over burstGateways instances of a target that
// share one store, on one key that has not been seen before, and measures
// what a limit is for in that moment: how many were allowed (exactly the
// limit, for a shared store), how long the slowest took, and how many
// decide statements the gateways sent for the whole burst.
const (
	burstRequests = 1000
	burstGateways = 3
)

// burstResult is one burst scenario against one target.
type burstResult struct {
	scenario scenario
	target   string
	bursts   []burst
}

// burst is one burst's outcome.
type burst struct {
	allowed, denied, errors int
	latencies               []time.Duration // of the answered requests, sorted
	statements              int64           // decide statements of all gateways; -1: not measured
	failed                  int64           // checks decided by a fail mode; -1: not measured
}

// burstTarget is a target's gateways for a burst scenario.
type burstTarget struct {
	target  string
	urls    []string
	servers []*server // nil for the baseline
	client  *http.Client
	result  *burstResult
}

// runBurst measures every target in burst scenario s: burstGateways
// instances of each (one baseline), an unmeasured burst each to open the
// connections, then a burst per target per round, targets taking turns.
func (b *bench) runBurst(ctx context.Context, s scenario) ([]burstResult, error) {
	var targets []*burstTarget
	for _, t := range b.opts.targets {
		bt := &burstTarget{target: t, result: &burstResult{scenario: s, target: t}}
		if t == targetBaseline {
			bt.urls = []string{b.baseline}
		} else {
			start := b.startSluice
			if t == targetRedis {
				start = b.startRedis
			}
			for i := range burstGateways {
				sv, err := start(ctx, s, t, i)
				if err != nil {
					return nil, err
				}
				defer b.procs.stop(sv.proc)
				bt.servers = append(bt.servers, sv)
				bt.urls = append(bt.urls, sv.url)
			}
		}
		bt.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			MaxIdleConnsPerHost: burstRequests, IdleConnTimeout: time.Minute,
		}}
		defer bt.client.CloseIdleConnections()
		targets = append(targets, bt)
	}
	var key int
	for round := -1; round < b.opts.rounds; round++ {
		for i := range targets {
			bt := targets[(max(round, 0)+i)%len(targets)]
			if round < 0 {
				fmt.Fprintf(b.log, "  warm-up %s\n", bt.target)
			} else {
				fmt.Fprintf(b.log, "  round %d/%d %s\n", round+1, b.opts.rounds, bt.target)
			}
			key++
			r, err := bt.burst(ctx, fmt.Sprintf("198.18.%d.%d", key/256, key%256))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", bt.target, err)
			}
			if round >= 0 {
				bt.result.bursts = append(bt.result.bursts, r)
			}
		}
	}
	results := make([]burstResult, len(targets))
	for i, bt := range targets {
		results[i] = *bt.result
	}
	return results, nil
}

// burst sends burstRequests requests as client ip at once, the i-th to the
// target's i-th gateway in turn, and returns what they got.
func (bt *burstTarget) burst(ctx context.Context, ip string) (burst, error) {
	r := burst{statements: -1, failed: -1}
	statementsBefore, failedBefore, err := bt.counters(ctx)
	if err != nil {
		return r, err
	}
	type answer struct {
		status int
		took   time.Duration
	}
	answers := make([]answer, burstRequests)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			status, err := get(ctx, bt.client, bt.urls[i%len(bt.urls)]+benchPath, ip)
			if err != nil {
				return // status 0: an error
			}
			answers[i] = answer{status, time.Since(t0)}
		})
	}
	close(start)
	wg.Wait()
	for _, a := range answers {
		switch {
		case a.status == 0:
			r.errors++
			continue
		case a.status < 400:
			r.allowed++
		default:
			r.denied++
		}
		r.latencies = append(r.latencies, a.took)
	}
	slices.Sort(r.latencies)
	if bt.servers != nil {
		statementsAfter, failedAfter, err := bt.counters(ctx)
		if err != nil {
			return r, err
		}
		if statementsBefore >= 0 {
			r.statements = statementsAfter - statementsBefore
		}
		r.failed = failedAfter - failedBefore
	}
	return r, ctx.Err()
}

// counters sums, over the target's gateways, the decide statements sent
// (-1 when the target has no such metric) and the checks decided by a
// fail mode.
func (bt *burstTarget) counters(ctx context.Context) (statements, failed int64, err error) {
	for _, sv := range bt.servers {
		o, err := sv.scrape(ctx)
		if err != nil {
			return 0, 0, err
		}
		failed += o.failed()
		n, ok, err := sv.gauge(ctx, "sluice_db_decide_statements_total")
		if err != nil {
			return 0, 0, err
		}
		if !ok {
			statements = -1
		} else if statements >= 0 {
			statements += n
		}
	}
	return statements, failed, nil
}

// gauge reads one unlabelled sample from the server's /metrics; ok is
// false when it has no such metric.
func (s *server) gauge(ctx context.Context, name string) (v int64, ok bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.admin+"/metrics", nil)
	if err != nil {
		return 0, false, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, fmt.Errorf("scrape metrics: %w", err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if value, found := strings.CutPrefix(sc.Text(), name+" "); found {
			f, err := strconv.ParseFloat(value, 64)
			return int64(f), err == nil, err
		}
	}
	return 0, false, sc.Err()
}

// writeBurstTable prints the burst scenarios' results as one Markdown
// table: per target, the allowed count of every burst, the median over
// the bursts of the p50 and p99 latency and of the statements per burst,
// and the fail-mode decisions of all bursts.
func writeBurstTable(w io.Writer, results []burstResult) {
	if len(results) == 0 {
		return
	}
	fmt.Fprintln(w, "| scenario | target | allowed per burst (limit) | p50 | p99 | p99 ÷ baseline | decide statements per burst | failed checks | errors |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range results {
		var allowed []string
		var p50, p99, statements []float64
		var failed, errs int64
		for _, x := range r.bursts {
			allowed = append(allowed, strconv.Itoa(x.allowed))
			p50 = append(p50, float64(percentile(x.latencies, 50).Microseconds()))
			p99 = append(p99, float64(percentile(x.latencies, 99).Microseconds()))
			if x.statements >= 0 {
				statements = append(statements, float64(x.statements))
			}
			failed += max(x.failed, 0)
			errs += int64(x.errors)
		}
		ratio := "–"
		if i := slices.IndexFunc(results, func(b burstResult) bool {
			return b.scenario.id == r.scenario.id && b.target == targetBaseline
		}); i >= 0 && r.target != targetBaseline {
			var rs []float64
			for k, x := range r.bursts {
				if k < len(results[i].bursts) {
					base := percentile(results[i].bursts[k].latencies, 99)
					rs = append(rs, float64(percentile(x.latencies, 99))/float64(max(base, 1)))
				}
			}
			ratio = fmt.Sprintf("%.2f", medianOf(rs))
		}
		st, fl := "–", "–"
		if len(statements) > 0 {
			st = fmt.Sprintf("%.0f", medianOf(statements))
		}
		if r.target != targetBaseline {
			fl = strconv.FormatInt(failed, 10)
		}
		lim := "–"
		if r.target != targetBaseline {
			lim = strconv.Itoa(r.scenario.burst)
		}
		fmt.Fprintf(w, "| %s. %s | %s | %s (%s) | %s | %s | %s | %s | %s | %d |\n",
			r.scenario.id, r.scenario.title, targetName(r.target), strings.Join(allowed, ", "), lim,
			millis(medianOf(p50)), millis(medianOf(p99)), ratio, st, fl, errs)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Bursts: %d requests at once on one new key, spread over %d instances of each target (one baseline), one burst per target per round after an unmeasured one; the memory store is per instance, so its instances allow the limit each."+
		" p50, p99: of each burst's requests, medians over the bursts; p99 ÷ baseline: median of each round's ratio."+
		" decide statements per burst: sluice_db_decide_statements_total of all instances (lease renewals included), median over the bursts.\n",
		burstRequests, burstGateways)
}
