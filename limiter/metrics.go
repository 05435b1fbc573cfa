package limiter

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of one check, the values of the outcome label of
// sluice_decisions_total.
const (
	// OutcomeAllowed: the check's own verdict was to allow (including a
	// shadow check under its limit and a check that allowed in a request
	// that another check denied).
	OutcomeAllowed = "allowed"
	// OutcomeLimited: a non-shadow check denied, decided by the store, by
	// the fast path, or by the local fallback.
	OutcomeLimited = "limited"
	// OutcomeShadowLimited: a shadow check would have denied.
	OutcomeShadowLimited = "shadow_limited"
	// OutcomeFailedOpen: the store could not decide and the check's fail
	// mode let the request through.
	OutcomeFailedOpen = "failed_open"
	// OutcomeFailedClosed: the store could not decide and a fail=closed
	// check of the request made it unavailable (every check of such a
	// request counts here).
	OutcomeFailedClosed = "failed_closed"
	// OutcomeLocal: the store could not decide and the per-instance
	// fallback allowed the check (its denials count as limited or
	// shadow_limited).
	OutcomeLocal = "local"
)

// Metrics are the limiter's Prometheus metrics. Labels carry rule names
// and fixed words only, never a key. A nil *Metrics records nothing.
type Metrics struct {
	// rules caches each rule's counters (a *ruleMetrics by rule name) so
	// that a decision does not hash label values. Rule names come from the
	// configuration, so it stays small.
	rules sync.Map

	decisions          *prometheus.CounterVec
	fastPathHits       *prometheus.CounterVec
	decisionDuration   prometheus.Histogram
	storeDuration      prometheus.Histogram
	storeErrors        *prometheus.CounterVec
	breakerGauge       prometheus.Gauge
	breakerTransitions *prometheus.CounterVec
	charges            *prometheus.CounterVec
	chargedUnits       *prometheus.CounterVec
}

// latencyBuckets are the buckets, in seconds, of the latency histograms.
var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

// NewMetrics creates the limiter's metrics and registers them with reg
// (unless reg is nil). Like prometheus.MustRegister, it panics if they are
// already registered with reg.
//
//   - sluice_decisions_total{rule, outcome}: checks decided, by outcome
//     (see the Outcome constants).
//   - sluice_fast_path_hits_total{rule}: checks denied from the over-limit
//     cache without asking the store.
//   - sluice_store_duration_seconds: the latency of store decisions,
//     failed ones included.
//   - sluice_decision_duration_seconds: the time of whole decisions, from
//     the fast path to the fail modes: what the limiter adds to a request.
//   - sluice_store_errors_total{kind}: failures of the store, by
//     ErrorKind: decisions, and the breaker's probes and trips (the
//     background work's failures), so that an outage shows without
//     traffic. Every kind's series exists from the start, at zero.
//   - sluice_store_breaker_state: the CircuitBreaker's state, 0 closed, 1
//     half-open, 2 open (stays 0 without a breaker).
//   - sluice_store_breaker_transitions_total{to}: changes of the breaker's
//     state, by the state entered (closed, half_open, open).
//   - sluice_charges_total{rule, result}: charges read from responses
//     (see the Charge constants); sluice_charged_units_total{rule}: the
//     units they charged.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: counterVec("sluice_decisions_total",
			"Rate-limit checks decided, by rule and outcome.", "rule", "outcome"),
		fastPathHits: counterVec("sluice_fast_path_hits_total",
			"Checks denied from the local over-limit cache without a store round trip, by rule.", "rule"),
		decisionDuration: histogram("sluice_decision_duration_seconds",
			"Time of one rate-limit decision, fast path, store call and fail modes included.",
			append([]float64{.00005}, latencyBuckets...)), // the fast path answers in tens of µs
		storeDuration: histogram("sluice_store_duration_seconds",
			"Latency of one store decision, failed ones included.", latencyBuckets),
		storeErrors: counterVec("sluice_store_errors_total",
			"Failures of the store (decisions, probes and background work), by kind (timeout, canceled, connection, read_only, too_many_connections, undefined_table, insufficient_privilege, other).", "kind"),
		breakerGauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_store_breaker_state",
			Help: "State of the store's circuit breaker: 0 closed, 1 half-open, 2 open.",
		}),
		breakerTransitions: counterVec("sluice_store_breaker_transitions_total",
			"Changes of the store circuit breaker's state, by the state entered.", "to"),
		charges: counterVec("sluice_charges_total",
			"Charges read from responses (charge=), by rule and result: charged, missing or invalid (the reservation stands), retried (the store could not take it at once).", "rule", "result"),
		chargedUnits: counterVec("sluice_charged_units_total",
			"Units charged from responses (charge=), by rule.", "rule"),
	}
	for _, k := range errorKinds {
		m.storeErrors.WithLabelValues(k)
	}
	for _, s := range []BreakerState{BreakerClosed, BreakerHalfOpen, BreakerOpen} {
		m.breakerTransitions.WithLabelValues(s.String())
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.fastPathHits, m.decisionDuration, m.storeDuration, m.storeErrors,
			m.breakerGauge, m.breakerTransitions, m.charges, m.chargedUnits)
	}
	return m
}

// ruleMetrics are one rule's counters, in the order of outcomes.
type ruleMetrics struct {
	outcomes [len(outcomes)]prometheus.Counter
	hits     prometheus.Counter
}

// outcomes lists the outcome label values; outcome indexes it.
var outcomes = [...]string{
	OutcomeAllowed, OutcomeLimited, OutcomeShadowLimited, OutcomeFailedOpen, OutcomeFailedClosed, OutcomeLocal,
}

type outcome uint8

const (
	outAllowed outcome = iota
	outLimited
	outShadowLimited
	outFailedOpen
	outFailedClosed
	outLocal
)

func (m *Metrics) rule(name string) *ruleMetrics {
	if r, ok := m.rules.Load(name); ok {
		return r.(*ruleMetrics)
	}
	r := &ruleMetrics{hits: m.fastPathHits.WithLabelValues(name)}
	for i, o := range outcomes {
		r.outcomes[i] = m.decisions.WithLabelValues(name, o)
	}
	got, _ := m.rules.LoadOrStore(name, r)
	return got.(*ruleMetrics)
}

func (m *Metrics) decision(rule string, o outcome) {
	if m != nil {
		m.rule(rule).outcomes[o].Inc()
	}
}

func (m *Metrics) fastPathHit(rule string) {
	if m != nil {
		m.rule(rule).hits.Inc()
	}
}

func (m *Metrics) storeCall(seconds float64, err error) {
	if m == nil {
		return
	}
	m.storeDuration.Observe(seconds)
	if err != nil {
		m.storeErrors.WithLabelValues(ErrorKind(err)).Inc()
	}
}

// storeError counts a failure of the store outside a decision.
func (m *Metrics) storeError(err error) {
	if m != nil {
		m.storeErrors.WithLabelValues(ErrorKind(err)).Inc()
	}
}

func (m *Metrics) decisionTime(seconds float64) {
	if m != nil {
		m.decisionDuration.Observe(seconds)
	}
}

// breakerState sets the state gauge without counting a transition.
func (m *Metrics) breakerState(s BreakerState) {
	if m != nil {
		m.breakerGauge.Set(float64(s))
	}
}

func (m *Metrics) breakerTransition(to BreakerState) {
	if m != nil {
		m.breakerGauge.Set(float64(to))
		m.breakerTransitions.WithLabelValues(to.String()).Inc()
	}
}

// charged counts one charge read from a response.
func (m *Metrics) charged(rule, read string, units int64) {
	if m != nil {
		m.charges.WithLabelValues(rule, read).Inc()
		m.chargedUnits.WithLabelValues(rule).Add(float64(units))
	}
}

// chargeResult counts a charge's fate at the store.
func (m *Metrics) chargeResult(rule, result string) {
	if m != nil {
		m.charges.WithLabelValues(rule, result).Inc()
	}
}
