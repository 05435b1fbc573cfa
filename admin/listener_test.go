package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
)

// send sends method url with body (and its content type, when not
// empty), Host host (when not empty) and the Authorization value auth
// (when not empty). It returns the response, its body read.
func send(t *testing.T, method, url, host, auth, contentType, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return proctest.Do(t, req)
}

// isProblem reports whether res and body are an RFC 9457 problem of
// status: the content type, and a body with type, title, status and
// detail.
func isProblem(res *http.Response, body string, status int) bool {
	var p proxy.Problem
	return res.StatusCode == status &&
		res.Header.Get("Content-Type") == "application/problem+json" &&
		json.Unmarshal([]byte(body), &p) == nil &&
		p.Type != "" && p.Title != "" && p.Status == status && p.Detail != ""
}

// TestAdminErrorsAreProblems: every error of the admin listener is
// problem+json, those that Go's ServeMux writes by itself (404 for a path
// it does not know, 405 for a method a path does not take, with its
// Allow header) included.
func TestAdminErrorsAreProblems(t *testing.T) {
	f := newAdminFixture(t, "login: POST /api/login by ip 2/1m", "s3cret")
	problem := func(method, path string, status int, allow string) {
		t.Helper()
		res, body := send(t, method, f.admin.URL+path, "", "Bearer s3cret", "", "")
		if !isProblem(res, body, status) {
			t.Errorf("%s %s: %d %s %s, want a %d problem", method, path, res.StatusCode, res.Header.Get("Content-Type"), body, status)
		}
		if got := res.Header.Get("Allow"); got != allow {
			t.Errorf("%s %s: Allow %q, want %q", method, path, got, allow)
		}
		if res.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("%s %s: no security headers", method, path)
		}
	}
	for _, path := range []string{"/nope", "/v1/nope", "/console/nope.js", "/v1"} {
		problem("GET", path, 404, "")
	}
	for _, tc := range []struct{ method, path, allow string }{
		{"POST", "/healthz", "GET, HEAD"},
		{"DELETE", "/metrics", "GET, HEAD"},
		{"POST", "/v1/rules", "GET, HEAD"},
		{"PATCH", "/v1/overrides", "DELETE, GET, HEAD, PUT"},
		{"POST", "/", "GET, HEAD"},
	} {
		problem(tc.method, tc.path, 405, tc.allow)
	}
	// A redirect of the mux's is no error: it stays one.
	req, _ := http.NewRequest("GET", f.admin.URL+"/v1//rules", nil)
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode/100 != 3 || res.Header.Get("Location") != "/v1/rules" {
		t.Errorf("GET /v1//rules: %d %q, want the mux's redirect to /v1/rules", res.StatusCode, res.Header.Get("Location"))
	}
}

// TestAdminBearerScheme: the scheme of Authorization is case-insensitive
// (RFC 9110 section 11.1), the token is not, and nothing but one token
// after the scheme counts.
func TestAdminBearerScheme(t *testing.T) {
	f := newAdminFixture(t, "login: POST /api/login by ip 2/1m", "s3cret")
	for _, tc := range []struct {
		auth string
		want int
	}{
		{"Bearer s3cret", 200},
		{"bearer s3cret", 200},
		{"BEARER s3cret", 200},
		{"bEaReR s3cret", 200},
		{"Bearer   s3cret", 200}, // 1*SP
		{"Bearer S3CRET", 401},
		{"Bearer s3cret2", 401},
		{"Bearer", 401},
		{"Bearer ", 401},
		{"Bearers3cret", 401},
		{"Bearer\ts3cret", 401},
		{"Basic s3cret", 401},
		{"s3cret", 401},
		{"Bearer s3cret, Bearer s3cret", 401},
	} {
		res, body := send(t, "GET", f.admin.URL+"/v1/rules", "", tc.auth, "", "")
		if res.StatusCode != tc.want {
			t.Errorf("Authorization %q: %d %s, want %d", tc.auth, res.StatusCode, body, tc.want)
		}
		if tc.want == 401 && (!isProblem(res, body, 401) || res.Header.Get("WWW-Authenticate") == "") {
			t.Errorf("Authorization %q: %v %s, want a 401 problem with WWW-Authenticate", tc.auth, res.Header, body)
		}
	}
	// Two Authorization lines are no token, even when one is right.
	res, _ := proctest.Send(t, "GET", f.admin.URL+"/v1/rules", "Authorization", "Bearer s3cret", "Authorization", "Bearer wrong")
	if res.StatusCode != 401 {
		t.Errorf("two Authorization lines: %d, want 401", res.StatusCode)
	}
}

// TestAdminWriteBody: a write's body is application/json (with any
// parameters), exactly one object, each member once and spelled as
// documented, and nothing after it but white space.
func TestAdminWriteBody(t *testing.T) {
	f := newAdminFixture(t, "query: GET /q by tenant 1/1d", "s3cret")
	u := f.admin.URL + "/v1/overrides?rule=query&tenant=acme"
	const good = `{"limit":3,"window":"1d"}`
	for _, tc := range []struct {
		name, contentType, body string
		want                    int
	}{
		{"plain", "application/json", good, 200},
		{"charset", "application/json; charset=utf-8", good, 200},
		{"upper-case type", "Application/JSON", good, 200},
		{"white space around", "application/json", " \n\t" + good + "\r\n ", 200},
		{"members in another order", "application/json", `{"window":"1d","limit":3}`, 200},
		{"escaped name", "application/json", `{"\u006cimit":3,"window":"1d"}`, 200},

		{"no content type", "", good, 415},
		{"text/plain", "text/plain", good, 415},
		{"form", "application/x-www-form-urlencoded", good, 415},
		{"a +json type", "application/merge-patch+json", good, 415},
		{"malformed type", "application/json; charset", good, 415},
		{"json with junk", "application/jsonx", good, 415},

		{"repeated member", "application/json", `{"limit":100,"window":"1d","limit":1}`, 400},
		{"repeated, escaped", "application/json", `{"limit":100,"window":"1d","\u006cimit":1}`, 400},
		{"another case", "application/json", `{"Limit":3,"window":"1d"}`, 400},
		{"upper case", "application/json", `{"limit":3,"WINDOW":"1d"}`, 400},
		{"both cases", "application/json", `{"limit":3,"Limit":1,"window":"1d"}`, 400},
		{"kelvin sign for k", "application/json", `{"limit":3,"window":"1d","\u212Aey":1}`, 400},
		{"unknown member", "application/json", `{"limit":3,"window":"1d","extra":1}`, 400},
		{"junk after", "application/json", good + " x", 400},
		{"a second object", "application/json", good + good, 400},
		{"a second value", "application/json", good + " 1", 400},
		{"an array", "application/json", "[" + good + "]", 400},
		{"null", "application/json", "null", 400},
		{"empty", "application/json", "", 400},
		{"truncated", "application/json", `{"limit":3,"window":"1d"`, 400},
		{"invalid UTF-8", "application/json", "{\"limit\":3,\"window\":\"1d\xff\"}", 400},
		{"lone surrogate", "application/json", `{"limit":3,"window":"1d\ud800"}`, 400},
		{"too large", "application/json", `{"limit":3,"window":"1d"` + strings.Repeat(" ", 8<<10) + "}", 413},
	} {
		res, body := send(t, "PUT", u, "", "Bearer s3cret", tc.contentType, tc.body)
		if res.StatusCode != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, res.StatusCode, body, tc.want)
			continue
		}
		if tc.want != 200 && !isProblem(res, body, tc.want) {
			t.Errorf("%s: %v %s, want a problem", tc.name, res.Header, body)
		}
	}
	// The last good body stands: no refused one changed the override.
	res, body := send(t, "GET", f.admin.URL+"/v1/overrides", "", "Bearer s3cret", "", "")
	if res.StatusCode != 200 || !strings.Contains(body, `"limit":3`) {
		t.Errorf("GET /v1/overrides: %d %s, want the limit of 3", res.StatusCode, body)
	}
}

// TestAdminHost: without a token, the admin listener answers only a Host
// that is a loopback address or localhost, so that a page whose name a
// DNS-rebinding attacker pointed at 127.0.0.1 cannot read it from an
// operator's browser; health, metrics and the console included. With a
// token, the token guards it, and Host is not looked at.
func TestAdminHost(t *testing.T) {
	open := newAdminFixture(t, "login: POST /api/login by ip 2/1m", "")
	guarded := newAdminFixture(t, "login: POST /api/login by ip 2/1m", "s3cret")
	paths := []string{"/", "/healthz", "/readyz", "/metrics", "/v1/rules", "/v1/keys?rule=login&ip=1.2.3.4", "/console/app.js", "/nope"}
	want := func(path string) int {
		if path == "/nope" {
			return 404
		}
		return 200
	}
	for _, host := range []string{
		"127.0.0.1", "127.0.0.1:9090", "127.8.9.10:1", "[::1]", "[::1]:9090", "[::ffff:127.0.0.1]:9090",
		"localhost", "localhost:9090", "LOCALHOST", "LocalHost:9090", "localhost.", "localhost.:9090",
	} {
		for _, path := range paths {
			if res, body := send(t, "GET", open.admin.URL+path, host, "", "", ""); res.StatusCode != want(path) {
				t.Errorf("no token, Host %q: GET %s = %d %s, want %d", host, path, res.StatusCode, body, want(path))
			}
		}
	}
	for _, host := range []string{
		"evil.example", "evil.example:9090", "rebind.evil.example.", "localhost.evil.example", "evil-localhost",
		"localhost..", "127.0.0.1.nip.io", "127.0.0.1.", "10.0.0.1", "10.0.0.1:9090", "0.0.0.0:9090", "[::]:9090",
		"[::2]", "[fe80::1%25lo]:9090", "127.1", "2130706433", "0x7f000001", "localhost:x", "localhost:9090:1",
		"[::1", "::1:9090",
	} {
		for _, path := range paths {
			res, body := send(t, "GET", open.admin.URL+path, host, "", "", "")
			if !isProblem(res, body, http.StatusMisdirectedRequest) {
				t.Errorf("no token, Host %q: GET %s = %d %s, want a 421 problem", host, path, res.StatusCode, body)
			}
			if strings.Contains(body, "login") {
				t.Errorf("no token, Host %q: GET %s told the rules: %s", host, path, body)
			}
		}
		// With a token, the token decides.
		for _, path := range paths {
			if res, body := send(t, "GET", guarded.admin.URL+path, host, "Bearer s3cret", "", ""); res.StatusCode != want(path) {
				t.Errorf("token, Host %q: GET %s = %d %s, want %d", host, path, res.StatusCode, body, want(path))
			}
		}
		if res, _ := send(t, "GET", guarded.admin.URL+"/v1/rules", host, "", "", ""); res.StatusCode != 401 {
			t.Errorf("token, Host %q: GET /v1/rules without it = %d, want 401", host, res.StatusCode)
		}
	}
}

// failingGatherer cannot gather.
type failingGatherer struct{}

func (failingGatherer) Gather() ([]*dto.MetricFamily, error) {
	return nil, errors.New("a collector failed")
}

// TestAdminMetricsError: /metrics failing to gather is a problem too, not
// promhttp's text/plain 500.
func TestAdminMetricsError(t *testing.T) {
	pol, _ := policy.Parse("login: POST /api/login by ip 2/1m")
	srv := httptest.NewServer(NewHandler(Config{Policy: func() *policy.Policy { return pol }, Gatherer: failingGatherer{}}))
	defer srv.Close()
	res, body := send(t, "GET", srv.URL+"/metrics", "", "", "", "")
	if !isProblem(res, body, http.StatusInternalServerError) || !strings.Contains(body, "a collector failed") {
		t.Errorf("GET /metrics: %d %s %s, want a 500 problem saying why", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	if res, body := send(t, "GET", srv.URL+"/healthz", "", "", "", ""); res.StatusCode != 200 || body != "ok\n" {
		t.Errorf("GET /healthz: %d %q", res.StatusCode, body)
	}
}

// TestAdminQuery: the admin API reads a query string only when it parses,
// and each of its parameters once: a ";" separator (which Go drops with
// its pair) or a second rule= is a 400, never a guess.
func TestAdminQuery(t *testing.T) {
	f := newAdminFixture(t, "login: POST /api/login by ip 2/1m; other: POST /api/other by ip 5/1m", "s3cret")
	query := func(method, target string) (*http.Response, string) {
		return send(t, method, f.admin.URL+target, "", "Bearer s3cret", "", "")
	}
	if res, body := query("GET", "/v1/keys?rule=login&ip=1.2.3.4"); res.StatusCode != 200 {
		t.Errorf("GET /v1/keys?rule=login&ip=1.2.3.4: %d %s, want 200", res.StatusCode, body)
	}
	for _, tc := range []struct{ method, target string }{
		{"GET", "/v1/keys?rule=login;ip=1.2.3.4"},
		{"GET", "/v1/keys?rule=login&ip=1.2.3.4&x=%zz"},
		{"GET", "/v1/keys?rule=login&rule=other&ip=1.2.3.4"},
		{"DELETE", "/v1/keys?rule=login&rule=other&ip=1.2.3.4"},
		{"DELETE", "/v1/keys?rule=login&ip=1.2.3.4;rule=other"},
		{"GET", "/v1/overrides?rule=login;x"},
	} {
		if res, body := query(tc.method, tc.target); !isProblem(res, body, 400) {
			t.Errorf("%s %s: %d %s, want a 400 problem", tc.method, tc.target, res.StatusCode, body)
		}
	}
}
