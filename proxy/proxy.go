// Package proxy is sluice's HTTP side: it canonicalises each request,
// works out the rate-limit keys of the rules that match it, asks the
// limiter, and either answers 429 (or 503) itself or forwards the request
// upstream.
//
// Request hygiene (hop-by-hop and spoofable headers, buffered bodies),
// forwarding, the listeners' servers and the wire format of responses
// (rate-limit headers, and problem+json, which the admin API shares) live
// here; reading identifiers from a request lives in the identity
// sub-package, the admin listener in package admin.
//
// It sees the limiter and never a particular store: it must not import
// limiter/memory or limiter/postgres, nor admin or gateway, which use it.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/identity"
)

// Config configures a Proxy. Upstream, Policy, Limiter and Hasher are
// required; every other field has a working zero value.
type Config struct {
	Upstream *url.URL
	Routes   []Route // longest prefix first, as ParseRoutes returns them
	// Policy is the rules to start with; SetPolicy replaces them.
	Policy  *policy.Policy
	Limiter *limiter.Limiter
	Hasher  *hashing.Hasher
	// Trusted lists the proxies whose X-Forwarded-For is believed.
	Trusted identity.TrustedProxies
	// MaxBodyBytes bounds the request bodies that are buffered whole
	// before they are forwarded: larger ones get 413 on routes whose rules
	// read the body, and are streamed elsewhere. Zero means 64 KiB.
	MaxBodyBytes int64
	Headers      HeaderFamilies
	// Transport reaches the upstreams; nil means
	// NewTransport(DefaultTimeouts().Upstream).
	Transport http.RoundTripper
	Logger    *zap.Logger // nil means no logging
	Metrics   *Metrics    // nil means no metrics
	// AccessLog receives one INFO line per request (see finish): method,
	// canonical path, matched rules, hashed key prefixes, outcome, status
	// and durations, never a raw identifier or the query string. Nil turns
	// the access log off.
	AccessLog *zap.Logger
}

// Proxy is the gateway's public handler. It is safe for concurrent use.
type Proxy struct {
	cfg     Config
	policy  atomic.Pointer[policy.Policy] // the rules in force
	rp      *httputil.ReverseProxy        // for requests a rule matched
	plain   *httputil.ReverseProxy        // for the rest: the upstream's headers pass untouched
	log     *zap.Logger
	global  string // the key every "by global" rule counts
	states  sync.Pool
	bodies  *bodyPool
	upNames []string // metric label per route, then the default upstream
}

// requestState holds the per-request scratch space, pooled so a decision
// allocates as little as possible.
type requestState struct {
	rules   []*policy.Rule
	checks  []limiter.Check
	outcome limiter.Outcome
	ident   identity.Request

	// For the responses metric and the access log.
	w        statusWriter
	path     string        // the canonical path, once known
	verdict  string        // the access log's outcome
	upstream time.Duration // time spent forwarding
}

// New returns a Proxy for cfg.
func New(cfg Config) (*Proxy, error) {
	if cfg.Upstream == nil || cfg.Policy == nil || cfg.Limiter == nil || cfg.Hasher == nil {
		return nil, errors.New("proxy: Upstream, Policy, Limiter and Hasher are required")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 64 << 10
	}
	if cfg.Transport == nil {
		cfg.Transport = NewTransport(DefaultTimeouts().Upstream)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	p := &Proxy{
		cfg:    cfg,
		log:    cfg.Logger,
		global: cfg.Hasher.Key(policy.ByGlobal.String(), ""),
		bodies: newBodyPool(cfg.MaxBodyBytes),
	}
	p.policy.Store(cfg.Policy)
	p.states.New = func() any { return new(requestState) }
	for _, r := range cfg.Routes {
		p.upNames = append(p.upNames, r.Prefix)
	}
	p.upNames = append(p.upNames, "default")
	if cfg.Metrics != nil {
		for _, name := range p.upNames { // every series exists from the start
			cfg.Metrics.upstream.WithLabelValues(name)
		}
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      cfg.Transport,
		FlushInterval:  -1, // stream responses (SSE, long polls) as they come
		ErrorHandler:   p.upstreamError,
		ModifyResponse: p.modifyResponse,
		ErrorLog:       zap.NewStdLog(cfg.Logger),
		BufferPool:     newBufferPool(),
	}
	plain := *p.rp
	plain.ModifyResponse = nil
	p.plain = &plain
	return p, nil
}

// Policy returns the rules in force.
func (p *Proxy) Policy() *policy.Policy { return p.policy.Load() }

// SetPolicy puts pol in force for the requests that arrive from now on. A
// request already being served finishes under the rules it started with:
// each request reads the rules once. pol must not be nil.
func (p *Proxy) SetPolicy(pol *policy.Policy) { p.policy.Store(pol) }

// ServeHTTP decides r against every matching rule and forwards it or
// answers it.
//
// Everything is read from the request as the upstream will receive it:
// hop-by-hop headers are removed first, the path is the canonical one the
// upstream is sent, the body is the buffered one it is sent, and the
// methods are its own and the one a "_method" field asks for.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := p.states.Get().(*requestState)
	defer func() {
		clear(st.checks)
		clear(st.rules)
		st.checks, st.rules = st.checks[:0], st.rules[:0]
		st.ident.Reset("", nil, nil, false)
		st.w = statusWriter{}
		st.path, st.verdict, st.upstream = "", "", 0
		p.states.Put(st)
	}()
	if p.observing() {
		began := time.Now()
		st.w.ResponseWriter = w
		w = &st.w
		st.verdict = outcomeRejected
		defer p.finish(r, st, began)
	}

	canonical, err := policy.CanonicalPath(r.URL.EscapedPath())
	if err != nil {
		WriteProblem(w, Problem{Status: http.StatusBadRequest, Detail: "malformed request path: " + err.Error()})
		return
	}
	st.path = canonical
	removeHopByHop(r.Header)
	// The client IP is read before the forwarding headers are stripped;
	// from here on, the only forwarding header is the one sluice sets.
	client := p.cfg.Trusted.ClientIP(r.RemoteAddr, r.Header)
	stripClientHeaders(r.Header)
	r.Header["X-Forwarded-For"] = []string{client.String()}
	if canonical != r.URL.EscapedPath() {
		unescaped, err := url.PathUnescape(canonical)
		if err != nil { // CanonicalPath only leaves valid escapes
			panic(err)
		}
		r.URL.Path, r.URL.RawPath = unescaped, canonical
	}
	match := policy.MatchPath(canonical)
	rules := p.policy.Load()
	// Methods are case-sensitive on the wire, but some frameworks
	// upper-case them; matching upper-case means "post" cannot slip past a
	// POST rule. The request is forwarded with the method as sent.
	method := upperMethod(r.Method)
	st.rules = rules.Match(method, match, st.rules[:0])
	// A "_method" field can only matter where some rule applies to the
	// path under another method; only then is it read.
	override := rules.MethodMatters(method, match)
	contentType := r.Header["Content-Type"]
	need := needsBody(st.rules) || override && identity.ReadsBody(contentType)

	body, err := p.bufferBody(r, need)
	if err != nil {
		if errors.Is(err, errBodyTooLarge) {
			WriteProblem(w, Problem{Status: http.StatusRequestEntityTooLarge, Detail: "request body is larger than " + strconv.FormatInt(p.cfg.MaxBodyBytes, 10) + " bytes"})
			return
		}
		WriteProblem(w, Problem{Status: http.StatusBadRequest, Detail: "the request body could not be read whole (malformed chunked framing, or fewer bytes than its Content-Length)"})
		return
	}
	var buffered []byte
	streamed := false
	if body != nil {
		defer body.done()
		buffered, streamed = body.buf, body.rest != nil
	} else if r.ContentLength > 0 {
		streamed = true // over the limit on a route that does not need it
	}
	st.ident.Reset(r.URL.RawQuery, contentType, buffered, streamed)

	if override {
		m, err := st.ident.Method()
		if err != nil {
			WriteProblem(w, Problem{Status: http.StatusBadRequest, Detail: err.Error()})
			return
		}
		if m != "" && m != method {
			methods := [2]string{method, m}
			st.rules = rules.MatchAny(methods[:], match, st.rules[:0])
		}
	}
	if len(st.rules) == 0 {
		st.verdict = outcomeNoRule
		st.upstream = p.forward(w, r, match, p.plain)
		return
	}

	ipKey := ""
	for _, rule := range st.rules {
		key, err := p.key(r, &st.ident, rule, client, &ipKey)
		if err != nil {
			WriteProblem(w, Problem{Status: http.StatusBadRequest, Detail: "rule '" + rule.Name + "': " + err.Error()})
			return
		}
		st.checks = append(st.checks, limiter.Check{Rule: rule, Key: key})
	}

	out := &st.outcome
	p.cfg.Limiter.DecideInto(r.Context(), st.checks, out)
	switch {
	case out.Unavailable:
		st.verdict = outcomeUnavailable
		p.unavailable(w, out)
	case !out.Allowed:
		st.verdict = outcomeLimited
		p.tooMany(w, st.checks, out)
	default:
		st.verdict = outcomeAllowed
		if i := out.Primary(st.checks); i >= 0 {
			res := &out.Results[i]
			p.cfg.Headers.set(w.Header(), quota{
				rule:      st.checks[i].Rule.Name,
				limit:     res.Limit,
				window:    res.Window,
				remaining: res.Remaining,
				resetIn:   CeilSeconds(res.ResetAfter),
				resetAt:   CeilUnix(res.Reset),
			})
		}
		st.upstream = p.forward(w, r, match, p.rp)
	}
}

// key returns the hashed identity that rule counts r by. A rule whose
// identifier is absent counts the client IP instead, so leaving the
// identifier out never escapes the limit.
func (p *Proxy) key(r *http.Request, ident *identity.Request, rule *policy.Rule, client netip.Addr, ipKey *string) (string, error) {
	var (
		value string
		found bool
		err   error
	)
	switch rule.Identity.Kind {
	case policy.ByGlobal:
		return p.global, nil
	case policy.ByEmail:
		value, found, err = ident.Email(rule.Identity.Field)
	case policy.ByTenant, policy.ByHeader:
		value, found, err = identity.Header(r.Header, rule.Identity.Field)
	}
	if err != nil {
		return "", err
	}
	if found {
		return p.cfg.Hasher.Key(rule.Identity.Kind.String(), value), nil
	}
	if *ipKey == "" {
		*ipKey = p.cfg.Hasher.Key(policy.ByIP.String(), hashing.IPGroup(client))
	}
	return *ipKey, nil
}

// needsBody reports whether any rule reads its identifier from the body.
func needsBody(rules []*policy.Rule) bool {
	return slices.ContainsFunc(rules, func(r *policy.Rule) bool { return r.Identity.Kind == policy.ByEmail })
}

// tooMany answers 429 for the denying rule with the longest wait.
func (p *Proxy) tooMany(w http.ResponseWriter, checks []limiter.Check, out *limiter.Outcome) {
	var violated []string
	for i := range checks {
		if out.Denied(checks, i) {
			violated = append(violated, checks[i].Rule.Name)
		}
	}
	worst := out.Primary(checks)
	if worst < 0 { // a denial always has a denying rule; never answer without one
		worst = 0
	}
	if len(violated) == 0 {
		violated = []string{checks[worst].Rule.Name}
	}
	res := &out.Results[worst]
	retry := max(CeilSeconds(res.RetryAfter), 1)
	name := checks[worst].Rule.Name
	h := w.Header()
	h["Retry-After"] = []string{strconv.FormatInt(retry, 10)}
	p.cfg.Headers.set(h, quota{
		rule:      name,
		limit:     res.Limit,
		window:    res.Window,
		remaining: 0,
		resetIn:   retry,
		// The store's clock at the decision, plus the wait.
		resetAt: CeilUnix(res.Reset.Add(-res.ResetAfter).Add(time.Duration(retry) * time.Second)),
	})
	WriteProblem(w, Problem{
		Type:             quotaExceededType,
		Status:           http.StatusTooManyRequests,
		Detail:           fmt.Sprintf("rate limit '%s' exceeded, retry in %d s", name, retry),
		ViolatedPolicies: violated,
		RetryAfter:       retry,
	})
}

// unavailable answers 503 when a fail=closed rule could not be decided.
func (p *Proxy) unavailable(w http.ResponseWriter, out *limiter.Outcome) {
	retry := max(CeilSeconds(out.RetryAfter), 1)
	w.Header()["Retry-After"] = []string{strconv.FormatInt(retry, 10)}
	WriteProblem(w, Problem{
		Status:     http.StatusServiceUnavailable,
		Detail:     "the rate limiter cannot decide right now; retry shortly",
		RetryAfter: retry,
	})
}

// forward sends r to its upstream and returns how long that took.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, match string, rp *httputil.ReverseProxy) time.Duration {
	start := time.Now()
	i := p.route(match)
	if i < len(p.cfg.Routes) {
		r = r.WithContext(withRoute(r.Context(), i))
	}
	rp.ServeHTTP(w, r)
	took := time.Since(start)
	if p.cfg.Metrics != nil {
		p.cfg.Metrics.upstream.WithLabelValues(p.upNames[i]).Observe(took.Seconds())
	}
	return took
}

// route returns the index of the route for the match-form path, or
// len(Routes) for the default upstream.
func (p *Proxy) route(match string) int {
	for i, rt := range p.cfg.Routes {
		if under(match, rt.Prefix) {
			return i
		}
	}
	return len(p.cfg.Routes)
}

// rewrite builds the upstream request. ReverseProxy has already removed
// hop-by-hop headers and the client's Forwarded and X-Forwarded-* headers
// from pr.Out; the ones set here are sluice's own.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	target := p.cfg.Upstream
	if i, ok := routeFrom(pr.In.Context()); ok {
		target = p.cfg.Routes[i].Upstream
	}
	pr.SetURL(target)
	pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
	pr.Out.Header["X-Forwarded-Host"] = []string{pr.In.Host}
	proto := "http"
	if pr.In.TLS != nil {
		proto = "https"
	}
	pr.Out.Header["X-Forwarded-Proto"] = []string{proto}
}

// modifyResponse drops an upstream's own rate-limit headers from responses
// to requests a rule matched, so a client never sees two answers.
func (p *Proxy) modifyResponse(res *http.Response) error {
	if p.cfg.Headers.IETF || p.cfg.Headers.X {
		for _, h := range rateLimitHeaders {
			delete(res.Header, h)
		}
	}
	return nil
}

// upstreamError answers 502 when the upstream cannot be reached or fails
// before sending a response.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		// The client went away; there is nobody to answer.
		w.WriteHeader(499)
		return
	}
	// The error of a failed round trip carries the URL, whose path and
	// query may hold identifiers; log only the cause.
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	p.log.Warn("upstream request failed", zap.Error(err))
	WriteProblem(w, Problem{Status: http.StatusBadGateway, Detail: "the upstream could not be reached"})
}

// routeKey carries the chosen route from ServeHTTP to rewrite.
type routeKey struct{}

func withRoute(ctx context.Context, i int) context.Context {
	return context.WithValue(ctx, routeKey{}, i)
}

func routeFrom(ctx context.Context) (int, bool) {
	i, ok := ctx.Value(routeKey{}).(int)
	return i, ok
}

// upperMethod upper-cases an ASCII method, without allocating when it
// already is.
func upperMethod(m string) string {
	for i := 0; i < len(m); i++ {
		if 'a' <= m[i] && m[i] <= 'z' {
			return strings.ToUpper(m)
		}
	}
	return m
}
