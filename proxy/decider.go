package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/jwt"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/identity"
)

// Listeners, as the listener label of sluice_requests_total and the access
// log name them.
const (
	ListenerPublic = "public" // the proxy (SLUICE_LISTEN)
	ListenerCheck  = "check"  // forward-auth (SLUICE_CHECK_LISTEN, package check)
	ListenerRLS    = "rls"    // Envoy's rate limit service (SLUICE_RLS_LISTEN, package check/rls)
)

// Outcomes of a request (or a question about one) as the access log and
// sluice_requests_total name them.
const (
	OutcomeAllowed     = "allowed"     // decided and allowed (forwarded, or 200 / OK)
	OutcomeLimited     = "limited"     // denied: 429 (403 on ?deny=403, OVER_LIMIT)
	OutcomeUnavailable = "unavailable" // a fail=closed rule could not be decided: 503 (UNKNOWN)
	OutcomeNoRule      = "no_rule"     // no rule matched (forwarded, or 200 / OK)
	OutcomeRejected    = "rejected"    // 400 or 413 before any decision
)

// DeciderConfig configures a Decider. Policy, Limiter and Hasher are
// required; every other field has a working zero value.
type DeciderConfig struct {
	// Policy is the rules to start with; SetPolicy replaces them.
	Policy  *policy.Policy
	Limiter *limiter.Limiter
	Hasher  *hashing.Hasher
	// Trusted lists the proxies whose X-Forwarded-For is believed.
	Trusted identity.TrustedProxies
	Headers HeaderFamilies
	// Metrics counts requests by listener and outcome; nil counts nothing.
	Metrics *Metrics
	// AccessLog receives one INFO line per request (see Finish); nil
	// turns the access log off.
	AccessLog *zap.Logger
	// JWT verifies the bearer tokens that jwt rules count by and plans
	// options choose limits by, once per decided request. Nil verifies
	// none: a jwt rule counts every request by its client IP, and no plan
	// applies (the gateway's settings refuse such rules without keys).
	JWT TokenVerifier
	// RejectInvalidTokens (SLUICE_JWT_INVALID=reject) answers 401 to a
	// request that a rule needs the token of and whose token is present
	// but not valid. False counts such a request as one without a token:
	// by its client IP under jwt rules, with the rule's own limit under
	// plans. A missing token is never rejected.
	RejectInvalidTokens bool
}

// TokenVerifier verifies bearer tokens: a *jwt.Verifier.
type TokenVerifier interface {
	// Verify returns the claims of a valid token, and the result of the
	// verification; token "" means the request had none.
	Verify(token string) (*jwt.Claims, jwt.Result)
	// Issuer is the issuer tokens are checked against ("" for any), part
	// of every key of a claim (hashing.Hasher.JWTKey).
	Issuer() string
}

var _ TokenVerifier = (*jwt.Verifier)(nil)

// Decider is the one definition of how sluice decides a request and what
// it answers, shared by every listener that decides: the public proxy,
// forward-auth (package check) and Envoy's rate limit service
// (check/rls). It holds the rules in force, reads the client IP and the
// identities, works out the hashed key of every matching rule, asks the
// limiter, and writes the rate-limit headers and the 429 and 503 answers.
// One Decider serves them all, so a reload of the rules reaches each at
// once. It is safe for concurrent use.
//
// An HTTP request is decided in steps, each on a Decision that holds the
// request's scratch space: Begin (path, hygiene, client IP, rules),
// Methods (a "_method" field), Keys, Decide, then Answer, and Finish to
// count and log it.
type Decider struct {
	cfg    DeciderConfig
	policy atomic.Pointer[policy.Policy]
	global string // the key every "by global" rule counts
	issuer string // the JWT verifier's issuer, part of every jwt key
	pool   sync.Pool
}

// NewDecider returns a Decider for cfg.
func NewDecider(cfg DeciderConfig) (*Decider, error) {
	if cfg.Policy == nil || cfg.Limiter == nil || cfg.Hasher == nil {
		return nil, errors.New("proxy: Policy, Limiter and Hasher are required")
	}
	d := &Decider{cfg: cfg, global: cfg.Hasher.Key(policy.ByGlobal.String(), "")}
	if cfg.JWT != nil {
		d.issuer = cfg.JWT.Issuer()
	}
	d.policy.Store(cfg.Policy)
	d.pool.New = func() any { return new(Decision) }
	return d, nil
}

// Policy returns the rules in force.
func (d *Decider) Policy() *policy.Policy { return d.policy.Load() }

// SetPolicy puts pol in force for the requests that arrive from now on on
// every listener. A request already being decided finishes under the
// rules it started with: each reads the rules once. pol must not be nil.
func (d *Decider) SetPolicy(pol *policy.Policy) { d.policy.Store(pol) }

// Decision is one request being decided, and its scratch space. Get one
// from Decider.Get and give it back with Decider.Put, or embed one in a
// pooled state of the caller's; a Decision is not safe for concurrent use.
type Decision struct {
	// Rules are the rules that match the request.
	Rules []*policy.Rule
	// Checks are the rules with the key each counts, once Keys (or the
	// caller, for descriptors) worked them out.
	Checks []limiter.Check
	// Outcome is the limiter's decision, once Decide ran.
	Outcome limiter.Outcome
	// Ident reads identities from the request's query string and body;
	// the caller Resets it before Methods and Keys.
	Ident identity.Request
	// Path is the canonical path (for descriptors, rls:DOMAIN), once
	// known: what the access log shows.
	Path string
	// Client is the client IP Begin derived.
	Client netip.Addr
	// Verdict is the outcome as the access log names it (OutcomeAllowed,
	// ...); OutcomeRejected until a decision says otherwise.
	Verdict string
	// Token is the result of verifying the request's bearer token (a
	// jwt.Result's name), once Keys verified it: "" when no matching rule
	// needed it. Never the token.
	Token string

	pol      *policy.Policy // the rules read once, by Begin
	method   string         // upper-cased
	match    string         // the path in match form
	override bool           // a "_method" field could bring other rules in
	methods  [4]string      // scratch for Methods
}

// Get returns an empty Decision.
func (d *Decider) Get() *Decision {
	x := d.pool.Get().(*Decision)
	x.Verdict = OutcomeRejected
	return x
}

// Put gives x back for reuse; x must not be used after.
func (d *Decider) Put(x *Decision) {
	x.reset()
	d.pool.Put(x)
}

// reset empties x, keeping its storage.
func (x *Decision) reset() {
	clear(x.Checks)
	clear(x.Rules)
	x.Checks, x.Rules = x.Checks[:0], x.Rules[:0]
	x.Ident.Reset("", nil, nil, false)
	x.Path, x.Client, x.Verdict, x.Token, x.pol, x.method, x.match, x.override = "", netip.Addr{}, "", "", nil, "", "", false
}

// Begin is the first step of deciding an HTTP request: method, its
// escaped path (a URL's EscapedPath, without the query), the connection's
// remote address and its headers h, read as the upstream will receive
// them. It canonicalises the path (a malformed one is a 400 *Problem);
// removes from h the hop-by-hop headers, then, once the client IP is read
// (X-Forwarded-For counts only from a trusted remoteAddr), every header a
// client could spoof an address, host, path or method with, so that
// identities are read from what the upstream will receive; and finds the
// rules that match the method and path, each rule read once from the
// rules in force. The caller sets its own forwarding headers afterwards.
func (d *Decider) Begin(x *Decision, method, escapedPath, remoteAddr string, h http.Header) *Problem {
	canonical, err := policy.CanonicalPath(escapedPath)
	if err != nil {
		return &Problem{Status: http.StatusBadRequest, Detail: "malformed request path: " + err.Error()}
	}
	x.Path = canonical
	removeHopByHop(h)
	// The client IP is read before the forwarding headers are stripped.
	x.Client = d.cfg.Trusted.ClientIP(remoteAddr, h)
	stripClientHeaders(h)
	x.match = policy.MatchPath(canonical)
	x.pol = d.policy.Load()
	// Methods are case-sensitive on the wire, but some frameworks
	// upper-case them; matching upper-case means "post" cannot slip past a
	// POST rule.
	x.method = upperMethod(method)
	x.Rules = x.pol.Match(x.method, x.match, x.Rules[:0])
	// A "_method" field can only matter where some rule applies to the
	// path under another method; only then is it read.
	x.override = x.pol.MethodMatters(x.method, x.match)
	return nil
}

// needsBody reports whether deciding x needs the body, when it is sent
// with these Content-Type lines: whether a matching rule reads its
// identifier from the body, or a "_method" field in it could matter.
func (x *Decision) needsBody(contentType []string) bool {
	return needsBody(x.Rules) || x.override && identity.ReadsBody(contentType)
}

// Methods matches the rules of the other methods the request may be
// treated as: the one its "_method" field asks for (read from x.Ident,
// which the caller has Reset, where some rule applies to the path under
// another method), and extra ones the caller knows of (already upper-case
// tokens). A "_method" field that is ambiguous or not a method name is a
// 400 *Problem.
func (d *Decider) Methods(x *Decision, extra ...string) *Problem {
	methods := append(x.methods[:0], x.method)
	if x.override {
		m, err := x.Ident.Method()
		if err != nil {
			return &Problem{Status: http.StatusBadRequest, Detail: err.Error()}
		}
		if m != "" && m != x.method {
			methods = append(methods, m)
		}
	}
	for _, m := range extra {
		if m != x.method {
			methods = append(methods, m)
		}
	}
	if len(methods) > 1 {
		x.Rules = x.pol.MatchAny(methods, x.match, x.Rules[:0])
	}
	clear(methods)
	return nil
}

// Keys works out the hashed key of every matching rule into x.Checks,
// reading header identities from h and body ones from x.Ident, unless
// bodyless: then the body is not seen (forward-auth), and a rule that
// reads its identifier from the body counts the client IP, as it does
// when the identifier is missing. An ambiguous identity is a 400
// *Problem naming the rule.
//
// Where a rule counts by a claim of the bearer token (jwt, jwt(claim)) or
// chooses its limit by one (plans), the one token of h's Authorization
// header is verified, once for all the rules: two Authorization headers,
// or anything but a single token, is a 400 *Problem; a present but
// invalid token is a 401 one with RejectInvalidTokens. A rule with plans
// is counted as the plan's rule (policy.Rule.ForPlan) when a verified
// claim names one of its plans.
func (d *Decider) Keys(x *Decision, h http.Header, bodyless bool) *Problem {
	var claims *jwt.Claims
	if needsToken(x.Rules) {
		var prob *Problem
		if claims, prob = d.verifyToken(x, h); prob != nil {
			return prob
		}
	}
	ipKey := ""
	for _, rule := range x.Rules {
		key, err := d.key(x, h, rule, claims, bodyless, &ipKey)
		if err != nil {
			return &Problem{Status: http.StatusBadRequest, Detail: "rule '" + rule.Name + "': " + err.Error()}
		}
		counted := rule
		if len(rule.Plans) > 0 {
			if plan, ok := claims.Claim(rule.PlanClaim); ok {
				counted = rule.ForPlan(plan)
			}
		}
		x.Checks = append(x.Checks, limiter.Check{Rule: counted, Key: key})
	}
	return nil
}

// verifyToken reads the bearer token of h and verifies it, once for every
// rule of the request, recording the result in x.Token. It returns the
// claims of a valid token (nil for a missing or invalid one), or the
// problem to answer: 400 when the Authorization header is ambiguous, and
// 401 for an invalid token when RejectInvalidTokens is set.
func (d *Decider) verifyToken(x *Decision, h http.Header) (*jwt.Claims, *Problem) {
	token, _, err := identity.Bearer(h)
	if err != nil {
		return nil, &Problem{Status: http.StatusBadRequest, Detail: err.Error()}
	}
	if d.cfg.JWT == nil {
		return nil, nil
	}
	claims, res := d.cfg.JWT.Verify(token)
	x.Token = res.String()
	if res != jwt.Valid && res != jwt.Missing && d.cfg.RejectInvalidTokens {
		return nil, &Problem{
			Status:    http.StatusUnauthorized,
			Detail:    "the bearer token is not valid (" + x.Token + ")",
			Challenge: wwwAuthenticateInvalid,
		}
	}
	return claims, nil
}

// wwwAuthenticateInvalid is the challenge of a 401 for an invalid token
// (RFC 6750 section 3).
const wwwAuthenticateInvalid = `Bearer error="invalid_token"`

// needsToken reports whether any rule counts by a claim of the bearer
// token or chooses its limit by one.
func needsToken(rules []*policy.Rule) bool {
	return slices.ContainsFunc(rules, func(r *policy.Rule) bool { return r.Identity.Kind == policy.ByJWT || len(r.Plans) > 0 })
}

// key returns the hashed identity that rule counts the request by. A rule
// whose identifier is absent (or, bodyless, in the body) counts the client
// IP instead, so leaving the identifier out never escapes the limit; so
// does a jwt rule without a verified token (claims nil), or whose claim is
// not an identifier, so a forged token spends its sender's quota, never
// its victim's.
func (d *Decider) key(x *Decision, h http.Header, rule *policy.Rule, claims *jwt.Claims, bodyless bool, ipKey *string) (string, error) {
	key, found, err := d.identityKey(x, h, rule, claims, bodyless)
	if err != nil || found {
		return key, err
	}
	return d.clientKey(x, ipKey), nil
}

// identityKey returns the hashed key of rule's own identity in the
// request, and whether the request carries it: found is false for an ip
// rule (the caller counts the client IP, clientKey), and for an
// identifier that is absent, in the body when bodyless, or a claim
// without a verified token. An ambiguous or invalid identifier is an
// error.
func (d *Decider) identityKey(x *Decision, h http.Header, rule *policy.Rule, claims *jwt.Claims, bodyless bool) (key string, found bool, err error) {
	var value string
	switch rule.Identity.Kind {
	case policy.ByGlobal:
		return d.global, true, nil
	case policy.ByEmail:
		if !bodyless {
			value, found, err = x.Ident.Email(rule.Identity.Field)
		}
	case policy.ByTenant, policy.ByHeader:
		value, found, err = identity.Header(h, rule.Identity.Field)
	case policy.ByJWT:
		if value, found = claims.Claim(rule.Identity.Field); found {
			return d.cfg.Hasher.JWTKey(d.issuer, rule.Identity.Field, value), true, nil
		}
	}
	if err != nil || !found {
		return "", false, err
	}
	return d.cfg.Hasher.Key(rule.Identity.Kind.String(), value), true, nil
}

// clientKey returns the hashed key of the request's client IP (its /64
// for IPv6), working it out once into *ipKey.
func (d *Decider) clientKey(x *Decision, ipKey *string) string {
	if *ipKey == "" {
		*ipKey = d.cfg.Hasher.Key(policy.ByIP.String(), hashing.IPGroup(x.Client))
	}
	return *ipKey
}

// DescriptorKey returns the hashed key of an Envoy descriptor's counted
// values (policy.Rule.DescriptorValues), under the kind "descriptor", so
// that it never equals a key of another kind.
func (d *Decider) DescriptorKey(values []string) string {
	return d.cfg.Hasher.Key(policy.ByDescriptor.String(), hashing.JoinValues(values))
}

// Decide asks the limiter about x.Checks, all together and atomically,
// and sets x.Verdict. Checks without a rule (x.Rules empty) are allowed
// as no_rule without asking.
func (d *Decider) Decide(ctx context.Context, x *Decision) {
	if len(x.Checks) == 0 {
		x.Verdict = OutcomeNoRule
		return
	}
	out := &x.Outcome
	d.cfg.Limiter.DecideInto(ctx, x.Checks, out)
	switch {
	case out.Unavailable:
		x.Verdict = OutcomeUnavailable
	case !out.Allowed:
		x.Verdict = OutcomeLimited
	default:
		x.Verdict = OutcomeAllowed
	}
}

// Answer answers a decided request on w and returns the status it wrote:
// 503 when it is unavailable, 429 (or denied, when not 0: 403 for nginx's
// auth_request) when it is denied, each with its headers and
// problem+json body. For an allowed one it sets the rate-limit headers,
// writes nothing and returns 0, for the caller to go on (forward it, or
// answer 200).
func (d *Decider) Answer(w http.ResponseWriter, x *Decision, denied int) int {
	switch x.Verdict {
	case OutcomeUnavailable:
		retry := max(CeilSeconds(x.Outcome.RetryAfter), 1)
		w.Header()["Retry-After"] = []string{strconv.FormatInt(retry, 10)}
		WriteProblem(w, Problem{
			Status:     http.StatusServiceUnavailable,
			Detail:     "the rate limiter cannot decide right now; retry shortly",
			RetryAfter: retry,
		})
		return http.StatusServiceUnavailable
	case OutcomeLimited:
		if denied == 0 {
			denied = http.StatusTooManyRequests
		}
		d.tooMany(w, x, denied)
		return denied
	case OutcomeAllowed:
		d.SetHeaders(w.Header(), x.Checks, &x.Outcome)
	}
	return 0
}

// SetHeaders sets on h the rate-limit headers of a decided request: for
// an allowed one, those of the matching rule with the least room left;
// for a denied one, Retry-After and those of the denying rule with the
// longest wait (see limiter.Outcome.Primary). It returns that wait, in
// whole seconds, and the rule's index in checks (-1 when no rule
// qualifies, for an allowed request: nothing is set then).
func (d *Decider) SetHeaders(h http.Header, checks []limiter.Check, out *limiter.Outcome) (retry int64, primary int) {
	i := out.Primary(checks)
	if out.Allowed {
		if i >= 0 {
			res := &out.Results[i]
			d.cfg.Headers.set(h, quota{
				rule:      checks[i].Rule.Name,
				limit:     res.Limit,
				window:    res.Window,
				remaining: res.Remaining,
				resetIn:   CeilSeconds(res.ResetAfter),
				resetAt:   CeilUnix(res.Reset),
			})
		}
		return 0, i
	}
	if i < 0 { // a denial always has a denying rule; never answer without one
		i = 0
	}
	res := &out.Results[i]
	retry = max(CeilSeconds(res.RetryAfter), 1)
	h["Retry-After"] = []string{strconv.FormatInt(retry, 10)}
	// The reset is the key's, rounded as on an allowed answer and in the
	// admin API, so that all three agree to the second. Rounding the
	// decision's instant plus the already rounded-up wait instead put it
	// a second later whenever the decision fell inside a second. The
	// instant a request of the rule's cost would first pass is never
	// after the key's reset; should a store ever say so, the later one
	// stands, so that a retry at the reset is never early.
	reset := res.Reset
	if at := res.Reset.Add(res.RetryAfter - res.ResetAfter); at.After(reset) {
		reset = at
	}
	d.cfg.Headers.set(h, quota{
		rule:      checks[i].Rule.Name,
		limit:     res.Limit,
		window:    res.Window,
		remaining: 0,
		resetIn:   retry,
		resetAt:   CeilUnix(reset),
	})
	return retry, i
}

// tooMany answers a denied request with status (429, or 403 for nginx),
// for the denying rule with the longest wait.
func (d *Decider) tooMany(w http.ResponseWriter, x *Decision, status int) {
	retry, worst := d.SetHeaders(w.Header(), x.Checks, &x.Outcome)
	var violated []string
	for i := range x.Checks {
		if x.Outcome.Denied(x.Checks, i) {
			violated = append(violated, x.Checks[i].Rule.Name)
		}
	}
	name := x.Checks[worst].Rule.Name
	if len(violated) == 0 {
		violated = []string{name}
	}
	WriteProblem(w, Problem{
		Type:             quotaExceededType,
		Status:           status,
		Detail:           fmt.Sprintf("rate limit '%s' exceeded, retry in %d s", name, retry),
		ViolatedPolicies: violated,
		RetryAfter:       retry,
	})
}

// observing reports whether Finish has anything to do.
func (d *Decider) observing() bool { return d.cfg.Metrics != nil || d.cfg.AccessLog != nil }

// Finish counts a decided request on listener (sluice_requests_total) and
// writes its access log line: method (empty for a descriptor), x's path,
// matched rules, hashed key prefixes and verdict, status (HTTP, or the
// gRPC answer's as the caller maps it), how long it took and, when it was
// forwarded, the part spent upstream, and the result of verifying the
// bearer token when a rule needed it. Never a raw identifier, a token or a
// query string.
func (d *Decider) Finish(listener, method string, x *Decision, status int, took, upstream time.Duration) {
	if m := d.cfg.Metrics; m != nil {
		m.countRequest(listener, x.Verdict, took)
	}
	if d.cfg.AccessLog == nil {
		return
	}
	rules := make([]string, len(x.Checks))
	keys := make([]string, len(x.Checks))
	for i, c := range x.Checks {
		rules[i] = c.Rule.Name
		keys[i] = c.Key[:min(len(c.Key), keyPrefixLen)]
	}
	if len(x.Checks) == 0 { // rejected before its keys were worked out
		for _, rule := range x.Rules {
			rules = append(rules, rule.Name)
		}
	}
	fields := make([]zap.Field, 0, 11)
	if listener != ListenerPublic {
		fields = append(fields, zap.String("listener", listener))
	}
	if method != "" {
		fields = append(fields, zap.String("method", method))
	}
	fields = append(fields,
		zap.String("path", x.Path),
		zap.Strings("rules", rules),
		zap.Strings("keys", keys),
		zap.String("outcome", x.Verdict),
		zap.Int("status", status),
		zap.Float64("duration_ms", float64(took.Microseconds())/1000),
	)
	if upstream > 0 {
		fields = append(fields, zap.Float64("upstream_ms", float64(upstream.Microseconds())/1000))
	}
	if x.Token != "" {
		fields = append(fields, zap.String("jwt", x.Token))
	}
	d.cfg.AccessLog.Info("request", fields...)
}
