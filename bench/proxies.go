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
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// proxiesOptions are the flags of bench proxies.
type proxiesOptions struct {
	databaseURL      string // empty: no PostgreSQL targets
	load             load
	warmup, duration time.Duration
	rounds           int
	callers, conns   int // gRPC callers, and the HTTP/2 connections they share
	keys             int // distinct X-Tenant-ID values and descriptor values
	deadline         time.Duration
}

func parseProxiesFlags(args []string) (proxiesOptions, error) {
	fs := flag.NewFlagSet("bench proxies", flag.ContinueOnError)
	defaultURL := os.Getenv("SLUICE_TEST_DATABASE_URL")
	if defaultURL == "" {
		defaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	var o proxiesOptions
	fs.StringVar(&o.databaseURL, "database-url", defaultURL, "Postgres for the postgres targets (a database of the run's own is created and dropped); empty leaves them out")
	fs.IntVar(&o.load.connections, "connections", 64, "wrk's concurrent connections (closed loop)")
	fs.IntVar(&o.load.threads, "threads", 2, "wrk threads")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load per target before its first round")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "one measured run")
	fs.IntVar(&o.rounds, "rounds", 3, "measured runs per target, taken in turns")
	fs.IntVar(&o.callers, "callers", 64, "concurrent gRPC callers (closed loop)")
	fs.IntVar(&o.conns, "grpc-connections", 4, "HTTP/2 connections the gRPC callers share, as Envoy's workers hold")
	fs.IntVar(&o.keys, "keys", 10000, "distinct keys (tenants) in rotation")
	fs.DurationVar(&o.deadline, "timeout", 10*time.Minute, "give up (and clean up) after this long")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.load.connections < o.load.threads || o.load.threads < 1:
		return o, errors.New("-connections must be at least -threads, and -threads at least 1 (wrk's rule)")
	case o.duration < time.Second || o.warmup < 0 || o.rounds < 1:
		return o, errors.New("-duration must be at least 1s (wrk counts whole seconds), -warmup not negative, -rounds at least 1")
	case o.callers < 1 || o.conns < 1 || o.keys < 1:
		return o, errors.New("-callers, -grpc-connections and -keys must be at least 1")
	}
	o.load.timeout = 5 * time.Second
	return o, nil
}

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

// grpcResult is one gRPC measurement.
type grpcResult struct {
	decisions, errors int64
	took              time.Duration
	p50, p99          time.Duration
}

func (r grpcResult) rate() float64 { return float64(r.decisions) / r.took.Seconds() }

func runProxies(ctx context.Context, o proxiesOptions) error {
	return proxies(ctx, o, os.Stdout, os.Stderr)
}

// proxies runs bench proxies and prints its tables to stdout. Whatever
// happens, it stops every process it started and drops its database.
func proxies(ctx context.Context, o proxiesOptions, stdout, progress io.Writer) (err error) {
	ctx, cancel := context.WithTimeout(ctx, o.deadline)
	defer cancel()
	wrkV, err := wrkVersion()
	if err != nil {
		return err
	}
	nginx, err := findNginx()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "sluice-bench-proxies-")
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
		if db, err = createBenchDB(ctx, o.databaseURL); err != nil {
			return err
		}
		defer func() {
			ps.stopAll()
			dropCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = errors.Join(err, db.drop(dropCtx))
		}()
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
	return nil
}

// findNginx returns nginx's path (Debian installs it in /usr/sbin).
func findNginx() (string, error) {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", nil
	}
	return "", errors.New("nginx not found: install it with apt-get install -y nginx-light")
}

func nginxVersion(path string) string {
	out, _ := exec.Command(path, "-v").CombinedOutput()
	_, v, _ := strings.Cut(strings.TrimSpace(string(out)), "nginx/")
	return v
}

// buildProxiesBench builds sluice, in its own module, and the harness's
// upstream into dir.
func buildProxiesBench(ctx context.Context, dir string) error {
	harness, product, err := moduleDirs()
	if err != nil {
		return err
	}
	for _, b := range []struct{ dir, pkg string }{{product, "."}, {harness, "./upstream"}} {
		build := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), b.pkg)
		build.Dir = b.dir
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("go build in %s: %w\n%s", b.dir, err, out)
		}
	}
	return nil
}

// startDecisionService starts a sluice on store with its check and gRPC
// listeners and no upstream, and returns their addresses once it is ready.
func startDecisionService(ctx context.Context, ps *procs, dir, store string, db *benchDB) (check, rls string, err error) {
	var admin string
	for _, a := range []*string{&check, &rls, &admin} {
		if *a, err = freeAddr(); err != nil {
			return "", "", err
		}
	}
	env := []string{
		"SLUICE_CHECK_LISTEN=" + check,
		"SLUICE_RLS_LISTEN=" + rls,
		"SLUICE_ADMIN_LISTEN=" + admin,
		"SLUICE_RULES=" + proxiesRules,
		"SLUICE_TRUSTED_PROXIES=127.0.0.1/32",
		"SLUICE_LOG_LEVEL=warn",
	}
	if store == targetPostgres {
		env = append(env, "SLUICE_DATABASE_URL="+db.url, "SLUICE_DB_SCHEMA=bench_proxies", "SLUICE_HASH_KEY="+randomHex(32))
	}
	p, err := ps.start("sluice-"+store, childEnv(env...), filepath.Join(dir, "sluice"))
	if err != nil {
		return "", "", err
	}
	return check, rls, waitReady(ctx, p, "http://"+admin+"/readyz")
}

// startBenchNginx starts one nginx with a server block per target: the
// upstream alone, behind limit_req (keyed by the tenant, as sluice's rule,
// with a rate no request reaches), and deploy/nginx/sluice.conf as
// shipped, its addresses replaced, for each sluice. It sets each target's
// URL.
func startBenchNginx(ctx context.Context, ps *procs, nginx, dir, upstream string, checks map[string]string, targets []*nginxTarget) error {
	_, product, err := moduleDirs()
	if err != nil {
		return err
	}
	shipped, err := os.ReadFile(filepath.Join(product, "deploy", "nginx", "sluice.conf"))
	if err != nil {
		return err
	}
	var conf strings.Builder
	fmt.Fprintf(&conf, `worker_processes auto;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[1]s/client_body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    upstream bench_app { server %[2]s; keepalive 64; }
    limit_req_zone $http_x_tenant_id zone=bench:32m rate=1000000r/s;
`, dir, upstream)
	for i, t := range targets {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		t.url = "http://" + addr
		switch {
		case t.sluice != "":
			// The shipped file, in a file of its own, its upstream blocks
			// renamed so that several can share one http block.
			site := strings.NewReplacer(
				"127.0.0.1:9191", checks[t.sluice],
				"127.0.0.1:3000", upstream,
				"listen 8000;", "listen "+addr+";",
				"upstream sluice_check", "upstream sluice_check_"+strconv.Itoa(i),
				"http://sluice_check/", "http://sluice_check_"+strconv.Itoa(i)+"/",
				"upstream app", "upstream app_"+strconv.Itoa(i),
				"http://app;", "http://app_"+strconv.Itoa(i)+";",
				"map $sluice_status $sluice_error_retry_after", "map $sluice_status $sluice_error_retry_after_"+strconv.Itoa(i),
				"$sluice_error_retry_after always", "$sluice_error_retry_after_"+strconv.Itoa(i)+" always",
			).Replace(string(shipped))
			path := filepath.Join(dir, "sluice-"+strconv.Itoa(i)+".conf")
			if err := os.WriteFile(path, []byte(site), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(&conf, "    include %s;\n", path)
		default:
			limit := ""
			if strings.Contains(t.name, "limit_req") {
				limit = "limit_req zone=bench burst=1000 nodelay;"
			}
			fmt.Fprintf(&conf, `    server {
        listen %s;
        location / {
            %s
            proxy_pass http://bench_app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
`, addr, limit)
		}
	}
	conf.WriteString("}\n")
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf.String()), 0o644); err != nil {
		return err
	}
	p, err := ps.start("nginx", childEnv(), nginx, "-p", dir, "-e", filepath.Join(dir, "nginx-error.log"), "-c", path, "-g", "daemon off;")
	if err != nil {
		return err
	}
	for _, t := range targets {
		if err := waitReady(ctx, p, t.url+"/"); err != nil {
			return err
		}
	}
	return nil
}

// measureRLS drives the gRPC listener at addr for o.duration with
// o.callers closed-loop callers, each sending one descriptor call at a
// time (a tenant in rotation), over o.conns shared HTTP/2 connections.
func measureRLS(ctx context.Context, addr string, o proxiesOptions) (grpcResult, error) {
	var clients []rlsv3.RateLimitServiceClient
	for range o.conns {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return grpcResult{}, err
		}
		defer conn.Close()
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	// One unmeasured call per connection: the connection set-up is not
	// the service's latency.
	for _, c := range clients {
		if _, err := c.ShouldRateLimit(ctx, rlsRequest(0)); err != nil {
			return grpcResult{}, fmt.Errorf("rate limit service at %s: %w", addr, err)
		}
	}
	var (
		mu        sync.Mutex
		latencies []time.Duration
		errs      int64
		wg        sync.WaitGroup
	)
	began := time.Now()
	end := began.Add(o.duration)
	for i := range o.callers {
		wg.Go(func() {
			c := clients[i%len(clients)]
			var own []time.Duration
			var failed int64
			for k := i; time.Now().Before(end) && ctx.Err() == nil; k += o.callers {
				callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
				t0 := time.Now()
				res, err := c.ShouldRateLimit(callCtx, rlsRequest(k%o.keys))
				own = append(own, time.Since(t0))
				cancel()
				if err != nil || res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					failed++
				}
			}
			mu.Lock()
			latencies = append(latencies, own...)
			errs += failed
			mu.Unlock()
		})
	}
	wg.Wait()
	took := time.Since(began)
	if err := ctx.Err(); err != nil {
		return grpcResult{}, err
	}
	slices.Sort(latencies)
	return grpcResult{
		decisions: int64(len(latencies)), errors: errs, took: took,
		p50: percentile(latencies, 50), p99: percentile(latencies, 99),
	}, nil
}

// rlsRequest is Envoy's call for tenant k.
func rlsRequest(k int) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "tenant-" + strconv.Itoa(k)}},
	}}}
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

// grpcRow is one line of the gRPC table: a store and a number of callers,
// with its rounds.
type grpcRow struct {
	store   string
	callers int
	rounds  []grpcResult
}

// writeGRPCTable prints the gRPC measurements: medians over the rounds
// and the spread of decisions a second.
func writeGRPCTable(w io.Writer, rows []grpcRow) {
	fmt.Fprintln(w, "| gRPC rate limit service | callers | decisions/s | lowest–highest round | p50 | p99 | failed or not OK |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|")
	for _, row := range rows {
		rates := make([]float64, len(row.rounds))
		var p50s, p99s []time.Duration
		var errs int64
		for i, r := range row.rounds {
			rates[i] = r.rate()
			p50s, p99s = append(p50s, r.p50), append(p99s, r.p99)
			errs += r.errors
		}
		slices.Sort(rates)
		slices.Sort(p50s)
		slices.Sort(p99s)
		fmt.Fprintf(w, "| sluice (%s) | %d | %.0f | %.0f–%.0f | %s | %s | %d |\n", row.store, row.callers,
			rates[len(rates)/2], rates[0], rates[len(rates)-1],
			fmtDuration(p50s[len(p50s)/2]), fmtDuration(p99s[len(p99s)/2]), errs)
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

// fmtDuration shows a latency in milliseconds with two decimals.
func fmtDuration(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000)
}
