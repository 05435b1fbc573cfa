// Package admin is the admin listener's handler: liveness (/healthz),
// readiness (/readyz), Prometheus metrics (/metrics), the /v1 API (the
// rules in force, counters and overrides by key, live stats) behind a
// bearer token, and the console (GET /), a web page over that API whose
// assets are embedded in the binary. The live figures (stats.go) are kept
// here too: rates sampled from the limiter's metrics, and the most
// limited keys, counted through the limiter's Denied hook.
//
// It is served on the admin listener only, never on the public one. It
// sees the store through KeyStore and its readiness through a function:
// it must not import limiter/memory, limiter/postgres or gateway. Errors
// are written with proxy.WriteProblem, the one writer of problem+json.
package admin

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
)

// Config configures the admin handler.
type Config struct {
	// Policy returns the rules in force (proxy.Proxy.Policy); it is asked on
	// every request, so a reload shows at once. Required.
	Policy func() *policy.Policy
	// Ready reports whether the store decides: nil when it does, or why it
	// does not (/readyz answers 503 with it). Nil means always ready.
	Ready    func() error
	Gatherer prometheus.Gatherer
	// Keys and Hasher serve /v1/keys and /v1/overrides; they are left out
	// when Keys is nil. The store tells the limiter's fast path of resets
	// and override changes itself.
	Keys   KeyStore
	Hasher *hashing.Hasher
	// JWTIssuer is the issuer bearer tokens are verified against
	// (SLUICE_JWT_ISSUER, "" for any): part of the key of every claim a jwt
	// rule counts by (hashing.Hasher.JWTKey), so that ?jwt= finds it.
	JWTIssuer string
	// Token is the bearer token of the /v1 API. Writes always need it, and
	// are refused when it is empty; reads need it whenever it is set.
	Token string
	// Stats serves /v1/stats and the console's live figures; nil leaves
	// /v1/stats out.
	Stats *Stats
	// StoreKind names the store for the console ("memory", "postgres").
	StoreKind string
	// Breaker reports the state of the store's circuit breaker; nil for a
	// store without one.
	Breaker func() limiter.BreakerState
}

// NewHandler returns the handler of the admin listener: /healthz, /readyz,
// /metrics, the /v1 API and the console. It must never be served on the
// public listener.
//
// Every response carries the console's security headers (see secure), and
// writes that a browser sends from another origin are refused (Go's
// CrossOriginProtection: Sec-Fetch-Site, else Origin against Host), so no
// other web page can make a signed-in operator's browser change a limit.
// Requests without those headers (curl, scripts) are not affected.
// Without a token, only a loopback Host is answered (loopbackOnly), so
// that no page can read the listener through DNS rebinding either. Every
// error is problem+json, ServeMux's own 404 and 405 included (problems).
func NewHandler(cfg Config) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeText(w, http.StatusOK, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if cfg.Ready != nil {
			if err := cfg.Ready(); err != nil {
				proxy.WriteProblem(w, proxy.Problem{Status: http.StatusServiceUnavailable, Detail: err.Error()})
				return
			}
		}
		writeText(w, http.StatusOK, "ready\n")
	})
	mux.Handle("GET /metrics", asProblem(promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{})))
	read := func(h http.HandlerFunc) http.HandlerFunc { return guard(cfg.Token, false, h) }
	write := func(h http.HandlerFunc) http.HandlerFunc { return guard(cfg.Token, true, h) }
	mux.HandleFunc("GET /v1/rules", read(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"rules": rulesJSON(cfg.Policy().Rules())})
	}))
	if cfg.Keys != nil {
		api := &keysAPI{policy: cfg.Policy, store: cfg.Keys, hasher: cfg.Hasher, issuer: cfg.JWTIssuer}
		mux.HandleFunc("GET /v1/keys", read(api.getKey))
		mux.HandleFunc("GET /v1/usage", read(api.getUsage))
		mux.HandleFunc("DELETE /v1/keys", write(api.deleteKey))
		mux.HandleFunc("GET /v1/overrides", read(api.listOverrides))
		mux.HandleFunc("PUT /v1/overrides", write(api.putOverride))
		mux.HandleFunc("DELETE /v1/overrides", write(api.deleteOverride))
	}
	if cfg.Stats != nil {
		mux.HandleFunc("GET /v1/stats", read(serveStats(&cfg)))
	}
	serveConsole(mux, cfg.Token != "")
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxy.WriteProblem(w, proxy.Problem{Status: http.StatusForbidden, Detail: "cross-origin request refused: admin writes must come from the admin listener's own origin"})
	}))
	h := cop.Handler(problems(mux))
	if cfg.Token == "" {
		h = loopbackOnly(h)
	}
	return secure(h)
}

// guard lets a /v1 request through to h only with the bearer token: always
// for a write, which is refused with 403 while no token is configured, and
// for a read whenever a token is configured, since the counters tell
// whether an address or an IP was active recently. A missing or wrong token
// is 401. The scheme's case does not matter, the token's does (hasToken).
// A query string that does not parse is 400.
func guard(token string, write bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch {
		case token == "" && write:
			proxy.WriteProblem(w, proxy.Problem{Status: http.StatusForbidden, Detail: "admin writes are disabled: set SLUICE_ADMIN_TOKEN"})
			return
		case token != "":
			if !hasToken(r, token) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sluice admin"`)
				proxy.WriteProblem(w, proxy.Problem{Status: http.StatusUnauthorized, Detail: "a valid Authorization: Bearer token is required"})
				return
			}
		}
		// Go's Query drops what does not parse ("a=1;b=2" loses its pair):
		// a parameter sluice never saw must not change what it answers.
		if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
			proxy.WriteProblem(w, proxy.Problem{Status: http.StatusBadRequest, Detail: "the query string is malformed: " + err.Error()})
			return
		}
		h(w, r)
	}
}

func writeText(w http.ResponseWriter, status int, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	w.Write([]byte(s)) //nolint:errcheck // the client may be gone
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		proxy.WriteProblem(w, proxy.Problem{Status: http.StatusInternalServerError, Detail: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client may be gone
}

// ruleJSON is a rule as the admin API shows it.
type ruleJSON struct {
	Name      string     `json:"name"`
	Line      int        `json:"line"`
	Methods   []string   `json:"methods"`
	Path      string     `json:"path"`
	Identity  string     `json:"identity"`
	Field     string     `json:"field,omitempty"`
	Limit     int64      `json:"limit"`
	Window    string     `json:"window"`
	WindowSec int64      `json:"window_seconds"`
	Algorithm string     `json:"algorithm"`
	BucketSec int64      `json:"bucket_seconds,omitempty"`
	Burst     int64      `json:"burst,omitempty"`
	Fail      string     `json:"fail"`
	Shadow    bool       `json:"shadow"`
	Cost      int64      `json:"cost"`
	CountAll  bool       `json:"count_all"`
	PlanClaim string     `json:"plan_claim,omitempty"`
	Plans     []planJSON `json:"plans,omitempty"`
	// A calendar window's zone (tz=) and a month's first day (anchor=),
	// and where a charge= rule reads its cost.
	TZ     string `json:"tz,omitempty"`
	Anchor int    `json:"anchor,omitempty"`
	Charge string `json:"charge,omitempty"`
}

// planJSON is one limit of a rule's plans option.
type planJSON struct {
	Name      string `json:"name"`
	Limit     int64  `json:"limit"`
	Window    string `json:"window"`
	WindowSec int64  `json:"window_seconds"`
}

func rulesJSON(rules []*policy.Rule) []ruleJSON {
	out := make([]ruleJSON, 0, len(rules))
	for _, r := range rules {
		methods := r.Methods
		if methods == nil {
			methods = []string{"*"}
		}
		path := r.PathString()
		var plans []planJSON
		for _, p := range r.Plans {
			plans = append(plans, planJSON{Name: p.Name, Limit: p.Limit, Window: policy.FormatWindow(p.Window), WindowSec: int64(p.Window / time.Second)})
		}
		j := ruleJSON{
			Name: r.Name, Line: r.Line, Methods: methods, Path: path,
			Identity: r.Identity.Kind.String(), Field: r.Identity.Field,
			Limit: r.Limit, Window: r.WindowString(), WindowSec: int64(r.Window / time.Second),
			Algorithm: r.Algorithm.String(), BucketSec: int64(r.Bucket / time.Second), Burst: r.Burst,
			Fail: r.Fail.String(), Shadow: r.Shadow, Cost: r.Cost, CountAll: r.CountAll,
			PlanClaim: r.PlanClaim, Plans: plans,
		}
		if cal := r.Calendar; cal != nil {
			j.TZ, j.Anchor = cal.Zone.String(), cal.Anchor
			// The current period's length: a month's or a DST day's.
			start, end := cal.Period(time.Now())
			j.WindowSec = int64(end.Sub(start) / time.Second)
			for i := range plans {
				plans[i].Window, plans[i].WindowSec = j.Window, j.WindowSec
			}
		}
		if r.Charge != nil {
			j.Charge = r.Charge.String()
		}
		out = append(out, j)
	}
	return out
}
