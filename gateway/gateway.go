// Package gateway assembles and runs a sluice gateway, and holds each of
// sluice's commands, which main.go dispatches to.
//
// Assembling a gateway goes settings → store → limiter → listeners →
// lifecycle and reloads, one file each: config.go reads and validates
// every setting (caarlos0/env, one pass, every problem reported);
// backend.go makes the store the settings ask for (memory or Postgres)
// with its breaker and background work; gateway.go puts the limiter, the
// decider, the proxy, forward-auth (check), Envoy's rate limit service
// (check/rls) and the admin handler together and runs their listeners
// until the context ends; tls.go reads the TLS files; reload.go puts a new
// rules file and new TLS files in force on SIGHUP. The
// commands are serve.go (the gateway), migrate.go, checkconfig.go,
// version.go, healthcheck.go, demoupstream.go and help.go.
//
// It is the one package that knows every other: it may import any of
// sluice's packages but the test support under internal/ (pgtest,
// proctest), and none may import it but main and the tests that start a
// gateway in-process (faults).
package gateway

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/admin"
	"github.com/sluicehq/sluice/check"
	"github.com/sluicehq/sluice/check/rls"
	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/jwt"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/telemetry"
)

// shutdownGrace bounds how long in-flight requests may take to finish after
// SIGTERM before connections are closed.
const shutdownGrace = 25 * time.Second

// Options are what the program that runs a gateway adds to the settings;
// none of them is a setting. The zero value is what the sluice binary
// runs with but its Stamp.
type Options struct {
	// Stamp is the version and commit linked into the binary (see
	// Stamp); sluice_build_info carries them.
	Stamp Stamp
	// Logger receives the gateway's log lines. Nil means the logger the
	// settings describe (SLUICE_LOG_LEVEL, SLUICE_LOG_FORMAT,
	// SLUICE_ACCESS_LOG), writing to stderr.
	Logger *zap.Logger
	// Wrap, when not nil, wraps the public listener's handler: middleware
	// of the program that embeds the gateway, such as a measurement of the
	// time each request spends inside it. The admin listener is not
	// wrapped.
	Wrap func(http.Handler) http.Handler
	// Listening, when not nil, is told the address of each listener that
	// Run opens (the admin one it is given included) as soon as it
	// accepts, with the setting that names it (SLUICE_ADMIN_LISTEN,
	// SLUICE_LISTEN, SLUICE_CHECK_LISTEN, SLUICE_RLS_LISTEN): how a
	// program that asked for port 0 learns the port the kernel chose.
	Listening func(setting string, addr net.Addr)
}

// Gateway is one sluice: the public proxy, the admin listener and the
// store's background work. Several may run in one process, each with a
// store of its own.
type Gateway struct {
	cfg      *config
	log      *zap.Logger
	public   *http.Server // nil without SLUICE_UPSTREAM
	check    *http.Server // nil without SLUICE_CHECK_LISTEN
	rls      *rls.Server  // nil without SLUICE_RLS_LISTEN
	admin    *http.Server
	backend  *backend
	dec      *proxy.Decider
	metrics  *proxy.Metrics
	registry prometheus.Gatherer    // sluice's metrics, and the runtime's
	reloads  *prometheus.CounterVec // sluice_rules_reloads_total
	tlsLoads *prometheus.CounterVec // sluice_tls_reloads_total
	jwt      *jwt.Verifier          // nil without SLUICE_JWT_* keys
	runners  []func(context.Context)
	tracing  *telemetry.Tracing // nil: tracing is off
	// listeningHook is Options.Listening.
	listeningHook func(setting string, addr net.Addr)
}

// New reads the settings from environ, validates them in one pass (the
// error lists every problem) and assembles a gateway from them. It waits
// for nothing: the store becomes ready in the background once Run runs.
// A gateway New returns is meant to be run, once: Run releases its store
// (the Postgres store's connection pool) when it returns.
func New(environ map[string]string, opts Options) (*Gateway, error) {
	cfg, err := load(environ)
	if err != nil {
		return nil, err
	}
	return newGateway(cfg, opts)
}

// newGateway wires a gateway from a validated configuration. It does not
// wait for the database: the store becomes ready in the background.
func newGateway(cfg *config, opts Options) (*Gateway, error) {
	log := opts.Logger
	if log == nil {
		log = newLogger(cfg)
	}
	g := &Gateway{cfg: cfg, log: log, listeningHook: opts.Listening}
	// reg holds sluice's own metrics, which the console's stats read
	// every second; the Go runtime's and the process's, which cost more to
	// read, are only scraped.
	reg := prometheus.NewRegistry()
	runtimeReg := prometheus.NewRegistry()
	g.registry = prometheus.Gatherers{reg, runtimeReg}
	runtimeReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(buildInfoCollector(opts.Stamp))
	stats := admin.NewStats(admin.StatsConfig{Gatherer: reg})
	// The baseline, before any metric exists: Run may start after the
	// listeners have decided requests, whose decisions must count.
	stats.Sample()
	g.runners = append(g.runners, stats.Run)

	hashKey := []byte(cfg.HashKey)
	if cfg.hashKeyDerived {
		// Nothing outlives this process on the memory store, so a random
		// key loses nothing and keeps identifiers unguessable in memory.
		hashKey = make([]byte, 32)
		rand.Read(hashKey)
	}
	hasher, err := hashing.New(hashKey)
	if err != nil {
		return nil, err
	}

	// The verifier's metrics exist without keys too (tokens 0, age 0), so
	// that dashboards and alerts find their series on every gateway.
	jwtMetrics := jwt.NewMetrics(reg)
	var tokens proxy.TokenVerifier // a nil interface without keys, not a nil *jwt.Verifier
	if cfg.jwt != nil {
		jc := cfg.jwtConfig
		jc.Logger, jc.Metrics = log.Named("jwt"), jwtMetrics
		if g.jwt, err = jwt.New(jc); err != nil {
			return nil, err
		}
		tokens = g.jwt
		if cfg.JWTJWKSURL != "" {
			g.runners = append(g.runners, g.jwt.Run)
		}
	}

	metrics := limiter.NewMetrics(reg)
	// The store tells the limiter's fast path of resets and override
	// changes; the limiter needs the store first, and no event comes
	// before the gateway serves.
	var lim *limiter.Limiter
	forget := func(rule, key string, at time.Time) { lim.Forget(rule, key, at) }
	be, err := newBackend(cfg, log, metrics, forget)
	if err != nil {
		return nil, err
	}
	g.backend = be
	g.runners = append(g.runners, be.run)
	reg.MustRegister(be.collectors...)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_store_ready",
		Help: "1 when the store decides (its circuit breaker is closed), 0 while it is not ready.",
	}, func() float64 {
		if be.ready() != nil {
			return 0
		}
		return 1
	}))

	local := memory.New(memory.Options{MaxKeys: cfg.MemoryMaxKeys})
	g.runners = append(g.runners, local.Run)
	reg.MustRegister(local.Collectors("local")...)
	var breaker limiter.Breaker
	if be.breaker != nil {
		breaker = be.breaker
	}
	// Tracing only when an OTLP endpoint is set: otherwise nothing is
	// wrapped and no span is made, so a request costs what it did before.
	g.tracing, err = telemetry.New(context.Background(), cfg.tracing, currentBuild(opts.Stamp).Version)
	if err != nil {
		be.close()
		return nil, err
	}
	var tracer trace.Tracer
	var transport http.RoundTripper = proxy.NewTransport(cfg.timeouts.Upstream)
	if g.tracing != nil {
		tracer = g.tracing.Tracer()
		transport = g.tracing.Transport(transport)
	}
	lim, err = limiter.New(limiter.Config{
		Store:       be.store,
		Local:       local,
		Timeout:     cfg.DBTimeout,
		DefaultFail: cfg.failMode,
		CacheSize:   orOff(cfg.LocalCacheSize),
		Metrics:     metrics,
		Logger:      log,
		Breaker:     breaker,
		Denied:      stats.Limited,
		Tracer:      tracer,
	})
	if err != nil {
		be.close()
		return nil, err
	}
	var accessLog *zap.Logger
	if cfg.AccessLog {
		accessLog = log.Named(accessLoggerName)
	}
	g.metrics = proxy.NewMetrics(reg)
	dec, err := proxy.NewDecider(proxy.DeciderConfig{
		Policy:    cfg.policy,
		Limiter:   lim,
		Hasher:    hasher,
		Trusted:   cfg.trusted,
		Headers:   cfg.headers,
		Metrics:   g.metrics,
		AccessLog: accessLog,
		JWT:       tokens,

		RejectInvalidTokens: cfg.JWTInvalid == "reject",
	})
	if err != nil {
		be.close()
		return nil, err
	}
	g.dec = dec
	g.reloads = newReloadsCounter(reg, "sluice_rules_reloads_total",
		"Reloads of SLUICE_RULES_FILE (on SIGHUP) by result: ok (the new rules are in force) or error (refused; the running rules stay).")
	if cfg.certs != nil {
		g.tlsLoads = newTLSCollectors(reg, cfg.certs)
	}
	// traced wraps a listener's handler in a server span per request when
	// tracing is on; off, it is the handler itself.
	traced := func(h http.Handler) http.Handler {
		if g.tracing != nil {
			return g.tracing.Handler(h)
		}
		return h
	}
	if cfg.public() {
		px, err := proxy.New(proxy.Config{
			Upstream:     cfg.upstream,
			Routes:       cfg.routes,
			Decider:      dec,
			MaxBodyBytes: cfg.MaxBodyBytes,
			Transport:    transport,
			Logger:       log,
			UsagePath:    cfg.UsagePath,
			Usage:        be.keys,
		})
		if err != nil {
			be.close()
			return nil, err
		}
		public := traced(px)
		if opts.Wrap != nil {
			public = opts.Wrap(public)
		}
		g.public = proxy.NewServer(public, cfg.timeouts)
		g.public.ErrorLog = zap.NewStdLog(log)
	}
	if cfg.CheckListen != "" {
		h, err := check.New(dec)
		if err != nil {
			be.close()
			return nil, err
		}
		// Answers are small: like the admin listener's, their writes are
		// bounded even when SLUICE_WRITE_TIMEOUT does not bound the proxy's.
		g.check = proxy.NewServer(traced(h), adminTimeouts(cfg.timeouts))
		g.check.ErrorLog = zap.NewStdLog(log)
	}
	if cfg.RLSListen != "" {
		var tlsCfg *tls.Config
		if cfg.certs != nil {
			tlsCfg = cfg.certs.serverConfig("h2")
		}
		if g.rls, err = rls.New(rls.Config{Decider: dec, TLS: tlsCfg}); err != nil {
			be.close()
			return nil, err
		}
	}
	if (cfg.CheckListen != "" || cfg.RLSListen != "") && cfg.TrustedProxies == "" {
		log.Warn("SLUICE_TRUSTED_PROXIES is empty: X-Forwarded-For from the proxies that ask SLUICE_CHECK_LISTEN is not believed, so every client of one proxy counts as that proxy's address under by-ip rules")
	}
	adminCfg := admin.Config{
		Policy: dec.Policy, Ready: be.ready, Gatherer: g.registry,
		Keys: be.keys, Hasher: hasher, Token: cfg.AdminToken, JWTIssuer: cfg.JWTIssuer,
		Stats: stats, StoreKind: "memory",
	}
	if be.pool != nil {
		adminCfg.StoreKind = "postgres"
	}
	if be.breaker != nil {
		adminCfg.Breaker = be.breaker.State
	}
	g.admin = proxy.NewServer(admin.NewHandler(adminCfg), adminTimeouts(cfg.timeouts))
	g.admin.ErrorLog = zap.NewStdLog(log)
	return g, nil
}

// adminTimeouts are the admin listener's: the public listener's, but with
// a write limit even when SLUICE_WRITE_TIMEOUT has none, since nothing
// there streams and a client that never reads must not hold a connection.
func adminTimeouts(t proxy.Timeouts) proxy.Timeouts {
	if t.Write == 0 {
		t.Write = adminWriteTimeout
	}
	return t
}

// adminWriteTimeout bounds an admin response when SLUICE_WRITE_TIMEOUT
// does not.
const adminWriteTimeout = 60 * time.Second

// Run runs the gateway until ctx is cancelled, serving the admin listener
// on admin, the public listener (when there is an upstream) on what
// openPublic opens, and the check and gRPC listeners, when they are set,
// on SLUICE_CHECK_LISTEN and SLUICE_RLS_LISTEN. The admin listener serves
// at once (health, readiness, metrics); the others are opened only once
// the store is ready, so that the first requests after a start are
// decided exactly, or after SLUICE_START_TIMEOUT, when they open anyway
// and the fail modes decide until the store is ready. Within the same
// deadline it waits for the first fetch of SLUICE_JWT_JWKS_URL (see
// waitKeys). On cancellation it stops accepting, lets in-flight requests
// finish (bounded by shutdownGrace) and stops the background work, the
// key set's refresh included. SIGHUP reloads the rules, the JWKS file and
// the TLS files (see reload) and never stops it. Run is called once: it
// releases the store when it returns.
func (g *Gateway) Run(ctx context.Context, admin net.Listener, openPublic func() (net.Listener, error)) error {
	defer g.backend.close()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, r := range g.runners {
		wg.Go(func() { r(bg) })
	}
	defer func() { stopBG(); wg.Wait() }()

	// The listeners answer the requests net/http refuses by itself with
	// problem+json too (over plain HTTP: see serveHTTP); the public one
	// counts them among its responses.
	admin = proxy.ProblemListener(admin, nil)
	errc := make(chan error, 4)
	go func() { errc <- g.admin.Serve(admin) }()
	g.listening("SLUICE_ADMIN_LISTEN", admin.Addr())

	began := time.Now()
	ready := g.backend.waitReady(ctx, g.cfg.StartTimeout)
	if ctx.Err() != nil {
		return errors.Join(g.admin.Close())
	}
	if !ready {
		g.log.Warn("the store is not ready after SLUICE_START_TIMEOUT: opening the listeners anyway; rules apply their fail modes until it is",
			zap.Duration("start_timeout", g.cfg.StartTimeout))
	}
	keys := g.waitKeys(ctx, began.Add(g.cfg.StartTimeout))
	if ctx.Err() != nil {
		return errors.Join(g.admin.Close())
	}
	if !keys {
		g.log.Warn("no JWK set from SLUICE_JWT_JWKS_URL yet: opening the listeners anyway; jwt rules count by client IP, and plans give their rules' own limits, until one is fetched",
			zap.Duration("start_timeout", g.cfg.StartTimeout))
	}
	fields, err := g.serveDeciding(openPublic, errc)
	if err != nil {
		g.closeAll()
		return err
	}
	g.log.Info("sluice started", append(append(g.backend.desc, fields...),
		zap.String("admin_listen", admin.Addr().String()),
		zap.Bool("tls", g.cfg.certs != nil),
		zap.Int("rules", g.dec.Policy().Len()),
		zap.Bool("store_ready", ready),
		zap.String("tracing", g.tracingDesc()),
		zap.Bool("jwks_ready", keys),
		zap.Duration("after", time.Since(began)))...)

wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case err = <-errc:
			err = fmt.Errorf("listener stopped: %w", err)
			break wait
		case <-hup:
			g.reload()
		}
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	// In-flight requests finish their decisions and upstream calls on
	// their own contexts; Shutdown waits for them.
	var stops []error
	if g.public != nil {
		stops = append(stops, g.public.Shutdown(shutdownCtx))
	}
	if g.check != nil {
		stops = append(stops, g.check.Shutdown(shutdownCtx))
	}
	if g.rls != nil {
		stops = append(stops, g.rls.Shutdown(shutdownCtx))
	}
	err = errors.Join(err, errors.Join(stops...), g.admin.Shutdown(shutdownCtx))
	if g.tracing != nil {
		// The spans of the last requests are still to be sent.
		traceCtx, cancel := context.WithTimeout(context.Background(), telemetry.ShutdownTimeout)
		if terr := g.tracing.Shutdown(traceCtx); terr != nil {
			g.log.Warn("tracing: the last spans could not be sent", zap.Error(terr))
		}
		cancel()
	}
	g.log.Info("sluice stopped")
	return err
}

// serveDeciding opens the listeners that decide — the public one (through
// openPublic), the check and the gRPC ones — and serves each, sending
// what Serve returns to errc. It returns their addresses as log fields.
func (g *Gateway) serveDeciding(openPublic func() (net.Listener, error), errc chan<- error) ([]zap.Field, error) {
	listenTCP := func(addr string) func() (net.Listener, error) {
		return func() (net.Listener, error) { return net.Listen("tcp", addr) }
	}
	var fields []zap.Field
	for _, d := range []struct {
		on           bool
		setting, key string // the listener's setting, and its field in the start-up line
		open         func() (net.Listener, error)
		serve        func(net.Listener)
	}{
		{g.public != nil, "SLUICE_LISTEN", "listen", openPublic,
			func(l net.Listener) { g.serveHTTP(g.public, l, g.metrics.CountResponse, errc) }},
		{g.check != nil, "SLUICE_CHECK_LISTEN", "check_listen", listenTCP(g.cfg.CheckListen),
			func(l net.Listener) { g.serveHTTP(g.check, l, nil, errc) }},
		{g.rls != nil, "SLUICE_RLS_LISTEN", "rls_listen", listenTCP(g.cfg.RLSListen),
			func(l net.Listener) { go func() { errc <- g.rls.Serve(l) }() }},
	} {
		if !d.on {
			continue
		}
		l, err := d.open()
		if err != nil {
			return nil, fmt.Errorf("listen on %s: %w", d.setting, err)
		}
		d.serve(l)
		g.listening(d.setting, l.Addr())
		fields = append(fields, zap.String(d.key, l.Addr().String()))
	}
	return fields, nil
}

// listening tells Options.Listening, when set, and the log that the
// listener setting names accepts at addr. The log line is how a parent
// process that gave a listener port 0 learns its port before the store
// is ready (the public one's arrives with "sluice started").
func (g *Gateway) listening(setting string, addr net.Addr) {
	if g.listeningHook != nil {
		g.listeningHook(setting, addr)
	}
	if setting == "SLUICE_ADMIN_LISTEN" {
		g.log.Info("admin listener open", zap.String("admin_listen", addr.String()))
	}
}

// serveHTTP serves srv on l: over TLS when the TLS files are set, with
// HTTP/2 offered beside HTTP/1.1; in plain HTTP, the answers net/http
// gives by itself to requests that do not parse become problem+json (and
// onStatus, when not nil, is told their status). Over TLS they stay
// net/http's plain text: rewriting them needs the bytes after
// encryption, and a wrapped connection would hide the TLS state (and
// HTTP/2) from net/http.
func (g *Gateway) serveHTTP(srv *http.Server, l net.Listener, onStatus func(int), errc chan<- error) {
	if g.cfg.certs != nil {
		l = tls.NewListener(l, g.cfg.certs.serverConfig("h2", "http/1.1"))
	} else {
		l = proxy.ProblemListener(l, onStatus)
	}
	go func() { errc <- srv.Serve(l) }()
}

// closeAll closes every listener at once, after a start that failed.
func (g *Gateway) closeAll() {
	g.admin.Close()
	if g.public != nil {
		g.public.Close()
	}
	if g.check != nil {
		g.check.Close()
	}
	if g.rls != nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		g.rls.Shutdown(ctx) //nolint:errcheck // stopping at once is the point
	}
}

// tracingDesc says whether tracing is on, for the start-up line.
func (g *Gateway) tracingDesc() string {
	if g.tracing == nil {
		return "off"
	}
	return g.cfg.tracing.Describe()
}

// waitKeys waits, until deadline, for the first fetch of
// SLUICE_JWT_JWKS_URL to end (Run started it), so that tokens verify from
// the first request on. It reports whether a key set is in force: true
// without a JWKS URL, false when the fetch failed (the verifier logged and
// counted why) or had not ended by the deadline; either way the verifier
// goes on trying in the background, and start-up waits no longer.
func (g *Gateway) waitKeys(ctx context.Context, deadline time.Time) bool {
	if g.jwt == nil || g.cfg.JWTJWKSURL == "" {
		return true
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-g.jwt.FirstFetch():
	case <-t.C:
	case <-ctx.Done():
	}
	return g.jwt.HasKeySet()
}

// Ready reports whether the gateway's store decides: nil, or why not. It
// is what /readyz answers: nil while the store's circuit breaker is
// closed; the memory store is always ready.
func (g *Gateway) Ready() error { return g.backend.ready() }

// Metrics gathers the gateway's metrics, as /metrics serves them.
func (g *Gateway) Metrics() prometheus.Gatherer { return g.registry }
