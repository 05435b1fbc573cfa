package proxy

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the proxy's Prometheus collectors.
type Metrics struct {
	upstream  *prometheus.HistogramVec
	responses *prometheus.CounterVec
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
	for _, code := range []string{"200", "400", "429", "502", "503"} { // the usual ones exist from the start
		m.responses.WithLabelValues(code)
	}
	reg.MustRegister(m.upstream, m.responses)
	return m
}
