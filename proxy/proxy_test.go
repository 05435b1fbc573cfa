package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/limiter/storetest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/identity"
)

// upstream is a test upstream that counts and records what reaches it.
type upstream struct {
	*proctest.Upstream
	mu   sync.Mutex
	last *http.Request
	body []byte
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Upstream = proctest.NewUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("upstream: reading the body: %v", err) // a truncated request reached it
		}
		u.mu.Lock()
		u.last, u.body = r, b
		u.mu.Unlock()
		sum := sha256.Sum256(b)
		w.Header().Set("X-Body-Sha256", hex.EncodeToString(sum[:]))
		w.Header().Set("X-RateLimit-Limit", "999") // an upstream's own header, to be replaced
		io.WriteString(w, "hello from upstream")
	})
	return u
}

func (u *upstream) lastRequest() (*http.Request, []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last, u.body
}

// gatewayOpts tweaks a test gateway.
type gatewayOpts struct {
	trusted     string
	headers     string
	maxBody     int64
	store       limiter.Store
	clock       *storetest.Clock
	readTimeout time.Duration // the server's ReadTimeout; 0: none
	jwt         TokenVerifier
	reject      bool   // RejectInvalidTokens
	usage       string // UsagePath, read through the store's Peek
}

// testGateway is a Proxy on a memory store with an injected clock, served
// by a real HTTP server.
type testGateway struct {
	*httptest.Server
	proxy  *Proxy
	clock  *storetest.Clock
	hasher *hashing.Hasher
	store  *recordingStore
	memory *memory.Store // the store under the recording, when the test gave none
}

// recordingStore remembers the checks of the last decision that reached
// the store, so tests can see which rules counted which key.
type recordingStore struct {
	limiter.Store
	mu   sync.Mutex
	last []string // "rule=key"
}

func (s *recordingStore) Decide(ctx context.Context, checks []limiter.Check, results []limiter.Result) (bool, error) {
	s.mu.Lock()
	s.last = s.last[:0]
	for _, c := range checks {
		s.last = append(s.last, c.Rule.Name+"="+c.Key)
	}
	s.mu.Unlock()
	return s.Store.Decide(ctx, checks, results)
}

// lastChecks returns the checks of the last decision, and forgets them.
func (s *recordingStore) lastChecks() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	last := s.last
	s.last = nil
	return last
}

func newGateway(t testing.TB, up *upstream, rules string, o gatewayOpts) *testGateway {
	t.Helper()
	pol, err := policy.Parse(rules)
	if err != nil {
		t.Fatal(err)
	}
	if o.clock == nil {
		o.clock = storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	}
	var mem *memory.Store
	if o.store == nil {
		mem = memory.New(memory.Options{Now: o.clock.Now})
		o.store = mem
	}
	rec := &recordingStore{Store: o.store}
	lim, err := limiter.New(limiter.Config{
		Store:       rec,
		Local:       memory.New(memory.Options{Now: o.clock.Now}),
		Timeout:     time.Second,
		DefaultFail: policy.FailOpen,
		CacheSize:   1000,
		Now:         o.clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := hashing.New([]byte("test-key-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	tp, err := identity.ParseTrustedProxies(o.trusted)
	if err != nil {
		t.Fatal(err)
	}
	if o.headers == "" {
		o.headers = "ietf,x"
	}
	hf, err := ParseHeaderFamilies(o.headers)
	if err != nil {
		t.Fatal(err)
	}
	upURL, _ := url.Parse(up.URL)
	dec, err := NewDecider(DeciderConfig{
		Policy: pol, Limiter: lim, Hasher: h, Trusted: tp, Headers: hf,
		JWT: o.jwt, RejectInvalidTokens: o.reject,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Upstream: upURL, Decider: dec, MaxBodyBytes: o.maxBody, UsagePath: o.usage}
	if o.usage != "" {
		cfg.Usage = o.store.(Peeker)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(p)
	srv.Config.ReadTimeout = o.readTimeout
	srv.Start()
	t.Cleanup(srv.Close)
	return &testGateway{Server: srv, proxy: p, clock: o.clock, hasher: h, store: rec, memory: mem}
}

// do sends a request and returns the response with its body read.
func (g *testGateway) do(t *testing.T, method, path string, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, g.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := g.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, b
}

// raw sends a request line exactly as written, so client libraries cannot
// normalise the path first.
func (g *testGateway) raw(t *testing.T, requestLine string, hdr ...string) *http.Response {
	t.Helper()
	msg := requestLine + "\r\nHost: sluice.test\r\nContent-Length: 0\r\nConnection: close\r\n"
	for _, h := range hdr {
		msg += h + "\r\n"
	}
	res, _ := proctest.Raw(t, g.Listener.Addr().String(), msg+"\r\n", false)
	return res
}

var (
	reRetryAfter = regexp.MustCompile(`^[1-9][0-9]*$`)
	reDigits     = regexp.MustCompile(`^[0-9]+$`)
)

// check429 asserts every header and the body of a 429 as docs/rules.md's Responses section gives them.
func check429(t *testing.T, res *http.Response, body []byte, rule string, limit, windowSec int64) int64 {
	t.Helper()
	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429; body %s", res.StatusCode, body)
	}
	ra := res.Header.Get("Retry-After")
	if !reRetryAfter.MatchString(ra) {
		t.Fatalf("Retry-After %q", ra)
	}
	retry, _ := strconv.ParseInt(ra, 10, 64)
	if got, want := res.Header.Get("RateLimit-Policy"), fmt.Sprintf(`"%s";q=%d;w=%d`, rule, limit, windowSec); got != want {
		t.Fatalf("RateLimit-Policy %q, want %q", got, want)
	}
	if got, want := res.Header.Get("RateLimit"), fmt.Sprintf(`"%s";r=0;t=%d`, rule, retry); got != want {
		t.Fatalf("RateLimit %q, want %q", got, want)
	}
	if got := res.Header.Get("X-RateLimit-Limit"); got != strconv.FormatInt(limit, 10) {
		t.Fatalf("X-RateLimit-Limit %q", got)
	}
	if got := res.Header.Get("X-RateLimit-Remaining"); got != "0" {
		t.Fatalf("X-RateLimit-Remaining %q", got)
	}
	if got := res.Header.Get("X-RateLimit-Reset"); !reDigits.MatchString(got) {
		t.Fatalf("X-RateLimit-Reset %q", got)
	}
	if got := res.Header.Get("Content-Type"); got != "application/problem+json" {
		t.Fatalf("Content-Type %q", got)
	}
	var p map[string]any
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	want := map[string]any{
		"type":              "https://iana.org/assignments/http-problem-types#quota-exceeded",
		"title":             "Too Many Requests",
		"status":            float64(429),
		"detail":            fmt.Sprintf("rate limit '%s' exceeded, retry in %d s", rule, retry),
		"violated-policies": []any{rule},
		"retry_after":       float64(retry),
	}
	for k, v := range want {
		if fmt.Sprint(p[k]) != fmt.Sprint(v) {
			t.Fatalf("body %s = %v, want %v (body %s)", k, p[k], v, body)
		}
	}
	return retry
}

// TestConcurrentLimit: of N concurrent requests against limit L, exactly L
// reach the upstream; the rest get a complete 429.
func TestConcurrentLimit(t *testing.T) {
	const n, l = 60, 5
	up := newUpstream(t)
	g := newGateway(t, up, "login: POST /api/login by ip 5/15m", gatewayOpts{})

	codes := proctest.CountStatuses(t, n, func(int) (int, error) {
		req, _ := http.NewRequest("POST", g.URL+"/api/login", nil)
		res, err := g.Client().Do(req)
		if err != nil {
			return 0, err
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusTooManyRequests && !bytes.Contains(body, []byte(`"violated-policies":["login"]`)) {
			return 0, fmt.Errorf("429 body %s", body)
		}
		return res.StatusCode, nil
	})
	if codes[http.StatusOK] != l || codes[http.StatusTooManyRequests] != n-l || up.Hits() != l {
		t.Fatalf("statuses %v, upstream saw %d; want %d × 200, %d × 429, %d", codes, up.Hits(), l, n-l, l)
	}
	res, body := g.do(t, "POST", "/api/login", "", nil)
	retry := check429(t, res, body, "login", 5, 900)
	if retry != 900 { // clock at a window start: the whole window is left
		t.Fatalf("Retry-After %d, want 900", retry)
	}
	if got, want := res.Header.Get("X-RateLimit-Reset"), strconv.FormatInt(g.clock.Now().Unix()+900, 10); got != want {
		t.Fatalf("X-RateLimit-Reset %s, want %s", got, want)
	}
	if up.Hits() != l {
		t.Fatal("a denied request reached the upstream")
	}
}

// TestRetryAfterIsHonest: a retry one second before Retry-After is denied,
// at Retry-After it is allowed.
func TestRetryAfterIsHonest(t *testing.T) {
	for _, algo := range []string{"fixed", "sliding", "reset", "token"} {
		t.Run(algo, func(t *testing.T) {
			up := newUpstream(t)
			g := newGateway(t, up, "login: POST /api/login by ip 2/1m "+algo, gatewayOpts{})
			g.clock.Advance(17*time.Second + 300*time.Millisecond)
			for range 2 {
				if res, body := g.do(t, "POST", "/api/login", "", nil); res.StatusCode != 200 {
					t.Fatalf("status %d: %s", res.StatusCode, body)
				}
				g.clock.Advance(time.Second)
			}
			res, body := g.do(t, "POST", "/api/login", "", nil)
			retry := check429(t, res, body, "login", 2, 60)
			g.clock.Advance(time.Duration(retry-1) * time.Second)
			if res, _ := g.do(t, "POST", "/api/login", "", nil); res.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("one second before Retry-After: status %d, want 429", res.StatusCode)
			}
			g.clock.Advance(time.Second)
			if res, body := g.do(t, "POST", "/api/login", "", nil); res.StatusCode != http.StatusOK {
				t.Fatalf("at Retry-After: status %d, want 200: %s", res.StatusCode, body)
			}
		})
	}
}

func TestAllowedResponseHeaders(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "wide: * /api/* by global 100/1h; login: POST /api/login by ip 3/1m", gatewayOpts{})
	res, body := g.do(t, "POST", "/api/login", "", nil)
	if res.StatusCode != 200 || string(body) != "hello from upstream" {
		t.Fatalf("status %d body %q", res.StatusCode, body)
	}
	// login has the least room left (2 of 3, against 99 of 100).
	for k, want := range map[string]string{
		"RateLimit-Policy":      `"login";q=3;w=60`,
		"RateLimit":             `"login";r=2;t=60`,
		"X-RateLimit-Limit":     "3",
		"X-RateLimit-Remaining": "2",
	} {
		if got := res.Header.Values(k); len(got) != 1 || got[0] != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	// A path no rule matches carries no rate-limit headers.
	res, _ = g.do(t, "GET", "/other", "", nil)
	if res.Header.Get("RateLimit") != "" || res.Header.Get("X-RateLimit-Limit") != "999" {
		t.Fatalf("unmatched path: %v", res.Header)
	}
}

func TestHeaderFamilies(t *testing.T) {
	for _, tc := range []struct {
		families  string
		ietf, x   bool
		retryHead bool
	}{
		{"ietf", true, false, true},
		{"x", false, true, true},
		{"none", false, false, true},
	} {
		t.Run(tc.families, func(t *testing.T) {
			up := newUpstream(t)
			g := newGateway(t, up, "one: GET /a by ip 1/1m", gatewayOpts{headers: tc.families})
			g.do(t, "GET", "/a", "", nil)
			res, _ := g.do(t, "GET", "/a", "", nil)
			if res.StatusCode != 429 {
				t.Fatalf("status %d", res.StatusCode)
			}
			if (res.Header.Get("RateLimit") != "") != tc.ietf || (res.Header.Get("RateLimit-Policy") != "") != tc.ietf {
				t.Errorf("ietf headers: %v", res.Header)
			}
			if (res.Header.Get("X-RateLimit-Limit") != "") != tc.x {
				t.Errorf("x headers: %v", res.Header)
			}
			if res.Header.Get("Retry-After") == "" {
				t.Error("Retry-After is always sent on 429")
			}
		})
	}
}

// TestPathSpellings: every spelling of a limited path counts against the
// same rule, and the upstream sees the canonical path.
func TestPathSpellings(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "login: POST /api/login by ip 1/1h", gatewayOpts{})
	if res := g.raw(t, "POST /api/login HTTP/1.1"); res.StatusCode != 200 {
		t.Fatalf("first request: %d", res.StatusCode)
	}
	for _, p := range []string{
		"/api/login", "/API/Login", "/api//login", "//api/login", "/api/./login", "/api/x/../login",
		"/api/%6Cogin", "/api/login/", "/api/login;jsessionid=1", "/api%2Flogin",
		"/api/login?x=1", `/api\login`, "/api/LOGIN/.",
		"/api/login.json", "/api/login.", "/api/login%20", "/API/LOGIN.XML/",
	} {
		if res := g.raw(t, "POST "+p+" HTTP/1.1"); res.StatusCode != http.StatusTooManyRequests {
			t.Errorf("%s: status %d, want 429", p, res.StatusCode)
		}
	}
	if up.Hits() != 1 {
		t.Fatalf("upstream saw %d requests", up.Hits())
	}
	// Spellings that would climb out of the path for some upstream.
	for _, p := range []string{"/api/%2e%2e/api/login", "/api/x/..%2Flogin", "/api/x%2F..%2Flogin", "/api/x/..;/login", "/api/login/..%2F..%2Fpublic"} {
		if res := g.raw(t, "POST "+p+" HTTP/1.1"); res.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", p, res.StatusCode)
		}
	}
	if up.Hits() != 1 {
		t.Fatalf("upstream saw %d requests", up.Hits())
	}
	for _, p := range []string{"/api/loginx", "/api/login2"} {
		if res := g.raw(t, "POST "+p+" HTTP/1.1"); res.StatusCode != 200 {
			t.Errorf("%s: status %d, want 200", p, res.StatusCode)
		}
	}
	g.raw(t, "GET /x//y/./z/%7Efoo/../%62ar?q=1 HTTP/1.1")
	r, _ := up.lastRequest()
	if got := r.URL.RequestURI(); got != "/x/y/z/bar?q=1" {
		t.Fatalf("upstream got %q", got)
	}
	if res := g.raw(t, "GET /a/%zz HTTP/1.1"); res.StatusCode != http.StatusBadRequest {
		t.Fatalf("malformed escape: %d", res.StatusCode)
	}
}

// TestEmailSpellings: spellings of one address share one key; the body
// reaches the upstream byte for byte.
func TestEmailSpellings(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "reset: POST /api/reset by email 3/1h", gatewayOpts{})
	json := func(email string) string { return `{ "email" : ` + strconv.Quote(email) + ` , "x": [1, {"y": 2}] }` }
	bodies := []struct{ ct, body string }{
		{"application/json", json("Victim@Example.com")},
		{"application/x-www-form-urlencoded", "email=+victim%40example.com+&a=b"},
		{"application/json; charset=utf-8", json("ｖｉｃｔｉｍ＠ｅｘａｍｐｌｅ．ｃｏｍ")},
		{"application/json", json("VICTIM@EXAMPLE.COM\t")},
	}
	for i, b := range bodies {
		res, _ := g.do(t, "POST", "/api/reset", b.body, map[string]string{"Content-Type": b.ct})
		want := 200
		if i == 3 {
			want = 429
		}
		if res.StatusCode != want {
			t.Fatalf("request %d (%q): status %d, want %d", i, b.body, res.StatusCode, want)
		}
		if want == 200 {
			sum := sha256.Sum256([]byte(b.body))
			if res.Header.Get("X-Body-Sha256") != hex.EncodeToString(sum[:]) {
				t.Fatalf("request %d: body changed on the way upstream", i)
			}
			_, got := up.lastRequest()
			if string(got) != b.body {
				t.Fatalf("upstream body %q, want %q", got, b.body)
			}
		}
	}
	// Another address is a different key.
	if res, _ := g.do(t, "POST", "/api/reset", json("other@example.com"), map[string]string{"Content-Type": "application/json"}); res.StatusCode != 200 {
		t.Fatalf("other address: %d", res.StatusCode)
	}
}

// TestMissingIdentifierFallsBackToIP: leaving the email out is limited by
// IP under the rule, never unlimited.
func TestMissingIdentifierFallsBackToIP(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "reset: POST /api/reset by email 2/1h; tenant: GET /t by tenant 2/1h", gatewayOpts{})
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/api/reset", `{"name":"x"}`},
		{"GET", "/t", ""},
	} {
		for i := range 3 {
			res, _ := g.do(t, tc.method, tc.path, tc.body, map[string]string{"Content-Type": "application/json"})
			if want := map[bool]int{true: 429, false: 200}[i == 2]; res.StatusCode != want {
				t.Fatalf("%s %s request %d: status %d, want %d", tc.method, tc.path, i, res.StatusCode, want)
			}
		}
	}
}

func TestAmbiguousAndOversizedBodies(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "reset: POST /api/reset by email 100/1h; t: GET /t by tenant 100/1h", gatewayOpts{maxBody: 64})
	for _, tc := range []struct {
		name, ct, body string
		hdr            map[string]string
		want           int
	}{
		{"duplicate key", "application/json", `{"email":"a@x.io","email":"b@x.io"}`, nil, 400},
		{"case variant", "application/json", `{"email":"a@x.io","Email":"b@x.io"}`, nil, 400},
		{"array", "application/json", `{"email":["a@x.io","b@x.io"]}`, nil, 400},
		{"object", "application/json", `{"email":{"a":"b"}}`, nil, 400},
		{"malformed", "application/json", `{"email":"a@x.io"`, nil, 400},
		{"trailing data", "application/json", `{"email":"a@x.io"}{"email":"b@x.io"}`, nil, 400},
		{"form twice", "application/x-www-form-urlencoded", `email=a%40x.io&email=b%40x.io`, nil, 400},
		{"oversized", "application/json", `{"email":"a@x.io","pad":"` + strings.Repeat("x", 64) + `"}`, nil, 413},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := up.Hits()
			res, body := g.do(t, "POST", "/api/reset", tc.body, map[string]string{"Content-Type": tc.ct})
			if res.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", res.StatusCode, tc.want, body)
			}
			if res.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("Content-Type %q", res.Header.Get("Content-Type"))
			}
			var p Problem
			if err := json.Unmarshal(body, &p); err != nil || p.Status != tc.want || p.Detail == "" || strings.Contains(p.Detail, "@x.io") {
				t.Fatalf("problem body %s (%v)", body, err)
			}
			if up.Hits() != before {
				t.Fatal("a rejected request reached the upstream")
			}
		})
	}
	res, _ := proctest.Send(t, "GET", g.URL+"/t", "X-Tenant-ID", "acme", "X-Tenant-ID", "evil")
	if res.StatusCode != 400 {
		t.Fatalf("two tenant headers: status %d, want 400", res.StatusCode)
	}
}

// TestSpoofedForwardingHeaders: without trusted proxies, no header moves a
// client to a fresh key; with one, the rightmost untrusted XFF entry counts.
func TestSpoofedForwardingHeaders(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "login: POST /api/login by ip 1/1h", gatewayOpts{})
	g.do(t, "POST", "/api/login", "", nil)
	for _, h := range []map[string]string{
		{"X-Forwarded-For": "203.0.113.7"},
		{"X-Real-IP": "203.0.113.8"},
		{"Forwarded": "for=203.0.113.9"},
		{"True-Client-IP": "203.0.113.10"},
	} {
		if res, _ := g.do(t, "POST", "/api/login", "", h); res.StatusCode != 429 {
			t.Errorf("%v moved the client to a fresh key: status %d", h, res.StatusCode)
		}
	}

	up2 := newUpstream(t)
	g2 := newGateway(t, up2, "login: POST /api/login by ip 1/1h", gatewayOpts{trusted: "127.0.0.1/32,10.0.0.0/8"})
	hdr := map[string]string{
		"X-Forwarded-For":        "198.51.100.1, 203.0.113.5, 10.1.2.3",
		"X-Real-IP":              "192.0.2.200",
		"Forwarded":              "for=192.0.2.201",
		"X-HTTP-Method-Override": "DELETE",
		"X-Method-Override":      "DELETE",
	}
	if res, _ := g2.do(t, "POST", "/api/login", "", hdr); res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	r, _ := up2.lastRequest()
	if got := r.Header.Values("X-Forwarded-For"); len(got) != 1 || got[0] != "203.0.113.5" {
		t.Fatalf("upstream X-Forwarded-For %q, want the derived client 203.0.113.5", got)
	}
	for _, h := range []string{"X-Real-Ip", "Forwarded", "X-Http-Method-Override", "X-Method-Override"} {
		if v := r.Header.Get(h); v != "" {
			t.Errorf("upstream saw client header %s: %q", h, v)
		}
	}
	// The same client behind a different leftmost (spoofed) entry is still
	// the same key; another real client is not.
	hdr["X-Forwarded-For"] = "1.1.1.1, 203.0.113.5"
	if res, _ := g2.do(t, "POST", "/api/login", "", hdr); res.StatusCode != 429 {
		t.Fatalf("same client via spoofed prefix: %d", res.StatusCode)
	}
	hdr["X-Forwarded-For"] = "203.0.113.6"
	if res, _ := g2.do(t, "POST", "/api/login", "", hdr); res.StatusCode != 200 {
		t.Fatalf("another client: %d", res.StatusCode)
	}
}

func TestShadowNeverBlocks(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "trial: GET /a by ip 1/1h shadow", gatewayOpts{})
	for range 3 {
		if res, _ := g.do(t, "GET", "/a", "", nil); res.StatusCode != 200 || res.Header.Get("RateLimit") != "" {
			t.Fatalf("status %d, headers %v", res.StatusCode, res.Header)
		}
	}
}

func TestUpstreamDown(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "", gatewayOpts{})
	up.Close()
	res, body := g.do(t, "GET", "/x", "", nil)
	if res.StatusCode != http.StatusBadGateway || res.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("status %d %s", res.StatusCode, body)
	}
}

// brokenStore cannot decide.
type brokenStore struct{}

func (brokenStore) Decide(context.Context, []limiter.Check, []limiter.Result) (bool, error) {
	return false, errors.New("store down")
}

func TestFailClosedAnswers503(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "c: GET /c by ip 5/1m fail=closed; o: GET /o by ip 5/1m fail=open", gatewayOpts{store: brokenStore{}})
	res, body := g.do(t, "GET", "/c", "", nil)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" || res.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("fail=closed: status %d %v %s", res.StatusCode, res.Header, body)
	}
	if res, _ := g.do(t, "GET", "/o", "", nil); res.StatusCode != 200 {
		t.Fatalf("fail=open: status %d", res.StatusCode)
	}
	if up.Hits() != 1 {
		t.Fatalf("upstream saw %d", up.Hits())
	}
}

// BenchmarkBareReverseProxy is BenchmarkProxy's baseline: the same request
// through a bare httputil.ReverseProxy with sluice's transport. Compare the
// two from one run; the difference is what sluice adds.
func BenchmarkBareReverseProxy(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	upURL, _ := url.Parse(up.URL)
	rp := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(upURL); pr.SetXForwarded() },
		Transport: NewTransport(DefaultTimeouts().Upstream),
	}
	benchLogin(b, rp)
}
