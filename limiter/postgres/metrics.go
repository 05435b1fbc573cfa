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

// Collectors returns Prometheus metrics of the Store's statements, for the
// gateway to register: sluice_db_decisions_total (decisions sent to the
// database), sluice_db_decide_statements_total (decide statements, retries
// included; their ratio is the transactions per decision) and
// sluice_db_queued_decisions (decisions waiting for a statement now) and
// sluice_db_progress_questions_total (questions about statements past
// their deadline; see progress.go).
func (s *Store) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_db_decisions_total",
			Help: "Decisions sent to the database.",
		}, func() float64 { return float64(s.nDecisions.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_db_decide_statements_total",
			Help: "Decide statements (transactions) sent for them, retries included.",
		}, func() float64 { return float64(s.nStatements.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_db_queued_decisions",
			Help: "Decisions waiting for a statement while others are in flight.",
		}, func() float64 { return float64(s.BatchStats().Queued) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_db_progress_questions_total",
			Help: "Questions asked of the database about decide statements past their deadline: is it making progress on them?",
		}, func() float64 { return float64(s.nQuestions.Load()) }),
	}
}

// LeaseStats describe a Store's leases (see lease.go).
type LeaseStats struct {
	// Local counts the decisions answered from leases, without the
	// database, since New.
	Local uint64
	// Grants counts the grants of leased units, and UnitsGranted their
	// units; UnitsReturned the unspent units given back.
	Grants, UnitsGranted, UnitsReturned uint64
	// ReturnsLost counts leases whose return could not be sent or may not
	// have been applied: their units stay counted until their windows end.
	ReturnsLost uint64
	// RecallWaits counts the provisional denials (other gateways held units
	// of a counter) asked again once the recalled units were back.
	RecallWaits uint64
	// Counters is the number of counters with lease state now, and
	// UnitsHeld the units they hold unspent.
	Counters, UnitsHeld int64
}

// LeaseStats returns the store's lease counters; zero without leases.
func (s *Store) LeaseStats() LeaseStats {
	t := s.leases
	if t == nil {
		return LeaseStats{}
	}
	return LeaseStats{
		Local: t.local.Load(), Grants: t.grants.Load(), UnitsGranted: t.unitsGranted.Load(),
		UnitsReturned: t.unitsReturned.Load(), ReturnsLost: t.returnsLost.Load(),
		RecallWaits: s.recalled.Load(), Counters: t.n.Load(), UnitsHeld: t.held.Load(),
	}
}

// LeaseCollectors returns Prometheus metrics of the store's leases:
// sluice_lease_decisions_total (decisions answered from leased units,
// without the database), sluice_lease_grants_total and
// sluice_lease_units_granted_total, sluice_lease_units_returned_total,
// sluice_lease_recall_waits_total (provisional denials asked again once
// recalled units were back), sluice_lease_returns_lost_total,
// sluice_lease_counters and sluice_lease_units_held.
func (s *Store) LeaseCollectors() []prometheus.Collector {
	var cs []prometheus.Collector
	for _, c := range []struct {
		name, help string
		value      func(LeaseStats) uint64
	}{
		{"sluice_lease_decisions_total", "Decisions answered from leased units, without the database.", func(st LeaseStats) uint64 { return st.Local }},
		{"sluice_lease_grants_total", "Grants of leased units.", func(st LeaseStats) uint64 { return st.Grants }},
		{"sluice_lease_units_granted_total", "Units granted on leases.", func(st LeaseStats) uint64 { return st.UnitsGranted }},
		{"sluice_lease_units_returned_total", "Leased units given back unspent.", func(st LeaseStats) uint64 { return st.UnitsReturned }},
		{"sluice_lease_recall_waits_total", "Times a decision denied while other gateways held units of its counter waited for them to be given back and asked again.", func(st LeaseStats) uint64 { return st.RecallWaits }},
		{"sluice_lease_returns_lost_total", "Leases whose unspent units could not be given back; they stay counted until their windows end.", func(st LeaseStats) uint64 { return st.ReturnsLost }},
	} {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help},
			func() float64 { return float64(c.value(s.LeaseStats())) }))
	}
	gauge := func(name, help string, f func(LeaseStats) int64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return float64(f(s.LeaseStats())) })
	}
	return append(cs,
		gauge("sluice_lease_counters", "Counters this gateway keeps lease state for.",
			func(st LeaseStats) int64 { return st.Counters }),
		gauge("sluice_lease_units_held", "Leased units this gateway holds unspent.",
			func(st LeaseStats) int64 { return st.UnitsHeld }))
}
