package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/proxy"
)

// get sends GET url and returns the response, its body read.
func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	return send(t, http.MethodGet, url, "", "", "", "")
}

// TestConsoleServed: GET / and the console's files are served without a
// token, with their content types, and every response of the admin
// listener carries the security headers.
func TestConsoleServed(t *testing.T) {
	for _, token := range []string{"", "s3cret"} {
		f := newAdminFixture(t, "login: POST /api/login by ip 2/1m", token)
		for _, tc := range []struct {
			path, contentType string
			status            int
		}{
			{"/", "text/html; charset=utf-8", 200},
			{"/console/app.js", "text/javascript; charset=utf-8", 200},
			{"/console/style.css", "text/css; charset=utf-8", 200},
			{"/console/icon.svg", "image/svg+xml", 200},
			{"/console/index.html", "application/problem+json", 404}, // the template is no file
			{"/console/", "", 404},
			{"/healthz", "text/plain; charset=utf-8", 200},
			{"/v1/rules", "", map[string]int{"": 200, "s3cret": 401}[token]},
		} {
			res, body := get(t, f.admin.URL+tc.path)
			if res.StatusCode != tc.status || tc.contentType != "" && res.Header.Get("Content-Type") != tc.contentType {
				t.Errorf("token %q: GET %s: %d %s, want %d %s", token, tc.path, res.StatusCode, res.Header.Get("Content-Type"), tc.status, tc.contentType)
			}
			for h, want := range map[string]string{
				"Content-Security-Policy": "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; require-trusted-types-for 'script'",
				"X-Frame-Options":         "DENY",
				"X-Content-Type-Options":  "nosniff",
				"Referrer-Policy":         "no-referrer",
			} {
				if got := res.Header.Get(h); got != want {
					t.Errorf("token %q: GET %s: %s %q, want %q", token, tc.path, h, got, want)
				}
			}
			if tc.path == "/" {
				want := map[string]string{"": `data-token="none"`, "s3cret": `data-token="required"`}[token]
				if !strings.Contains(body, want) {
					t.Errorf("token %q: the page does not say %s", token, want)
				}
				if strings.Contains(body, "login") && strings.Contains(body, "s3cret") {
					t.Errorf("the page holds the token")
				}
			}
		}
	}
}

var (
	tagRE  = regexp.MustCompile(`<([a-zA-Z][a-zA-Z0-9]*)((?:\s+[^\s>]+)*)\s*/?>`)
	attrRE = regexp.MustCompile(`([^\s=]+)(?:=("[^"]*"|'[^']*'|[^\s>]+))?`)
)

// TestConsoleNoInlineCode: the page runs only the script file of its own
// origin: no inline script or style, no on…= handler, no javascript: URL,
// nothing loaded from another origin; and the script never writes HTML
// from strings nor evaluates code, so text from the API stays text. (The
// browser test also fails on any violation of the policy Chromium
// reports.)
func TestConsoleNoInlineCode(t *testing.T) {
	f := newAdminFixture(t, "login: POST /api/login by ip 2/1m", "s3cret")
	_, page := get(t, f.admin.URL+"/")
	tags := tagRE.FindAllStringSubmatch(page, -1)
	if len(tags) < 50 {
		t.Fatalf("only %d tags found: the scan is broken", len(tags))
	}
	scripts := 0
	for _, tag := range tags {
		name := strings.ToLower(tag[1])
		if name == "style" {
			t.Errorf("inline <style>: %s", tag[0])
		}
		attrs := map[string]string{}
		for _, a := range attrRE.FindAllStringSubmatch(tag[2], -1) {
			k, v := strings.ToLower(a[1]), strings.Trim(a[2], `"'`)
			attrs[k] = v
			switch {
			case strings.HasPrefix(k, "on"):
				t.Errorf("event handler attribute: %s", tag[0])
			case k == "style":
				t.Errorf("style attribute: %s", tag[0])
			case (k == "src" || k == "href" || k == "action") && (!strings.HasPrefix(v, "/") || strings.HasPrefix(v, "//")):
				t.Errorf("%s not on this origin: %s", k, tag[0])
			case strings.Contains(strings.ToLower(v), "javascript:"):
				t.Errorf("javascript: URL: %s", tag[0])
			}
		}
		if name == "script" {
			scripts++
			if attrs["src"] != "/console/app.js" {
				t.Errorf("script that is not /console/app.js: %s", tag[0])
			}
		}
	}
	if scripts != 1 || strings.Count(strings.ToLower(page), "<script") != 1 {
		t.Errorf("%d script tags, want the one of app.js", scripts)
	}
	// An inline script's body is the text between <script …> and
	// </script>: app.js's tag has none.
	if !strings.Contains(page, `<script src="/console/app.js" defer></script>`) {
		t.Error("the script tag has a body or changed")
	}

	_, js := get(t, f.admin.URL+"/console/app.js")
	for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "setTimeout('", "localStorage", "document.cookie", "?token", "&token"} {
		if strings.Contains(js, bad) {
			t.Errorf("app.js uses %s", bad)
		}
	}
	for _, u := range regexp.MustCompile(`https?://[^\s'"]+`).FindAllString(js, -1) {
		if u != "http://www.w3.org/2000/svg" { // a namespace name, never fetched
			t.Errorf("app.js names another origin: %s", u)
		}
	}
	_, css := get(t, f.admin.URL+"/console/style.css")
	if strings.Contains(css, "url(") || strings.Contains(css, "@import") {
		t.Error("style.css loads something")
	}
}

// TestCrossOriginWrites: a browser's write from another origin is refused
// before the token is even looked at; the same origin's, and a client
// that is no browser (no Sec-Fetch-Site, no Origin), get through. Reads
// are never refused for their origin.
func TestCrossOriginWrites(t *testing.T) {
	f := newAdminFixture(t, "query: GET /q by tenant 1/1d", "s3cret")
	u := f.admin.URL + "/v1/overrides?rule=query&tenant=acme"
	for _, tc := range []struct {
		name, method string
		headers      map[string]string
		want         int
	}{
		{"cross-site fetch", "PUT", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"same-site, other origin", "PUT", map[string]string{"Sec-Fetch-Site": "same-site"}, 403},
		{"old browser, other Origin", "DELETE", map[string]string{"Origin": "http://evil.example"}, 403},
		{"same origin", "PUT", map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": f.admin.URL}, 200},
		{"curl", "PUT", nil, 200},
		{"curl delete", "DELETE", nil, 204},
		{"cross-site read", "GET", map[string]string{"Sec-Fetch-Site": "cross-site"}, 200},
	} {
		path := u
		if tc.method == "GET" {
			path = f.admin.URL + "/v1/overrides"
		}
		req, _ := http.NewRequest(tc.method, path, strings.NewReader(`{"limit":5,"window":"1d"}`))
		req.Header.Set("Authorization", "Bearer s3cret")
		req.Header.Set("Content-Type", "application/json")
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, res.StatusCode, body, tc.want)
		}
		if tc.want == 403 {
			var p proxy.Problem
			if json.Unmarshal(body, &p) != nil || !strings.Contains(p.Detail, "cross-origin") || res.Header.Get("Content-Security-Policy") == "" {
				t.Errorf("%s: refusal %q is not the problem+json with the security headers", tc.name, body)
			}
		}
	}
}

// TestStatsEndpoint: GET /v1/stats needs the token like every /v1 read,
// and tells the store's kind, readiness and breaker from Config.
func TestStatsEndpoint(t *testing.T) {
	f := newAdminFixture(t, "login: POST /api/login by ip 2/1m", "s3cret")
	for range 4 {
		call(t, "POST", f.public.URL+"/api/login", "", "")
	}
	f.stats.Sample()
	if code, _ := call(t, "GET", f.admin.URL+"/v1/stats", "", ""); code != 401 {
		t.Fatalf("without the token: %d", code)
	}
	code, body := call(t, "GET", f.admin.URL+"/v1/stats", "s3cret", "")
	var s statsJSON
	if code != 200 || json.Unmarshal([]byte(body), &s) != nil {
		t.Fatalf("GET /v1/stats: %d %s", code, body)
	}
	key := f.hasher.Key("ip", "127.0.0.1")
	if len(s.Rules) != 1 || s.Rules[0].Rule != "login" || len(s.TopLimited) != 1 || s.TopLimited[0] != (topKeyJSON{Rule: "login", Key: key, Count: 2}) {
		t.Fatalf("stats: %s", body)
	}
	if !s.Store.Ready || s.Store.Kind != "memory" || s.Store.Breaker != "" {
		t.Fatalf("store: %+v", s.Store)
	}
	if strings.Contains(body, "127.0.0.1") {
		t.Fatal("the stats show a raw IP")
	}

	cfg := Config{Ready: func() error { return errReadyTest }, Breaker: func() limiter.BreakerState { return limiter.BreakerOpen }, StoreKind: "postgres"}
	var st storeStatsJSON
	cfg.storeState(&st)
	if st != (storeStatsJSON{Kind: "postgres", Ready: false, NotReady: errReadyTest.Error(), Breaker: "open"}) {
		t.Fatalf("store state %+v", st)
	}
}

var errReadyTest = io.ErrUnexpectedEOF

// TestKeysByHashedKey: key= names a counter by its hashed key, as the
// overrides and the most limited keys show it: looked up, reset,
// overridden and returned to its rule without the identity.
func TestKeysByHashedKey(t *testing.T) {
	f := newAdminFixture(t, "login: POST /api/login by ip 2/1m", "s3cret")
	for range 3 {
		call(t, "POST", f.public.URL+"/api/login", "", "")
	}
	key := f.hasher.Key("ip", "127.0.0.1")
	byKey := f.admin.URL + "/v1/keys?rule=login&key=" + key
	code, body := call(t, "GET", byKey, "s3cret", "")
	var k keyJSON
	if code != 200 || json.Unmarshal([]byte(body), &k) != nil || k.Count != 2 || k.Key != key {
		t.Fatalf("GET by key: %d %s", code, body)
	}
	if code, _ := call(t, "DELETE", byKey, "s3cret", ""); code != 204 {
		t.Fatalf("DELETE by key: %d", code)
	}
	if code, _ := call(t, "POST", f.public.URL+"/api/login", "", ""); code != 200 {
		t.Fatalf("after a reset by key: %d", code)
	}
	ov := f.admin.URL + "/v1/overrides?rule=login&key=" + key
	if code, body := call(t, "PUT", ov, "s3cret", `{"limit":9,"window":"1m"}`); code != 200 {
		t.Fatalf("PUT override by key: %d %s", code, body)
	}
	if _, body := call(t, "GET", f.admin.URL+"/v1/overrides", "s3cret", ""); !strings.Contains(body, key) {
		t.Fatalf("override not listed: %s", body)
	}
	if code, _ := call(t, "DELETE", ov, "s3cret", ""); code != 204 {
		t.Fatalf("DELETE override by key: %d", code)
	}
	for _, tc := range []struct{ query, detail string }{
		{"rule=login&key=short", "key: not a hashed key (43 characters of base64url, as GET /v1/overrides lists them)"},
		{"rule=login&key=" + key + "&key=" + key, "query parameter key given more than once"},
		{"rule=login&key=" + key + "&ip=1.2.3.4", "give one of ip, email, tenant, header, jwt, descriptor or key, got ip, key"},
	} {
		code, body := call(t, "GET", f.admin.URL+"/v1/keys?"+tc.query, "s3cret", "")
		var p proxy.Problem
		json.Unmarshal([]byte(body), &p)
		if code != 400 || p.Detail != tc.detail {
			t.Errorf("%s: %d %q, want 400 %q", tc.query, code, p.Detail, tc.detail)
		}
	}
}
