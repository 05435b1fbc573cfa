package limiter

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"

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

// Kinds of store errors, the values of the kind label of
// sluice_store_errors_total and of the kind field of log lines. They are
// fixed words, so that alerts can select on them.
const (
	// ErrorTimeout: the store did not answer within the decision's
	// deadline (the context's deadline, a network timeout, or the server
	// cancelling the statement: SQLSTATE 57014 query_canceled, 55P03
	// lock_not_available).
	ErrorTimeout = "timeout"
	// ErrorCanceled: the caller gave up (the client went away). It says
	// nothing about the store's health.
	ErrorCanceled = "canceled"
	// ErrorConnection: the store could not be reached or dropped the
	// connection: refused, reset, closed, SQLSTATE class 08, or the server
	// shutting down or starting up (57P01 admin_shutdown, 57P02
	// crash_shutdown, 57P03 cannot_connect_now).
	ErrorConnection = "connection"
	// ErrorReadOnly: the server takes no writes (SQLSTATE 25006
	// read_only_sql_transaction): a standby, or a primary demoted by a
	// failover.
	ErrorReadOnly = "read_only"
	// ErrorTooManyConnections: the server refused a new connection
	// (SQLSTATE 53300 too_many_connections).
	ErrorTooManyConnections = "too_many_connections"
	// ErrorUndefinedTable: sluice's schema objects are missing (SQLSTATE
	// 42P01 undefined_table, 42883 undefined_function, 3F000
	// invalid_schema_name): dropped, or never migrated.
	ErrorUndefinedTable = "undefined_table"
	// ErrorInsufficientPrivilege: the database role may not use sluice's
	// objects (SQLSTATE 42501 insufficient_privilege).
	ErrorInsufficientPrivilege = "insufficient_privilege"
	// ErrorOther: anything else.
	ErrorOther = "other"
)

// errorKinds lists the kinds, for validating what a KindedError reports.
var errorKinds = [...]string{
	ErrorTimeout, ErrorCanceled, ErrorConnection, ErrorReadOnly, ErrorTooManyConnections,
	ErrorUndefinedTable, ErrorInsufficientPrivilege, ErrorOther,
}

// KindedError is implemented by store errors that know their kind better
// than ErrorKind can tell from the outside, such as a driver's own
// sentinel errors. StoreErrorKind returns one of the Error constants.
type KindedError interface {
	error
	StoreErrorKind() string
}

// sqlStater is implemented by database errors that carry a SQLSTATE, such
// as *pgconn.PgError. Declaring it here keeps the limiter free of any
// driver: SQLSTATEs are the SQL standard's, not a driver's.
type sqlStater interface {
	SQLState() string
}

// ErrorKind classifies a store error for metrics, logs and the circuit
// breaker, looking through wrapped errors, in this order: a deadline
// (context.DeadlineExceeded) is ErrorTimeout and a cancelled context
// ErrorCanceled, whatever else the error says; then the kind reported by a
// KindedError; then the SQLSTATE of a database error (see the Error
// constants for the codes); then network errors: a timeout is
// ErrorTimeout, any other net.Error, a refused or reset connection, or a
// connection that ended mid-message (io.EOF, io.ErrUnexpectedEOF) is
// ErrorConnection. Everything else is ErrorOther.
func ErrorKind(err error) string {
	switch {
	case err == nil:
		return ErrorOther
	case errors.Is(err, context.DeadlineExceeded):
		return ErrorTimeout
	case errors.Is(err, context.Canceled):
		return ErrorCanceled
	}
	var ke KindedError
	if errors.As(err, &ke) {
		if k := ke.StoreErrorKind(); slices.Contains(errorKinds[:], k) {
			return k
		}
	}
	var st sqlStater
	if errors.As(err, &st) {
		if k := sqlStateKind(st.SQLState()); k != "" {
			return k
		}
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return ErrorTimeout
	case ne != nil,
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return ErrorConnection
	}
	return ErrorOther
}

// sqlStateKind maps a SQLSTATE to a kind, or "" when it has none.
func sqlStateKind(code string) string {
	switch code {
	case "57014", "55P03": // query_canceled, lock_not_available
		return ErrorTimeout
	case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
		return ErrorConnection
	case "25006": // read_only_sql_transaction
		return ErrorReadOnly
	case "53300": // too_many_connections
		return ErrorTooManyConnections
	case "42P01", "42883", "3F000": // undefined_table, undefined_function, invalid_schema_name
		return ErrorUndefinedTable
	case "42501": // insufficient_privilege
		return ErrorInsufficientPrivilege
	}
	if strings.HasPrefix(code, "08") { // connection_exception
		return ErrorConnection
	}
	return ""
}

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
//   - sluice_store_errors_total{kind}: store decisions that failed, by
//     ErrorKind (every kind's series exists from the start, at zero).
//   - sluice_store_breaker_state: the CircuitBreaker's state, 0 closed, 1
//     half-open, 2 open (stays 0 without a breaker).
//   - sluice_store_breaker_transitions_total{to}: changes of the breaker's
//     state, by the state entered (closed, half_open, open).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Rate-limit checks decided, by rule and outcome.",
		}, []string{"rule", "outcome"}),
		fastPathHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_fast_path_hits_total",
			Help: "Checks denied from the local over-limit cache without a store round trip, by rule.",
		}, []string{"rule"}),
		decisionDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sluice_decision_duration_seconds",
			Help: "Time of one rate-limit decision, fast path, store call and fail modes included.",
			Buckets: []float64{
				.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1,
			},
		}),
		storeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sluice_store_duration_seconds",
			Help: "Latency of one store decision, failed ones included.",
			Buckets: []float64{
				.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1,
			},
		}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_store_errors_total",
			Help: "Store decisions that failed, by kind (timeout, canceled, connection, read_only, too_many_connections, undefined_table, insufficient_privilege, other).",
		}, []string{"kind"}),
		breakerGauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_store_breaker_state",
			Help: "State of the store's circuit breaker: 0 closed, 1 half-open, 2 open.",
		}),
		breakerTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_store_breaker_transitions_total",
			Help: "Changes of the store circuit breaker's state, by the state entered.",
		}, []string{"to"}),
	}
	for _, k := range errorKinds {
		m.storeErrors.WithLabelValues(k)
	}
	for _, s := range []BreakerState{BreakerClosed, BreakerHalfOpen, BreakerOpen} {
		m.breakerTransitions.WithLabelValues(s.String())
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.fastPathHits, m.decisionDuration, m.storeDuration, m.storeErrors,
			m.breakerGauge, m.breakerTransitions)
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

// Init creates the series of the named rules at zero, so that rates and
// alerts see them before their first decision. It is optional.
func (m *Metrics) Init(rules ...string) {
	if m == nil {
		return
	}
	for _, r := range rules {
		m.rule(r)
	}
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
