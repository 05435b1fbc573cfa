// Package check is sluice's decision service for proxies that keep their
// own place in the request path (SLUICE_CHECK_LISTEN): nginx's
// auth_request, Traefik's forwardAuth and Caddy's forward_auth ask it
// about each request before they forward it, and it answers 200 with the
// rate-limit headers, or 429 with the same headers and problem+json body
// as sluice's own proxy. Envoy's gRPC rate limit service is in the
// sub-package rls.
//
// Every request to the listener is a question about the request that its
// headers describe; its own path is not read. The deciding itself, from
// the rules that match to the answer's headers and body, is the proxy's
// (proxy.Decider), so that the two listeners cannot disagree.
//
// It imports hashing, limiter, policy, proxy and proxy/identity of sluice
// at most, never a particular store; its listener is gateway's.
package check

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/identity"
)

// Handler answers forward-auth questions. It is safe for concurrent use.
type Handler struct {
	dec *proxy.Decider
}

// New returns a Handler that decides with dec, which it shares with the
// proxy and the other listeners (the rules in force, the limiter, the
// trusted proxies, the headers, the metrics and the access log).
func New(dec *proxy.Decider) (*Handler, error) {
	if dec == nil {
		return nil, errors.New("check: a Decider is required")
	}
	return &Handler{dec: dec}, nil
}

// The headers that describe the request in question: the Traefik and
// Caddy spelling first, then nginx's usual one. Each may be sent once;
// when both spellings are sent they must agree.
var (
	methodHeaders = [2]string{"X-Forwarded-Method", "X-Original-Method"}
	uriHeaders    = [2]string{"X-Forwarded-Uri", "X-Original-Uri"}
)

// methodOverrideHeaders are the headers that some frameworks (Express's
// method-override, Symfony, Rails with Rack::MethodOverride configured)
// read as the method a request asks to be treated as. sluice's proxy
// removes them; behind another proxy they reach the upstream, so the
// request is also checked against the rules of the methods they name.
var methodOverrideHeaders = [...]string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"}

// ServeHTTP answers whether the request described by r's headers may go
// on:
//
//   - the method is X-Forwarded-Method (or X-Original-Method) and the
//     request target X-Forwarded-Uri (or X-Original-URI: a path with its
//     query, or an absolute URL); rules match them as the proxy matches a
//     request's own. X-Forwarded-Host changes nothing, since rules have
//     no host.
//   - The client IP is the asking proxy's address, or, when that is in
//     SLUICE_TRUSTED_PROXIES, what its X-Forwarded-For says, as for the
//     proxy.
//   - Header identities (tenant, header(...)) are read from the headers
//     the asking proxy passes on (every one of the client's, for nginx,
//     Traefik and Caddy), and so is the bearer token that jwt identities
//     and plans read, from Authorization: the Decider verifies it as the
//     proxy's, with the same IP fallback. The body is never seen: a rule
//     that reads its identifier from the body counts the client IP.
//   - A "_method" field in the query string, and X-HTTP-Method-Override,
//     X-HTTP-Method and X-Method-Override, which the upstream will receive,
//     bring in the rules of the method they name too.
//
// The answer is 200 with the rate-limit headers when the request may go
// on (no rule matched: 200 without them); 429 with Retry-After, the
// rate-limit headers and the problem+json body, as the proxy sends them,
// when it is denied (403 instead with the query parameter deny=403, for
// nginx, whose auth_request accepts nothing else); 503 with Retry-After
// when a fail=closed rule could not be decided; 401 with
// WWW-Authenticate when a rule needs the bearer token and it is invalid
// under SLUICE_JWT_INVALID=reject (nginx's auth_request passes a 401 on,
// and Traefik and Caddy any answer); 400 when the question is malformed
// or an identity is ambiguous.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	began := time.Now()
	x := h.dec.Get()
	defer h.dec.Put(x)
	method, code := "", http.StatusOK
	defer func() { h.dec.Finish(proxy.ListenerCheck, method, x, code, time.Since(began), 0) }()
	problem := func(p proxy.Problem) {
		code = p.Status
		proxy.WriteProblem(w, p)
	}

	denied, err := deniedStatus(r.URL.RawQuery)
	if err != nil {
		problem(proxy.Problem{Status: http.StatusBadRequest, Detail: err.Error()})
		return
	}
	method, err = described(r.Header, methodHeaders)
	if err == nil {
		var merr error
		if method, merr = identity.CanonicalMethod(method); merr != nil {
			err = errors.New("header " + strconv.Quote(methodHeaders[0]) + " " + merr.Error())
		}
	}
	if err != nil {
		problem(proxy.Problem{Status: http.StatusBadRequest, Detail: err.Error()})
		return
	}
	target, err := described(r.Header, uriHeaders)
	var path, query string
	if err == nil {
		path, query, err = splitTarget(target)
	}
	if err != nil {
		problem(proxy.Problem{Status: http.StatusBadRequest, Detail: err.Error()})
		return
	}
	overrides, err := methodOverrides(r.Header)
	if err != nil {
		problem(proxy.Problem{Status: http.StatusBadRequest, Detail: err.Error()})
		return
	}

	if p := h.dec.Begin(x, method, path, r.RemoteAddr, r.Header); p != nil {
		problem(*p)
		return
	}
	x.Ident.Reset(query, nil, nil, false)
	if p := h.dec.Methods(x, overrides...); p != nil {
		problem(*p)
		return
	}
	if p := h.dec.Keys(x, r.Header, true); p != nil {
		problem(*p)
		return
	}
	h.dec.Decide(r.Context(), x)
	if code = h.dec.Answer(w, x, denied); code != 0 {
		return
	}
	code = http.StatusOK
	w.Header()["Content-Length"] = []string{"0"}
	w.WriteHeader(code)
}

// deniedStatus reads the deny parameter of the question's own query
// string: the status of a denial, 0 for the default 429.
func deniedStatus(rawQuery string) (int, error) {
	if rawQuery == "" {
		return 0, nil
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return 0, errors.New("the query string is malformed")
	}
	switch d := q["deny"]; {
	case len(d) == 0:
		return 0, nil
	case len(d) == 1 && d[0] == "403":
		return http.StatusForbidden, nil
	case len(d) == 1 && d[0] == "429":
		return http.StatusTooManyRequests, nil
	}
	return 0, errors.New("query parameter deny: expected 403 or 429, once")
}

// described returns the value of the request-describing header sent
// under either of names: sent once, or under both names with one value.
func described(h http.Header, names [2]string) (string, error) {
	var value string
	seen := 0
	for _, name := range names {
		for k, vs := range h {
			if !identity.HeaderNameEqual(k, name) {
				continue
			}
			for _, v := range vs {
				if seen > 0 && v != value {
					return "", errors.New(names[0] + " and " + names[1] + ": sent more than once, with different values")
				}
				value = v
				seen++
			}
		}
	}
	if seen == 0 {
		return "", errors.New("the request to check is not described: send " + names[0] + " (or " + names[1] + ")")
	}
	return value, nil
}

// splitTarget splits a described request target into its escaped path
// and raw query: an origin-form target ("/api/login?x=1"), or an absolute
// URL ("https://example.com/api/login?x=1"), as the asking proxy may
// have received either. A raw "#" in it is an error, as on the proxy's
// request line (policy.CheckTarget): "/api/x#/../secret" is /api/x to
// one reader and /api/secret to another.
func splitTarget(target string) (path, query string, err error) {
	if err := policy.CheckTarget(target); err != nil {
		return "", "", errors.New(uriHeaders[0] + ": malformed request path: " + err.Error())
	}
	if strings.HasPrefix(target, "/") {
		path, query, _ = strings.Cut(target, "?")
		return path, query, nil
	}
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return "", "", errors.New(uriHeaders[0] + ": expected a path such as /api/login?x=1 or an absolute http(s) URL")
	}
	path = u.EscapedPath()
	if path == "" {
		path = "/"
	}
	return path, u.RawQuery, nil
}

// methodOverrides returns the methods that the method-override headers
// name, upper-cased; a value that is not a method name is an error, as a
// "_method" field's is.
func methodOverrides(h http.Header) ([]string, error) {
	var out []string
	for k, vs := range h {
		for _, name := range methodOverrideHeaders {
			if !identity.HeaderNameEqual(k, name) {
				continue
			}
			for _, v := range vs {
				for m := range strings.SplitSeq(v, ",") {
					if strings.TrimSpace(m) == "" {
						continue
					}
					m, err := identity.CanonicalMethod(m)
					if err != nil {
						return nil, errors.New("header " + strconv.Quote(name) + " " + err.Error())
					}
					out = append(out, m)
				}
			}
		}
	}
	return out, nil
}
