package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/proxy"
)

// shutdownGrace bounds how long in-flight requests may take to finish after
// SIGTERM before connections are closed.
const shutdownGrace = 25 * time.Second

// keyEventPoll is how often each instance looks for keys reset or
// re-limited elsewhere.
const keyEventPoll = time.Second

// memorySweepInterval is how often the memory store drops expired counters.
const memorySweepInterval = 10 * time.Second

// gateway is one running sluice: the public proxy, the admin listener and
// the store's background work. Tests start several in one process.
type gateway struct {
	cfg     *config
	log     *zap.Logger
	public  *http.Server
	admin   *http.Server
	pool    *pgxpool.Pool // nil on the memory store
	runners []func(context.Context)
}

// newGateway wires a gateway from a validated configuration.
func newGateway(ctx context.Context, cfg *config, log *zap.Logger) (*gateway, error) {
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

	var (
		store  limiter.Store
		pinger proxy.Pinger
		keys   proxy.KeyStore
	)
	if cfg.databaseURL == "" {
		log.Warn("no database configured: running on the in-memory store; limits are per-instance and not durable")
		mem := memory.New()
		store, keys = mem, memory.Admin{Store: mem}
		g.runners = append(g.runners, func(ctx context.Context) { mem.Run(ctx, memorySweepInterval) })
	} else {
		pool, err := openPool(ctx, cfg)
		if err != nil {
			return nil, err
		}
		g.pool = pool
		if cfg.AutoMigrate {
			if _, err := applyMigrations(ctx, pool, cfg.DBSchema); err != nil {
				pool.Close()
				return nil, err
			}
		}
		pg, err := postgres.New(ctx, pool, postgres.Options{
			Schema:             cfg.DBSchema,
			Logger:             log,
			Unbatched:          !cfg.DBBatch,
			BatchWait:          batchWait(cfg),
			AsynchronousCommit: cfg.DBSyncCommit == "off",
		})
		if err != nil {
			pool.Close()
			return nil, err
		}
		store, pinger, keys = pg, pg, pg
		reg.MustRegister(pg.Collectors()...)
		reg.MustRegister(postgres.NewPoolCollector(pool))
		g.runners = append(g.runners, func(ctx context.Context) {
			if err := pg.Run(ctx); err != nil && ctx.Err() == nil {
				log.Error("store background work stopped", zap.Error(err))
			}
		})
	}

	metrics := limiter.NewMetrics(reg)
	breaker, err := newBreaker(cfg, metrics, log)
	if err != nil {
		g.close()
		return nil, err
	}
	lim, err := limiter.New(limiter.Config{
		Store:       store,
		Local:       memory.New(),
		Timeout:     cfg.DBTimeout,
		DefaultFail: cfg.failMode,
		CacheSize:   cfg.LocalCacheSize,
		Metrics:     metrics,
		Logger:      log,
		Breaker:     breaker,
	})
	if err != nil {
		g.close()
		return nil, err
	}
	if pg, ok := store.(*postgres.Store); ok {
		// An admin reset or override change on any instance clears this
		// instance's fast path for that key within about a second.
		g.runners = append(g.runners, func(ctx context.Context) { pg.WatchKeyEvents(ctx, keyEventPoll, lim.Forget) })
	}
	px, err := proxy.New(proxy.Config{
		Upstream:     cfg.upstream,
		Routes:       cfg.routes,
		Policy:       cfg.policy,
		Limiter:      lim,
		Hasher:       hasher,
		Trusted:      cfg.trusted,
		MaxBodyBytes: cfg.MaxBodyBytes,
		Headers:      cfg.headers,
		Logger:       log,
		Metrics:      proxy.NewMetrics(reg),
	})
	if err != nil {
		g.close()
		return nil, err
	}
	g.public = proxy.NewServer(px)
	g.public.ErrorLog = zap.NewStdLog(log)
	g.admin = proxy.NewServer(proxy.NewAdmin(proxy.AdminConfig{
		Policy: cfg.policy, Store: pinger, Gatherer: reg,
		Keys: keys, Limiter: lim, Hasher: hasher, Token: cfg.AdminToken,
	}))
	g.admin.ErrorLog = g.public.ErrorLog
	return g, nil
}

// newBreaker returns the circuit breaker of the database store, or nil on
// the memory store, which does not fail. Its cool-down is at least twice
// the decision timeout, so that a probe is never presumed lost while it
// may still be waiting for its answer.
func newBreaker(cfg *config, metrics *limiter.Metrics, log *zap.Logger) (limiter.Breaker, error) {
	if cfg.databaseURL == "" {
		return nil, nil
	}
	b, err := limiter.NewBreaker(limiter.BreakerConfig{
		Cooldown: max(limiter.DefaultBreakerCooldown, 2*cfg.DBTimeout),
		Metrics:  metrics,
		Logger:   log.Named("breaker"),
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// serve runs the gateway on the given listeners until ctx is cancelled,
// then stops accepting, lets in-flight requests finish (bounded by
// shutdownGrace) and stops the background work.
func (g *gateway) serve(ctx context.Context, public, admin net.Listener) error {
	defer g.close()
	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, r := range g.runners {
		wg.Go(func() { r(bg) })
	}
	defer func() { stopBG(); wg.Wait() }()

	errc := make(chan error, 2)
	go func() { errc <- g.public.Serve(public) }()
	go func() { errc <- g.admin.Serve(admin) }()
	g.log.Info("sluice started",
		zap.String("listen", public.Addr().String()),
		zap.String("admin_listen", admin.Addr().String()),
		zap.Int("rules", len(g.cfg.policy.Rules())))

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		err = fmt.Errorf("listener stopped: %w", err)
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	// In-flight requests finish their decisions and upstream calls on
	// their own contexts; Shutdown waits for them.
	err = errors.Join(err, g.public.Shutdown(shutdownCtx), g.admin.Shutdown(shutdownCtx))
	g.log.Info("sluice stopped")
	return err
}

func (g *gateway) close() {
	if g.pool != nil {
		g.pool.Close()
	}
}

// serveCmd listens on the configured addresses and serves until ctx ends.
func serve(ctx context.Context, cfg *config) error {
	log, err := newLogger(cfg)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // nothing useful to do at exit
	g, err := newGateway(ctx, cfg, log)
	if err != nil {
		return err
	}
	public, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		g.close()
		return fmt.Errorf("listen on SLUICE_LISTEN: %w", err)
	}
	admin, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		public.Close()
		g.close()
		return fmt.Errorf("listen on SLUICE_ADMIN_LISTEN: %w", err)
	}
	return g.serve(ctx, public, admin)
}

// openPool connects to the configured database and checks it answers.
func openPool(ctx context.Context, cfg *config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.databaseURL)
	if err != nil {
		return nil, errors.New("SLUICE_DATABASE_URL: not a valid Postgres connection string")
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "sluice"
	postgres.ConfigurePool(pc)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return pool, nil
}

// applyMigrations brings the schema up to date.
func applyMigrations(ctx context.Context, pool *pgxpool.Pool, schema string) (int, error) {
	n, err := migrations.Up(ctx, pool, schema)
	if err != nil {
		return n, fmt.Errorf("migrate schema %s: %w", schema, err)
	}
	return n, nil
}

// newLogger builds the zap logger from SLUICE_LOG_LEVEL and SLUICE_LOG_FORMAT.
func newLogger(cfg *config) (*zap.Logger, error) {
	zc := zap.NewProductionConfig()
	if cfg.LogFormat == "console" {
		zc = zap.NewDevelopmentConfig()
	}
	zc.Level = zap.NewAtomicLevelAt(cfg.logLevel)
	zc.EncoderConfig.TimeKey = "time"
	zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	zc.DisableStacktrace = cfg.logLevel > zapcore.DebugLevel
	return zc.Build()
}

// batchWait is the store's BatchWait: SLUICE_DB_BATCH_WAIT, but at most a
// quarter of SLUICE_DB_TIMEOUT, so that gathering never spends the time a
// decision has; 0 turns gathering off.
func batchWait(cfg *config) time.Duration {
	if w := min(cfg.DBBatchWait, cfg.DBTimeout/4); w > 0 {
		return w
	}
	return -1 // the store reads 0 as its default
}
