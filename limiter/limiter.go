package limiter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/policy"
)

// Source says how one check of an Outcome was decided.
type Source uint8

const (
	// SourceNotEvaluated: the check was not looked at, because the fast
	// path denied the request on another check. Its Result holds only the
	// rule's Limit and Window.
	SourceNotEvaluated Source = iota
	// SourceStore: the store decided.
	SourceStore
	// SourceFastPath: the over-limit cache denied without asking the store.
	SourceFastPath
	// SourceFailedOpen: the store could not decide; the check let the
	// request through.
	SourceFailedOpen
	// SourceFailedClosed: the store could not decide and a fail=closed
	// check made the request unavailable.
	SourceFailedClosed
	// SourceLocal: the store could not decide; the per-instance fallback
	// store decided.
	SourceLocal
)

func (s Source) String() string {
	switch s {
	case SourceNotEvaluated:
		return "not_evaluated"
	case SourceStore:
		return "store"
	case SourceFastPath:
		return "fast_path"
	case SourceFailedOpen:
		return "failed_open"
	case SourceFailedClosed:
		return "failed_closed"
	case SourceLocal:
		return "local"
	}
	return "unknown"
}

// Breaker is the seam for a circuit breaker around the store: when Allow
// reports false the store is not called and the checks' fail modes apply
// at once, so that a dead store does not add the timeout to every request.
// Record receives the outcome of every store call that Allow let through
// (nil on success) and how long the call took. Implementations are safe
// for simultaneous use.
type Breaker interface {
	Allow() bool
	Record(took time.Duration, err error)
}

type alwaysAllow struct{}

func (alwaysAllow) Allow() bool                 { return true }
func (alwaysAllow) Record(time.Duration, error) {}

// UnavailableRetryAfter is the RetryAfter of an Unavailable outcome: a
// hint for the Retry-After of the 503, since nothing is known about when
// the store will be back.
const UnavailableRetryAfter = time.Second

// Defaults for the zero values of Config.
const (
	// DefaultTimeout is SLUICE_DB_TIMEOUT's default.
	DefaultTimeout = 50 * time.Millisecond
	// DefaultCacheSize is SLUICE_LOCAL_CACHE_SIZE's default.
	DefaultCacheSize = 100_000
)

// Config configures a Limiter. Every field documents its zero value (see
// Off for the convention).
type Config struct {
	// Store decides. Required.
	Store Store
	// Local decides the checks of fail=local rules when Store cannot: a
	// per-instance in-memory store (see package memory), owned by this
	// Limiter. Required, since any rule may say fail=local. It is passed
	// here, rather than made by New, because package memory imports this
	// one.
	Local Store
	// Timeout is the deadline of one store decision (SLUICE_DB_TIMEOUT).
	// Zero means DefaultTimeout; Off means no deadline beyond the caller's
	// context. A SelfTimed store applies it itself, to what it sends, and
	// gets no deadline from the Limiter.
	Timeout time.Duration
	// DefaultFail is the fail mode of rules whose Fail is FailDefault
	// (SLUICE_FAIL_MODE). FailDefault here means FailLocal, the setting's
	// own default: a rule without fail= still holds a limit (per
	// instance) when the store cannot decide.
	DefaultFail policy.FailMode
	// CacheSize is the number of entries of the over-limit cache
	// (SLUICE_LOCAL_CACHE_SIZE). Zero means DefaultCacheSize; Off turns the
	// fast path off.
	CacheSize int
	// Now is the local clock of the fast path and of the fail-open
	// results. Nil means time.Now.
	Now func() time.Time
	// Metrics records decisions. Nil records nothing.
	Metrics *Metrics
	// Logger logs store failures. Nil means zap.NewNop().
	Logger *zap.Logger
	// Breaker guards the store (a *CircuitBreaker in production). Nil
	// means the store is always called, however often it fails.
	Breaker Breaker
	// Tracer, when set, makes a span of every decision and of every
	// store call (see trace.go). Nil makes none, at no cost.
	Tracer trace.Tracer
	// Denied is called with every check whose own verdict was to deny
	// (a shadow check's too), whoever decided it: the store, the fast
	// path or the fail=local fallback. It is called on the decision's
	// goroutine, so it must be quick and safe for simultaneous use (the
	// admin console's count of the most limited keys). Nil calls nothing.
	Denied func(Check)
}

// Limiter decides requests against a Store, with the over-limit fast path
// in front of it and the rules' fail modes behind it. It is safe for
// simultaneous use by multiple goroutines.
type Limiter struct {
	store       Store
	local       Store
	timeout     time.Duration
	defaultFail policy.FailMode
	fast        *fastPath // nil when the fast path is off
	now         func() time.Time
	metrics     *Metrics
	log         *zap.Logger
	breaker     Breaker
	denied      func(Check)  // nil: nobody asked
	tracer      trace.Tracer // nil: no spans
	overloaded  logEvery     // the overload log line's rate limit
	charges     charges      // settlements waiting for the store
}

// New returns a Limiter for cfg, or an error that names every invalid
// field.
func New(cfg Config) (*Limiter, error) {
	var errs []error
	if cfg.Store == nil {
		errs = append(errs, errors.New("limiter: Store is required"))
	}
	if cfg.Local == nil {
		errs = append(errs, errors.New("limiter: Local (the fail=local fallback store) is required"))
	}
	if cfg.Timeout < 0 && cfg.Timeout != Off {
		errs = append(errs, fmt.Errorf("limiter: Timeout %v: must be Off or not negative", cfg.Timeout))
	}
	if cfg.CacheSize < 0 && cfg.CacheSize != Off {
		errs = append(errs, fmt.Errorf("limiter: CacheSize %d: must be Off or not negative", cfg.CacheSize))
	}
	if cfg.DefaultFail > policy.FailLocal {
		errs = append(errs, fmt.Errorf("limiter: DefaultFail %d: unknown fail mode", cfg.DefaultFail))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	l := &Limiter{
		store:       cfg.Store,
		local:       cfg.Local,
		timeout:     cmp.Or(cfg.Timeout, DefaultTimeout),
		defaultFail: cfg.DefaultFail,
		now:         cfg.Now,
		metrics:     cfg.Metrics,
		log:         cfg.Logger,
		breaker:     cfg.Breaker,
		denied:      cfg.Denied,
		tracer:      cfg.Tracer,
	}
	if l.defaultFail == policy.FailDefault {
		l.defaultFail = policy.FailLocal
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.log == nil {
		l.log = zap.NewNop()
	}
	if st, ok := cfg.Store.(SelfTimed); ok && st.TimesItself() {
		l.timeout = Off
	}
	if l.breaker == nil {
		l.breaker = alwaysAllow{}
	}
	if cfg.CacheSize != Off {
		f, err := newFastPath(cmp.Or(cfg.CacheSize, DefaultCacheSize))
		if err != nil {
			return nil, fmt.Errorf("limiter: fast path: %w", err)
		}
		l.fast = f
	}
	return l, nil
}

// Outcome is the decision on one request.
type Outcome struct {
	// Allowed: forward the request.
	Allowed bool
	// Unavailable: the store could not decide and a fail=closed check
	// forbids guessing; answer 503. Allowed is then false.
	Unavailable bool
	// Results has one Result per check. Checks that failed open report
	// Allowed with the rule's Limit and Window, Remaining equal to the
	// limit and Reset at the local now; see Sources for how each was
	// decided.
	Results []Result
	// Sources says how each check was decided.
	Sources []Source
	// RetryAfter is the longest RetryAfter among the non-shadow checks
	// that denied; zero when Allowed. For an Unavailable outcome it is
	// UnavailableRetryAfter.
	RetryAfter time.Duration
	// Err is the store's error when the fail modes decided, else nil.
	Err error
}

// Denied reports whether check i denied the request: a non-shadow check,
// evaluated, whose own verdict was to deny. checks are the ones the
// Outcome was decided for.
func (o *Outcome) Denied(checks []Check, i int) bool {
	return !checks[i].Rule.Shadow && o.Sources[i] != SourceNotEvaluated && !o.Results[i].Allowed
}

// Primary returns the index of the check the response headers should
// describe, or -1 when no check qualifies: for a denied request, the
// denying check with the longest RetryAfter; for an allowed one, the
// evaluated non-shadow check with the least Remaining (the earliest Reset
// on a tie). Failed-open checks do not qualify.
func (o *Outcome) Primary(checks []Check) int {
	best := -1
	for i := range checks {
		if checks[i].Rule.Shadow {
			continue
		}
		switch o.Sources[i] {
		case SourceNotEvaluated, SourceFailedOpen, SourceFailedClosed:
			continue
		}
		r := &o.Results[i]
		if best < 0 {
			if o.Allowed || !r.Allowed {
				best = i
			}
			continue
		}
		b := &o.Results[best]
		switch {
		case !o.Allowed:
			if !r.Allowed && r.RetryAfter > b.RetryAfter {
				best = i
			}
		case r.Remaining < b.Remaining || (r.Remaining == b.Remaining && r.Reset.Before(b.Reset)):
			best = i
		}
	}
	return best
}

// Decide decides the request made of checks. It never fails: when the
// store cannot decide within the Timeout, each check's fail mode applies.
// A store decision's denials are remembered by the fast path; a request
// with a remembered check (and no count=all check) is denied without
// calling the store.
func (l *Limiter) Decide(ctx context.Context, checks []Check) Outcome {
	var o Outcome
	l.DecideInto(ctx, checks, &o)
	return o
}

// DecideInto is Decide writing into o, reusing the storage of o.Results
// and o.Sources; a fast-path hit then allocates nothing.
func (l *Limiter) DecideInto(ctx context.Context, checks []Check, o *Outcome) {
	if l.tracer != nil {
		var end func()
		ctx, end = l.traceDecision(ctx, checks, o)
		defer end()
	}
	if l.metrics == nil {
		l.decideInto(ctx, checks, o)
		return
	}
	began := time.Now()
	l.decideInto(ctx, checks, o)
	l.metrics.decisionTime(time.Since(began).Seconds())
}

func (l *Limiter) decideInto(ctx context.Context, checks []Check, o *Outcome) {
	n := len(checks)
	o.Results = resize(o.Results, n)
	o.Sources = resize(o.Sources, n)
	o.Allowed, o.Unavailable, o.RetryAfter, o.Err = false, false, 0, nil

	start := l.now()
	if l.fast != nil {
		if hit, wait := l.fast.deny(checks, start, o.Results, o.Sources); hit {
			o.RetryAfter = wait
			for i, c := range checks {
				if o.Sources[i] == SourceFastPath {
					l.metrics.fastPathHit(c.Rule.Name)
					l.decided(c, outLimited)
				}
			}
			return
		}
	}
	if n == 0 {
		o.Allowed = true
		return
	}

	allowed, err := l.callStore(ctx, checks, o.Results, start)
	if err != nil {
		l.fail(ctx, checks, start, err, o)
		return
	}
	o.Allowed = allowed
	for i, c := range checks {
		o.Sources[i] = SourceStore
		r := &o.Results[i]
		l.decided(c, verdictOutcome(c.Rule, r.Allowed))
		if !allowed && !c.Rule.Shadow && !r.Allowed {
			o.RetryAfter = max(o.RetryAfter, r.RetryAfter)
		}
	}
	if l.fast != nil {
		l.fast.remember(checks, o.Results, start)
	}
}

// Forget drops (rule, key) from the fast path when an admin reset or an
// override change at at, on the store's clock, made its remembered denial
// stale: a denial the store decided after at is kept.
func (l *Limiter) Forget(rule, key string, at time.Time) {
	if l.fast != nil {
		l.fast.forget(rule, key, at)
	}
}

// callStore asks the store under the Timeout, through the breaker. start
// is when the decision began on the limiter's clock, which should be the
// breaker's too (both are time.Now in production): the breaker places the
// call's start on its own clock from how long it took. The metrics time
// the call on the wall clock.
func (l *Limiter) callStore(ctx context.Context, checks []Check, results []Result, start time.Time) (bool, error) {
	if !l.breaker.Allow() {
		return false, ErrBreakerOpen
	}
	sctx, cancel := ctx, context.CancelFunc(nil)
	if l.timeout > 0 {
		sctx, cancel = context.WithTimeout(ctx, l.timeout)
	}
	var traced func(error)
	if l.tracer != nil {
		sctx, traced = l.traceStore(sctx, len(checks))
	}
	began := time.Now()
	allowed, err := l.store.Decide(sctx, checks, results)
	elapsed := time.Since(began)
	if traced != nil {
		traced(err)
	}
	if cancel != nil {
		cancel()
	}
	l.metrics.storeCall(elapsed.Seconds(), err)
	l.breaker.Record(l.now().Sub(start), err)
	return allowed, err
}

// fail decides checks by their fail modes after the store failed with err.
func (l *Limiter) fail(ctx context.Context, checks []Check, now time.Time, err error, o *Outcome) {
	o.Err = err
	closed, local := false, 0
	for _, c := range checks {
		switch l.mode(c.Rule) {
		case policy.FailClosed:
			closed = true
		case policy.FailLocal:
			local++
		}
	}
	// An open breaker is the expected state during an outage and fails
	// every request: logging each at Warn would flood the log (the breaker
	// logs its own changes of state). A cancelled decision is the client's
	// doing, not the store's.
	// An overload (the gateway's own queue at its bound) can come from
	// every request of a flood: it is said at most once a second, with how
	// many there were.
	kind := ErrorKind(err)
	level := zap.WarnLevel
	if errors.Is(err, ErrBreakerOpen) || errors.Is(err, context.Canceled) {
		level = zap.DebugLevel
	}
	if kind == ErrorOverload {
		if n := l.overloaded.tick(time.Now()); n > 0 {
			l.log.Warn("too many decisions waiting for the rate-limit store: applying fail modes without it (overload)",
				zap.Error(err), zap.Int64("overloaded_decisions", n))
		}
	} else if ce := l.log.Check(level, "rate-limit store could not decide; applying fail modes"); ce != nil {
		ce.Write(zap.String("kind", kind), zap.Error(err), zap.Bool("closed", closed), zap.Int("local_checks", local))
	}

	// A decision whose caller went away (the client closed its
	// connection) is decided as any other, for whoever still reads the
	// outcome, but it is not counted among the decisions: the store did not
	// fail, and a dashboard or an alert on failed decisions must not see a
	// client's disconnect, or a load generator ending its run, as the
	// store's fault. sluice_store_errors_total{kind="canceled"} counts it.
	count := l.metrics.decision
	decided := l.decided
	if kind == ErrorCanceled && ctx.Err() != nil {
		count = func(string, outcome) {}
		decided = func(Check, outcome) {}
	}

	// Until told otherwise, every check fails open.
	for i, c := range checks {
		o.Results[i] = Result{
			Allowed: true, Limit: c.Rule.Limit, Window: c.Rule.Window,
			Remaining: c.Rule.Limit, Reset: now,
		}
		o.Sources[i] = SourceFailedOpen
	}
	if closed {
		o.Unavailable = true
		o.RetryAfter = UnavailableRetryAfter
		for i, c := range checks {
			o.Sources[i] = SourceFailedClosed
			count(c.Rule.Name, outFailedClosed)
		}
		return
	}

	o.Allowed = true
	if local > 0 {
		l.decideLocally(ctx, checks, local, o)
	}
	for i, c := range checks {
		switch o.Sources[i] {
		case SourceFailedOpen:
			count(c.Rule.Name, outFailedOpen)
		case SourceLocal:
			if o.Results[i].Allowed {
				count(c.Rule.Name, outLocal)
			} else {
				decided(c, verdictOutcome(c.Rule, false))
			}
		}
	}
}

// decideLocally decides the n fail=local checks together, all or nothing,
// with the local store. A failure there leaves them failed open.
func (l *Limiter) decideLocally(ctx context.Context, checks []Check, n int, o *Outcome) {
	idx := make([]int, 0, n)
	sub := make([]Check, 0, n)
	for i, c := range checks {
		if l.mode(c.Rule) == policy.FailLocal {
			idx = append(idx, i)
			sub = append(sub, c)
		}
	}
	res := make([]Result, n)
	// The caller's deadline may be what failed the store; the local store
	// does not wait on anything, so it is not held to it.
	allowed, err := l.local.Decide(context.WithoutCancel(ctx), sub, res)
	if err != nil {
		l.log.Error("local fallback store could not decide; failing open", zap.Error(err))
		return
	}
	o.Allowed = allowed
	for j, i := range idx {
		o.Results[i] = res[j]
		o.Sources[i] = SourceLocal
		if !sub[j].Rule.Shadow && !res[j].Allowed {
			o.RetryAfter = max(o.RetryAfter, res[j].RetryAfter)
		}
	}
}

// decided counts check c's outcome o, and tells Denied of a denial.
func (l *Limiter) decided(c Check, o outcome) {
	l.metrics.decision(c.Rule.Name, o)
	if l.denied != nil && (o == outLimited || o == outShadowLimited) {
		l.denied(c)
	}
}

func (l *Limiter) mode(r *policy.Rule) policy.FailMode {
	if r.Fail == policy.FailDefault {
		return l.defaultFail
	}
	return r.Fail
}

// verdictOutcome is the metrics outcome of a check's own verdict.
func verdictOutcome(r *policy.Rule, ok bool) outcome {
	switch {
	case ok:
		return outAllowed
	case r.Shadow:
		return outShadowLimited
	}
	return outLimited
}

// resize returns s with length n, reusing its storage when it can.
func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

// logEvery rate-limits a log line to one a second. It is safe for
// simultaneous use.
type logEvery struct {
	mu     sync.Mutex
	last   time.Time
	missed int64
}

// tick counts one event at now and returns how many events the line
// should report: all since the last line, once a second has passed since
// it; otherwise 0 (say nothing now).
func (e *logEvery) tick(now time.Time) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.missed++
	if !e.last.IsZero() && now.Sub(e.last) < time.Second {
		return 0
	}
	n := e.missed
	e.last, e.missed = now, 0
	return n
}
