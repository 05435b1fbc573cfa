package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/identity"
)

// The tests in this file replay attacks on identity and request hygiene,
// each as it was observed, end to end: raw bytes on a TCP connection to a
// real gateway (so no client library normalises the request first), in
// front of a real upstream that records what reaches it.

// send writes msg to the gateway as is, half-closes the connection when
// closeWrite is set (a client that stops sending), and reads the response.
func (g *testGateway) send(t *testing.T, msg string, closeWrite bool) (*http.Response, string) {
	t.Helper()
	return proctest.Raw(t, g.Listener.Addr().String(), msg, closeWrite)
}

// request builds a raw HTTP/1.1 request with a Content-Length body.
func request(method, target, body string, headers ...string) string {
	msg := method + " " + target + " HTTP/1.1\r\nHost: sluice.test\r\nConnection: close\r\n"
	for _, h := range headers {
		if h != "" {
			msg += h + "\r\n"
		}
	}
	return msg + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// key is what a check must have counted: a rule and the identity, in the
// form "rule=kind:value"; kind "ip" takes the client address.
func (g *testGateway) key(ruleKey string) string {
	rule, id, _ := strings.Cut(ruleKey, "=")
	kind, value, _ := strings.Cut(id, ":")
	k := map[string]policy.IdentityKind{"ip": policy.ByIP, "email": policy.ByEmail, "tenant": policy.ByTenant, "header": policy.ByHeader}[kind]
	return rule + "=" + g.hasher.Key(k.String(), value)
}

// attack is one request and what sluice must make of it.
type attack struct {
	name   string
	msg    string   // the raw request
	status int      // the status sluice answers
	keys   []string // for an allowed request: "rule=kind:value" of every check
	half   bool     // half-close the connection after msg
	absent []string // headers that must not reach the upstream, in any spelling
}

// replay sends each attack and checks its status, the keys it was counted
// under, and that a refused request never reached the upstream.
func replay(t *testing.T, g *testGateway, up *upstream, attacks []attack) {
	t.Helper()
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			before := up.Hits()
			g.store.lastChecks()
			res, body := g.send(t, a.msg, a.half)
			if res.StatusCode != a.status {
				t.Fatalf("status %d, want %d: %s", res.StatusCode, a.status, body)
			}
			if a.status >= 400 {
				if res.Header.Get("Content-Type") != "application/problem+json" {
					t.Errorf("Content-Type %q, want application/problem+json", res.Header.Get("Content-Type"))
				}
				var p Problem
				if err := json.Unmarshal([]byte(body), &p); err != nil || p.Status != a.status || p.Detail == "" {
					t.Errorf("problem body %s (%v)", body, err)
				}
				for _, raw := range []string{"victim", "fresh", "evil", "@example"} {
					if strings.Contains(p.Detail, raw) {
						t.Errorf("detail %q echoes the client's value", p.Detail)
					}
				}
				if got := up.Hits(); got != before {
					t.Fatalf("a refused request reached the upstream")
				}
				if c := g.store.lastChecks(); len(c) != 0 {
					t.Fatalf("a refused request was counted: %v", c)
				}
				return
			}
			if up.Hits() != before+1 {
				t.Fatalf("upstream saw %d requests, want 1", up.Hits()-before)
			}
			want := make([]string, len(a.keys))
			for i, k := range a.keys {
				want[i] = g.key(k)
			}
			if got := g.store.lastChecks(); !slices.Equal(got, want) {
				t.Fatalf("counted %v, want %v", got, want)
			}
			r, _ := up.lastRequest()
			for name := range r.Header {
				for _, a := range a.absent {
					if identity.HeaderNameEqual(name, a) {
						t.Errorf("the upstream received %s", name)
					}
				}
			}
		})
	}
}

// mpBody is a multipart/form-data body with boundary XyZ.
func mpBody(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString("--XyZ\r\n" + p + "\r\n")
	}
	return b.String() + "--XyZ--\r\n"
}

// mpField is a field part of mpBody.
func mpField(name, value string) string {
	return `Content-Disposition: form-data; name="` + name + `"` + "\r\n\r\n" + value
}

const (
	ctJSON = "Content-Type: application/json"
	ctForm = "Content-Type: application/x-www-form-urlencoded"
	ctMP   = "Content-Type: multipart/form-data; boundary=XyZ"
	victim = `{"email":"victim@example.com"}`
)

// TestAttackBodyFormats: the victim's address in a body, a fresh one in
// the query string. Frameworks that read the body (or multipart into
// params) serve the victim, so the query's address must not become the
// key.
func TestAttackBodyFormats(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "reset: POST /api/reset by email 1000/1h", gatewayOpts{})
	replay(t, g, up, []attack{
		{name: "text/plain body, fresh query", msg: request("POST", "/api/reset?email=fresh1@example.com", victim, "Content-Type: text/plain"), status: 400},
		{name: "text/json body, fresh query", msg: request("POST", "/api/reset?email=fresh2@example.com", victim, "Content-Type: text/json"), status: 400},
		{name: "unknown type, fresh query", msg: request("POST", "/api/reset?email=fresh3@example.com", "email=victim%40example.com", "Content-Type: application/octet-stream"), status: 400},
		{name: "no type, unparseable body, fresh query", msg: request("POST", "/api/reset?email=fresh4@example.com", "victim@example.com;%", ""), status: 400},
		{name: "multipart body, fresh query", msg: request("POST", "/api/reset?email=fresh5@example.com", mpBody(mpField("email", "victim@example.com")), ctMP), status: 400},
		{name: "multipart body", msg: request("POST", "/api/reset", mpBody(mpField("password", "x"), mpField("email", "Victim@Example.com")), ctMP), status: 200, keys: []string{"reset=email:victim@example.com"}},
		{name: "multipart body and the same address in the query", msg: request("POST", "/api/reset?EMAIL=victim%40example.com", mpBody(mpField("email", "victim@example.com")), ctMP), status: 200, keys: []string{"reset=email:victim@example.com"}},
		{name: "multipart field sent as a file", msg: request("POST", "/api/reset", mpBody(`Content-Disposition: form-data; name="email"; filename="x"`+"\r\n\r\nvictim@example.com"), ctMP), status: 400},
		{name: "multipart field hidden after a bare LF", msg: request("POST", "/api/reset", "--XyZ\r\n"+mpField("a", "1")+"\n--XyZ\r\n"+mpField("email", "victim@example.com")+"\r\n--XyZ--\r\n", ctMP), status: 400},
		{name: "multipart field beside a file holding JSON", msg: request("POST", "/api/reset", mpBody(`Content-Disposition: form-data; name="f"; filename="a.json"`+"\r\nContent-Type: application/json\r\n\r\n"+`{"email":"fresh6@example.com"}`, mpField("email", "victim@example.com")), ctMP), status: 200, keys: []string{"reset=email:victim@example.com"}},
		{name: "json body, fresh query", msg: request("POST", "/api/reset?email=fresh7@example.com", victim, ctJSON), status: 400},
		{name: "form body, fresh query", msg: request("POST", "/api/reset?email=fresh8@example.com", "email=victim%40example.com", ctForm), status: 400},
		{name: "Content-Type twice", msg: request("POST", "/api/reset", victim, ctJSON, "Content-Type: text/plain"), status: 400},
		{name: "text/plain body alone: the client IP", msg: request("POST", "/api/reset", victim, "Content-Type: text/plain"), status: 200, keys: []string{"reset=ip:127.0.0.1"}},
		{name: "query alone", msg: request("POST", "/api/reset?email=Victim%40Example.com", ""), status: 200, keys: []string{"reset=email:victim@example.com"}},
	})
}

// TestAttackInvisibleCharacters: addresses that Java, JavaScript or Python
// trimming turns back into the victim's get 400, not a fresh key.
func TestAttackInvisibleCharacters(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "reset: POST /api/reset by email 1000/1h; t: GET /t by tenant 1000/1h", gatewayOpts{})
	var attacks []attack
	for _, c := range []struct{ name, json, form string }{
		{"NUL", `\u0000`, "%00"},
		{"SOH (Java trim)", `\u0001`, "%01"},
		{"unit separator (Python strip)", `\u001f`, "%1F"},
		{"DEL", `\u007f`, "%7F"},
		{"C1 control", `\u0090`, "%C2%90"},
		{"BOM (JavaScript trim)", `\ufeff`, "%EF%BB%BF"},
		{"zero width space", `\u200b`, "%E2%80%8B"},
		{"zero width joiner", `\u200d`, "%E2%80%8D"},
		{"soft hyphen", `\u00ad`, "%C2%AD"},
		{"word joiner", `\u2060`, "%E2%81%A0"},
	} {
		attacks = append(attacks,
			attack{name: c.name + " before, JSON", msg: request("POST", "/api/reset", `{"email":"`+c.json+`victim@example.com"}`, ctJSON), status: 400},
			attack{name: c.name + " after, JSON", msg: request("POST", "/api/reset", `{"email":"victim@example.com`+c.json+`"}`, ctJSON), status: 400},
			attack{name: c.name + " inside, form", msg: request("POST", "/api/reset", "email=vic"+c.form+"tim%40example.com", ctForm), status: 400},
			attack{name: c.name + " before, query", msg: request("POST", "/api/reset?email="+c.form+"victim%40example.com", ""), status: 400},
		)
	}
	attacks = append(attacks,
		attack{name: "invalid UTF-8, form", msg: request("POST", "/api/reset", "email=victim%FF%40example.com", ctForm), status: 400},
		attack{name: "invalid UTF-8, JSON", msg: request("POST", "/api/reset", "{\"email\":\"victim\xff@example.com\"}", ctJSON), status: 400},
		attack{name: "white space is trimmed", msg: request("POST", "/api/reset", `{"email":"\u00a0\t Victim@Example.com\u3000\n"}`, ctJSON), status: 200, keys: []string{"reset=email:victim@example.com"}},
		attack{name: "fullwidth is NFKC", msg: request("POST", "/api/reset", `{"email":"ｖｉｃｔｉｍ＠ｅｘａｍｐｌｅ．ｃｏｍ"}`, ctJSON), status: 200, keys: []string{"reset=email:victim@example.com"}},
		attack{name: "tenant with a tab inside", msg: request("GET", "/t", "", "X-Tenant-ID: ac\tme"), status: 400},
		attack{name: "tenant with a C1 control", msg: request("GET", "/t", "", "X-Tenant-ID: acme\u0085x"), status: 400},
		attack{name: "tenant with a zero width space", msg: request("GET", "/t", "", "X-Tenant-ID: acme\u200b"), status: 400},
		attack{name: "tenant padded", msg: request("GET", "/t", "", "X-Tenant-ID: \u00a0Acme\u00a0"), status: 200, keys: []string{"t=tenant:Acme"}},
	)
	replay(t, g, up, attacks)
}

// TestAttackHopByHop: a header named in Connection never reaches the
// upstream, so sluice must not key on it either.
func TestAttackHopByHop(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "t: GET /t by tenant 1000/1h; k: GET /k by header(X-Key) 1000/1h", gatewayOpts{})
	replay(t, g, up, []attack{
		{name: "tenant named in Connection", msg: request("GET", "/t", "", "Connection: X-Tenant-ID", "X-Tenant-ID: fresh-1"), status: 200, keys: []string{"t=ip:127.0.0.1"}, absent: []string{"X-Tenant-ID"}},
		{name: "tenant named in a second Connection line, lower case", msg: request("GET", "/t", "", "Connection: keep-alive", "Connection: x-tenant-id", "X-Tenant-ID: fresh-2"), status: 200, keys: []string{"t=ip:127.0.0.1"}, absent: []string{"X-Tenant-ID"}},
		{name: "tenant in its CGI spelling named in Connection", msg: request("GET", "/t", "", "Connection: X-Tenant-ID", "X_Tenant_ID: fresh-3"), status: 200, keys: []string{"t=ip:127.0.0.1"}, absent: []string{"X-Tenant-ID"}},
		{name: "header(X-Key) named in Connection", msg: request("GET", "/k", "", "Connection: close, X-Key", "X-Key: fresh-4"), status: 200, keys: []string{"k=ip:127.0.0.1"}, absent: []string{"X-Key"}},
		{name: "tenant not named", msg: request("GET", "/t", "", "X-Tenant-ID: acme"), status: 200, keys: []string{"t=tenant:acme"}},
	})
	if r, _ := up.lastRequest(); r.Header.Get("X-Tenant-Id") != "acme" {
		t.Errorf("a tenant not named in Connection reached the upstream as %q", r.Header.Get("X-Tenant-Id"))
	}
}

// TestAttackMethodOverride: a "_method" field carries a POST past a rule
// for DELETE unless sluice checks the request under both methods.
func TestAttackMethodOverride(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "del: DELETE /api/items/* by ip 1000/1h; post: POST /api/items/* by ip 1000/1h", gatewayOpts{})
	both := []string{"del=ip:127.0.0.1", "post=ip:127.0.0.1"}
	replay(t, g, up, []attack{
		{name: "query", msg: request("POST", "/api/items/1?_method=DELETE", ""), status: 200, keys: both},
		{name: "form (Rails, Laravel)", msg: request("POST", "/api/items/1", "_method=delete", ctForm), status: 200, keys: both},
		{name: "JSON", msg: request("POST", "/api/items/1", `{"_method":"DELETE"}`, ctJSON), status: 200, keys: both},
		{name: "multipart (Symfony)", msg: request("POST", "/api/items/1", mpBody(mpField("_method", "DELETE")), ctMP), status: 200, keys: both},
		{name: "PHP spelling .method", msg: request("POST", "/api/items/1", ".method=DELETE", ctForm), status: 200, keys: both},
		{name: "no body type", msg: request("POST", "/api/items/1", "_method=DELETE", ""), status: 200, keys: both},
		{name: "no override", msg: request("POST", "/api/items/1", "a=1", ctForm), status: 200, keys: []string{"post=ip:127.0.0.1"}},
		{name: "override to the request's own method", msg: request("POST", "/api/items/1?_method=post", ""), status: 200, keys: []string{"post=ip:127.0.0.1"}},
		{name: "given twice", msg: request("POST", "/api/items/1", "_method=DELETE&_method=PUT", ctForm), status: 400},
		{name: "two spellings", msg: request("POST", "/api/items/1", "_method=PUT&.method=DELETE", ctForm), status: 400},
		{name: "body and query disagree", msg: request("POST", "/api/items/1?_method=PUT", "_method=DELETE", ctForm), status: 400},
		{name: "not a method", msg: request("POST", "/api/items/1?_method=DEL%20ETE", ""), status: 400},
		{name: "unread body beside a query override", msg: request("POST", "/api/items/1?_method=PUT", "_method=DELETE", "Content-Type: text/plain"), status: 400},
		{name: "override headers are stripped, not read", msg: request("POST", "/api/items/1", "", "X-HTTP-Method-Override: DELETE", "X-HTTP-Method: DELETE", "X_Method_Override: DELETE"), status: 200,
			keys: []string{"post=ip:127.0.0.1"}, absent: []string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"}},
	})
	// Where no rule depends on the method, "_method" is not read at all.
	g2 := newGateway(t, up, "all: * /api/* by ip 1000/1h", gatewayOpts{})
	replay(t, g2, up, []attack{
		{name: "irrelevant duplicate", msg: request("POST", "/api/x?_method=A&_method=B", ""), status: 200, keys: []string{"all=ip:127.0.0.1"}},
	})
}

// TestAttackPathSpellings: spellings the matcher used to miss, decoding
// that climbs out of a rule's path, and spellings that readers which
// ignore case or normalise compatibility forms, and Windows, read as a
// rule's path, which are counted under that rule; the upstream receives
// the canonical path sluice matched, still spelled as sent, since folding
// is for matching only; a raw "#" is refused, and so is a query string
// that does not parse, on every route.
func TestAttackPathSpellings(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "login: POST /api/login by ip 1000/1h; admin: * /api/admin/* by ip 1000/1h", gatewayOpts{})
	login := []string{"login=ip:127.0.0.1"}
	admin := []string{"admin=ip:127.0.0.1"}
	// counted is a spelling of a rule's path, counted under keys; refused,
	// a spelling that climbs out of its path or holds a raw "#": a 400.
	counted := func(name, method, target string, keys []string) attack {
		return attack{name: name, msg: request(method, target, ""), status: 200, keys: keys}
	}
	refused := func(name, method, target string) attack {
		return attack{name: name, msg: request(method, target, ""), status: 400}
	}
	replay(t, g, up, []attack{
		counted("format suffix (Rails, Spring)", "POST", "/api/login.json", login),
		counted("other format suffix", "POST", "/API/Login.XML", login),
		counted("trailing dot (IIS)", "POST", "/api/login.", login),
		counted("trailing space (IIS)", "POST", "/api/login%20", login),
		counted("old spellings still match", "POST", "/API//./login/;x", login),
		counted("dotless i", "POST", "/api/log%C4%B1n", login),
		counted("fullwidth", "POST", "/%EF%BD%81pi/login", login),
		counted("NTFS stream", "GET", "/api/ADMIN::$DATA/x", admin),
		counted("fullwidth solidus", "GET", "/api/admin%EF%BC%8Fx", admin),
		counted("ideographic space", "GET", "/api/admin%E3%80%80/x", admin),
		refused("escaped dot dot", "GET", "/api/admin/%2e%2e/public"),
		refused("%2F.. climbing out", "GET", "/api/admin/..%2F..%2Fpublic"),
		refused("doubly encoded", "GET", "/api/admin/%252e%252e/public"),
		refused("backslash dot dot", "GET", `/api/admin\..\public`),
		refused("Tomcat ..;", "GET", "/api/admin/..;/public"),
		refused("dots and spaces", "GET", "/api/admin/..%20/public"),
		refused("fragment", "GET", "/api/x#/../admin/x"),
		refused("fullwidth dot dot", "GET", "/api/admin/%EF%BC%8E%EF%BC%8E/login"),
		// A query the reverse proxy would rewrite (drop "a=1;b=2", re-encode
		// the rest), on a route that does not read the query.
		refused("semicolon in the query", "GET", "/api/admin/x?a=1;b=2&c=3"),
		refused("bad escape in the query", "GET", "/api/admin/x?q=%zz&x=1"),
		refused("truncated escape in the query", "GET", "/api/admin/x?a=%2e%2e/&b=%"),
		counted("a query that parses reaches the upstream", "GET", "/api/admin/x?a=%2e%2e/&b=%25&c=+", admin),
	})
	for _, tc := range []struct{ method, target, want string }{
		{"POST", "/API/./login.json?a=1", "/API/login.json?a=1"},
		{"GET", "/api/ADM%C4%B1N::$DATA/x", "/api/ADM%C4%B1N::$DATA/x"},
		{"GET", "/api/admin%EF%BC%8Fx%E3%80%80", "/api/admin%EF%BC%8Fx%E3%80%80"},
		{"GET", "/api/admin/x?a=%2e%2e/&b=%25&c=+&c=%2B", "/api/admin/x?a=%2e%2e/&b=%25&c=+&c=%2B"},
	} {
		g.send(t, request(tc.method, tc.target, ""), false)
		if r, _ := up.lastRequest(); r.URL.RequestURI() != tc.want {
			t.Errorf("%s: the upstream received %q, want %q", tc.target, r.URL.RequestURI(), tc.want)
		}
	}
}

// TestAttackPHPFieldNames: PHP drops leading spaces from field names, so
// "email" and " email" are one field given twice.
func TestAttackPHPFieldNames(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "reset: POST /api/reset by email 1000/1h", gatewayOpts{})
	replay(t, g, up, []attack{
		{name: "leading space, form", msg: request("POST", "/api/reset", "email=fresh%40example.com&+email=victim%40example.com", ctForm), status: 400},
		{name: "escaped leading space, form", msg: request("POST", "/api/reset", "%20email=victim%40example.com&email=fresh%40example.com", ctForm), status: 400},
		{name: "leading space, query", msg: request("POST", "/api/reset?email=fresh%40example.com&%20email=victim%40example.com", ""), status: 400},
		{name: "leading space, multipart", msg: request("POST", "/api/reset", mpBody(mpField("email", "fresh@example.com"), mpField(" email", "victim@example.com")), ctMP), status: 400},
		{name: "padded JSON key", msg: request("POST", "/api/reset", `{"email":"fresh@example.com"," email":"victim@example.com"}`, ctJSON), status: 400},
		{name: "array syntax", msg: request("POST", "/api/reset", "email[]=victim%40example.com", ctForm), status: 400},
		{name: "leading space alone", msg: request("POST", "/api/reset", "+email=victim%40example.com", ctForm), status: 200, keys: []string{"reset=email:victim@example.com"}},
	})
}

// TestAttackUpgrade: an h2c upgrade would give the client a tunnel past
// every rule; only WebSocket upgrades are passed on.
func TestAttackUpgrade(t *testing.T) {
	var upgrades []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upgrades = append(upgrades, r.Header.Get("Upgrade")+"|"+r.Header.Get("Http2-Settings"))
		if r.Header.Get("Upgrade") == "websocket" {
			if conn, _ := proctest.AcceptWebSocket(t, w); conn != nil {
				conn.Close()
			}
			return
		}
		io.WriteString(w, "plain")
	}))
	t.Cleanup(up.Close)
	g := newGatewayTo(t, up.URL, "all: * /* by ip 1000/1h", gatewayOpts{})
	res, body := g.send(t, request("GET", "/chat", "", "Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA"), false)
	if res.StatusCode != 200 || body != "plain" {
		t.Fatalf("h2c upgrade: %d %q, want the plain response", res.StatusCode, body)
	}
	// An upgrade that Connection does not announce is no upgrade either.
	res, body = g.send(t, request("GET", "/chat", "", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA"), false)
	if res.StatusCode != 200 || body != "plain" {
		t.Fatalf("unannounced h2c upgrade: %d %q, want the plain response", res.StatusCode, body)
	}
	res, _ = g.send(t, request("GET", "/chat", "", "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"), false)
	if res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("WebSocket upgrade: %d, want 101", res.StatusCode)
	}
	if want := []string{"|", "|", "websocket|"}; !slices.Equal(upgrades, want) {
		t.Fatalf("the upstream saw upgrades %q, want %q", upgrades, want)
	}
}

// TestAttackClientIPHeaders: no client-address header reaches the upstream
// in any spelling, and none moves the client to a fresh key.
func TestAttackClientIPHeaders(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "login: POST /api/login by ip 1000/1h", gatewayOpts{})
	var headers []string
	for i, name := range clientIPHeaders {
		headers = append(headers, name+": 203.0.113."+strconv.Itoa(i), strings.ReplaceAll(name, "-", "_")+": 198.51.100."+strconv.Itoa(i))
	}
	var absent []string
	for _, name := range clientIPHeaders {
		if name != "X-Forwarded-For" {
			absent = append(absent, name)
		}
	}
	replay(t, g, up, []attack{
		{name: "every client-IP header", msg: request("POST", "/api/login", "", headers...), status: 200, keys: []string{"login=ip:127.0.0.1"}, absent: absent},
	})
	r, _ := up.lastRequest()
	if got := r.Header.Values("X-Forwarded-For"); !slices.Equal(got, []string{"127.0.0.1"}) {
		t.Errorf("X-Forwarded-For %q, want sluice's own", got)
	}
	for name := range r.Header {
		if identity.HeaderNameEqual(name, "X-Forwarded-For") && name != "X-Forwarded-For" {
			t.Errorf("the upstream received %s", name)
		}
	}
}

// TestAttackMalformedBodies: a body that cannot be read whole gets 400, and
// nothing reaches the upstream (it used to get 502 and a truncated request
// upstream). Every route buffers, matched or not.
func TestAttackMalformedBodies(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "login: POST /api/login by ip 1000/1h", gatewayOpts{})
	head := "POST /api/login HTTP/1.1\r\nHost: sluice.test\r\n"
	chunked := head + "Transfer-Encoding: chunked\r\n\r\n"
	replay(t, g, up, []attack{
		{name: "bad chunk size", msg: chunked + "5\r\nhello\r\nzz\r\nworld\r\n0\r\n\r\n", status: 400},
		{name: "chunk longer than announced", msg: chunked + "3\r\nhello\r\n0\r\n\r\n", status: 400},
		{name: "chunked, connection closed mid-body", msg: chunked + "a\r\nhello", status: 400, half: true},
		{name: "chunked, no last chunk", msg: chunked + "5\r\nhello\r\n", status: 400, half: true},
		{name: "Content-Length not reached", msg: head + "Content-Length: 100\r\n\r\nonly a few bytes", status: 400, half: true},
		{name: "unmatched route too", msg: "POST /other HTTP/1.1\r\nHost: sluice.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nxx\r\n", status: 400},
		{name: "well-formed chunked", msg: chunked + "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", status: 200, keys: []string{"login=ip:127.0.0.1"}},
	})
	if _, body := up.lastRequest(); string(body) != "hello world" {
		t.Errorf("upstream body %q", body)
	}

	// A client that stops sending before its Content-Length is reached gets
	// 400 once the read timeout passes; nothing is forwarded.
	slow := newGateway(t, up, "login: POST /api/login by ip 1000/1h", gatewayOpts{readTimeout: 300 * time.Millisecond})
	replay(t, slow, up, []attack{
		{name: "read timeout", msg: head + "Content-Length: 100\r\n\r\nonly a few bytes", status: 400},
	})

	// Over the buffer on a route that does not read the body, the body is
	// streamed: its start has reached the upstream when the client stalls
	// or stops short. The client still there is told so (400, problem+json),
	// not sent a status of nginx's logs (499) with no body.
	cut := &upstream{Upstream: proctest.NewUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck // the body is cut short: that is the point
	})}
	streamed := newGateway(t, cut, "login: POST /api/login by ip 1000/1h", gatewayOpts{readTimeout: 300 * time.Millisecond, maxBody: 64})
	for _, half := range []bool{false, true} {
		res, body := streamed.send(t, head+"Content-Length: 1000\r\n\r\n"+strings.Repeat("a", 200), half)
		var p Problem
		if res.StatusCode != 400 || res.Header.Get("Content-Type") != "application/problem+json" || json.Unmarshal([]byte(body), &p) != nil || p.Status != 400 {
			t.Errorf("a streamed body cut short (half-closed %v): %d %q %s, want a 400 problem", half, res.StatusCode, res.Header.Get("Content-Type"), body)
		}
	}
}

// TestBodiesByteForByte: buffered and streamed bodies, chunked or not,
// reach the upstream as sent; over the limit, a route that reads the body
// answers 413 and any other streams it.
func TestBodiesByteForByte(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "login: POST /api/login by ip 1000/1h; reset: POST /api/reset by email 1000/1h", gatewayOpts{maxBody: 1000})
	for _, tc := range []struct {
		name, path string
		size       int
		chunked    bool
		status     int
	}{
		{"small", "/api/login", 10, false, 200},
		{"small chunked", "/api/login", 10, true, 200},
		{"at the limit", "/api/login", 1000, false, 200},
		{"at the limit, chunked", "/api/login", 1000, true, 200},
		{"over the limit, streamed", "/api/login", 5000, false, 200},
		{"over the limit, chunked, streamed", "/api/login", 5000, true, 200},
		{"over the limit, unmatched", "/upload", 70000, true, 200},
		{"over the limit where a rule reads it", "/api/reset", 1001, false, 413},
		{"over the limit where a rule reads it, chunked", "/api/reset", 1001, true, 413},
		{"empty chunked", "/api/login", 0, true, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := strings.Repeat("0123456789abcde\n", tc.size/16+1)[:tc.size]
			msg := "POST " + tc.path + " HTTP/1.1\r\nHost: sluice.test\r\nConnection: close\r\nContent-Type: application/octet-stream\r\n"
			if tc.chunked {
				msg += "Transfer-Encoding: chunked\r\n\r\n"
				for rest := body; rest != ""; {
					n := min(len(rest), 777)
					msg += strconv.FormatInt(int64(n), 16) + "\r\n" + rest[:n] + "\r\n"
					rest = rest[n:]
				}
				msg += "0\r\n\r\n"
			} else {
				msg += "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
			}
			res, _ := g.send(t, msg, false)
			if res.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", res.StatusCode, tc.status)
			}
			if tc.status != 200 {
				return
			}
			sum := sha256.Sum256([]byte(body))
			if res.Header.Get("X-Body-Sha256") != hex.EncodeToString(sum[:]) {
				_, got := up.lastRequest()
				t.Fatalf("the upstream received %d bytes, not the %d sent", len(got), len(body))
			}
		})
	}
}

// newGatewayTo is newGateway in front of any upstream URL.
func newGatewayTo(t *testing.T, upstreamURL, rules string, o gatewayOpts) *testGateway {
	t.Helper()
	u, err := url.Parse(upstreamURL)
	if err != nil {
		t.Fatal(err)
	}
	return newGateway(t, &upstream{Upstream: &proctest.Upstream{Server: &httptest.Server{URL: u.String()}}}, rules, o)
}
