// Package proxy is sluice's HTTP side: it canonicalises each request,
// works out the rate-limit keys of the rules that match it, asks the
// limiter, and either answers 429 (or 503) itself or forwards the request
// upstream.
//
// Request hygiene (hop-by-hop and spoofable headers, buffered bodies),
// forwarding, the listeners' servers and the wire format of responses
// (rate-limit headers, and problem+json, which the admin API shares) live
// here; reading identifiers from a request lives in the identity
// sub-package, the admin listener in package admin, and verifying bearer
// tokens in package jwt (a *jwt.Verifier, through TokenVerifier).
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
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/identity"
)

// Config configures a Proxy. Upstream and Decider are required; every
// other field has a working zero value.
type Config struct {
	Upstream *url.URL
	Routes   []Route // longest prefix first, as ParseRoutes returns them
	// Decider decides: the rules, identities, limiter, rate-limit headers,
	// metrics and access log, shared with the other listeners that decide
	// (forward-auth, Envoy's rate limit service).
	Decider *Decider
	// MaxBodyBytes bounds the request bodies that are buffered whole
	// before they are forwarded: larger ones get 413 on routes whose rules
	// read the body, and are streamed elsewhere. Zero means 64 KiB.
	MaxBodyBytes int64
	// Transport reaches the upstreams; nil means
	// NewTransport(DefaultTimeouts().Upstream).
	Transport http.RoundTripper
	Logger    *zap.Logger // nil means no logging
	// UsagePath is SLUICE_USAGE_PATH: a canonical path where a GET or HEAD
	// is answered by sluice with the caller's standing on every rule
	// (usage.go), never forwarded; other methods there get 405. Empty
	// turns the endpoint off. Usage is required with it.
	UsagePath string
	// Usage reads the counters the usage endpoint shows (the store's
	// Peek).
	Usage Peeker
}

// Proxy is the gateway's public handler. It is safe for concurrent use.
type Proxy struct {
	cfg     Config
	dec     *Decider
	rp      *httputil.ReverseProxy // for requests a rule matched
	plain   *httputil.ReverseProxy // for the rest: the upstream's headers pass untouched
	log     *zap.Logger
	states  sync.Pool
	bodies  *bodyPool
	upNames []string // metric label per route, then the default upstream
	// usageMatch is the usage path in match form; "" when it is off.
	usageMatch string
}

// requestState holds the per-request scratch space, pooled so a decision
// allocates as little as possible.
type requestState struct {
	Decision

	// For the responses metric and the access log.
	w        statusWriter
	upstream time.Duration // time spent forwarding
}

// New returns a Proxy for cfg.
func New(cfg Config) (*Proxy, error) {
	if cfg.Upstream == nil || cfg.Decider == nil {
		return nil, errors.New("proxy: Upstream and Decider are required")
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
	if err := ValidateUsagePath(cfg.UsagePath); err != nil {
		return nil, fmt.Errorf("proxy: UsagePath: %w", err)
	}
	if cfg.UsagePath != "" && cfg.Usage == nil {
		return nil, errors.New("proxy: Usage is required with a UsagePath")
	}
	p := &Proxy{
		cfg:    cfg,
		dec:    cfg.Decider,
		log:    cfg.Logger,
		bodies: newBodyPool(cfg.MaxBodyBytes),
	}
	if cfg.UsagePath != "" {
		p.usageMatch = policy.MatchPath(cfg.UsagePath)
	}
	p.states.New = func() any { return new(requestState) }
	for _, r := range cfg.Routes {
		p.upNames = append(p.upNames, r.Prefix)
	}
	p.upNames = append(p.upNames, "default")
	if m := p.dec.cfg.Metrics; m != nil {
		for _, name := range p.upNames { // every series exists from the start
			m.upstream.WithLabelValues(name)
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

// Decider returns the proxy's decider, to share with the other listeners.
func (p *Proxy) Decider() *Decider { return p.dec }

// Policy returns the rules in force.
func (p *Proxy) Policy() *policy.Policy { return p.dec.Policy() }

// SetPolicy puts pol in force (see Decider.SetPolicy), on every listener
// that shares the proxy's decider.
func (p *Proxy) SetPolicy(pol *policy.Policy) { p.dec.SetPolicy(pol) }

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
		st.reset()
		st.w = statusWriter{}
		st.upstream = 0
		p.states.Put(st)
	}()
	x := &st.Decision
	x.Verdict = OutcomeRejected
	if p.observing() {
		began := time.Now()
		st.w.ResponseWriter = w
		w = &st.w
		defer p.finish(r, st, began)
	}

	// net/http keeps a raw "#" in the path, where other readers see a
	// fragment: the upstream's reading is unknown (policy.CheckTarget).
	if err := policy.CheckTarget(r.RequestURI); err != nil {
		WriteProblem(w, Problem{Status: http.StatusBadRequest, Detail: "malformed request path: " + err.Error()})
		return
	}
	// A query string that does not parse would reach the upstream other
	// than as sent (the reverse proxy drops its pairs that do not parse and
	// re-encodes the rest), and readers split ';' and bad escapes each
	// their own way: refused on every route, as the routes that read the
	// query refuse it.
	if !identity.QueryValid(r.URL.RawQuery) {
		WriteProblem(w, Problem{Status: http.StatusBadRequest, Detail: "the query string is malformed (a ';' separator or a bad % escape): what the upstream would read of it is unknown"})
		return
	}
	if prob := p.dec.Begin(x, r.Method, r.URL.EscapedPath(), r.RemoteAddr, r.Header); prob != nil {
		WriteProblem(w, *prob)
		return
	}
	usage := p.isUsage(x)
	if usage && usageMethodNotAllowed(w, r.Method) {
		return
	}
	// From here on, the only forwarding header is the one sluice sets.
	r.Header["X-Forwarded-For"] = []string{x.Client.String()}
	if x.Path != r.URL.EscapedPath() {
		unescaped, err := url.PathUnescape(x.Path)
		if err != nil { // CanonicalPath only leaves valid escapes
			panic(err)
		}
		r.URL.Path, r.URL.RawPath = unescaped, x.Path
	}
	// The request is forwarded with the method as sent.
	contentType := r.Header["Content-Type"]
	body, err := p.bufferBody(r, x.needsBody(contentType))
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
	x.Ident.Reset(r.URL.RawQuery, contentType, buffered, streamed)

	if prob := p.dec.Methods(x); prob != nil {
		WriteProblem(w, *prob)
		return
	}
	if len(x.Rules) == 0 {
		x.Verdict = OutcomeNoRule
		if usage {
			p.serveUsage(w, r, x)
			return
		}
		st.upstream = p.forward(w, r, x.match, p.plain)
		return
	}
	if prob := p.dec.Keys(x, r.Header, false); prob != nil {
		WriteProblem(w, *prob)
		return
	}
	p.dec.Decide(r.Context(), x)
	if p.dec.Answer(w, x, 0) == 0 {
		if usage { // the rules of its path allowed it
			p.serveUsage(w, r, x)
			return
		}
		if c := p.admittedCharges(x); c != nil {
			r = r.WithContext(withCharges(r.Context(), c))
		}
		st.upstream = p.forward(w, r, x.match, p.rp)
	}
}

// needsBody reports whether any rule reads its identifier from the body.
func needsBody(rules []*policy.Rule) bool {
	return slices.ContainsFunc(rules, func(r *policy.Rule) bool { return r.Identity.Kind == policy.ByEmail })
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
	if p.dec.cfg.Metrics != nil {
		p.dec.cfg.Metrics.upstream.WithLabelValues(p.upNames[i]).Observe(took.Seconds())
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
	if c := chargesFrom(pr.In.Context()); c != nil && c.readsBody() {
		// The counts are read from the body as it passes: ask for it as
		// it is, not compressed.
		pr.Out.Header["Accept-Encoding"] = []string{"identity"}
	}
}

// modifyResponse drops an upstream's own rate-limit headers from responses
// to requests a rule matched, so a client never sees two answers.
func (p *Proxy) modifyResponse(res *http.Response) error {
	if c := chargesFrom(res.Request.Context()); c != nil {
		c.watch(res)
	}
	if p.dec.cfg.Headers.IETF || p.dec.cfg.Headers.X {
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
		if r.ContentLength > p.cfg.MaxBodyBytes || r.ContentLength < 0 {
			// A streamed body (bufferBody) whose read failed: the client
			// stopped short of its length, or stalled past the read
			// timeout, and the server ended the request's context. It may
			// still be there to read the answer.
			WriteProblem(w, Problem{Status: http.StatusBadRequest, Detail: "the request body was not received in full (it ended before its length, or stalled past the read timeout); its start had been forwarded"})
			return
		}
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
