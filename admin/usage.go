package admin

import (
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/proxy"
)

// getUsage serves GET /v1/usage?tenant=acme (or ip=, email=, header=,
// jwt=): the standing of that identity on every rule keyed by its kind,
// in the order of the rules, as the usage endpoint of the public listener
// shows a caller theirs (proxy.Usage), with the hashed key of each.
// tenant= covers every tenant(...) rule, header= every header(...) rule,
// jwt= every rule that counts by a claim (the claim's value), email= the
// email rules, which the public endpoint never lists, and ip= the ip
// rules. Exactly one identity parameter is given, once; rules are counted
// under their own limit, or the key's override (a plan cannot be told
// from an identity: GET /v1/keys?plan= reads a key under one).
func (a *keysAPI) getUsage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	given, kind, value, prob := identityQuery(q)
	if prob != nil {
		proxy.WriteProblem(w, *prob)
		return
	}
	if len(given) != 1 {
		detail := "give one of ip, email, tenant, header or jwt"
		if len(given) > 1 {
			detail += ", got " + strings.Join(given, ", ")
		}
		proxy.WriteProblem(w, proxy.Problem{Status: http.StatusBadRequest, Detail: detail})
		return
	}
	items := []proxy.Usage{}
	for _, rule := range a.policy().Rules() {
		if rule.IsRLS() || rule.Identity.Kind != kind {
			continue
		}
		key, prob := a.identityKey(rule, kind, value)
		if prob != nil {
			proxy.WriteProblem(w, *prob)
			return
		}
		res, err := a.store.Peek(r.Context(), limiter.Check{Rule: rule, Key: key})
		if err != nil {
			proxy.WriteProblem(w, proxy.Problem{Status: http.StatusServiceUnavailable, Detail: "store: " + err.Error()})
			return
		}
		u := proxy.UsageOf(rule, res)
		u.Key = key
		items = append(items, u)
	}
	proxy.WriteUsage(w, r, items)
}
