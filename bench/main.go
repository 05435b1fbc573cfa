// Command bench is sluice's load harness. In one run it starts a
// trivial upstream, a bare httputil.ReverseProxy with sluice's transport
// (the baseline), the same proxy limited by go-redis/redis_rate (the Redis
// peer), sluice on the memory store and sluice on PostgreSQL, all as
// separate processes on loopback; drives each with wrk at a fixed
// concurrency through four scenarios; and prints one Markdown table of
// throughput, latency, ratios to the baseline, Postgres transactions per
// decision and allowed/denied counts. See bench/README.md.
//
//	go -C bench run . [-database-url URL] [-redis-url URL] [-connections 64] [-threads 2] [-duration 5s] [-rounds 3] [-warmup 2s]
//	go -C bench run . soak [-duration 1h] [-rate 2000] [-keys 20000] [-window 1m]
//	go -C bench run . fleet [-gateways 1,2,4,8] [-callers 64] [-keys 10000] [-hot] [-duration 5s]
//	go -C bench run . proxies [-connections 64] [-callers 64] [-keys 10000] [-duration 3s] [-rounds 3]
//
// Every process it starts, and the database it creates, are removed when
// it ends, also on failure or Ctrl-C.
//
// The harness is a module of its own (bench/go.mod), which the product
// never imports. Of sluice it imports hashing, limiter, limiter/postgres
// and policy (the soak and the fleet run the store in-process), and
// internal/proctest for its ports; the
// baseline, the Redis peer and the upstream say in their package comments
// what they import.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/proctest"
)

// Targets, in the order each scenario measures them.
const (
	targetBaseline = "baseline"
	targetRedis    = "redis"
	// targetBefore is sluice on the memory store built from another
	// commit (-before), to measure a change: of this one, the cost of
	// tracing when it is off.
	targetBefore = "before"
	targetMemory = "memory"
	// targetTraced is sluice on the memory store with tracing on at 100%
	// sampling, exporting to the harness's OTLP sink.
	targetTraced   = "traced"
	targetPostgres = "postgres"
	// targetBeforePostgres is sluice on Postgres built from another commit
	// (-before), with that commit's defaults, in a database of its own:
	// to compare a change of the durable store with what it replaces.
	targetBeforePostgres = "before-postgres"
)

// onPostgres reports whether target t decides on Postgres; each such
// target has a database of its own, so that its transactions are its own.
func onPostgres(t string) bool { return t == targetPostgres || t == targetBeforePostgres }

// knownTargets are every target, in the order they are measured;
// defaultTargets those measured without -targets.
var (
	knownTargets   = []string{targetBaseline, targetRedis, targetBefore, targetMemory, targetTraced, targetBeforePostgres, targetPostgres}
	defaultTargets = []string{targetBaseline, targetRedis, targetMemory, targetPostgres}
)

// options are the command-line flags.
type options struct {
	databaseURL      string
	redisURL         string
	load             load
	warmup, duration time.Duration
	rounds           int
	deadline         time.Duration
	scenarios        []scenario
	targets          []string
	sluiceEnv        []string
	before           string // git revision of the before target
}

func main() {
	args := os.Args[1:]
	switch {
	case len(args) > 0 && args[0] == "soak": // see soak.go
		command("bench soak", args[1:], parseSoakFlags, func(ctx context.Context, o soakOptions) error {
			return soak(ctx, o, os.Stdout, os.Stderr)
		})
	case len(args) > 0 && args[0] == "fleet": // see fleet.go
		command("bench fleet", args[1:], parseFleetFlags, runFleet)
	case len(args) > 0 && args[0] == "proxies": // see proxies.go
		command("bench proxies", args[1:], parseProxiesFlags, runProxies)
	default:
		command("bench", args, parseFlags, func(ctx context.Context, o options) error {
			return run(ctx, o, os.Stdout, os.Stderr)
		})
	}
}

// command runs one of the harness's commands: parses its flags, runs it
// until it ends or the process is interrupted, and exits with status 2 on
// bad flags and 1 when it fails.
func command[O any](name string, args []string, parse func([]string) (O, error), run func(context.Context, O) error) {
	opts, err := parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, opts)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	defaultURL := defaultDatabaseURL()
	var o options
	var scen, targets string
	fs.StringVar(&o.databaseURL, "database-url", defaultURL, "Postgres to benchmark on (default $SLUICE_TEST_DATABASE_URL); the harness creates and drops a database of its own there")
	defaultRedis := os.Getenv("SLUICE_BENCH_REDIS_URL")
	if defaultRedis == "" {
		defaultRedis = "redis://127.0.0.1:6379/0"
	}
	fs.StringVar(&o.redisURL, "redis-url", defaultRedis, "Redis of the redis target (default $SLUICE_BENCH_REDIS_URL); its keys are deleted at the end")
	o.load.flags(fs)
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured load before each measurement")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured load per round, scenario and target")
	fs.IntVar(&o.rounds, "rounds", 3, "measured runs per scenario and target, taken in turns; the table gives medians")
	fs.DurationVar(&o.deadline, "timeout", 20*time.Minute, "give up (and clean up) after this long")
	fs.StringVar(&scen, "scenarios", "1,2,3,4,5", "scenarios to run, comma-separated")
	fs.StringVar(&targets, "targets", strings.Join(defaultTargets, ","), "targets to measure, comma-separated, of "+strings.Join(knownTargets, ","))
	fs.StringVar(&o.before, "before", "main", "git revision the before target is built from")
	fs.Func("env", "extra KEY=VALUE setting for both sluice targets (repeatable), e.g. -env SLUICE_DB_TIMEOUT=100ms", func(s string) error {
		if k, _, ok := strings.Cut(s, "="); !ok || k == "" {
			return fmt.Errorf("expected KEY=VALUE, got %q", s)
		}
		o.sluiceEnv = append(o.sluiceEnv, s)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := o.load.check(); err != nil {
		return o, err
	}
	if o.duration < time.Second || o.warmup < 0 || o.load.timeout < time.Second || o.rounds < 1 {
		return o, errors.New("-duration and -request-timeout must be at least 1s, -warmup not negative (wrk counts whole seconds), -rounds at least 1")
	}
	for id := range strings.SplitSeq(scen, ",") {
		i := slices.IndexFunc(scenarios, func(s scenario) bool { return s.id == strings.TrimSpace(id) })
		if i < 0 {
			return o, fmt.Errorf("-scenarios: no scenario %q", id)
		}
		o.scenarios = append(o.scenarios, scenarios[i])
	}
	for t := range strings.SplitSeq(targets, ",") {
		t = strings.TrimSpace(t)
		if !slices.Contains(knownTargets, t) {
			return o, fmt.Errorf("-targets: expected some of %s, got %q", strings.Join(knownTargets, ","), t)
		}
		o.targets = append(o.targets, t)
	}
	// Measure in a fixed order whatever the flag's order: the baseline
	// first, so every ratio refers to a number measured just before.
	slices.SortFunc(o.targets, func(a, b string) int {
		return slices.Index(knownTargets, a) - slices.Index(knownTargets, b)
	})
	o.targets = slices.Compact(o.targets)
	return o, nil
}

// bench holds what one run has set up.
type bench struct {
	opts     options
	log      io.Writer // progress
	dir      string
	procs    *procs
	dbs      map[string]*benchDB // per target on Postgres (onPostgres)
	upstream string              // base URL
	baseline string              // base URL
	hashKey  string
	// redisPrefix starts the keys of every Redis peer of the run.
	redisPrefix string
	notes       []string  // printed under the table
	otlp        *otlpSink // the traced target's collector; nil without it
}

// note records something the reader of the table should know.
func (b *bench) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintln(b.log, "  note:", msg)
	b.notes = append(b.notes, msg)
}

// run performs the whole benchmark and prints the table to stdout. Whatever
// happens, it stops every process it started and drops its database.
func run(ctx context.Context, opts options, stdout, progress io.Writer) (err error) {
	ctx, cancel := context.WithTimeout(ctx, opts.deadline)
	defer cancel()
	defer func() {
		// A killed wrk or a refused connection is only the symptom.
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("stopped (%w): %w", ctx.Err(), err)
		}
	}()
	wrkV, dir, err := prepareRun("sluice-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	b := &bench{opts: opts, log: progress, dir: dir, procs: &procs{dir: dir}, hashKey: randomHex(32), redisPrefix: "sluice-bench-" + randomHex(4) + "-"}
	defer b.procs.stopAll()

	fmt.Fprintln(progress, "building sluice, baseline, Redis peer and upstream…")
	if err := buildAll(ctx, dir); err != nil {
		return err
	}
	if slices.Contains(opts.targets, targetBefore) || slices.Contains(opts.targets, targetBeforePostgres) {
		fmt.Fprintf(progress, "building sluice at %s…\n", opts.before)
		if err := buildBefore(ctx, dir, opts.before); err != nil {
			return err
		}
	}
	if slices.Contains(opts.targets, targetTraced) {
		if b.otlp, err = startOTLPSink(); err != nil {
			return err
		}
		defer b.otlp.stop()
	}

	redisVersion := "Redis not used"
	if slices.Contains(opts.targets, targetRedis) {
		if redisVersion, err = b.checkRedis(ctx); err != nil {
			return err
		}
	}

	pgVersion := "not used"
	for _, t := range opts.targets {
		if !onPostgres(t) {
			continue
		}
		db, drop, err := openBenchDB(ctx, opts.databaseURL, b.procs)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, drop()) }()
		if b.dbs == nil {
			b.dbs = map[string]*benchDB{}
		}
		b.dbs[t] = db
		pgVersion = db.version(ctx)
	}

	if err := b.startHelpers(ctx); err != nil {
		return err
	}

	var results []result
	var bursts []burstResult
	for _, s := range opts.scenarios {
		if s.burst > 0 {
			fmt.Fprintf(progress, "scenario %s: %s\n", s.id, s.title)
			rs, err := b.runBurst(ctx, s)
			if err != nil {
				return fmt.Errorf("scenario %s: %w", s.id, err)
			}
			bursts = append(bursts, rs...)
			continue
		}
		script, err := writeScript(dir, "scenario"+s.id, s.mix)
		if err != nil {
			return err
		}
		fmt.Fprintf(progress, "scenario %s: %s\n", s.id, s.title)
		rs, err := b.runScenario(ctx, s, script)
		if err != nil {
			return fmt.Errorf("scenario %s: %w", s.id, err)
		}
		results = append(results, rs...)
	}

	fmt.Fprintf(stdout, "Machine: %s. Go %s, PostgreSQL %s, %s, %s. Load: %d connections, %d wrk threads; per scenario and target %s warm-up, then %d rounds of %s taken in turns.\n\n",
		machine(), strings.TrimPrefix(runtime.Version(), "go"), pgVersion, redisVersion, wrkV,
		opts.load.connections, opts.load.threads, opts.warmup, opts.rounds, opts.duration)
	if len(results) > 0 {
		writeTable(stdout, results)
	}
	if len(bursts) > 0 {
		fmt.Fprintln(stdout)
		writeBurstTable(stdout, bursts)
	}
	for _, n := range b.notes {
		fmt.Fprintln(stdout, "\nNote:", n)
	}
	return nil
}

// startHelpers starts the upstream and the baseline proxy, which serve
// every scenario.
func (b *bench) startHelpers(ctx context.Context) error {
	lifetime := "-lifetime=" + b.opts.deadline.String()
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	up, err := b.procs.start("upstream", childEnv(), filepath.Join(b.dir, "upstream"), "-listen="+addr, lifetime)
	if err != nil {
		return err
	}
	b.upstream = "http://" + addr
	if err := waitReady(ctx, up, b.upstream+"/"); err != nil {
		return err
	}
	if addr, err = freeAddr(); err != nil {
		return err
	}
	base, err := b.procs.start("baseline", childEnv(), filepath.Join(b.dir, "baseline"), "-listen="+addr, "-upstream="+b.upstream, lifetime)
	if err != nil {
		return err
	}
	b.baseline = "http://" + addr
	return waitReady(ctx, base, b.baseline+benchPath)
}

// buildAll builds sluice, in its own module as users build it, and the
// harness's baseline, Redis peer and upstream, in the harness's module,
// into dir: dir/sluice, dir/baseline, dir/redis and dir/upstream.
func buildAll(ctx context.Context, dir string) error {
	harness, product, err := moduleDirs()
	if err != nil {
		return err
	}
	dest := dir + string(filepath.Separator)
	for _, b := range []struct {
		dir  string
		pkgs []string
	}{
		{product, []string{"."}},
		{harness, []string{"./baseline", "./redis", "./upstream"}},
	} {
		build := proctest.BuildCommand(ctx, b.dir, dest, "", b.pkgs...)
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("go build in %s: %w\n%s", b.dir, err, out)
		}
	}
	return nil
}

// buildBefore builds sluice at the git revision rev into dir/sluice-before:
// the revision's files, from git archive, in a directory of their own.
func buildBefore(ctx context.Context, dir, rev string) error {
	_, product, err := moduleDirs()
	if err != nil {
		return err
	}
	src := filepath.Join(dir, "before-src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return err
	}
	archive := exec.CommandContext(ctx, "git", "-C", product, "archive", "--format=tar", rev)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	var stderr strings.Builder
	archive.Stderr = &stderr
	if err := untar.Start(); err != nil {
		return err
	}
	if err := archive.Run(); err != nil {
		untar.Wait() //nolint:errcheck // the archive's error says more
		return fmt.Errorf("git archive %s: %w: %s", rev, err, stderr.String())
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("untar %s: %w", rev, err)
	}
	build := proctest.BuildCommand(ctx, src, filepath.Join(dir, "sluice-before"), "", ".")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build at %s: %w\n%s", rev, err, out)
	}
	return nil
}

// moduleDirs returns the directory of the harness's go.mod, wherever
// inside that module the harness is started, and that of the sluice it
// measures: the module its go.mod replaces sluice's with (the repository's
// root).
func moduleDirs() (harness, product string, err error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", "", errors.New("run the harness from inside its module (go -C bench run . at the repository's root)")
	}
	harness = filepath.Dir(mod)
	list := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/sluicehq/sluice")
	list.Dir = harness
	if out, err = list.Output(); err != nil {
		return "", "", fmt.Errorf("go list -m github.com/sluicehq/sluice in %s: %w", harness, err)
	}
	return harness, strings.TrimSpace(string(out)), nil
}

// machine describes the CPU the run had, for the README.
func machine() string {
	model := runtime.GOARCH
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%d × %s, %s", runtime.NumCPU(), model, runtime.GOOS)
}

// prepareRun checks that wrk is there and makes the run's directory: it
// returns wrk's version and the directory, which the caller removes.
func prepareRun(prefix string) (wrkV, dir string, err error) {
	if wrkV, err = wrkVersion(); err != nil {
		return "", "", err
	}
	dir, err = os.MkdirTemp("", prefix)
	return wrkV, dir, err
}
