package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter/postgres"
)

// poolSeries gathers reg into series name (with its state label, if any)
// → value.
func poolSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]float64{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range s.GetLabel() {
				name += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case s.GetGauge() != nil:
				m[name] = s.GetGauge().GetValue()
			case s.GetCounter() != nil:
				m[name] = s.GetCounter().GetValue()
			}
		}
	}
	return m
}

// TestPoolCollector: the collector reports the pool as it is at the
// scrape: connections in use, the bound, and the acquires that waited.
func TestPoolCollector(t *testing.T) {
	pool := pgtest.NewPool(t, pgtest.URL(), 2)
	reg := prometheus.NewPedanticRegistry() // also checks Describe against Collect
	reg.MustRegister(postgres.NewPoolCollector(pool))
	ctx := context.Background()

	c1, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := poolSeries(t, reg)
	for series, want := range map[string]float64{
		"sluice_db_pool_connections{state=acquired}":     2,
		"sluice_db_pool_connections{state=idle}":         0,
		"sluice_db_pool_connections{state=constructing}": 0,
		"sluice_db_pool_max_connections":                 2,
	} {
		if got, ok := m[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	before := m["sluice_db_pool_empty_acquire_total"]
	waitedBefore := m["sluice_db_pool_empty_acquire_wait_seconds_total"]

	// A third acquire finds the pool exhausted and waits until c1 is
	// released.
	const hold = 100 * time.Millisecond
	got := make(chan *pgxpool.Conn)
	go func() {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	time.Sleep(hold) // the time the acquire must wait: measured, not awaited
	c1.Release()
	c3 := <-got
	if c3 == nil {
		t.FailNow()
	}
	m = poolSeries(t, reg)
	if n := m["sluice_db_pool_empty_acquire_total"]; n != before+1 {
		t.Errorf("empty acquires went from %v to %v, want one more", before, n)
	}
	if w := m["sluice_db_pool_empty_acquire_wait_seconds_total"] - waitedBefore; w < hold.Seconds()/2 {
		t.Errorf("waited %vs more, want about %vs", w, hold.Seconds())
	}
	c2.Release()
	c3.Release()
	if m = poolSeries(t, reg); m["sluice_db_pool_connections{state=acquired}"] != 0 || m["sluice_db_pool_connections{state=idle}"] != 2 {
		t.Errorf("after release: %v", m)
	}
}
