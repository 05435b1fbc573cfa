package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the proxy's Prometheus collectors.
type Metrics struct {
	upstream  *prometheus.HistogramVec
	responses *prometheus.CounterVec
	requests  *prometheus.CounterVec   // sluice_requests_total{listener,outcome}
	answers   *prometheus.HistogramVec // sluice_answer_duration_seconds{listener}
}

// NewMetrics registers the proxy's collectors with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_upstream_duration_seconds",
			Help:    "Time to proxy a request to its upstream, by route prefix (or default).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"upstream"}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_http_responses_total",
			Help: "Responses of the public listener by HTTP status code: forwarded upstream answers, sluice's own (429, 400, 413, 502, 503) and the listener's answers to requests that did not parse.",
		}, []string{"code"}),
	}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_requests_total",
		Help: "Requests decided, by listener (public: the proxy; check: forward-auth; rls: Envoy's rate limit service, one per ShouldRateLimit call) and outcome (allowed, limited, unavailable, no_rule, rejected).",
	}, []string{"listener", "outcome"})
	m.answers = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sluice_answer_duration_seconds",
		Help:    "Time to answer a question of another proxy, from its arrival to the answer, by listener (check, rls): what the asking proxy waits for.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .02, .05, .1, .25, .5, 1},
	}, []string{"listener"})
	for _, code := range []string{"200", "400", "429", "502", "503"} { // the usual ones exist from the start
		m.responses.WithLabelValues(code)
	}
	for _, l := range []string{ListenerPublic, ListenerCheck, ListenerRLS} {
		for _, o := range []string{OutcomeAllowed, OutcomeLimited, OutcomeUnavailable, OutcomeNoRule, OutcomeRejected} {
			m.requests.WithLabelValues(l, o)
		}
		if l != ListenerPublic {
			m.answers.WithLabelValues(l)
		}
	}
	reg.MustRegister(m.upstream, m.responses, m.requests, m.answers)
	return m
}

// countRequest counts one decided request of listener, and, for the
// listeners that answer other proxies, how long the answer took.
func (m *Metrics) countRequest(listener, outcome string, took time.Duration) {
	m.requests.WithLabelValues(listener, outcome).Inc()
	if listener != ListenerPublic {
		m.answers.WithLabelValues(listener).Observe(took.Seconds())
	}
}
