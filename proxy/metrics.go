package proxy

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the proxy's Prometheus collectors.
type Metrics struct {
	upstream *prometheus.HistogramVec
}

// NewMetrics registers the proxy's collectors with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_upstream_duration_seconds",
			Help:    "Time to proxy a request to its upstream, by route prefix (or default).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"upstream"}),
	}
	reg.MustRegister(m.upstream)
	return m
}
