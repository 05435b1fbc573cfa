package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/admin"
	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/proxy"
)

// shutdownGrace bounds how long in-flight requests may take to finish after
// SIGTERM before connections are closed.
const shutdownGrace = 25 * time.Second

// gateway is one running sluice: the public proxy, the admin listener and
// the store's background work. Tests start several in one process.
type gateway struct {
	cfg     *config
	log     *zap.Logger
	public  *http.Server
	admin   *http.Server
	backend *backend
	proxy   *proxy.Proxy
	metrics *proxy.Metrics
	reloads *prometheus.CounterVec // sluice_rules_reloads_total
	runners []func(context.Context)
}

// newGateway wires a gateway from a validated configuration. It does not
// wait for the database: the store becomes ready in the background.
func newGateway(cfg *config, log *zap.Logger) (*gateway, error) {
	g := &gateway{cfg: cfg, log: log}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(buildInfoCollector())

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
	lim, err = limiter.New(limiter.Config{
		Store:       be.store,
		Local:       local,
		Timeout:     cfg.DBTimeout,
		DefaultFail: cfg.failMode,
		CacheSize:   orOff(cfg.LocalCacheSize),
		Metrics:     metrics,
		Logger:      log,
		Breaker:     breaker,
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
	px, err := proxy.New(proxy.Config{
		Upstream:     cfg.upstream,
		Routes:       cfg.routes,
		Policy:       cfg.policy,
		Limiter:      lim,
		Hasher:       hasher,
		Trusted:      cfg.trusted,
		MaxBodyBytes: cfg.MaxBodyBytes,
		Headers:      cfg.headers,
		Transport:    proxy.NewTransport(cfg.timeouts.Upstream),
		Logger:       log,
		Metrics:      g.metrics,
		AccessLog:    accessLog,
	})
	if err != nil {
		be.close()
		return nil, err
	}
	g.proxy = px
	g.reloads = newReloadsCounter(reg)
	g.public = proxy.NewServer(px, cfg.timeouts)
	g.public.ErrorLog = zap.NewStdLog(log)
	g.admin = proxy.NewServer(admin.NewHandler(admin.Config{
		Policy: px.Policy, Ready: be.ready, Gatherer: reg,
		Keys: be.keys, Hasher: hasher, Token: cfg.AdminToken,
	}), adminTimeouts(cfg.timeouts))
	g.admin.ErrorLog = g.public.ErrorLog
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

// serve runs the gateway until ctx is cancelled. The admin listener serves
// at once (health, readiness, metrics); the public listener is opened with
// openPublic only once the store is ready, so that the first requests
// after a start are decided exactly, or after SLUICE_START_TIMEOUT, when it
// opens anyway and the fail modes decide until the store is ready. On
// cancellation it stops accepting, lets in-flight requests finish (bounded
// by shutdownGrace) and stops the background work. SIGHUP reloads the
// rules (see reload) and never stops it.
func (g *gateway) serve(ctx context.Context, openPublic func() (net.Listener, error), admin net.Listener) error {
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

	// Both listeners answer the requests net/http refuses by itself with
	// problem+json too; the public one counts them among its responses.
	admin = proxy.ProblemListener(admin, nil)
	errc := make(chan error, 2)
	go func() { errc <- g.admin.Serve(admin) }()

	began := time.Now()
	ready := g.backend.waitReady(ctx, g.cfg.StartTimeout)
	if ctx.Err() != nil {
		return errors.Join(g.admin.Close())
	}
	if !ready {
		g.log.Warn("the store is not ready after SLUICE_START_TIMEOUT: opening the public listener anyway; rules apply their fail modes until it is",
			zap.Duration("start_timeout", g.cfg.StartTimeout))
	}
	public, err := openPublic()
	if err != nil {
		g.admin.Close()
		return fmt.Errorf("listen on SLUICE_LISTEN: %w", err)
	}
	public = proxy.ProblemListener(public, g.metrics.CountResponse)
	go func() { errc <- g.public.Serve(public) }()
	g.log.Info("sluice started", append(g.backend.desc,
		zap.String("listen", public.Addr().String()),
		zap.String("admin_listen", admin.Addr().String()),
		zap.Int("rules", len(g.cfg.policy.Rules())),
		zap.Bool("store_ready", ready),
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
			g.reload() //nolint:errcheck // reload logs and counts its own failure
		}
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	// In-flight requests finish their decisions and upstream calls on
	// their own contexts; Shutdown waits for them.
	err = errors.Join(err, g.public.Shutdown(shutdownCtx), g.admin.Shutdown(shutdownCtx))
	g.log.Info("sluice stopped")
	return err
}

// serve listens on the configured addresses and serves until ctx ends.
func serve(ctx context.Context, cfg *config) error {
	log, err := newLogger(cfg)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // nothing useful to do at exit
	g, err := newGateway(cfg, log)
	if err != nil {
		return err
	}
	admin, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		g.backend.close()
		return fmt.Errorf("listen on SLUICE_ADMIN_LISTEN: %w", err)
	}
	return g.serve(ctx, func() (net.Listener, error) { return net.Listen("tcp", cfg.Listen) }, admin)
}

// applyMigrations brings the schema up to date.
func applyMigrations(ctx context.Context, pool *pgxpool.Pool, schema string) (int, error) {
	n, err := postgres.Migrate(ctx, pool, schema)
	if err != nil {
		return n, fmt.Errorf("migrate schema %s: %w", schema, err)
	}
	return n, nil
}

// newLogger builds the zap logger from SLUICE_LOG_LEVEL, SLUICE_LOG_FORMAT
// and SLUICE_ACCESS_LOG, writing to stderr.
func newLogger(cfg *config) (*zap.Logger, error) {
	return buildLogger(cfg, zapcore.Lock(os.Stderr)), nil
}

// buildLogger is newLogger writing to out. It is zap's production logger
// (JSON, sampled: of the lines with one level and message, the first 100
// of each second and every 100th after them), or its development logger
// for SLUICE_LOG_FORMAT=console, at SLUICE_LOG_LEVEL. The access log's
// lines (logger "access") are written whatever the level and never
// sampled: they all share one message, and an access log that keeps one
// line in a hundred is no access log.
func buildLogger(cfg *config, out zapcore.WriteSyncer) *zap.Logger {
	encCfg := zap.NewProductionEncoderConfig()
	stackAt := zapcore.ErrorLevel
	if cfg.LogFormat == "console" {
		encCfg = zap.NewDevelopmentEncoderConfig()
		stackAt = zapcore.WarnLevel
	}
	encCfg.TimeKey = "time"
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	enc := zapcore.NewJSONEncoder(encCfg)
	if cfg.LogFormat == "console" {
		enc = zapcore.NewConsoleEncoder(encCfg)
	}
	core := zapcore.NewCore(enc, out, zap.NewAtomicLevelAt(cfg.logLevel))
	opts := []zap.Option{zap.AddCaller(), zap.ErrorOutput(zapcore.Lock(os.Stderr))}
	if cfg.LogFormat == "console" {
		opts = append(opts, zap.Development())
	} else {
		core = zapcore.NewSamplerWithOptions(core, time.Second, 100, 100)
	}
	if cfg.logLevel <= zapcore.DebugLevel {
		opts = append(opts, zap.AddStacktrace(stackAt))
	}
	if cfg.AccessLog {
		core = accessSplit{rest: core, access: zapcore.NewCore(enc.Clone(), out, zapcore.InfoLevel)}
	}
	return zap.New(core, opts...)
}

// accessLoggerName is the name of the access log's logger.
const accessLoggerName = "access"

// accessSplit sends the entries of the access logger to access and every
// other entry to rest.
type accessSplit struct{ rest, access zapcore.Core }

func (c accessSplit) Enabled(l zapcore.Level) bool {
	return c.rest.Enabled(l) || c.access.Enabled(l)
}

func (c accessSplit) With(fields []zapcore.Field) zapcore.Core {
	return accessSplit{rest: c.rest.With(fields), access: c.access.With(fields)}
}

func (c accessSplit) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.LoggerName == accessLoggerName {
		return c.access.Check(e, ce)
	}
	return c.rest.Check(e, ce)
}

// Write is never called: Check hands each entry to the core that writes
// it. It writes to rest should a caller write directly.
func (c accessSplit) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.rest.Write(e, fields)
}

func (c accessSplit) Sync() error {
	return errors.Join(c.rest.Sync(), c.access.Sync())
}
