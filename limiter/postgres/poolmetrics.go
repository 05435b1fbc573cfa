package postgres

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// PoolCollector exports the statistics of a pgx pool, read at every
// scrape:
//
//   - sluice_db_pool_connections{state}: connections by state: acquired
//     (in use), idle, constructing (being opened).
//   - sluice_db_pool_max_connections: the pool's bound (pool_max_conns).
//   - sluice_db_pool_empty_acquire_total: acquires that found no idle
//     connection and had to wait for one to be opened or released.
//   - sluice_db_pool_empty_acquire_wait_seconds_total: the time those
//     acquires waited.
//
// Acquired connections near the maximum with a growing wait time mean the
// pool, not the database, is what decisions wait for.
type PoolCollector struct {
	pool                              *pgxpool.Pool
	conns, max, emptyAcquire, waiting *prometheus.Desc
}

var _ prometheus.Collector = (*PoolCollector)(nil)

// NewPoolCollector returns the collector of pool's statistics.
func NewPoolCollector(pool *pgxpool.Pool) *PoolCollector {
	return &PoolCollector{
		pool: pool,
		conns: prometheus.NewDesc("sluice_db_pool_connections",
			"Connections of the database pool, by state: acquired, idle, constructing.", []string{"state"}, nil),
		max: prometheus.NewDesc("sluice_db_pool_max_connections",
			"Most connections the database pool opens.", nil, nil),
		emptyAcquire: prometheus.NewDesc("sluice_db_pool_empty_acquire_total",
			"Acquires of a database connection that found none idle and waited.", nil, nil),
		waiting: prometheus.NewDesc("sluice_db_pool_empty_acquire_wait_seconds_total",
			"Time the acquires that found no idle connection waited.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.conns
	ch <- c.max
	ch <- c.emptyAcquire
	ch <- c.waiting
}

// Collect implements prometheus.Collector.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.AcquiredConns()), "acquired")
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.IdleConns()), "idle")
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.ConstructingConns()), "constructing")
	ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(s.MaxConns()))
	ch <- prometheus.MustNewConstMetric(c.emptyAcquire, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.CounterValue, s.EmptyAcquireWaitTime().Seconds())
}
