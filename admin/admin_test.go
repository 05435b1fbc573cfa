package admin

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/jwt"
	"github.com/sluicehq/sluice/jwt/jwttest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/limiter/storetest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
)

// adminFixture is a gateway and its admin listener on one memory store.
type adminFixture struct {
	public, admin *httptest.Server
	hasher        *hashing.Hasher
	stats         *Stats
}

func newAdminFixture(t *testing.T, rules, token string) *adminFixture {
	t.Helper()
	return newAdminFixtureJWT(t, rules, token, nil)
}

// newAdminFixtureJWT is newAdminFixture whose proxy verifies bearer
// tokens with v (when not nil), and whose admin API knows v's issuer.
func newAdminFixtureJWT(t *testing.T, rules, token string, v *jwt.Verifier) *adminFixture {
	t.Helper()
	// The upstream tells a request's cost in X-Charge when the request
	// asks it to with ?charge=N (for charge=header(X-Charge) rules).
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := r.URL.Query().Get("charge"); n != "" {
			w.Header().Set("X-Charge", n)
		}
	}))
	t.Cleanup(up.Close)
	pol, err := policy.Parse(rules)
	if err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var lim *limiter.Limiter
	mem := memory.New(memory.Options{Now: clock.Now, Forget: func(rule, key string, at time.Time) { lim.Forget(rule, key, at) }})
	reg := prometheus.NewRegistry()
	stats := NewStats(StatsConfig{Gatherer: reg, Now: clock.Now})
	lim, err = limiter.New(limiter.Config{
		Store: mem, Local: memory.New(memory.Options{}), Timeout: time.Second, CacheSize: 100, Now: clock.Now,
		Metrics: limiter.NewMetrics(reg), Denied: stats.Limited,
	})
	if err != nil {
		t.Fatal(err)
	}
	h, _ := hashing.New([]byte("admin-test-key-0123"))
	upURL, _ := url.Parse(up.URL)
	dcfg := proxy.DeciderConfig{Policy: pol, Limiter: lim, Hasher: h, Headers: proxy.HeaderFamilies{IETF: true, X: true}}
	issuer := ""
	if v != nil {
		dcfg.JWT, issuer = v, v.Issuer()
	}
	dec, err := proxy.NewDecider(dcfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.New(proxy.Config{Upstream: upURL, Decider: dec})
	if err != nil {
		t.Fatal(err)
	}
	pub := httptest.NewServer(p)
	t.Cleanup(pub.Close)
	adm := httptest.NewServer(NewHandler(Config{
		Policy: p.Policy, Gatherer: reg,
		Keys: mem, Hasher: h, Token: token, Stats: stats, StoreKind: "memory", JWTIssuer: issuer,
	}))
	t.Cleanup(adm.Close)
	return &adminFixture{public: pub, admin: adm, hasher: h, stats: stats}
}

// call is proctest.Call.
var call = proctest.Call

func TestAdminKeys(t *testing.T) {
	f := newAdminFixture(t, "login: POST /api/login by ip 2/1m", "s3cret")
	for range 3 {
		call(t, "POST", f.public.URL+"/api/login", "", "")
	}
	code, body := call(t, "GET", f.admin.URL+"/v1/keys?rule=login&ip=127.0.0.1", "s3cret", "")
	var k keyJSON
	if code != 200 || json.Unmarshal([]byte(body), &k) != nil || k.Count != 2 || k.Remaining != 0 || k.Limit != 2 || k.Window != "1m" || k.ResetAfter != 60 {
		t.Fatalf("GET key: %d %s", code, body)
	}
	// Writes need the token.
	if code, _ := call(t, "DELETE", f.admin.URL+"/v1/keys?rule=login&ip=127.0.0.1", "", ""); code != 401 {
		t.Fatalf("DELETE without token: %d", code)
	}
	if code, _ := call(t, "DELETE", f.admin.URL+"/v1/keys?rule=login&ip=127.0.0.1", "wrong", ""); code != 401 {
		t.Fatalf("DELETE with a wrong token: %d", code)
	}
	// The key is in the fast path now; a reset must clear that too.
	if code, body := call(t, "DELETE", f.admin.URL+"/v1/keys?rule=login&ip=127.0.0.1", "s3cret", ""); code != 204 {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	if code, _ := call(t, "POST", f.public.URL+"/api/login", "", ""); code != 200 {
		t.Fatalf("after reset: %d", code)
	}
}

// TestAdminToken: with a token configured, every /v1 request needs it, so
// GET /v1/keys is no oracle of whether an address or IP was active; without
// one, reads are open and writes refused. Health and metrics never need it.
func TestAdminToken(t *testing.T) {
	for _, tc := range []struct {
		token, send, method, path string
		want                      int
	}{
		{"s3cret", "", "GET", "/v1/keys?rule=reset&email=victim@example.com", 401},
		{"s3cret", "wrong", "GET", "/v1/keys?rule=reset&email=victim@example.com", 401},
		{"s3cret", "s3cret2", "GET", "/v1/keys?rule=reset&email=victim@example.com", 401},
		{"s3cret", "s3cret", "GET", "/v1/keys?rule=reset&email=victim@example.com", 200},
		{"s3cret", "", "GET", "/v1/rules", 401},
		{"s3cret", "s3cret", "GET", "/v1/rules", 200},
		{"s3cret", "", "DELETE", "/v1/keys?rule=reset&email=victim@example.com", 401},
		{"s3cret", "", "PUT", "/v1/overrides?rule=reset&email=victim@example.com", 401},
		{"s3cret", "", "DELETE", "/v1/overrides?rule=reset&email=victim@example.com", 401},
		{"s3cret", "s3cret", "DELETE", "/v1/keys?rule=reset&email=victim@example.com", 204},
		{"s3cret", "", "GET", "/healthz", 200},
		{"s3cret", "", "GET", "/readyz", 200},
		{"s3cret", "", "GET", "/metrics", 200},
		{"", "", "GET", "/v1/keys?rule=reset&email=victim@example.com", 200},
		{"", "", "GET", "/v1/rules", 200},
		{"", "anything", "DELETE", "/v1/keys?rule=reset&email=victim@example.com", 403},
		{"", "", "PUT", "/v1/overrides?rule=reset&email=victim@example.com", 403},
	} {
		f := newAdminFixture(t, "reset: POST /api/reset by email 3/1h", tc.token)
		code, body := call(t, tc.method, f.admin.URL+tc.path, tc.send, "")
		if code != tc.want {
			t.Errorf("token %q, sent %q: %s %s = %d, want %d (%s)", tc.token, tc.send, tc.method, tc.path, code, tc.want, body)
		}
	}
}

func TestAdminOverrides(t *testing.T) {
	f := newAdminFixture(t, "query: GET /q by tenant 1/1d", "s3cret")
	get := func() int {
		req, _ := http.NewRequest("GET", f.public.URL+"/q", nil)
		req.Header.Set("X-Tenant-ID", "acme")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	statuses := func(n int) []int {
		var got []int
		for range n {
			got = append(got, get())
		}
		return got
	}
	if got := statuses(2); !slices.Equal(got, []int{200, 429}) {
		t.Fatalf("limit 1 not applied: %v", got)
	}
	u := f.admin.URL + "/v1/overrides?rule=query&tenant=acme"
	if code, body := call(t, "PUT", u, "s3cret", `{"limit":3,"window":"1d"}`); code != 200 || !strings.Contains(body, `"limit":3`) {
		t.Fatalf("PUT: %d %s", code, body)
	}
	if got := statuses(3); !slices.Equal(got, []int{200, 200, 429}) {
		t.Fatalf("override not applied: %v", got)
	}
	// Listed with the hashed key, never the tenant sent; reads need the
	// token too.
	if code, _ := call(t, "GET", f.admin.URL+"/v1/overrides", "", ""); code != 401 {
		t.Fatalf("GET /v1/overrides without the token: %d", code)
	}
	var list struct{ Overrides []overrideItemJSON }
	code, body := call(t, "GET", f.admin.URL+"/v1/overrides", "s3cret", "")
	if code != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list.Overrides) != 1 || strings.Contains(body, "acme") {
		t.Fatalf("GET /v1/overrides: %d %s", code, body)
	}
	want := overrideItemJSON{Rule: "query", Key: f.hasher.Key(policy.ByTenant.String(), "acme"), Limit: 3, Window: "1d", WindowSec: 86400}
	if list.Overrides[0] != want {
		t.Fatalf("listed %+v, want %+v", list.Overrides[0], want)
	}
	if code, body := call(t, "GET", f.admin.URL+"/v1/overrides?rule=query", "s3cret", ""); code != 200 || strings.Count(body, `"rule":"query"`) != 1 {
		t.Fatalf("GET /v1/overrides?rule=query: %d %s", code, body)
	}
	// A rule that is not in force, with no override stored: 404, as
	// /v1/keys and PUT answer it.
	if code, body := call(t, "GET", f.admin.URL+"/v1/overrides?rule=other", "s3cret", ""); code != 404 || !strings.Contains(body, `"status":404`) {
		t.Fatalf("GET /v1/overrides?rule=other: %d %s, want 404", code, body)
	}
	if code, _ := call(t, "GET", f.admin.URL+"/v1/overrides?rule=a&rule=b", "s3cret", ""); code != 400 {
		t.Fatalf("rule given twice: %d", code)
	}
	if code, _ := call(t, "DELETE", u, "s3cret", ""); code != 204 {
		t.Fatalf("DELETE: %d", code)
	}
	if get() != 429 {
		t.Fatal("override not removed")
	}
}

func TestAdminErrors(t *testing.T) {
	f := newAdminFixture(t, "login: POST /api/login by ip 2/1m; all: * /* by global 9/1m", "")
	for _, tc := range []struct {
		method, path, token, body string
		code                      int
		detail                    string
	}{
		{"GET", "/v1/keys", "", "", 400, "query parameter rule is required"},
		{"GET", "/v1/keys?rule=nope&ip=1.2.3.4", "", "", 404, "no rule named 'nope'"},
		{"GET", "/v1/keys?rule=login", "", "", 400, "rule 'login' counts by ip: give ip="},
		{"GET", "/v1/keys?rule=login&ip=1.2.3.4&email=a@b.c", "", "", 400, "give one of ip, email, tenant, header, jwt, descriptor or key, got ip, email"},
		{"GET", "/v1/keys?rule=login&ip=banana", "", "", 400, "ip: not an IP address"},
		{"GET", "/v1/keys?rule=login&ip=1.2.3.4&ip=5.6.7.8", "", "", 400, "query parameter ip given more than once"},
		{"GET", "/v1/keys?rule=login&email=%EF%BB%BFa@b.c", "", "", 400, "email: holds an invisible format character"},
		{"GET", "/v1/keys?rule=login&tenant=a%09b", "", "", 400, "tenant: holds a control character"},
		{"DELETE", "/v1/keys?rule=login&ip=1.2.3.4", "x", "", 403, "admin writes are disabled: set SLUICE_ADMIN_TOKEN"},
		{"PUT", "/v1/overrides?rule=login&ip=1.2.3.4", "x", `{"limit":1,"window":"1m"}`, 403, "admin writes are disabled: set SLUICE_ADMIN_TOKEN"},
	} {
		code, body := call(t, tc.method, f.admin.URL+tc.path, tc.token, tc.body)
		var p proxy.Problem
		json.Unmarshal([]byte(body), &p)
		if code != tc.code || p.Detail != tc.detail {
			t.Errorf("%s %s: %d %q, want %d %q", tc.method, tc.path, code, p.Detail, tc.code, tc.detail)
		}
	}
	if code, body := call(t, "GET", f.admin.URL+"/v1/keys?rule=all", "", ""); code != 200 || !strings.Contains(body, `"limit":9`) {
		t.Errorf("global rule needs no identity: %d %s", code, body)
	}

	g := newAdminFixture(t, "login: POST /api/login by ip 2/1m cost=2", "t")
	for _, tc := range []struct{ body, detail string }{
		{`{"limit":0,"window":"1m"}`, `invalid override for rule "login": limit: expected 1 to 1000000000000, got 0`},
		{`{"limit":1,"window":"1m"}`, `invalid override for rule "login": limit: must be at least the rule's cost 2, got 1`},
		{`{"limit":5,"window":"soon"}`, `window: expected Ns, Nm, Nh or Nd such as 15m, got "soon"`},
		{`{"limit":5,"window":"1m","extra":1}`, `body: expected {"limit":N,"window":"1d"}: unknown member "extra" (names are spelled exactly as documented)`},
	} {
		code, body := call(t, "PUT", g.admin.URL+"/v1/overrides?rule=login&ip=1.2.3.4", "t", tc.body)
		var p proxy.Problem
		json.Unmarshal([]byte(body), &p)
		if code != 400 || p.Detail != tc.detail {
			t.Errorf("PUT %s: %d %q, want 400 %q", tc.body, code, p.Detail, tc.detail)
		}
	}
}

// TestAdminJWT: ?jwt= names the key of a user of a jwt rule as the proxy
// counts it (the claim, keyed with the issuer), for lookups, resets and
// overrides; ?plan= looks it up under a plan's limit; /v1/rules shows the
// plans.
func TestAdminJWT(t *testing.T) {
	const secret = "admin-test-jwt-secret-of-32-bytes!"
	v, err := jwt.New(jwt.Config{Secret: []byte(secret), Issuer: "https://issuer.example/"})
	if err != nil {
		t.Fatal(err)
	}
	f := newAdminFixtureJWT(t, "api: GET /api/* by jwt 2/1h plans(plan)=pro:5/1h,team:50/1d; login: POST /api/login by ip 2/1m", "s3cret", v)
	alice := jwttest.HS256(t, secret, map[string]any{"sub": "alice", "iss": "https://issuer.example/", "exp": time.Now().Add(time.Hour).Unix(), "plan": "free"})
	send := func() int {
		req, _ := http.NewRequest("GET", f.public.URL+"/api/x", nil)
		req.Header.Set("Authorization", "Bearer "+alice)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if got := []int{send(), send(), send()}; !slices.Equal(got, []int{200, 200, 429}) {
		t.Fatalf("alice: %v, want [200 200 429]", got)
	}
	key := func(query string) keyJSON {
		t.Helper()
		code, body := call(t, "GET", f.admin.URL+"/v1/keys?"+query, "s3cret", "")
		var k keyJSON
		if code != 200 || json.Unmarshal([]byte(body), &k) != nil {
			t.Fatalf("GET /v1/keys?%s: %d %s", query, code, body)
		}
		return k
	}
	if k := key("rule=api&jwt=alice"); k.Count != 2 || k.Limit != 2 || k.Remaining != 0 {
		t.Fatalf("alice: %+v, want 2 of 2 used", k)
	}
	if k := key("rule=api&jwt=alice&plan=pro"); k.Count != 2 || k.Limit != 5 || k.Remaining != 3 || k.Window != "1h" {
		t.Fatalf("alice under pro: %+v, want 2 of 5 used", k)
	}
	if k := key("rule=api&jwt=bob"); k.Count != 0 {
		t.Fatalf("bob: %+v, want nothing used", k)
	}
	if k := key("rule=api&ip=127.0.0.1"); k.Count != 0 {
		t.Fatalf("the client's IP: %+v, want nothing used: alice's token verified", k)
	}
	// key=, the hashed key that the overrides and the most limited keys
	// show, takes plan= too: a hashed key does not tell its plan.
	hashed := key("rule=api&jwt=alice").Key
	if k := key("rule=api&key=" + hashed + "&plan=pro"); k.Count != 2 || k.Limit != 5 || k.Key != hashed {
		t.Fatalf("alice's hashed key under pro: %+v, want 2 of 5 used", k)
	}

	// An override for alice, then a reset of her counter.
	u := f.admin.URL + "/v1/overrides?rule=api&jwt=alice"
	if code, body := call(t, "PUT", u, "s3cret", `{"limit":3,"window":"1h"}`); code != 200 {
		t.Fatalf("PUT override: %d %s", code, body)
	}
	if got := []int{send(), send()}; !slices.Equal(got, []int{200, 429}) {
		t.Fatalf("alice with an override of 3: %v, want [200 429]", got)
	}
	if code, _ := call(t, "DELETE", f.admin.URL+"/v1/keys?rule=api&jwt=alice", "s3cret", ""); code != 204 {
		t.Fatalf("DELETE key: %d", code)
	}
	if k := key("rule=api&jwt=alice"); k.Count != 0 || k.Limit != 3 {
		t.Fatalf("alice after the reset: %+v, want 0 of her override's 3 used", k)
	}
	if code, _ := call(t, "DELETE", u, "s3cret", ""); code != 204 {
		t.Fatalf("DELETE override: %d", code)
	}

	for _, tc := range []struct{ query, detail string }{
		{"rule=login&jwt=alice", "jwt: rule 'login' counts by ip, not by a token's claim"},
		{"rule=api&jwt=", "jwt: empty"},
		{"rule=api&jwt=a&jwt=b", "query parameter jwt given more than once"},
		{"rule=api&jwt=alice&ip=1.2.3.4", "give one of ip, email, tenant, header, jwt, descriptor or key, got ip, jwt"},
		{"rule=api&jwt=alice&key=" + hashed, "give one of ip, email, tenant, header, jwt, descriptor or key, got jwt, key"},
		{"rule=api&jwt=alice&descriptor=x", "give one of ip, email, tenant, header, jwt, descriptor or key, got jwt, descriptor"},
		{"rule=api&key=" + hashed + "&plan=gold", "plan: rule 'api' has no plan 'gold' (its plans: pro, team)"},
		{"rule=api&jwt=alice&plan=gold", "plan: rule 'api' has no plan 'gold' (its plans: pro, team)"},
		{"rule=api&jwt=alice&plan=pro&plan=team", "query parameter plan given more than once"},
		{"rule=login&ip=1.2.3.4&plan=pro", "plan: rule 'login' has no plans"},
	} {
		code, body := call(t, "GET", f.admin.URL+"/v1/keys?"+tc.query, "s3cret", "")
		var p proxy.Problem
		json.Unmarshal([]byte(body), &p)
		if code != 400 || p.Detail != tc.detail {
			t.Errorf("GET /v1/keys?%s: %d %q, want 400 %q", tc.query, code, p.Detail, tc.detail)
		}
	}

	var rules struct{ Rules []ruleJSON }
	code, body := call(t, "GET", f.admin.URL+"/v1/rules", "s3cret", "")
	if code != 200 || json.Unmarshal([]byte(body), &rules) != nil || len(rules.Rules) != 2 {
		t.Fatalf("GET /v1/rules: %d %s", code, body)
	}
	api := rules.Rules[0]
	want := []planJSON{{Name: "pro", Limit: 5, Window: "1h", WindowSec: 3600}, {Name: "team", Limit: 50, Window: "1d", WindowSec: 86400}}
	if api.Identity != "jwt" || api.Field != "sub" || api.PlanClaim != "plan" || !slices.Equal(api.Plans, want) {
		t.Errorf("/v1/rules shows %+v", api)
	}
	if strings.Contains(body, `"plans"`) && strings.Count(body, `"plans"`) != 1 {
		t.Errorf("a rule without plans shows them: %s", body)
	}
}
