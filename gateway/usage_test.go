package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/jwt/jwttest"
)

// The usage endpoints through whole gateways assembled from their
// settings, on the memory store and on Postgres: SLUICE_USAGE_PATH on the
// public listener and GET /v1/usage on the admin one.

// usageEntry is one object of a usage body.
type usageEntry struct {
	Rule          string `json:"rule"`
	Limit         int64  `json:"limit"`
	Window        string `json:"window"`
	WindowSeconds int64  `json:"window_seconds"`
	Count         int64  `json:"count"`
	Remaining     int64  `json:"remaining"`
	Reset         int64  `json:"reset"`
	ResetAfter    int64  `json:"reset_after"`
	Key           *string
}

// usageGatewayRules have limits below 32, as logins and daily quotas do.
// Postgres leases them a request or two at a time (limiter/postgres,
// leaseSmall): the counts the usage endpoint reads must still be the
// traffic, not the units the gateway holds.
const usageGatewayRules = `
login: POST /api/login      by ip     5/15m
reset: POST /api/reset      by email  3/1h
query: GET  /api/*          by tenant 10/1d
user:  GET  /api/*          by jwt    20/1h plans(tier)=pro:30/1h
api:   *    /api/*          by global 31/1m
usage: GET  /_sluice/usage  by ip     5/1m
`

// TestUsageThroughGateway runs the usage acceptance on the memory store
// and on Postgres.
func TestUsageThroughGateway(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		env := base()
		env["SLUICE_RULES"] = usageGatewayRules
		testUsageThroughGateway(t, env)
	})
	t.Run("postgres", func(t *testing.T) {
		testUsageThroughGateway(t, databaseEnv(pgtest.New(t), "", usageGatewayRules))
	})
}

func testUsageThroughGateway(t *testing.T, env map[string]string) {
	var hits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer up.Close()
	const token = "usage-admin-t0ken"
	env["SLUICE_UPSTREAM"] = up.URL
	env["SLUICE_USAGE_PATH"] = "/_sluice/usage"
	env["SLUICE_ADMIN_TOKEN"] = token
	env["SLUICE_JWT_SECRET"] = testJWTSecret
	env["SLUICE_JWT_ISSUER"] = jwtIssuer
	g := start(t, env)
	// Every count in one window of the 1m rules (and so of the others).
	pgtest.ClearOf(t, time.Minute, 5*time.Second)

	now := time.Now().Unix()
	pat := jwttest.HS256(t, testJWTSecret, map[string]any{"sub": "pat", "tier": "pro", "iss": jwtIssuer, "iat": now - 60, "exp": now + 3600})
	send := func(method, path string, hdr ...string) (*http.Response, string) {
		t.Helper()
		return proctest.Send(t, method, g.url+path, hdr...)
	}
	decode := func(what, body string) []usageEntry {
		t.Helper()
		var u struct{ Usage []usageEntry }
		if err := json.Unmarshal([]byte(body), &u); err != nil || u.Usage == nil {
			t.Fatalf("%s: %s", what, body)
		}
		return u.Usage
	}
	usage := func(hdr ...string) (*http.Response, []usageEntry) {
		t.Helper()
		res, body := send("GET", "/_sluice/usage", hdr...)
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("GET /_sluice/usage: %d %s", res.StatusCode, body)
		}
		return res, decode("GET /_sluice/usage", body)
	}
	admin := func(query string) []usageEntry {
		t.Helper()
		req, _ := http.NewRequest("GET", g.admin+"/v1/usage?"+query, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("GET /v1/usage?%s: %d %s", query, res.StatusCode, body)
		}
		return decode("GET /v1/usage?"+query, string(body))
	}
	counts := func(items []usageEntry) map[string]int64 {
		m := map[string]int64{}
		for _, u := range items {
			m[u.Rule] = u.Count
		}
		return m
	}
	names := func(items []usageEntry) []string {
		var n []string
		for _, u := range items {
			n = append(n, u.Rule)
		}
		return n
	}

	// Traffic: 2 logins, 3 calls of acme's pro user pat, 1 reset mail.
	tenant := []string{"X-Tenant-ID", "acme", "Authorization", "Bearer " + pat}
	for range 2 {
		send("POST", "/api/login")
	}
	for range 3 {
		if res, body := send("GET", "/api/items", tenant...); res.StatusCode != 200 {
			t.Fatalf("GET /api/items: %d %s", res.StatusCode, body)
		}
	}
	send("POST", "/api/reset?email=bob@example.com")
	if hits.Load() != 6 {
		t.Fatalf("the upstream saw %d requests, want 6", hits.Load())
	}

	// The caller's standing: every rule its request keys, in order; the
	// plan's limit for pat; never the email rule, never a key.
	res, items := usage(tenant...)
	if got := names(items); !slices.Equal(got, []string{"login", "query", "user", "api", "usage"}) {
		t.Fatalf("usage lists %v", got)
	}
	if c := counts(items); c["login"] != 2 || c["query"] != 3 || c["user"] != 3 || c["api"] != 6 || c["usage"] != 1 {
		t.Errorf("usage counts %v", c)
	}
	for _, u := range items {
		if u.Key != nil {
			t.Errorf("the public usage shows %s's key", u.Rule)
		}
		if u.Count+u.Remaining != u.Limit || u.ResetAfter < 1 || u.ResetAfter > u.WindowSeconds || u.Reset < now {
			t.Errorf("usage %+v", u)
		}
	}
	if items[2].Limit != 30 || items[0].Window != "15m" || items[0].WindowSeconds != 900 {
		t.Errorf("usage %+v", items)
	}
	if res.Header.Get("X-RateLimit-Limit") != "5" {
		t.Errorf("the usage rule's headers: X-RateLimit-Limit %q", res.Header.Get("X-RateLimit-Limit"))
	}
	// Without a tenant and a token, those rules are left out.
	if _, items := usage(); !slices.Equal(names(items), []string{"login", "api", "usage"}) {
		t.Errorf("without identities the usage lists %v", names(items))
	}
	// Reads count only under the usage rule: 5 a minute, then 429.
	for range 3 {
		usage(tenant...)
	}
	if res, body := send("GET", "/_sluice/usage", tenant...); res.StatusCode != 429 || !strings.Contains(body, "rate limit 'usage' exceeded") {
		t.Fatalf("the 6th read: %d %s", res.StatusCode, body)
	}
	if res, _ := send("POST", "/_sluice/usage"); res.StatusCode != 405 || res.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %d Allow %q", res.StatusCode, res.Header.Get("Allow"))
	}
	if hits.Load() != 6 {
		t.Fatalf("the usage endpoint reached the upstream: %d", hits.Load())
	}

	// The operator's view: by identity, with keys, email rules too.
	for _, tc := range []struct {
		query string
		want  map[string]int64
	}{
		{"tenant=acme", map[string]int64{"query": 3}},
		{"ip=127.0.0.1", map[string]int64{"login": 2, "usage": 5}},
		{"email=Bob@Example.com", map[string]int64{"reset": 1}},
		{"jwt=pat", map[string]int64{"user": 3}},
		{"header=acme", map[string]int64{}},
	} {
		items := admin(tc.query)
		if c := counts(items); len(c) != len(tc.want) || !mapsEqual(c, tc.want) {
			t.Errorf("/v1/usage?%s counts %v, want %v", tc.query, c, tc.want)
		}
		for _, u := range items {
			if u.Key == nil || len(*u.Key) != 43 {
				t.Errorf("/v1/usage?%s: %s has no hashed key", tc.query, u.Rule)
			}
		}
	}
	// The key is the one /v1/keys gives.
	code, body := proctest.Call(t, "GET", g.admin+"/v1/keys?rule=query&tenant=acme", token, "")
	if q := admin("tenant=acme"); code != 200 || !strings.Contains(body, `"key":"`+*q[0].Key+`"`) {
		t.Errorf("/v1/keys: %d %s; /v1/usage's key %s", code, body, *q[0].Key)
	}
	for _, q := range []string{"", "tenant=acme&ip=127.0.0.1", "rule=query"} {
		if code, body := proctest.Call(t, "GET", g.admin+"/v1/usage?"+q, token, ""); code != 400 || !strings.Contains(body, `"status":400`) {
			t.Errorf("/v1/usage?%s: %d %s", q, code, body)
		}
	}
	if code, _ := proctest.Call(t, "GET", g.admin+"/v1/usage?tenant=acme", "", ""); code != 401 {
		t.Errorf("/v1/usage without the token: %d", code)
	}

	// An override is the limit the key is counted under, on both.
	req, _ := http.NewRequest("PUT", g.admin+"/v1/overrides?rule=query&tenant=acme", strings.NewReader(`{"limit":50,"window":"1d"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	if res := sendDiscard(t, req); res.StatusCode != 200 {
		t.Fatalf("PUT override: %d", res.StatusCode)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if q := admin("tenant=acme"); q[0].Limit == 50 && q[0].Remaining == 47 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the override does not show in /v1/usage: %+v", admin("tenant=acme"))
		}
	}
}

func mapsEqual(a, b map[string]int64) bool {
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return len(a) == len(b)
}

// TestLoadUsagePath: SLUICE_USAGE_PATH is an exact canonical path, on a
// gateway with a public listener; check-config names it.
func TestLoadUsagePath(t *testing.T) {
	for _, tc := range []struct {
		path, want string
	}{
		{"/_sluice/usage", ""},
		{"_sluice/usage", `SLUICE_USAGE_PATH: expected a path starting with /, such as /_sluice/usage, got "_sluice/usage"`},
		{"/_sluice/../usage", `SLUICE_USAGE_PATH: expected a canonical path (no dot segments, no repeated slashes, no characters that need escaping), got "/_sluice/../usage"`},
		{"/_sluice//usage", `SLUICE_USAGE_PATH: expected a canonical path (no dot segments, no repeated slashes, no characters that need escaping), got "/_sluice//usage"`},
		{"/_sluice/usage?x=1", `SLUICE_USAGE_PATH: expected a path without %, ? or #, got "/_sluice/usage?x=1"`},
		{"/_sluice/%75sage", `SLUICE_USAGE_PATH: expected a path without %, ? or #, got "/_sluice/%75sage"`},
	} {
		env := base()
		env["SLUICE_USAGE_PATH"] = tc.path
		_, err := load(env)
		var ce *configError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.path, err)
		case tc.want != "" && (!errors.As(err, &ce) || !slices.Equal(ce.problems, []string{tc.want})):
			t.Errorf("%q: %v, want %s", tc.path, err, tc.want)
		}
	}
	env := map[string]string{"SLUICE_CHECK_LISTEN": "127.0.0.1:0", "SLUICE_USAGE_PATH": "/_sluice/usage"}
	var ce *configError
	if _, err := load(env); !errors.As(err, &ce) || !slices.Equal(ce.problems, []string{"SLUICE_USAGE_PATH: needs SLUICE_UPSTREAM: without it there is no public listener to answer on"}) {
		t.Errorf("without an upstream: %v", err)
	}
	env = base()
	env["SLUICE_USAGE_PATH"] = "/_sluice/usage"
	var out strings.Builder
	if err := CheckConfig(env, &out); err != nil || !strings.Contains(out.String(), "usage at /_sluice/usage") {
		t.Errorf("check-config: %v %s", err, out.String())
	}
}
