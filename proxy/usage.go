package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/jwt"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// The usage endpoint (SLUICE_USAGE_PATH): a GET there on the public
// listener is answered by sluice with the caller's standing on every rule
// whose key the request itself gives. It is never forwarded, and it
// counts only under the rules whose path matches it, like any request,
// so that a rule can bound what reading one's usage costs. GET /v1/usage
// on the admin listener (package admin) shows the same objects by
// identity.

// Peeker reads a counter without consuming from it: the store's Peek, as
// GET /v1/keys reads it.
type Peeker interface {
	Peek(ctx context.Context, c limiter.Check) (limiter.Result, error)
}

// Usage is one rule's standing, as the usage endpoint and GET /v1/usage
// show it.
type Usage struct {
	Rule string `json:"rule"`
	// Limit and Window are those the key is counted under: the rule's,
	// its plan's or the key's override.
	Limit         int64  `json:"limit"`
	Window        string `json:"window"`         // "1m", or a calendar window's "1d", "1w", "1mo"
	WindowSeconds int64  `json:"window_seconds"` // the current period's length
	// Count is what the window has used; it exceeds Limit after an
	// overdraft (a charge), and Remaining is then 0.
	Count      int64 `json:"count"`
	Remaining  int64 `json:"remaining"`
	Reset      int64 `json:"reset"`       // Unix seconds, as X-RateLimit-Reset and /v1/keys give it
	ResetAfter int64 `json:"reset_after"` // whole seconds, as the RateLimit header's t
	// Key is the hashed key, on the admin listener only.
	Key string `json:"key,omitempty"`
}

// UsageOf is the standing res (a Peek of a key under rule) describes.
func UsageOf(rule *policy.Rule, res limiter.Result) Usage {
	return Usage{
		Rule:          rule.Name,
		Limit:         res.Limit,
		Window:        usageWindow(rule, res),
		WindowSeconds: int64(res.Window / time.Second),
		Count:         res.Count,
		Remaining:     res.Remaining,
		Reset:         CeilUnix(res.Reset),
		ResetAfter:    CeilSeconds(res.ResetAfter),
	}
}

// usageWindow names the window of res: a calendar rule's unit ("1mo")
// while the key is counted by its calendar, else the window's length.
func usageWindow(rule *policy.Rule, res limiter.Result) string {
	if unit, ok := CalendarOf(rule, res); ok {
		return unit.String()
	}
	return policy.FormatWindow(res.Window)
}

// CalendarOf reports the calendar unit that res (a decision or a Peek of
// a key under rule) was counted by: false for a rule without a calendar,
// and for a key whose override gives it a window of its own.
func CalendarOf(rule *policy.Rule, res limiter.Result) (policy.CalendarUnit, bool) {
	if cal := rule.Calendar; cal != nil && !res.Reset.IsZero() {
		start, end := cal.Period(res.Reset.Add(-time.Nanosecond))
		if end.Equal(res.Reset) && end.Sub(start) == res.Window {
			return cal.Unit, true
		}
	}
	return 0, false
}

// usageJSON is the body of the usage endpoint and of GET /v1/usage.
type usageJSON struct {
	Usage []Usage `json:"usage"`
}

// MarshalUsage returns the body that lists items.
func MarshalUsage(items []Usage) []byte {
	if items == nil {
		items = []Usage{}
	}
	body, err := json.Marshal(usageJSON{Usage: items})
	if err != nil { // strings and ints always marshal
		panic(err)
	}
	return body
}

// WriteUsage answers 200 with the usage body of items, never to be
// stored by a cache (it is one caller's standing); a HEAD gets the
// headers only.
func WriteUsage(w http.ResponseWriter, r *http.Request, items []Usage) {
	body := MarshalUsage(items)
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	h["Cache-Control"] = []string{"no-store"}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(body) //nolint:errcheck // the client may be gone
	}
}

// isUsage reports whether x is a request for the usage endpoint: its path
// in match form is the usage path's, so every spelling that would match
// a rule of that path (case, a trailing slash, ";" parameters, escapes)
// reaches it too, and none is forwarded.
func (p *Proxy) isUsage(x *Decision) bool {
	return p.usageMatch != "" && x.match == p.usageMatch
}

// usageMethodNotAllowed answers a request for the usage endpoint with a
// method other than GET or HEAD, and reports whether it did.
func usageMethodNotAllowed(w http.ResponseWriter, method string) bool {
	if method == http.MethodGet || method == http.MethodHead {
		return false
	}
	w.Header()["Allow"] = []string{"GET, HEAD"}
	WriteProblem(w, Problem{Status: http.StatusMethodNotAllowed, Detail: "the usage endpoint answers GET and HEAD only"})
	return true
}

// serveUsage answers a request for the usage endpoint that the rules
// matching it allowed (their rate-limit headers are set already): the
// standing of its key on every rule whose key it gives, read without
// counting anything.
func (p *Proxy) serveUsage(w http.ResponseWriter, r *http.Request, x *Decision) {
	checks, prob := p.dec.UsageChecks(x, r.Header)
	if prob != nil {
		WriteProblem(w, *prob)
		return
	}
	items := make([]Usage, 0, len(checks))
	for _, c := range checks {
		res, err := p.cfg.Usage.Peek(r.Context(), c)
		if err != nil {
			if r.Context().Err() == nil {
				p.log.Warn("usage: the store could not be read", zap.String("rule", c.Rule.Name), zap.Error(err))
			}
			WriteProblem(w, Problem{Status: http.StatusServiceUnavailable, Detail: "the counters cannot be read right now; retry shortly"})
			return
		}
		items = append(items, UsageOf(c.Rule, res))
	}
	WriteUsage(w, r, items)
}

// UsageChecks returns, in the order of the rules in force (read by
// Begin), the check of every rule whose key the request x itself gives:
// an ip rule always, a global rule, a tenant or header rule when its
// header is present and valid, a jwt rule when the bearer token verifies
// and holds its claim. Rules keyed by email are never listed (a caller
// could name anyone's address), nor Envoy's rls: rules, nor a rule whose
// identifier the request lacks (whose requests would count by the client
// IP). A rule with plans is checked under the plan a verified claim
// names, as Keys counts it. The token is verified as Keys verifies it: an
// ambiguous Authorization header is a 400 *Problem, and an invalid token
// a 401 one with RejectInvalidTokens.
func (d *Decider) UsageChecks(x *Decision, h http.Header) ([]limiter.Check, *Problem) {
	rules := x.pol.Rules()
	var claims *jwt.Claims
	if needsToken(rules) {
		var prob *Problem
		if claims, prob = d.verifyToken(x, h); prob != nil {
			return nil, prob
		}
	}
	checks := make([]limiter.Check, 0, len(rules))
	ipKey := ""
	for _, rule := range rules {
		if rule.IsRLS() || rule.Identity.Kind == policy.ByEmail {
			continue
		}
		key, found, err := d.identityKey(x, h, rule, claims, true)
		switch {
		case rule.Identity.Kind == policy.ByIP:
			key = d.clientKey(x, &ipKey)
		case err != nil || !found: // an invalid identifier is none
			continue
		}
		counted := rule
		if len(rule.Plans) > 0 {
			if plan, ok := claims.Claim(rule.PlanClaim); ok {
				counted = rule.ForPlan(plan)
			}
		}
		checks = append(checks, limiter.Check{Rule: counted, Key: key})
	}
	return checks, nil
}

// ValidateUsagePath checks SLUICE_USAGE_PATH: empty (off), or an exact
// path that starts with "/" and is canonical (policy.CanonicalPath gives
// it back unchanged), with no dot segment, no percent-escape and no "?"
// or "#".
func ValidateUsagePath(path string) error {
	switch {
	case path == "":
		return nil
	case path[0] != '/':
		return fmt.Errorf("expected a path starting with /, such as /_sluice/usage, got %q", path)
	case strings.ContainsAny(path, "%?#"):
		return fmt.Errorf("expected a path without %%, ? or #, got %q", path)
	}
	if c, err := policy.CanonicalPath(path); err != nil || c != path {
		return fmt.Errorf("expected a canonical path (no dot segments, no repeated slashes, no characters that need escaping), got %q", path)
	}
	return nil
}
