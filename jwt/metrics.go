package jwt

import (
	"math"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the verifier's Prometheus metrics. Labels carry fixed words
// only, never anything of a token. A nil *Metrics records nothing.
type Metrics struct {
	tokens    [numResults]prometheus.Counter
	refreshOK prometheus.Counter
	refreshNo prometheus.Counter
	verifier  atomic.Pointer[Verifier] // whose key set's age the gauge shows
}

// NewMetrics creates the verifier's metrics and registers them with reg
// (unless reg is nil). Like prometheus.MustRegister, it panics if they are
// already registered with reg. Every series exists from the start.
//
//   - sluice_jwt_tokens_total{result}: bearer tokens verified, by Result:
//     valid, missing, malformed, bad_signature, expired, not_yet_valid,
//     wrong_issuer, wrong_audience, unknown_key, algorithm_refused.
//   - sluice_jwt_jwks_refreshes_total{result}: fetches of the JWKS URL and
//     reads of the JWKS file, ok or error (an error keeps the last good
//     key set).
//   - sluice_jwt_jwks_age_seconds: how long ago the key set in force was
//     fetched or read; +Inf while there is none yet, 0 without a JWKS.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{}
	tokens := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_jwt_tokens_total",
		Help: "Bearer tokens verified, by result: valid, missing, malformed, bad_signature, expired, not_yet_valid, wrong_issuer, wrong_audience, unknown_key, algorithm_refused.",
	}, []string{"result"})
	for r := range Result(numResults) {
		m.tokens[r] = tokens.WithLabelValues(r.String())
	}
	refreshes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_jwt_jwks_refreshes_total",
		Help: "Fetches of the JWKS URL and reads of the JWKS file, by result (ok, error); after an error the last good key set stays in force.",
	}, []string{"result"})
	m.refreshOK, m.refreshNo = refreshes.WithLabelValues("ok"), refreshes.WithLabelValues("error")
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_jwt_jwks_age_seconds",
		Help: "Seconds since the JWK set in force was fetched or read; +Inf while there is none yet, 0 without a JWKS.",
	}, m.age)
	if reg != nil {
		reg.MustRegister(tokens, refreshes, age)
	}
	return m
}

func (m *Metrics) attach(v *Verifier) {
	if m != nil {
		m.verifier.Store(v)
	}
}

func (m *Metrics) count(r Result) {
	if m != nil {
		m.tokens[r].Inc()
	}
}

func (m *Metrics) refreshed(ok bool) {
	switch {
	case m == nil:
	case ok:
		m.refreshOK.Inc()
	default:
		m.refreshNo.Inc()
	}
}

func (m *Metrics) age() float64 {
	v := m.verifier.Load()
	if v == nil || v.jwksURL == "" && v.file == "" {
		return 0
	}
	set := v.set.Load()
	if set == nil {
		return math.Inf(1)
	}
	return v.now().Sub(set.at).Seconds()
}
