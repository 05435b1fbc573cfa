package main

// bench proxies: what sluice's decision service costs the proxies that
// keep their place in front of an application. In one run it measures,
// with wrk, nginx in front of the upstream alone, nginx with its own
// limit_req, and nginx asking sluice (deploy/nginx/sluice.conf, as
// shipped) on the memory store and on PostgreSQL; then, with a Go client
// built from Envoy's types, the decisions a second and the latency of
// sluice's gRPC rate limit service from many concurrent callers, as Envoy
// calls it. Every limit is far above the load: what is measured is the
// cost of deciding, not of refusing.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// proxiesRules are the rules of both sluice targets: one HTTP rule and
// one descriptor rule, each by tenant, far above the load.
const proxiesRules = "bench: GET /api/bench by tenant 1000000000/1h; rls-bench: * rls:bench by descriptor(tenant) 1000000000/1h"

// An nginx target: a server block, and whether it asks sluice.
type nginxTarget struct {
	name   string
	sluice string // the sluice target it asks, or ""
	url    string
	rounds []wrkResult
}

func runProxies(ctx context.Context, o proxiesOptions) error {
	return proxies(ctx, o, os.Stdout, os.Stderr)
}

// proxies runs bench proxies and prints its tables to stdout. Whatever
// happens, it stops every process it started and drops its database.
func proxies(ctx context.Context, o proxiesOptions, stdout, progress io.Writer) (err error) {
	ctx, cancel := context.WithTimeout(ctx, o.deadline)
	defer cancel()
	nginx, err := findNginx()
	if err != nil {
		return err
	}
	wrkV, dir, err := prepareRun("sluice-bench-proxies-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755) // nginx's workers may run as another user
	ps := &procs{dir: dir}
	defer ps.stopAll()

	fmt.Fprintln(progress, "building sluice and the upstream…")
	if err := buildProxiesBench(ctx, dir); err != nil {
		return err
	}
	stores := []string{targetMemory}
	var db *benchDB
	pgVersion := "not used"
	if o.databaseURL != "" {
		var drop func() error
		if db, drop, err = openBenchDB(ctx, o.databaseURL, ps); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, drop()) }()
		pgVersion = db.version(ctx)
		stores = append(stores, targetPostgres)
	}

	upstream, err := freeAddr()
	if err != nil {
		return err
	}
	up, err := ps.start("upstream", childEnv(), filepath.Join(dir, "upstream"), "-listen="+upstream, "-lifetime="+o.deadline.String())
	if err != nil {
		return err
	}
	if err := waitReady(ctx, up, "http://"+upstream+"/"); err != nil {
		return err
	}
	checks, rlsAddrs := map[string]string{}, map[string]string{}
	for _, store := range stores {
		if checks[store], rlsAddrs[store], err = startDecisionService(ctx, ps, dir, store, db); err != nil {
			return err
		}
	}

	targets := []*nginxTarget{{name: "nginx alone"}, {name: "nginx limit_req"}}
	for _, store := range stores {
		targets = append(targets, &nginxTarget{name: "nginx + sluice (" + store + ")", sluice: store})
	}
	if err := startBenchNginx(ctx, ps, nginx, dir, upstream, checks, targets); err != nil {
		return err
	}
	script, err := writeScript(dir, "proxies", mix{GoodIPs: o.keys, Tenants: o.keys})
	if err != nil {
		return err
	}
	for _, t := range targets {
		fmt.Fprintf(progress, "warm-up: %s\n", t.name)
		if _, err := runWrk(ctx, o.load, script, t.url, max(o.warmup, time.Second)); err != nil {
			return err
		}
	}
	for round := range o.rounds {
		for _, t := range targets {
			fmt.Fprintf(progress, "round %d: %s\n", round+1, t.name)
			r, err := runWrk(ctx, o.load, script, t.url, o.duration)
			if err != nil {
				return err
			}
			t.rounds = append(t.rounds, r)
		}
	}
	// Many callers measure throughput (and latency under it); one caller
	// measures the latency of a call alone, what Envoy's timeout is about.
	var grpcRows []grpcRow
	for _, store := range stores {
		for _, callers := range []int{o.callers, 1} {
			grpcRows = append(grpcRows, grpcRow{store: store, callers: callers})
		}
	}
	for round := range o.rounds {
		for i := range grpcRows {
			row := &grpcRows[i]
			fmt.Fprintf(progress, "round %d: gRPC, sluice (%s), %d callers\n", round+1, row.store, row.callers)
			oc := o
			oc.callers = row.callers
			r, err := measureRLS(ctx, rlsAddrs[row.store], oc)
			if err != nil {
				return err
			}
			row.rounds = append(row.rounds, r)
		}
	}

	fmt.Fprintf(stdout, "Machine: %s. Go %s, PostgreSQL %s, %s, nginx %s. wrk: %d connections, %d threads; gRPC: %d callers on %d connections; %d keys; per target %s warm-up, then %d rounds of %s taken in turns.\n\n",
		machine(), strings.TrimPrefix(runtime.Version(), "go"), pgVersion, wrkV, nginxVersion(nginx),
		o.load.connections, o.load.threads, o.callers, o.conns, o.keys, o.warmup, o.rounds, o.duration)
	writeProxiesTable(stdout, targets)
	fmt.Fprintln(stdout)
	writeGRPCTable(stdout, grpcRows)
	ps.logsTo(progress, "sluice-")
	return nil
}

// writeProxiesTable prints the nginx targets: medians over the rounds,
// the spread (lowest and highest req/s), and each round's ratio to nginx
// alone in the same round, as a median.
func writeProxiesTable(w io.Writer, targets []*nginxTarget) {
	fmt.Fprintln(w, "| target | req/s | req/s, lowest–highest round | p50 | p99 | req/s ÷ nginx alone | p99 ÷ nginx alone | non-2xx |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|")
	base := targets[0].rounds
	for _, t := range targets {
		lo, hi := spread(t.rounds, wrkResult.rps)
		rpsRatio, p99Ratio := "–", "–"
		if t != targets[0] {
			rpsRatio = ratio(t.rounds, base, wrkResult.rps)
			p99Ratio = ratio(t.rounds, base, func(x wrkResult) float64 { return x.P99US })
		}
		var non2xx int64
		for _, r := range t.rounds {
			non2xx += r.Non2xx + r.SocketErrors
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f–%.0f | %s | %s | %s | %s | %d |\n", t.name,
			median(t.rounds, wrkResult.rps), lo, hi,
			millis(median(t.rounds, func(x wrkResult) float64 { return x.P50US })),
			millis(median(t.rounds, func(x wrkResult) float64 { return x.P99US })),
			rpsRatio, p99Ratio, non2xx)
	}
}

// spread is the lowest and highest of f over rounds.
func spread(rounds []wrkResult, f func(wrkResult) float64) (lo, hi float64) {
	for i, r := range rounds {
		v := f(r)
		if i == 0 || v < lo {
			lo = v
		}
		if i == 0 || v > hi {
			hi = v
		}
	}
	return lo, hi
}
