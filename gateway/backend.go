package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/admin"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/limiter/postgres"
)

// backend is the store the settings ask for, with everything the gateway
// needs of it: the store the limiter decides with, its admin side, its
// circuit breaker (which is its readiness), its background work and its
// metrics. Only newBackend knows which store it is.
type backend struct {
	store limiter.Store
	keys  admin.KeyStore
	// breaker guards the store and says whether it is ready; nil for the
	// memory store, which is always ready.
	breaker *limiter.CircuitBreaker
	// pool is the Postgres store's connection pool; nil on the memory
	// store.
	pool *pgxpool.Pool
	// run does the store's background work until its context ends.
	run        func(ctx context.Context)
	collectors []prometheus.Collector
	close      func()
	// desc names the store for the start-up log line.
	desc []zap.Field
}

// newBackend makes the store of cfg. forget is told of every reset and
// override change (the limiter's Forget); it is called only once the
// gateway serves. Nothing here waits for the database: a Postgres store
// becomes ready in the background (see postgres.Store.Probe).
func newBackend(cfg *config, log *zap.Logger, metrics *limiter.Metrics, forget func(rule, key string, at time.Time)) (*backend, error) {
	if cfg.databaseURL == "" {
		log.Warn("no database configured: running on the in-memory store; limits are per-instance and not durable")
		mem := memory.New(memory.Options{MaxKeys: cfg.MemoryMaxKeys, Forget: forget})
		return &backend{
			store:      mem,
			keys:       mem,
			run:        mem.Run,
			collectors: mem.Collectors("memory"),
			close:      func() {},
			desc:       []zap.Field{zap.String("store", "memory"), zap.Int("memory_max_keys", cfg.MemoryMaxKeys)},
		}, nil
	}

	breaker, err := limiter.NewBreaker(limiter.BreakerConfig{
		StartOpen: true,
		Metrics:   metrics,
		Logger:    log.Named("breaker"),
	})
	if err != nil {
		return nil, err
	}
	opts := postgres.Options{
		Schema:             cfg.DBSchema,
		Migrate:            cfg.AutoMigrate,
		Logger:             log,
		Breaker:            breaker,
		DecisionTimeout:    cfg.DBTimeout,
		Forget:             forget,
		Batching:           batching(cfg),
		BatchWait:          batchWait(cfg),
		AsynchronousCommit: cfg.DBSyncCommit == "off",
		Leasing:            leasing(cfg),
	}
	pool, err := openPool(cfg, &opts)
	if err != nil {
		return nil, err
	}
	pg, err := postgres.New(pool, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &backend{
		store:      pg,
		keys:       pg,
		breaker:    breaker,
		pool:       pool,
		run:        pg.Run,
		collectors: append(append(pg.Collectors(), pg.LeaseCollectors()...), postgres.NewPoolCollector(pool)),
		close:      pool.Close,
		desc:       []zap.Field{zap.String("store", "postgres"), zap.String("schema", cfg.DBSchema)},
	}, nil
}

// ready reports whether the store decides: nil, or why not.
func (b *backend) ready() error {
	if b.breaker == nil || b.breaker.Ready() {
		return nil
	}
	return errNotReady
}

// errNotReady is /readyz's answer while the breaker is not closed.
var errNotReady = errors.New("the store is not ready: its circuit breaker is open until a probe shows the database decides within SLUICE_DB_TIMEOUT (see the log)")

// waitReady waits until the store is ready, ctx is done or timeout has
// passed, and reports whether it is ready.
func (b *backend) waitReady(ctx context.Context, timeout time.Duration) bool {
	if b.breaker == nil {
		return true
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		changed := b.breaker.Changed()
		if b.breaker.Ready() {
			return true
		}
		select {
		case <-changed:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// openPool makes the connection pool of the configured database; with a
// store's opts, set up for that store (postgres.ConfigurePool: warm
// connections only), without them a plain one (for migrations). It
// connects nothing yet.
func openPool(cfg *config, opts *postgres.Options) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.databaseURL)
	if err != nil {
		return nil, errBadDatabaseURL
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "sluice"
	if opts != nil {
		if err := postgres.ConfigurePool(pc, *opts); err != nil {
			return nil, err
		}
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("database pool: %w", err)
	}
	return pool, nil
}

// batching is the store's Batching: SLUICE_DB_BATCH.
func batching(cfg *config) postgres.Batching {
	if cfg.DBBatch {
		return postgres.Batched
	}
	return postgres.Unbatched
}

// leasing is the store's Leasing: SLUICE_DB_LEASES.
func leasing(cfg *config) postgres.Leasing {
	if cfg.DBLeases {
		return postgres.Leased
	}
	return postgres.Unleased
}

// batchWait is the store's BatchWait: SLUICE_DB_BATCH_WAIT, but at most a
// quarter of SLUICE_DB_TIMEOUT, so that gathering never spends the time a
// decision has; 0 turns gathering off.

func batchWait(cfg *config) time.Duration {
	return orOff(min(cfg.DBBatchWait, cfg.DBTimeout/4))
}

// orOff turns a setting whose 0 means off (the environment's convention)
// into an option whose zero means its default (the packages' convention):
// 0, or less, becomes limiter.Off.
func orOff[T ~int | ~int64](v T) T {
	if v <= 0 {
		return limiter.Off
	}
	return v
}
