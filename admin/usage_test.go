package admin

import (
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/jwt"
	"github.com/sluicehq/sluice/jwt/jwttest"
	"github.com/sluicehq/sluice/proxy"
)

const (
	usageIssuer = "https://auth.example/"
	usageSecret = "an-hs256-secret-of-at-least-32-bytes"
)

// TestAdminUsage: GET /v1/usage lists, for one identity, every rule keyed
// by its kind with the counts the gateway's requests left and the hashed
// key, email rules included; it needs exactly one identity parameter,
// and the token of every /v1 read.
func TestAdminUsage(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // the fixture's clock
	v, err := jwt.New(jwt.Config{Secret: []byte(usageSecret), Issuer: usageIssuer, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	f := newAdminFixtureJWT(t, `
login:  POST /api/login  by ip                5/15m
reset:  POST /api/reset  by email             3/1h
query:  GET  /api/query  by tenant            10/1d
org:    GET  /api/*      by tenant(X-Org)     20/1h
acct:   GET  /api/*      by header(X-Account) 7/1h
user:   GET  /api/*      by jwt               9/1h
api:    *    /api/*      by global            1000/1m
edge:   *    rls:edge    by descriptor(remote_address) 5/1m`, "s3cret", v)
	token := jwttest.HS256(t, usageSecret, map[string]any{"sub": "alice", "iss": usageIssuer, "exp": now.Unix() + 3600})
	send := func(method, path string, hdr ...string) {
		t.Helper()
		if res, _ := proctest.Send(t, method, f.public.URL+path, hdr...); res.StatusCode != 200 {
			t.Fatalf("%s %s: %d", method, path, res.StatusCode)
		}
	}
	for range 2 {
		send("POST", "/api/login")
	}
	for range 3 {
		send("GET", "/api/query", "X-Tenant-ID", "acme", "X-Org", "acme", "X-Account", "a-1", "Authorization", "Bearer "+token)
	}
	send("POST", "/api/reset?email=bob@example.com")

	usage := func(query string) []proxy.Usage {
		t.Helper()
		code, body := call(t, "GET", f.admin.URL+"/v1/usage?"+query, "s3cret", "")
		var u struct{ Usage []proxy.Usage }
		if code != 200 || json.Unmarshal([]byte(body), &u) != nil || u.Usage == nil {
			t.Fatalf("GET /v1/usage?%s: %d %s", query, code, body)
		}
		return u.Usage
	}
	at := now.Unix()
	tenantKey := f.hasher.Key("tenant", "acme")
	for _, tc := range []struct {
		query string
		want  []proxy.Usage
	}{
		{"tenant=acme", []proxy.Usage{
			{Rule: "query", Limit: 10, Window: "1d", WindowSeconds: 86400, Count: 3, Remaining: 7, Reset: at + 86400, ResetAfter: 86400, Key: tenantKey},
			{Rule: "org", Limit: 20, Window: "1h", WindowSeconds: 3600, Count: 3, Remaining: 17, Reset: at + 3600, ResetAfter: 3600, Key: tenantKey},
		}},
		{"tenant=+acme+", nil}, // trimmed as the proxy trims it: the same as tenant=acme
		{"tenant=globex", []proxy.Usage{
			{Rule: "query", Limit: 10, Window: "1d", WindowSeconds: 86400, Count: 0, Remaining: 10, Reset: at + 86400, ResetAfter: 86400, Key: f.hasher.Key("tenant", "globex")},
			{Rule: "org", Limit: 20, Window: "1h", WindowSeconds: 3600, Count: 0, Remaining: 20, Reset: at + 3600, ResetAfter: 3600, Key: f.hasher.Key("tenant", "globex")},
		}},
		{"ip=127.0.0.1", []proxy.Usage{
			{Rule: "login", Limit: 5, Window: "15m", WindowSeconds: 900, Count: 2, Remaining: 3, Reset: at + 900, ResetAfter: 900, Key: f.hasher.Key("ip", "127.0.0.1")},
		}},
		{"email=" + url.QueryEscape(" Bob@Example.com"), []proxy.Usage{
			{Rule: "reset", Limit: 3, Window: "1h", WindowSeconds: 3600, Count: 1, Remaining: 2, Reset: at + 3600, ResetAfter: 3600, Key: f.hasher.Key("email", "bob@example.com")},
		}},
		{"header=a-1", []proxy.Usage{
			{Rule: "acct", Limit: 7, Window: "1h", WindowSeconds: 3600, Count: 3, Remaining: 4, Reset: at + 3600, ResetAfter: 3600, Key: f.hasher.Key("header", "a-1")},
		}},
		{"jwt=alice", []proxy.Usage{
			{Rule: "user", Limit: 9, Window: "1h", WindowSeconds: 3600, Count: 3, Remaining: 6, Reset: at + 3600, ResetAfter: 3600, Key: f.hasher.JWTKey(usageIssuer, "sub", "alice")},
		}},
	} {
		got := usage(tc.query)
		want := tc.want
		if want == nil {
			want = usage("tenant=acme")
		}
		if len(got) != len(want) {
			t.Errorf("%s: %+v, want %+v", tc.query, got, want)
			continue
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%s: %+v, want %+v", tc.query, got[i], want[i])
			}
		}
	}

	for _, query := range []string{
		"",
		"rule=query",
		"tenant=acme&ip=127.0.0.1",
		"tenant=acme&tenant=globex",
		"ip=not-an-ip",
		"tenant=",
		"email=not-an-address%00",
		"descriptor=10.0.0.1",
	} {
		if code, body := call(t, "GET", f.admin.URL+"/v1/usage?"+query, "s3cret", ""); code != 400 {
			t.Errorf("GET /v1/usage?%s: %d %s, want 400", query, code, body)
		}
	}
	for _, token := range []string{"", "wrong"} {
		if code, body := call(t, "GET", f.admin.URL+"/v1/usage?tenant=acme", token, ""); code != 401 {
			t.Errorf("GET /v1/usage?tenant=acme with token %q: %d %s, want 401", token, code, body)
		}
	}
	// Reading counts nothing.
	if got := usage("tenant=acme"); got[0].Count != 3 {
		t.Errorf("after the reads, query counts %d", got[0].Count)
	}
}

// TestAdminKeysAsUsage: GET /v1/keys shows a key as GET /v1/usage shows
// it: its count past the limit after an overdraft (remaining 0), and a
// calendar rule's window as the calendar names it, not as its current
// length.
func TestAdminKeysAsUsage(t *testing.T) {
	f := newAdminFixture(t, `
tokens:  GET /api/chat  by tenant 100/1h charge=header(X-Charge)
monthly: GET /api/*     by tenant 10/1mo tz=America/New_York anchor=31
weekly:  GET /api/*     by tenant 10/1w`, "s3cret")
	for _, charge := range []string{"25", "90"} {
		if res, _ := proctest.Send(t, "GET", f.public.URL+"/api/chat?charge="+charge, "X-Tenant-ID", "acme"); res.StatusCode != 200 {
			t.Fatalf("charge %s: %d", charge, res.StatusCode)
		}
	}
	code, body := call(t, "GET", f.admin.URL+"/v1/usage?tenant=acme", "s3cret", "")
	var u struct{ Usage []proxy.Usage }
	if code != 200 || json.Unmarshal([]byte(body), &u) != nil || len(u.Usage) != 3 {
		t.Fatalf("GET /v1/usage: %d %s", code, body)
	}
	if tok := u.Usage[0]; tok.Count != 115 || tok.Remaining != 0 || u.Usage[1].Window != "1mo" || u.Usage[2].Window != "1w" {
		t.Fatalf("usage: %+v, want 115 of 100 used of tokens, windows 1mo and 1w", u.Usage)
	}
	for _, want := range u.Usage {
		code, body := call(t, "GET", f.admin.URL+"/v1/keys?rule="+want.Rule+"&tenant=acme", "s3cret", "")
		var got proxy.Usage
		if code != 200 || json.Unmarshal([]byte(body), &got) != nil {
			t.Fatalf("GET /v1/keys?rule=%s: %d %s", want.Rule, code, body)
		}
		if got != want {
			t.Errorf("GET /v1/keys?rule=%s: %+v, want what /v1/usage shows, %+v", want.Rule, got, want)
		}
	}
}
