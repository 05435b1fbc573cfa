package admin

import (
	"context"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// The live figures of the console and of GET /v1/stats.
//
// Rates cost the requests nothing: once a second, Stats reads sluice's
// own metrics (the counters the limiter keeps anyway) into a ring of a
// minute of samples, and a rate is the difference of two samples. The
// store's latency comes the same way, from the buckets of
// sluice_store_duration_seconds, and its pool from the sluice_db_pool_*
// gauges, so admin needs to know no store. The one thing the metrics do
// not have is which keys were denied: the limiter's Denied hook (Limited)
// counts those in a fixed-size sketch (see topkeys.go).

// Sampling.
const (
	statsEvery = time.Second
	// statsWindow is how far back the rates look.
	statsWindow = time.Minute
	// statsSamples is one more sample than the window holds, so that the
	// window has a sample at each end.
	statsSamples = int(statsWindow/statsEvery) + 1
	// statsTopShown is how many of the most limited keys are shown.
	statsTopShown = 20
)

// Metrics read by Stats.
const (
	metricDecisions     = "sluice_decisions_total"
	metricStoreDuration = "sluice_store_duration_seconds"
	metricStoreErrors   = "sluice_store_errors_total"
	metricPoolConns     = "sluice_db_pool_connections"
	metricPoolMax       = "sluice_db_pool_max_connections"
	metricChargedUnits  = "sluice_charged_units_total"
	metricCharges       = "sluice_charges_total"
)

// StatsConfig configures Stats.
type StatsConfig struct {
	// Gatherer holds sluice's metrics (those of limiter.NewMetrics, and
	// of the Postgres store's pool when there is one). It is gathered
	// once a second, so it should not hold the Go runtime's and the
	// process's collectors, which cost more to read. Required.
	Gatherer prometheus.Gatherer
	// Now is the clock of the samples. Nil means time.Now.
	Now func() time.Time
}

// Stats keeps the live figures of the admin console: the decisions of the
// last minute by rule and outcome, the store's latency and errors, its
// pool, and the most limited keys of the last minutes. It is safe for
// simultaneous use; Run samples the metrics until its context ends.
type Stats struct {
	gather prometheus.Gatherer
	now    func() time.Time
	top    *topKeys

	mu      sync.Mutex
	samples []sample // oldest first, at most statsSamples
	taken   int      // samples taken, to rotate the top keys every statsWindow
}

// sample is what the metrics said at one instant.
type sample struct {
	at        time.Time
	decisions map[string]map[string]float64 // by rule, then outcome
	units     map[string]float64            // charged units, by rule
	charges   map[string]map[string]float64 // charges by rule, then result
	latency   histogram
	errors    float64
	overload  float64   // of errors, those of kind overload
	pool      *poolJSON // nil without a pool
}

// histogram is a Prometheus histogram's cumulative counts.
type histogram struct {
	bounds []float64 // upper bounds, increasing, +Inf left out
	counts []float64 // cumulative counts at each bound
	count  float64
}

// NewStats returns Stats over cfg's metrics.
func NewStats(cfg StatsConfig) *Stats {
	s := &Stats{gather: cfg.Gatherer, now: cfg.Now, top: newTopKeys()}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// Limited counts a denial for the most limited keys; it is the limiter's
// Denied hook (limiter.Config.Denied). Shadow checks are left out: they
// limited nobody. It takes one of eight locks and allocates nothing once
// the key is counted.
func (s *Stats) Limited(c limiter.Check) {
	if c.Rule.Shadow {
		return
	}
	s.top.add(c.Rule.Name, c.Key)
}

// Run samples the metrics every second until ctx is done.
func (s *Stats) Run(ctx context.Context) {
	t := time.NewTicker(statsEvery)
	defer t.Stop()
	s.Sample()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sample()
		}
	}
}

// Sample reads the metrics now. Run calls it every second; tests call it
// after moving the clock.
func (s *Stats) Sample() {
	mfs, _ := s.gather.Gather() // a partial gathering is still worth having
	smp := sample{at: s.now(), decisions: map[string]map[string]float64{},
		units: map[string]float64{}, charges: map[string]map[string]float64{}}
	for _, mf := range mfs {
		switch mf.GetName() {
		case metricDecisions:
			for _, m := range mf.GetMetric() {
				rule := label(m, "rule")
				d := smp.decisions[rule]
				if d == nil {
					d = map[string]float64{}
					smp.decisions[rule] = d
				}
				d[label(m, "outcome")] = m.GetCounter().GetValue()
			}
		case metricChargedUnits:
			for _, m := range mf.GetMetric() {
				smp.units[label(m, "rule")] = m.GetCounter().GetValue()
			}
		case metricCharges:
			for _, m := range mf.GetMetric() {
				rule := label(m, "rule")
				if smp.charges[rule] == nil {
					smp.charges[rule] = map[string]float64{}
				}
				smp.charges[rule][label(m, "result")] = m.GetCounter().GetValue()
			}
		case metricStoreDuration:
			for _, m := range mf.GetMetric() {
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					if !math.IsInf(b.GetUpperBound(), 1) {
						smp.latency.bounds = append(smp.latency.bounds, b.GetUpperBound())
						smp.latency.counts = append(smp.latency.counts, float64(b.GetCumulativeCount()))
					}
				}
				smp.latency.count = float64(h.GetSampleCount())
			}
		case metricStoreErrors:
			for _, m := range mf.GetMetric() {
				smp.errors += m.GetCounter().GetValue()
				for _, l := range m.GetLabel() {
					if l.GetName() == "kind" && l.GetValue() == limiter.ErrorOverload {
						smp.overload += m.GetCounter().GetValue()
					}
				}
			}
		case metricPoolConns, metricPoolMax:
			if smp.pool == nil {
				smp.pool = &poolJSON{}
			}
			for _, m := range mf.GetMetric() {
				v := int64(m.GetGauge().GetValue())
				switch {
				case mf.GetName() == metricPoolMax:
					smp.pool.Max = v
				case label(m, "state") == "acquired":
					smp.pool.Acquired = v
				case label(m, "state") == "idle":
					smp.pool.Idle = v
				case label(m, "state") == "constructing":
					smp.pool.Constructing = v
				}
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = append(s.samples, smp)
	if len(s.samples) > statsSamples {
		s.samples = slices.Delete(s.samples, 0, len(s.samples)-statsSamples)
	}
	s.taken++
	if s.taken%int(statsWindow/statsEvery) == 0 {
		s.top.rotate()
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// statsJSON is GET /v1/stats.
type statsJSON struct {
	At time.Time `json:"at"`
	// WindowSeconds is the time the rates and counts cover: a minute,
	// or less just after start.
	WindowSeconds float64         `json:"window_seconds"`
	Rules         []ruleStatsJSON `json:"rules"`
	// TopLimited are the most limited keys of the last TopMinutes
	// minutes (and of the current one), by rule and hashed key.
	TopLimited []topKeyJSON    `json:"top_limited"`
	TopMinutes int             `json:"top_limited_minutes"`
	Store      *storeStatsJSON `json:"store"`
}

// ruleStatsJSON is one rule's decisions over the window.
type ruleStatsJSON struct {
	Rule string `json:"rule"`
	// Decisions counts checks by outcome: the limiter's (allowed,
	// limited, shadow_limited, failed_open, failed_closed, local), once
	// the rule has decided; allowed and limited always.
	Decisions map[string]float64 `json:"decisions"`
	// AllowedPerSecond and LimitedPerSecond are the rates over the window.
	AllowedPerSecond float64 `json:"allowed_per_second"`
	LimitedPerSecond float64 `json:"limited_per_second"`
	// For a charge= rule: the units its responses charged over the
	// window, and its charges by how they were read.
	Charged *float64           `json:"charged_units,omitempty"`
	Charges map[string]float64 `json:"charges,omitempty"`
	// Allowed and Limited are the checks of each second of the window,
	// the oldest first, for a sparkline.
	Allowed []float64 `json:"allowed"`
	Limited []float64 `json:"limited"`
}

// topKeyJSON is one of the most limited keys. Count may include up to
// Error denials of keys it took the place of in the sketch.
type topKeyJSON struct {
	Rule  string `json:"rule"`
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error,omitempty"`
}

// storeStatsJSON is the store's state.
type storeStatsJSON struct {
	Kind string `json:"kind,omitempty"`
	// Ready and NotReady are /readyz's answer.
	Ready    bool   `json:"ready"`
	NotReady string `json:"not_ready,omitempty"`
	// Breaker is the circuit breaker's state (closed, half_open, open);
	// empty for a store without one (the memory store).
	Breaker string `json:"breaker,omitempty"`
	// Calls, Errors and Latency cover the window; Latency is nil without
	// calls.
	Calls  float64 `json:"calls"`
	Errors float64 `json:"errors"`
	// Overload counts, of Errors, the decisions that found the gateway's
	// queue for the store full and applied their fail modes without it.
	Overload float64      `json:"overload"`
	Latency  *latencyJSON `json:"latency_seconds"`
	Pool     *poolJSON    `json:"pool"`
}

// latencyJSON are quantiles of the store's decisions, estimated from the
// histogram's buckets as Prometheus' histogram_quantile does.
type latencyJSON struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// poolJSON is the Postgres store's connection pool.
type poolJSON struct {
	Acquired     int64 `json:"acquired"`
	Idle         int64 `json:"idle"`
	Constructing int64 `json:"constructing"`
	Max          int64 `json:"max"`
}

// snapshot computes the figures for rules from the samples.
func (s *Stats) snapshot(rules []*policy.Rule) statsJSON {
	out := statsJSON{At: s.now().UTC(), TopMinutes: topIntervals, Rules: make([]ruleStatsJSON, 0, len(rules)), Store: &storeStatsJSON{}}
	for _, e := range s.top.top(statsTopShown) {
		out.TopLimited = append(out.TopLimited, topKeyJSON{Rule: e.rule, Key: e.key, Count: e.count, Error: e.err})
	}
	if out.TopLimited == nil {
		out.TopLimited = []topKeyJSON{}
	}

	s.mu.Lock()
	samples := slices.Clone(s.samples)
	s.mu.Unlock()
	// first is the oldest sample in the window, last the newest.
	var first, last *sample
	if n := len(samples); n > 0 {
		last = &samples[n-1]
		for i := range samples {
			if last.at.Sub(samples[i].at) <= statsWindow {
				first = &samples[i]
				break
			}
		}
	}
	seconds := 0.0
	if first != nil {
		seconds = last.at.Sub(first.at).Seconds()
	}
	out.WindowSeconds = seconds
	n := statsSamples - 1
	for _, r := range rules {
		// Every outcome the metrics know (the limiter counts six), and
		// allowed and limited even before a rule's first decision.
		rs := ruleStatsJSON{Rule: r.Name, Allowed: make([]float64, n), Limited: make([]float64, n),
			Decisions: map[string]float64{limiter.OutcomeAllowed: 0, limiter.OutcomeLimited: 0}}
		if first != nil {
			for o, v := range last.decisions[r.Name] {
				rs.Decisions[o] = max(v-first.decisions[r.Name][o], 0)
			}
		}
		if r.Charge != nil {
			// What responses charged over the window, and how the charges
			// were read (charged, missing, invalid, retried).
			rs.Charged, rs.Charges = new(float64), map[string]float64{}
			if first != nil {
				*rs.Charged = max(last.units[r.Name]-first.units[r.Name], 0)
				for k, v := range last.charges[r.Name] {
					rs.Charges[k] = max(v-first.charges[r.Name][k], 0)
				}
			}
		}
		if seconds > 0 {
			rs.AllowedPerSecond = rs.Decisions[limiter.OutcomeAllowed] / seconds
			rs.LimitedPerSecond = rs.Decisions[limiter.OutcomeLimited] / seconds
		}
		// The series ends with the newest second; before the first
		// minute is over, it starts with zeros.
		for j := 1; j < len(samples); j++ {
			k := n - len(samples) + j
			prev, cur := samples[j-1].decisions[r.Name], samples[j].decisions[r.Name]
			rs.Allowed[k] = max(cur[limiter.OutcomeAllowed]-prev[limiter.OutcomeAllowed], 0)
			rs.Limited[k] = max(cur[limiter.OutcomeLimited]-prev[limiter.OutcomeLimited], 0)
		}
		out.Rules = append(out.Rules, rs)
	}
	if first != nil {
		out.Store.Calls = max(last.latency.count-first.latency.count, 0)
		out.Store.Errors = max(last.errors-first.errors, 0)
		out.Store.Overload = max(last.overload-first.overload, 0)
		out.Store.Latency = quantiles(first.latency, last.latency)
		out.Store.Pool = last.pool
	}
	return out
}

// quantiles estimates the latency quantiles of the observations between
// two histograms of the same buckets, or nil when there were none.
func quantiles(from, to histogram) *latencyJSON {
	if from.count == 0 && len(from.counts) == 0 {
		// A sample from before the store's histogram existed: it had
		// counted nothing.
		from.counts = make([]float64, len(to.counts))
	}
	total := to.count - from.count
	if total <= 0 || len(to.bounds) == 0 || len(from.counts) != len(to.counts) {
		return nil
	}
	delta := make([]float64, len(to.counts))
	for i := range delta {
		delta[i] = to.counts[i] - from.counts[i]
	}
	q := func(q float64) float64 {
		rank := q * total
		lower, below := 0.0, 0.0
		for i, c := range delta {
			if c >= rank {
				if c == below {
					return to.bounds[i]
				}
				return lower + (to.bounds[i]-lower)*(rank-below)/(c-below)
			}
			lower, below = to.bounds[i], c
		}
		return to.bounds[len(to.bounds)-1] // in the +Inf bucket: the largest bound is all that is known
	}
	return &latencyJSON{P50: q(0.5), P90: q(0.9), P99: q(0.99)}
}

// storeState says what Config knows of the store: its kind, readiness and
// breaker.
func (cfg *Config) storeState(st *storeStatsJSON) {
	st.Kind = cfg.StoreKind
	st.Ready = true
	if cfg.Ready != nil {
		if err := cfg.Ready(); err != nil {
			st.Ready, st.NotReady = false, err.Error()
		}
	}
	if cfg.Breaker != nil {
		st.Breaker = cfg.Breaker().String()
	}
}

// serveStats serves GET /v1/stats.
func serveStats(cfg *Config) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		out := cfg.Stats.snapshot(cfg.Policy().Rules())
		cfg.storeState(out.Store)
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusOK, out)
	}
}
