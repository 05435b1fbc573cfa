package limiter

import "github.com/prometheus/client_golang/prometheus"

// StoreErrors is the sluice_store_errors_total series of kind.
func (m *Metrics) StoreErrors(kind string) prometheus.Counter {
	return m.storeErrors.WithLabelValues(kind)
}

// StartProbe and EndProbe let the external tests step a breaker through a
// probe at fixed instants of its clock, as Run does in real time.
func StartProbe(b *CircuitBreaker) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setState(BreakerHalfOpen)
}

func EndProbe(b *CircuitBreaker, err error) { b.probed(err) }

// Init creates the series of the named rules at zero, as a rule's first
// decision does.
func (m *Metrics) Init(rules ...string) {
	if m == nil {
		return
	}
	for _, r := range rules {
		m.rule(r)
	}
}
