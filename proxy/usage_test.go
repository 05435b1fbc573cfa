package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/jwt"
	"github.com/sluicehq/sluice/jwt/jwttest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storetest"
)

// usageRules have a rule of every identity kind, a plan, an Envoy rule,
// and one that bounds the usage endpoint itself.
const usageRules = `
login:  POST /api/login  by ip                 5/15m
reset:  POST /api/reset  by email              3/1h
query:  GET  /api/query  by tenant             10/1d
acct:   GET  /api/*      by header(X-Account)  7/1h
user:   GET  /api/*      by jwt                20/1h plans(tier)=pro:200/1h
api:    *    /api/*      by global             1000/1m
edge:   *    rls:edge    by descriptor(remote_address) 5/1m
usage:  GET  /_sluice/usage by ip              4/1m
`

// newUsageGateway is a test gateway with usageRules, the usage endpoint
// at /_sluice/usage, and tokens signed with jwtSecret verified.
func newUsageGateway(t *testing.T, rules string) (*testGateway, *upstream) {
	t.Helper()
	clock := storetest.NewClock(t0)
	v, err := jwt.New(jwt.Config{Secret: []byte(jwtSecret), Issuer: jwtIssuer, Audiences: []string{jwtAudience}, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	return newGateway(t, up, rules, gatewayOpts{clock: clock, jwt: v, usage: "/_sluice/usage"}), up
}

// readUsage decodes a usage body.
func readUsage(t *testing.T, res *http.Response, body []byte) []Usage {
	t.Helper()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("usage: %d %s %s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	var u struct{ Usage []Usage }
	if err := json.Unmarshal(body, &u); err != nil {
		t.Fatalf("usage body %s: %v", body, err)
	}
	return u.Usage
}

func usageRuleNames(items []Usage) []string {
	var names []string
	for _, u := range items {
		names = append(names, u.Rule)
	}
	return names
}

// TestUsageEndpoint: the usage path is answered by sluice, never
// forwarded, and counts only under the rule of its path; it lists every
// rule whose key the request gives, in the rules' order, with the
// counts the requests left, and never an email or rls: rule; a rule
// whose identity the request does not carry is left out.
func TestUsageEndpoint(t *testing.T) {
	g, up := newUsageGateway(t, usageRules)
	alice := jwttest.HS256(t, jwtSecret, tokenClaims("alice"))
	hdr := map[string]string{"X-Tenant-ID": "acme", "X-Account": "a-1", "Authorization": "Bearer " + alice}

	// Some traffic: 2 logins, 3 queries of acme (by alice, account a-1),
	// one reset mail.
	var login *http.Response
	for range 2 {
		login, _ = g.do(t, "POST", "/api/login", "", nil)
	}
	for range 3 {
		if res, body := g.do(t, "GET", "/api/query", "", hdr); res.StatusCode != 200 {
			t.Fatalf("query: %d %s", res.StatusCode, body)
		}
	}
	g.do(t, "POST", "/api/reset", "email=bob@example.com", map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if up.Hits() != 6 {
		t.Fatalf("the upstream saw %d requests, want 6", up.Hits())
	}

	// An address in the query names nobody's counter.
	res, body := g.do(t, "GET", "/_sluice/usage?email=bob@example.com", "", hdr)
	items := readUsage(t, res, body)
	if got, want := usageRuleNames(items), []string{"login", "query", "acct", "user", "api", "usage"}; !slices.Equal(got, want) {
		t.Fatalf("usage lists %v, want %v: %s", got, want, body)
	}
	at := t0.Unix()
	want := []Usage{
		{Rule: "login", Limit: 5, Window: "15m", WindowSeconds: 900, Count: 2, Remaining: 3, Reset: at + 900, ResetAfter: 900},
		{Rule: "query", Limit: 10, Window: "1d", WindowSeconds: 86400, Count: 3, Remaining: 7, Reset: at + 86400, ResetAfter: 86400},
		{Rule: "acct", Limit: 7, Window: "1h", WindowSeconds: 3600, Count: 3, Remaining: 4, Reset: at + 3600, ResetAfter: 3600},
		{Rule: "user", Limit: 20, Window: "1h", WindowSeconds: 3600, Count: 3, Remaining: 17, Reset: at + 3600, ResetAfter: 3600},
		{Rule: "api", Limit: 1000, Window: "1m", WindowSeconds: 60, Count: 6, Remaining: 994, Reset: at + 60, ResetAfter: 60},
		{Rule: "usage", Limit: 4, Window: "1m", WindowSeconds: 60, Count: 1, Remaining: 3, Reset: at + 60, ResetAfter: 60},
	}
	if !slices.Equal(items, want) {
		t.Errorf("usage\n got %+v\nwant %+v", items, want)
	}
	if strings.Contains(string(body), `"key"`) {
		t.Errorf("the public usage shows keys: %s", body)
	}
	// The same instant X-RateLimit-Reset gave.
	if got := login.Header.Get("X-RateLimit-Reset"); got != strconv.FormatInt(items[0].Reset, 10) {
		t.Errorf("login's X-RateLimit-Reset %s, usage's reset %d", got, items[0].Reset)
	}
	// The usage rule's headers are on the answer, as on any request.
	if got := res.Header.Get("RateLimit"); got != `"usage";r=3;t=60` {
		t.Errorf("RateLimit %q", got)
	}
	if res.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("Cache-Control %q", res.Header.Get("Cache-Control"))
	}
	if up.Hits() != 6 {
		t.Fatalf("the usage request reached the upstream")
	}

	// Without the tenant, the account and the token, only what the
	// request gives: its IP and the global key. Every spelling of the
	// path is the endpoint; none is forwarded, none counts but under
	// the usage rule (3 more: 4 of 4 spent).
	for _, path := range []string{"/_sluice/usage/", "/_SLUICE/Usage", "/_sluice//usage;x=1"} {
		res, body := g.do(t, "GET", path, "", nil)
		if got := usageRuleNames(readUsage(t, res, body)); !slices.Equal(got, []string{"login", "api", "usage"}) {
			t.Errorf("GET %s lists %v", path, got)
		}
	}
	if up.Hits() != 6 {
		t.Fatalf("a usage request reached the upstream: %d", up.Hits())
	}
	// Spent: the usage rule denies it, with the usual 429.
	res, body = g.do(t, "GET", "/_sluice/usage", "", nil)
	check429(t, res, body, "usage", 4, 60)

	// A minute later the usage rule has room again; nothing else moved
	// (the window of 1m rules restarted: api is 0 now).
	g.clock.Advance(time.Minute)
	res, body = g.do(t, "GET", "/_sluice/usage", "", hdr)
	items = readUsage(t, res, body)
	for _, u := range items {
		wantCount := map[string]int64{"login": 2, "query": 3, "acct": 3, "user": 3, "api": 0, "usage": 1}[u.Rule]
		if u.Count != wantCount {
			t.Errorf("after a minute, %s counts %d, want %d", u.Rule, u.Count, wantCount)
		}
	}
	if up.Hits() != 6 {
		t.Fatalf("a usage request reached the upstream: %d", up.Hits())
	}
}

// TestUsageNotCounted: with no rule on its path, many reads of the usage
// endpoint change no count, and other methods get 405 with Allow.
func TestUsageNotCounted(t *testing.T) {
	g, up := newUsageGateway(t, "login: POST /api/login by ip 5/15m\nall: * /* by ip 1000/1h\nany: * /_sluice/* by global 3/1h")
	g.do(t, "POST", "/api/login", "", nil)
	// "all" and "any" match the usage path (a prefix rule covers it):
	// they count it. Without them only login would be listed unchanged.
	g2, up2 := newUsageGateway(t, "login: POST /api/login by ip 5/15m\ntenants: GET /api/* by tenant 9/1h")
	g2.do(t, "POST", "/api/login", "", nil)
	g2.do(t, "GET", "/api/x", "", map[string]string{"X-Tenant-ID": "acme"})
	for range 20 {
		res, body := g2.do(t, "GET", "/_sluice/usage", "", map[string]string{"X-Tenant-ID": "acme"})
		items := readUsage(t, res, body)
		if len(items) != 2 || items[0].Count != 1 || items[1].Count != 1 {
			t.Fatalf("usage %+v", items)
		}
		if h := res.Header.Get("X-RateLimit-Limit"); h != "" {
			t.Fatalf("no rule matches the usage path, yet it has rate-limit headers: %s", h)
		}
	}
	res, body := g2.do(t, "HEAD", "/_sluice/usage", "", nil)
	if res.StatusCode != 200 || len(body) != 0 || res.Header.Get("Content-Type") != "application/json" {
		t.Errorf("HEAD: %d %q", res.StatusCode, body)
	}
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH", "OPTIONS"} {
		res, body := g2.do(t, m, "/_sluice/usage", "", nil)
		if res.StatusCode != 405 || res.Header.Get("Allow") != "GET, HEAD" || res.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d Allow %q %s", m, res.StatusCode, res.Header.Get("Allow"), body)
		}
	}
	if up2.Hits() != 2 {
		t.Errorf("the upstream saw %d requests, want the 2 that were not for the usage endpoint", up2.Hits())
	}

	// Rules of the usage path count it, as any request; the rest do not.
	for range 2 {
		g.do(t, "GET", "/_sluice/usage", "", nil)
	}
	res, body = g.do(t, "GET", "/_sluice/usage", "", nil)
	items := readUsage(t, res, body)
	counts := map[string]int64{}
	for _, u := range items {
		counts[u.Rule] = u.Count
	}
	if counts["login"] != 1 || counts["all"] != 4 || counts["any"] != 3 {
		t.Errorf("counts %v, want login 1, all 4 (the login and 3 reads), any 3", counts)
	}
	res, body = g.do(t, "GET", "/_sluice/usage", "", nil)
	check429(t, res, body, "any", 3, 3600)
	if up.Hits() != 1 {
		t.Errorf("the upstream saw %d requests, want 1", up.Hits())
	}
}

// TestUsagePlansAndTokens: a jwt rule is listed only for a verified token
// holding its claim, under the plan the token names; with
// SLUICE_JWT_INVALID=ip an invalid token is no identity, and two
// Authorization headers are a 400.
func TestUsagePlansAndTokens(t *testing.T) {
	g, _ := newUsageGateway(t, "user: GET /api/* by jwt 20/1h plans(tier)=pro:200/1h\norg: GET /api/* by jwt(org.id) 50/1h\nip: GET /api/* by ip 30/1h")
	pro := jwttest.HS256(t, jwtSecret, tokenClaims("pat", "tier", "pro", "org", map[string]any{"id": 7}))
	for range 2 {
		g.do(t, "GET", "/api/x", "", map[string]string{"Authorization": "Bearer " + pro})
	}
	res, body := g.do(t, "GET", "/_sluice/usage", "", map[string]string{"Authorization": "Bearer " + pro})
	items := readUsage(t, res, body)
	if got := usageRuleNames(items); !slices.Equal(got, []string{"user", "org", "ip"}) {
		t.Fatalf("lists %v", got)
	}
	if items[0].Limit != 200 || items[0].Count != 2 || items[1].Limit != 50 || items[1].Count != 2 {
		t.Errorf("usage %+v", items)
	}
	// No sub: the user rule is left out, the org rule is listed.
	noSub := jwttest.HS256(t, jwtSecret, tokenClaims("", "sub", nil, "org", map[string]any{"id": 7}))
	res, body = g.do(t, "GET", "/_sluice/usage", "", map[string]string{"Authorization": "Bearer " + noSub})
	if got := usageRuleNames(readUsage(t, res, body)); !slices.Equal(got, []string{"org", "ip"}) {
		t.Errorf("a token without sub lists %v", got)
	}
	bad := jwttest.HS256(t, "another-secret-of-at-least-32-bytes!!", tokenClaims("pat"))
	res, body = g.do(t, "GET", "/_sluice/usage", "", map[string]string{"Authorization": "Bearer " + bad})
	if got := usageRuleNames(readUsage(t, res, body)); !slices.Equal(got, []string{"ip"}) {
		t.Errorf("a forged token lists %v", got)
	}
	r := g.raw(t, "GET /_sluice/usage HTTP/1.1", bearer(pro), bearer(pro))
	if r.StatusCode != 400 {
		t.Errorf("two Authorization headers: %d", r.StatusCode)
	}
}

// TestUsagePathValidation: SLUICE_USAGE_PATH must be an exact canonical
// path.
func TestUsagePathValidation(t *testing.T) {
	for _, p := range []string{"", "/_sluice/usage", "/usage", "/a/b-c_d~e"} {
		if err := ValidateUsagePath(p); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
	for _, p := range []string{"usage", "/a/../usage", "/a/./u", "//u", "/u%41", "/u?x", "/u#x", "/u x", "/a//b"} {
		if err := ValidateUsagePath(p); err == nil {
			t.Errorf("%q: accepted", p)
		}
	}
}

// TestUsageCalendarWindow: a calendar rule's window is named by its unit,
// with the current period's length and its end; an override with a window
// of its own is named by its length.
func TestUsageCalendarWindow(t *testing.T) {
	g, _ := newUsageGateway(t, "monthly: GET /api/* by ip 100/1mo tz=Europe/Berlin\ndaily: GET /api/* by ip 50/1d tz=America/New_York")
	g.do(t, "GET", "/api/x", "", nil)
	res, body := g.do(t, "GET", "/_sluice/usage", "", nil)
	items := readUsage(t, res, body)
	berlin, _ := time.LoadLocation("Europe/Berlin")
	newYork, _ := time.LoadLocation("America/New_York")
	// t0 is 2026-01-01 00:00 UTC: 01:00 on the 1st in Berlin, 19:00 on
	// 31 December in New York.
	feb := time.Date(2026, 2, 1, 0, 0, 0, 0, berlin)
	jan1NY := time.Date(2026, 1, 1, 0, 0, 0, 0, newYork)
	want := []Usage{
		{Rule: "monthly", Limit: 100, Window: "1mo", WindowSeconds: 31 * 86400, Count: 1, Remaining: 99, Reset: feb.Unix(), ResetAfter: feb.Unix() - t0.Unix()},
		{Rule: "daily", Limit: 50, Window: "1d", WindowSeconds: 86400, Count: 1, Remaining: 49, Reset: jan1NY.Unix(), ResetAfter: jan1NY.Unix() - t0.Unix()},
	}
	if !slices.Equal(items, want) {
		t.Errorf("usage\n got %+v\nwant %+v", items, want)
	}
	if err := g.memory.SetOverride(context.Background(), limiter.Check{Rule: g.proxy.Policy().Rules()[0], Key: g.hasher.Key("ip", "127.0.0.1")}, 10, 7*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	res, body = g.do(t, "GET", "/_sluice/usage", "", nil)
	if items := readUsage(t, res, body); items[0].Window != "7d" || items[0].Limit != 10 || items[0].WindowSeconds != 7*86400 {
		t.Errorf("under an override of 10/7d: %+v", items[0])
	}
}
