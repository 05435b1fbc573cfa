package admin

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
)

// KeyStore is what the admin API needs from the store behind the limiter.
// Its writes tell every instance's over-limit fast path themselves.
type KeyStore interface {
	// Peek reports a counter without consuming from it.
	Peek(ctx context.Context, c limiter.Check) (limiter.Result, error)
	// Reset deletes a counter.
	Reset(ctx context.Context, c limiter.Check) error
	// SetOverride gives one key its own limit and window under a rule;
	// an invalid one is an error wrapping limiter.ErrInvalidOverride.
	SetOverride(ctx context.Context, c limiter.Check, limit int64, window time.Duration) error
	// DeleteOverride returns a key to its rule's limit.
	DeleteOverride(ctx context.Context, c limiter.Check) error
	// Overrides lists every override, by rule and key.
	Overrides(ctx context.Context) ([]limiter.Override, error)
}

// keysAPI serves /v1/keys and /v1/overrides.
type keysAPI struct {
	policy func() *policy.Policy // the rules in force
	store  KeyStore
	hasher *hashing.Hasher
	issuer string // the issuer tokens are verified against, part of a jwt rule's keys
}

// identityParams are the kinds of identity whose query parameter (the
// kind's name in the rule language: ip=, email=, tenant=, header=, jwt=)
// names a key.
var identityParams = []policy.IdentityKind{policy.ByIP, policy.ByEmail, policy.ByTenant, policy.ByHeader, policy.ByJWT}

// identityQuery reads the identity parameters of q (ip=, email=,
// tenant=, header=, jwt=): the names given, and the kind and value of the
// last; a parameter given more than once is a 400 problem.
func identityQuery(q url.Values) (given []string, kind policy.IdentityKind, value string, prob *proxy.Problem) {
	for _, k := range identityParams {
		if vs, ok := q[k.String()]; ok {
			given = append(given, k.String())
			if len(vs) != 1 {
				return nil, 0, "", &proxy.Problem{Status: http.StatusBadRequest, Detail: fmt.Sprintf("query parameter %s given more than once", k)}
			}
			kind, value = k, vs[0]
		}
	}
	return given, kind, value, nil
}

// keyParam names a counter by its hashed key, as GET /v1/overrides and
// the console's most limited keys show it, instead of by an identity.
const keyParam = "key"

// target resolves ?rule=…&ip=… (or email=, tenant=, header=, jwt=,
// descriptor= once for each open value of an rls: rule's descriptor, or
// key=, the hashed key itself) to a check. A "by global" rule needs no
// identity. Any identity kind but jwt is accepted for any rule, so the IP
// counters that stand in for a missing identifier (or an unverified
// token) can be read and reset too; jwt= is the value of the claim a "by
// jwt" rule counts by, keyed as the proxy keys it. plan=, on a rule with
// plans, checks the key under that plan's limit, as the proxy does for a
// user whose verified claim names it; with key= too, since a hashed key
// does not tell the plan it was counted under.
func (a *keysAPI) target(r *http.Request) (limiter.Check, *proxy.Problem) {
	q := r.URL.Query()
	if len(q["rule"]) > 1 {
		return limiter.Check{}, &proxy.Problem{Status: http.StatusBadRequest, Detail: "query parameter rule given more than once"}
	}
	name := q.Get("rule")
	if name == "" {
		return limiter.Check{}, &proxy.Problem{Status: http.StatusBadRequest, Detail: "query parameter rule is required"}
	}
	rule, ok := a.policy().Lookup(name)
	if !ok {
		return limiter.Check{}, &proxy.Problem{Status: http.StatusNotFound, Detail: fmt.Sprintf("no rule named '%s'", name)}
	}
	given, kind, value, prob := identityQuery(q)
	if prob != nil {
		return limiter.Check{}, prob
	}
	// An Envoy descriptor's key: the values its rule leaves open, one
	// descriptor= each, in the rule's order.
	descriptor, isDescriptor := q[policy.ByDescriptor.String()]
	if isDescriptor {
		given = append(given, policy.ByDescriptor.String())
		kind, value = policy.ByDescriptor, hashing.JoinValues(descriptor)
	}
	hashed, byKey := q[keyParam]
	if byKey {
		given = append(given, keyParam)
	}
	switch {
	case len(given) > 1:
		return limiter.Check{}, &proxy.Problem{Status: http.StatusBadRequest, Detail: "give one of ip, email, tenant, header, jwt, descriptor or key, got " + strings.Join(given, ", ")}
	case isDescriptor && rule.IsRLS() && len(descriptor) != len(rule.DescriptorValues(rule.Descriptor, nil)):
		return limiter.Check{}, &proxy.Problem{Status: http.StatusBadRequest, Detail: fmt.Sprintf("rule '%s' counts the values of descriptor(%s) that it leaves open: give descriptor= once for each, in order", name, rule.Identity.Field)}
	case isDescriptor:
		return a.planned(q, limiter.Check{Rule: rule, Key: a.hasher.Key(kind.String(), value)})
	case byKey:
		if len(hashed) != 1 {
			return limiter.Check{}, &proxy.Problem{Status: http.StatusBadRequest, Detail: "query parameter key given more than once"}
		}
		if !isHashedKey(hashed[0]) {
			return limiter.Check{}, &proxy.Problem{Status: http.StatusBadRequest, Detail: "key: not a hashed key (43 characters of base64url, as GET /v1/overrides lists them)"}
		}
		return a.planned(q, limiter.Check{Rule: rule, Key: hashed[0]})
	case len(given) == 0 && rule.Identity.Kind == policy.ByGlobal:
		return a.planned(q, limiter.Check{Rule: rule, Key: a.hasher.Key(policy.ByGlobal.String(), "")})
	case len(given) == 0:
		return limiter.Check{}, &proxy.Problem{Status: http.StatusBadRequest, Detail: fmt.Sprintf("rule '%s' counts by %s: give %s=", name, rule.Identity.Kind, identityParam(rule.Identity.Kind))}
	}
	key, prob := a.identityKey(rule, kind, value)
	if prob != nil {
		return limiter.Check{}, prob
	}
	return a.planned(q, limiter.Check{Rule: rule, Key: key})
}

// identityKey returns the hashed key that rule counts an identity of
// kind (ip, email, tenant, header or jwt) with this value by, as the
// proxy keys it: the value canonicalised as the proxy reads it (an IP's
// group, a canonical email, trimmed header text), or a 400 *Problem
// naming the query parameter when it is not one. jwt is only for a rule
// that counts by a claim, and keyed with that claim and the issuer.
func (a *keysAPI) identityKey(rule *policy.Rule, kind policy.IdentityKind, value string) (string, *proxy.Problem) {
	param := kind.String()
	switch kind {
	case policy.ByIP:
		addr, err := netip.ParseAddr(value)
		if err != nil {
			return "", &proxy.Problem{Status: http.StatusBadRequest, Detail: "ip: not an IP address"}
		}
		value = hashing.IPGroup(addr.Unmap())
	case policy.ByEmail:
		// The proxy counts no email that hashing refuses, so there is no
		// such key to show or reset.
		v, err := hashing.CanonicalEmail(value)
		if err != nil {
			return "", &proxy.Problem{Status: http.StatusBadRequest, Detail: "email: " + err.Error()}
		}
		value = v
	case policy.ByTenant, policy.ByHeader:
		v, err := hashing.CanonicalText(value)
		if err != nil {
			return "", &proxy.Problem{Status: http.StatusBadRequest, Detail: param + ": " + err.Error()}
		}
		value = v
	case policy.ByJWT:
		// A claim is keyed as the token holds it (an integer as its
		// decimal), under the claim's name and the issuer: only a rule
		// that counts by a claim has such keys.
		if rule.Identity.Kind != policy.ByJWT {
			return "", &proxy.Problem{Status: http.StatusBadRequest, Detail: fmt.Sprintf("jwt: rule '%s' counts by %s, not by a token's claim", rule.Name, rule.Identity.Kind)}
		}
	}
	if value == "" {
		return "", &proxy.Problem{Status: http.StatusBadRequest, Detail: param + ": empty"}
	}
	if kind == policy.ByJWT {
		return a.hasher.JWTKey(a.issuer, rule.Identity.Field, value), nil
	}
	return a.hasher.Key(kind.String(), value), nil
}

// planned applies ?plan= to c: the rule as counted under that plan
// (policy.Rule.ForPlan), or c as it is without the parameter.
func (a *keysAPI) planned(q url.Values, c limiter.Check) (limiter.Check, *proxy.Problem) {
	vs, ok := q["plan"]
	switch {
	case !ok:
		return c, nil
	case len(vs) != 1:
		return limiter.Check{}, &proxy.Problem{Status: http.StatusBadRequest, Detail: "query parameter plan given more than once"}
	case len(c.Rule.Plans) == 0:
		return limiter.Check{}, &proxy.Problem{Status: http.StatusBadRequest, Detail: fmt.Sprintf("plan: rule '%s' has no plans", c.Rule.Name)}
	}
	planned := c.Rule.ForPlan(vs[0])
	if planned == c.Rule {
		names := make([]string, len(c.Rule.Plans))
		for i, p := range c.Rule.Plans {
			names[i] = p.Name
		}
		return limiter.Check{}, &proxy.Problem{Status: http.StatusBadRequest, Detail: fmt.Sprintf("plan: rule '%s' has no plan '%s' (its plans: %s)", c.Rule.Name, vs[0], strings.Join(names, ", "))}
	}
	c.Rule = planned
	return c, nil
}

// isHashedKey reports whether s has the form of hashing.Hasher.Key's
// keys: an HMAC-SHA256 in unpadded base64url.
func isHashedKey(s string) bool {
	b, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil && len(b) == sha256.Size
}

func identityParam(k policy.IdentityKind) string {
	if k == policy.ByGlobal {
		return "nothing"
	}
	return k.String()
}

// keyJSON is a counter as GET /v1/keys shows it: its standing as the
// usage endpoints show it (proxy.Usage: the count past the limit after an
// overdraft, a calendar rule's window as "1mo"), with its hashed key.
type keyJSON = proxy.Usage

func (a *keysAPI) getKey(w http.ResponseWriter, r *http.Request) {
	c, prob := a.target(r)
	if prob != nil {
		proxy.WriteProblem(w, *prob)
		return
	}
	res, err := a.store.Peek(r.Context(), c)
	if err != nil {
		proxy.WriteProblem(w, proxy.Problem{Status: http.StatusServiceUnavailable, Detail: "store: " + err.Error()})
		return
	}
	k := proxy.UsageOf(c.Rule, res)
	k.Key = c.Key
	writeJSON(w, http.StatusOK, k)
}

// write serves a write on one key (guard has checked the token): change
// makes it, and a store error becomes a 503.
func (a *keysAPI) write(w http.ResponseWriter, r *http.Request, change func(c limiter.Check) (any, *proxy.Problem, error)) {
	c, prob := a.target(r)
	if prob != nil {
		proxy.WriteProblem(w, *prob)
		return
	}
	body, prob, err := change(c)
	switch {
	case prob != nil:
		proxy.WriteProblem(w, *prob)
		return
	case err != nil:
		proxy.WriteProblem(w, proxy.Problem{Status: http.StatusServiceUnavailable, Detail: "store: " + err.Error()})
		return
	}
	if body == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

func (a *keysAPI) deleteKey(w http.ResponseWriter, r *http.Request) {
	a.write(w, r, func(c limiter.Check) (any, *proxy.Problem, error) {
		return nil, nil, a.store.Reset(r.Context(), c)
	})
}

func (a *keysAPI) deleteOverride(w http.ResponseWriter, r *http.Request) {
	a.write(w, r, func(c limiter.Check) (any, *proxy.Problem, error) {
		return nil, nil, a.store.DeleteOverride(r.Context(), c)
	})
}

// overrideJSON is the body of PUT /v1/overrides.
type overrideJSON struct {
	Limit  int64  `json:"limit"`
	Window string `json:"window"`
}

func (a *keysAPI) putOverride(w http.ResponseWriter, r *http.Request) {
	a.write(w, r, func(c limiter.Check) (any, *proxy.Problem, error) {
		var body overrideJSON
		if prob := readBody(w, r, &body, `{"limit":N,"window":"1d"}`); prob != nil {
			return nil, prob, nil
		}
		window, err := policy.ParseWindow(body.Window)
		if cal := c.Rule.Calendar; cal != nil && body.Window == cal.Unit.String() {
			// A calendar rule's own window: the override changes the
			// limit of each period (1mo stays a calendar month).
			window, err = c.Rule.Window, nil
		}
		if err != nil {
			return nil, &proxy.Problem{Status: http.StatusBadRequest, Detail: err.Error()}, nil
		}
		// The store checks the override against its rule
		// (limiter.ValidateOverride), for every way of setting one.
		if err := a.store.SetOverride(r.Context(), c, body.Limit, window); err != nil {
			if errors.Is(err, limiter.ErrInvalidOverride) {
				return nil, &proxy.Problem{Status: http.StatusBadRequest, Detail: err.Error()}, nil
			}
			return nil, nil, err
		}
		shown := policy.FormatWindow(window)
		if c.Rule.Calendar != nil && window == c.Rule.Window {
			shown = c.Rule.WindowString()
		}
		return map[string]any{"rule": c.Rule.Name, "limit": body.Limit, "window": shown}, nil, nil
	})
}

// overrideItemJSON is one override as GET /v1/overrides lists it: the key
// is the hashed identity, as stored.
type overrideItemJSON struct {
	Rule      string `json:"rule"`
	Key       string `json:"key"`
	Limit     int64  `json:"limit"`
	Window    string `json:"window"`
	WindowSec int64  `json:"window_seconds"`
}

// listOverrides serves GET /v1/overrides: every override, or those of one
// rule with ?rule=. Overrides of a rule no longer in force are listed too:
// they apply again if the rule comes back.
func (a *keysAPI) listOverrides(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if vs := q["rule"]; len(vs) > 1 {
		proxy.WriteProblem(w, proxy.Problem{Status: http.StatusBadRequest, Detail: "query parameter rule given more than once"})
		return
	}
	rule := q.Get("rule")
	all, err := a.store.Overrides(r.Context())
	if err != nil {
		proxy.WriteProblem(w, proxy.Problem{Status: http.StatusServiceUnavailable, Detail: "store: " + err.Error()})
		return
	}
	out := make([]overrideItemJSON, 0, len(all))
	for _, o := range all {
		if rule != "" && o.Rule != rule {
			continue
		}
		window := policy.FormatWindow(o.Window)
		if r, ok := a.policy().Lookup(o.Rule); ok && r.Calendar != nil && o.Window == r.Window {
			window = r.WindowString()
		}
		out = append(out, overrideItemJSON{
			Rule: o.Rule, Key: o.Key, Limit: o.Limit,
			Window: window, WindowSec: int64(o.Window / time.Second),
		})
	}
	if _, ok := a.policy().Lookup(rule); rule != "" && !ok && len(out) == 0 {
		// A misspelt rule, as /v1/keys and PUT answer it; the overrides of
		// a rule a reload removed are still listed by its name.
		proxy.WriteProblem(w, proxy.Problem{Status: http.StatusNotFound, Detail: fmt.Sprintf("no rule named '%s', and no override of one", rule)})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"overrides": out})
}
