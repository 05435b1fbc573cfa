package check

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/proxytest"
)

// fixture is a forward-auth handler and a proxy sharing one decider on a
// memory store at a fixed instant, in front of an upstream that counts
// what reaches it.
type fixture struct {
	check, proxy *httptest.Server
	upstream     *atomic.Int64
}

// options of newFixture.
type options struct {
	trusted string        // SLUICE_TRUSTED_PROXIES
	store   limiter.Store // nil: a memory store
}

func newFixture(t *testing.T, rules string, o options) *fixture {
	t.Helper()
	dec := proxytest.NewDecider(t, rules, proxytest.DeciderOptions{Store: o.store, Trusted: o.trusted})
	f := &fixture{upstream: &atomic.Int64{}}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f.upstream.Add(1) }))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	px, err := proxy.New(proxy.Config{Upstream: upURL, Decider: dec})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := New(dec)
	if err != nil {
		t.Fatal(err)
	}
	f.check, f.proxy = httptest.NewServer(ch), httptest.NewServer(px)
	t.Cleanup(f.check.Close)
	t.Cleanup(f.proxy.Close)
	return f
}

// answer is a response with its body read.
type answer struct {
	code   int
	header http.Header
	body   string
}

// ask sends one forward-auth question to the check listener at path (and
// its query), with header as name, value pairs.
func (f *fixture) ask(t *testing.T, path string, header ...string) answer {
	t.Helper()
	return send(t, "GET", f.check.URL+path, header...)
}

// send sends method url with header as name, value pairs.
func send(t *testing.T, method, url string, header ...string) answer {
	t.Helper()
	res, body := proctest.Send(t, method, url, header...)
	return answer{res.StatusCode, res.Header, body}
}

// about describes a request as Traefik and Caddy do.
func about(method, uri string, more ...string) []string {
	return append([]string{"X-Forwarded-Method", method, "X-Forwarded-Uri", uri}, more...)
}

// TestAllowAndDeny: three questions within a limit of three are answered
// 200 with the rate-limit headers, the next 429 with exactly the headers
// and body that the proxy sends for the same rule and key.
func TestAllowAndDeny(t *testing.T) {
	f := newFixture(t, "login: POST /api/login by ip 3/1m", options{})
	for i := range 3 {
		a := f.ask(t, "/", about("POST", "/api/login")...)
		if a.code != 200 || a.body != "" {
			t.Fatalf("question %d: %d %q, want 200 and no body", i+1, a.code, a.body)
		}
		if got, want := a.header.Get("RateLimit"), `"login";r=`+string(rune('2'-i))+`;t=60`; got != want {
			t.Errorf("question %d: RateLimit %q, want %q", i+1, got, want)
		}
		if a.header.Get("X-RateLimit-Limit") != "3" || a.header.Get("RateLimit-Policy") != `"login";q=3;w=60` {
			t.Errorf("question %d: headers %v", i+1, a.header)
		}
	}
	denied := f.ask(t, "/anything?at=all", about("POST", "/api/login?x=1")...)
	if denied.code != http.StatusTooManyRequests || denied.header.Get("Retry-After") != "60" {
		t.Fatalf("fourth question: %d, Retry-After %q", denied.code, denied.header.Get("Retry-After"))
	}
	// The proxy answers the same client, over the same limit, alike.
	viaProxy := send(t, "POST", f.proxy.URL+"/api/login")
	if f.upstream.Load() != 0 {
		t.Fatal("the proxy forwarded a request over the limit")
	}
	if viaProxy.code != denied.code || viaProxy.body != denied.body {
		t.Errorf("proxy: %d %s\ncheck: %d %s", viaProxy.code, viaProxy.body, denied.code, denied.body)
	}
	for _, h := range []string{"Content-Type", "Retry-After", "Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Cache-Control"} {
		if viaProxy.header.Get(h) != denied.header.Get(h) || denied.header.Get(h) == "" {
			t.Errorf("%s: proxy %q, check %q", h, viaProxy.header.Get(h), denied.header.Get(h))
		}
	}
	if want := `"violated-policies":["login"]`; !strings.Contains(denied.body, want) {
		t.Errorf("body %s lacks %s", denied.body, want)
	}
}

// TestDeny403: with ?deny=403 a denial is 403 with the same headers, for
// nginx's auth_request; other values of deny are refused.
func TestDeny403(t *testing.T) {
	f := newFixture(t, "login: POST /api/login by ip 1/1m", options{})
	if a := f.ask(t, "/?deny=403", about("POST", "/api/login")...); a.code != 200 {
		t.Fatalf("first question: %d", a.code)
	}
	a := f.ask(t, "/?deny=403", about("POST", "/api/login")...)
	if a.code != http.StatusForbidden || a.header.Get("Retry-After") != "60" || a.header.Get("Ratelimit") != `"login";r=0;t=60` ||
		!strings.Contains(a.body, `"status":403`) || !strings.Contains(a.body, "quota-exceeded") {
		t.Errorf("deny=403: %d %v %s", a.code, a.header, a.body)
	}
	for _, q := range []string{"?deny=401", "?deny=403&deny=403", "?deny", "?%zz"} {
		if a := f.ask(t, "/"+q, about("POST", "/api/login")...); a.code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", q, a.code)
		}
	}
}

// TestQuestionShape: the described method and target, in either spelling,
// are required, once or alike; targets may be absolute URLs.
func TestQuestionShape(t *testing.T) {
	f := newFixture(t, "login: POST /api/login by ip 100/1m", options{})
	tests := []struct {
		name   string
		header []string
		code   int
		detail string
	}{
		{"traefik spelling", about("POST", "/api/login"), 200, ""},
		{"nginx spelling", []string{"X-Original-Method", "POST", "X-Original-URI", "/api/login"}, 200, ""},
		{"both spellings, alike", about("POST", "/api/login", "X-Original-URI", "/api/login"), 200, ""},
		{"absolute URL", about("POST", "https://example.com/API//login.json?x=1"), 200, ""},
		{"lower-case method", about(" post ", "/api/login"), 200, ""},
		{"no method", []string{"X-Forwarded-Uri", "/api/login"}, 400, `the request to check is not described: send X-Forwarded-Method (or X-Original-Method)`},
		{"no target", []string{"X-Forwarded-Method", "POST"}, 400, `the request to check is not described: send X-Forwarded-Uri (or X-Original-Uri)`},
		{"spellings disagree", about("POST", "/api/login", "X-Original-URI", "/other"), 400, `X-Forwarded-Uri and X-Original-Uri: sent more than once, with different values`},
		{"method twice", about("POST", "/api/login", "X-Forwarded-Method", "GET"), 400, `sent more than once`},
		{"bad method", about("PO ST", "/api/login"), 400, `header \"X-Forwarded-Method\" is not a method name`},
		{"bad target", about("POST", "api/login"), 400, `X-Forwarded-Uri: expected a path such as /api/login?x=1 or an absolute http(s) URL`},
		{"malformed path", about("POST", "/api/%zz"), 400, `malformed request path`},
		{"dot segment in disguise", about("POST", "/api/%2e%2e/login"), 400, `malformed request path`},
	}
	for _, tt := range tests {
		a := f.ask(t, "/", tt.header...)
		if a.code != tt.code || !strings.Contains(a.body, tt.detail) {
			t.Errorf("%s: %d %s, want %d with %q", tt.name, a.code, a.body, tt.code, tt.detail)
		}
	}
	// Every answered question counted against the one rule: 5 of 100.
	if a := f.ask(t, "/", about("POST", "/api/login")...); a.header.Get("X-Ratelimit-Remaining") != "94" {
		t.Errorf("remaining %q, want 94: questions that matched were not all counted", a.header.Get("X-Ratelimit-Remaining"))
	}
}

// TestForgedForwardedFor: X-Forwarded-For from an asker outside
// SLUICE_TRUSTED_PROXIES changes no key: every question counts the
// asker's own address. From a trusted asker it is the client.
func TestForgedForwardedFor(t *testing.T) {
	rules := "login: POST /api/login by ip 2/1m"
	untrusted := newFixture(t, rules, options{trusted: "192.0.2.0/24"})
	codes := ""
	for i := range 4 {
		a := untrusted.ask(t, "/", about("POST", "/api/login", "X-Forwarded-For", "203.0.113."+string(rune('1'+i)))...)
		codes += string(rune('0' + a.code/100))
	}
	if codes != "2244" {
		t.Errorf("untrusted asker, four forged addresses: classes %s, want 2244 (one key)", codes)
	}
	trusted := newFixture(t, rules, options{trusted: "127.0.0.1"})
	codes = ""
	for i := range 4 {
		a := trusted.ask(t, "/", about("POST", "/api/login", "X-Forwarded-For", "203.0.113."+string(rune('1'+i)))...)
		codes += string(rune('0' + a.code/100))
	}
	if codes != "2222" {
		t.Errorf("trusted asker, four clients: classes %s, want 2222 (a key each)", codes)
	}
}

// TestIdentities: header identities come from the forwarded headers; a
// body identity, never seen, counts the client IP, whatever the query
// says; an ambiguous header is 400.
func TestIdentities(t *testing.T) {
	f := newFixture(t, "q: GET /api/q by tenant 1/1m; reset: POST /api/reset by email 1/1m", options{})
	if a := f.ask(t, "/", about("GET", "/api/q", "X-Tenant-ID", "acme")...); a.code != 200 {
		t.Fatalf("acme: %d", a.code)
	}
	if a := f.ask(t, "/", about("GET", "/api/q", "X-Tenant-ID", "globex")...); a.code != 200 {
		t.Errorf("globex, a tenant of its own: %d", a.code)
	}
	if a := f.ask(t, "/", about("GET", "/api/q", "X-Tenant-ID", "acme")...); a.code != 429 {
		t.Errorf("acme again: %d", a.code)
	}
	if a := f.ask(t, "/", about("GET", "/api/q", "X-Tenant-ID", "acme", "X_Tenant_ID", "other")...); a.code != 400 || !strings.Contains(a.body, "rule 'q'") {
		t.Errorf("tenant sent twice: %d %s", a.code, a.body)
	}
	if a := f.ask(t, "/", about("POST", "/api/reset?email=a@example.com")...); a.code != 200 {
		t.Fatalf("first reset: %d", a.code)
	}
	if a := f.ask(t, "/", about("POST", "/api/reset?email=b@example.com")...); a.code != 429 {
		t.Errorf("another email in the query, same client: %d, want 429 (the body is not seen, so the IP counts)", a.code)
	}
}

// TestMethods: a "_method" field in the query and the method-override
// headers bring in the rules of the methods they name, since the upstream
// receives them; rules for Envoy's descriptors never match.
func TestMethods(t *testing.T) {
	f := newFixture(t, "del: DELETE /api/items by ip 1/1m; rls: * rls:edge by descriptor(remote_address) 1/1m", options{})
	if a := f.ask(t, "/", about("POST", "/api/items", "X-HTTP-Method-Override", "delete")...); a.code != 200 || a.header.Get("Ratelimit-Policy") == "" {
		t.Fatalf("POST as DELETE: %d %v", a.code, a.header)
	}
	if a := f.ask(t, "/", about("POST", "/api/items?_method=DELETE")...); a.code != 429 {
		t.Errorf("POST with _method=DELETE after one DELETE: %d, want 429", a.code)
	}
	if a := f.ask(t, "/", about("POST", "/api/items", "X-Method-Override", "x y")...); a.code != 400 {
		t.Errorf("an override that is no method: %d, want 400", a.code)
	}
	if a := f.ask(t, "/", about("POST", "/api/items")...); a.code != 200 || a.header.Get("Ratelimit-Policy") != "" {
		t.Errorf("a plain POST, no rule: %d %v", a.code, a.header)
	}
	for _, uri := range []string{"/", "/rls:edge", "/edge"} {
		if a := f.ask(t, "/", about("GET", uri)...); a.code != 200 || a.header.Get("Ratelimit-Policy") != "" {
			t.Errorf("%s: %d %v, want 200 without headers: an rls rule matched", uri, a.code, a.header)
		}
	}
}

// failingStore fails every decision, as a dead database does.
type failingStore struct{}

func (failingStore) Decide(context.Context, []limiter.Check, []limiter.Result) (bool, error) {
	return false, errors.New("connection refused")
}

// TestFailModes: when the store cannot decide, each rule's fail mode
// answers: closed 503 with Retry-After, open 200, local per instance.
func TestFailModes(t *testing.T) {
	f := newFixture(t, `closed: GET /closed by ip 5/1m fail=closed
open: GET /open by ip 1/1m fail=open
local: GET /local by ip 1/1m fail=local`, options{store: failingStore{}})
	if a := f.ask(t, "/", about("GET", "/closed")...); a.code != 503 || a.header.Get("Retry-After") != "1" || !strings.Contains(a.body, `"status":503`) {
		t.Errorf("closed: %d %v %s", a.code, a.header, a.body)
	}
	for range 3 {
		if a := f.ask(t, "/", about("GET", "/open")...); a.code != 200 {
			t.Errorf("open: %d", a.code)
		}
	}
	if a := f.ask(t, "/", about("GET", "/local")...); a.code != 200 {
		t.Errorf("local, first: %d", a.code)
	}
	if a := f.ask(t, "/", about("GET", "/local")...); a.code != 429 {
		t.Errorf("local, second: %d, want 429 from the per-instance limiter", a.code)
	}
}
