package proxy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/jwt"
	"github.com/sluicehq/sluice/jwt/jwttest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/storetest"
)

// The tests in this file replay attacks on verified identities through a
// real gateway, with tokens that PyJWT signed (jwt/jwttest): a request
// whose token does not verify is never counted under the claims it
// makes, but under its client's IP, and a valid token's claim keys
// exactly its user.

const (
	jwtIssuer   = "https://auth.example/"
	jwtAudience = "api"
	jwtSecret   = "a-supabase-style-jwt-secret-of-40-bytes!"
)

// t0 is the instant of the test gateways' clocks.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// valid are the registered claims of a valid token at t0.
var valid = jwttest.Claims{Issuer: jwtIssuer, Audience: jwtAudience, IssuedAt: t0.Add(-time.Minute), Expires: t0.Add(time.Hour)}

// tokenClaims are the claims of a valid token for sub, changed by the
// pairs of set (a nil value deletes the claim).
func tokenClaims(sub any, set ...any) map[string]any { return valid.For(sub, set...) }

// rawPayload is tokenClaims("attacker") as JSON text with more written
// as is.
func rawPayload(more string) string { return valid.Text("attacker", more) }

// proxyMinter mints the tokens of the tests once.
var proxyMinter jwttest.Minter

// mintProxyTokens mints every token of this file once, with Python.
func mintProxyTokens(t *testing.T) *jwttest.Minted {
	t.Helper()
	return proxyMinter.Mint(t, jwtSecret, []jwttest.Key{
		{Name: "rsa", Type: "RSA"}, {Name: "ec", Type: "EC:P-256"}, {Name: "ed", Type: "Ed25519"},
		{Name: "evil", Type: "EC:P-256"},
	}, func(trapURL string) []jwttest.Token {
		meta := func(plan string) map[string]any { return map[string]any{"plan": plan} }
		return append([]jwttest.Token{
			{Name: "alice", Alg: "RS256", Key: "rsa", Claims: tokenClaims("alice")},
			{Name: "alice-2", Alg: "RS256", Key: "rsa", Claims: tokenClaims("alice", "iat", t0.Unix()-10, "jti", "second")},
			{Name: "alice-es", Alg: "ES256", Key: "ec", Claims: tokenClaims("alice", "jti", "third")},
			{Name: "bob", Alg: "ES256", Key: "ec", Claims: tokenClaims("bob")},
			{Name: "carol", Alg: "EdDSA", Key: "ed", Claims: tokenClaims("carol")},
			{Name: "dave", Alg: "HS256", Key: "secret", Claims: tokenClaims("dave")},
			{Name: "victim", Alg: "RS256", Key: "rsa", Claims: tokenClaims("victim", "app_metadata", meta("pro"))},
			{Name: "attacker", Alg: "ES256", Key: "ec", Claims: tokenClaims("attacker")},
			{Name: "sub-ip", Alg: "RS256", Key: "rsa", Claims: tokenClaims("127.0.0.1")},
			{Name: "sub-number", Alg: "RS256", Key: "rsa", Claims: tokenClaims(42)},
			{Name: "sub-float", Alg: "RS256", Key: "rsa", Payload: strings.Replace(rawPayload(""), `"attacker"`, `42.0`, 1)},
			{Name: "expired", Alg: "RS256", Key: "rsa", Claims: tokenClaims("victim", "exp", t0.Unix()-3600)},
			{Name: "exp-0", Alg: "RS256", Key: "rsa", Claims: tokenClaims("victim", "exp", 0)},
			{Name: "no-exp", Alg: "RS256", Key: "rsa", Claims: tokenClaims("victim", "exp", nil)},
			{Name: "nbf-future", Alg: "RS256", Key: "rsa", Claims: tokenClaims("victim", "nbf", t0.Unix()+3600)},
			{Name: "nbf-1e300", Alg: "RS256", Key: "rsa", Payload: strings.Replace(rawPayload(`,"nbf":1e300`), "attacker", "victim", 1)},
			{Name: "dup-sub", Alg: "RS256", Key: "rsa", Payload: rawPayload(`,"sub":"victim"`)},
			{Name: "case-sub", Alg: "RS256", Key: "rsa", Payload: rawPayload(`,"SUB":"victim"`)},
			{Name: "oversize", Alg: "RS256", Key: "rsa", Claims: tokenClaims("victim", "pad", strings.Repeat("x", 7000))},
			{Name: "free", Alg: "RS256", Key: "rsa", Claims: tokenClaims("free-user", "app_metadata", meta("free"))},
			{Name: "pro", Alg: "RS256", Key: "rsa", Claims: tokenClaims("pro-user", "app_metadata", meta("pro"))},
			{Name: "self-made-pro", Alg: "RS256", Key: "rsa", Claims: tokenClaims("sneaky-user", "app_metadata", meta("free"), "user_metadata", meta("pro"))},
		}, jwttest.Attacks(valid, trapURL)...)
	})
}

// jwtGateway is a test gateway with a verifier of the minted keys, served
// by a JWKS server, and the secret.
type jwtGateway struct {
	*testGateway
	up       *upstream
	jwks     *jwttest.Server
	verifier *jwt.Verifier
	reg      *prometheus.Registry
}

func newJWTGateway(t *testing.T, rules string, reject bool) *jwtGateway {
	t.Helper()
	m := mintProxyTokens(t)
	o := gatewayOpts{clock: storetest.NewClock(t0), reject: reject}
	srv := jwttest.NewServer(t, m.JWKS("rsa", "ec", "ed"))
	reg := prometheus.NewRegistry()
	v, err := jwt.New(jwt.Config{
		JWKSURL: srv.URL, Secret: []byte(jwtSecret), Issuer: jwtIssuer, Audiences: []string{jwtAudience},
		Now: o.clock.Now, Metrics: jwt.NewMetrics(reg),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	o.jwt = v
	up := newUpstream(t)
	return &jwtGateway{testGateway: newGateway(t, up, rules, o), up: up, jwks: srv, verifier: v, reg: reg}
}

// jwtKey is the key of a user of the tests' issuer under a claim.
func (g *testGateway) jwtKey(rule, claim, value string) string {
	return rule + "=" + g.hasher.JWTKey(jwtIssuer, claim, value)
}

// bearer is an Authorization header line.
func bearer(token string) string { return "Authorization: Bearer " + token }

// get is a raw GET of path with headers.
func get(path string, headers ...string) string { return request("GET", path, "", headers...) }

// TestJWTExactLimits: every user, whatever the algorithm of their token,
// gets exactly the rule's limit; one user's several tokens share one
// quota; a request without a token is counted by its IP.
func TestJWTExactLimits(t *testing.T) {
	m := mintProxyTokens(t)
	g := newJWTGateway(t, "api: GET /api/* by jwt 3/1h", false)
	for _, user := range []string{"bob", "carol", "dave"} {
		for i := 1; i <= 4; i++ {
			res, body := g.send(t, get("/api/x", bearer(m.Token(t, user))), false)
			if want := map[bool]int{true: 200, false: 429}[i <= 3]; res.StatusCode != want {
				t.Fatalf("%s request %d: %d, want %d: %s", user, i, res.StatusCode, want, body)
			}
		}
	}
	// Alice has three tokens, two algorithms: one quota.
	for i, tok := range []string{"alice", "alice-2", "alice-es", "alice"} {
		res, _ := g.send(t, get("/api/x", bearer(m.Token(t, tok))), false)
		if want := map[bool]int{true: 200, false: 429}[i < 3]; res.StatusCode != want {
			t.Fatalf("alice's token %s (request %d): %d, want %d", tok, i+1, res.StatusCode, want)
		}
	}
	// No token: the client IP, with its own quota.
	for i := 1; i <= 4; i++ {
		res, _ := g.send(t, get("/api/x"), false)
		if want := map[bool]int{true: 200, false: 429}[i <= 3]; res.StatusCode != want {
			t.Fatalf("anonymous request %d: %d, want %d", i, res.StatusCode, want)
		}
	}
}

// TestJWTKeys: the keys claims give, and what a claim that is no
// identifier falls back to.
func TestJWTKeys(t *testing.T) {
	m := mintProxyTokens(t)
	g := newJWTGateway(t, "api: GET /api/* by jwt 1000/1h; plan: GET /api/plan by jwt(app_metadata.plan) 1000/1h; ip: GET /api/* by ip 1000/1h", false)
	for _, tt := range []struct {
		name, msg string
		keys      []string
	}{
		{"a user", get("/api/x", bearer(m.Token(t, "alice"))), []string{g.jwtKey("api", "sub", "alice"), g.key("ip=ip:127.0.0.1")}},
		{"a user whose sub is an IP is not that IP", get("/api/x", bearer(m.Token(t, "sub-ip"))), []string{g.jwtKey("api", "sub", "127.0.0.1"), g.key("ip=ip:127.0.0.1")}},
		{"an integer sub", get("/api/x", bearer(m.Token(t, "sub-number"))), []string{g.jwtKey("api", "sub", "42"), g.key("ip=ip:127.0.0.1")}},
		{"a sub of 42.0 is no identifier: the IP", get("/api/x", bearer(m.Token(t, "sub-float"))), []string{g.key("api=ip:127.0.0.1"), g.key("ip=ip:127.0.0.1")}},
		{"a nested claim", get("/api/plan", bearer(m.Token(t, "victim"))), []string{g.jwtKey("api", "sub", "victim"), g.jwtKey("plan", "app_metadata.plan", "pro"), g.key("ip=ip:127.0.0.1")}},
		{"a nested claim that is missing: the IP", get("/api/plan", bearer(m.Token(t, "alice"))), []string{g.jwtKey("api", "sub", "alice"), g.key("plan=ip:127.0.0.1"), g.key("ip=ip:127.0.0.1")}},
		{"no token", get("/api/x"), []string{g.key("api=ip:127.0.0.1"), g.key("ip=ip:127.0.0.1")}},
		{"another scheme", get("/api/x", "Authorization: Basic YWxpY2U6eA=="), []string{g.key("api=ip:127.0.0.1"), g.key("ip=ip:127.0.0.1")}},
		{"Authorization named in Connection", get("/api/x", "Connection: Authorization", bearer(m.Token(t, "alice"))), []string{g.key("api=ip:127.0.0.1"), g.key("ip=ip:127.0.0.1")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g.store.lastChecks()
			if res, body := g.send(t, tt.msg, false); res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
			if got := g.store.lastChecks(); strings.Join(got, " ") != strings.Join(tt.keys, " ") {
				t.Fatalf("counted %v, want %v", got, tt.keys)
			}
		})
	}
	// The kinds are apart: a user whose sub is 127.0.0.1 and the client at
	// 127.0.0.1 under the same rule have two keys.
	if g.jwtKey("api", "sub", "127.0.0.1") == g.key("api=ip:127.0.0.1") {
		t.Fatal("a sub of 127.0.0.1 has the key of the IP 127.0.0.1")
	}
}

// TestJWTAttacks replays the attack table of issue 21 through a real
// gateway: none of the tokens counts under the victim's key; each is
// counted by its client's IP; the victim's counter is untouched
// afterwards; and the server that jku and x5u point at is never
// contacted.
func TestJWTAttacks(t *testing.T) {
	m := mintProxyTokens(t)
	g := newJWTGateway(t, "api: GET /api/* by jwt 1000/1h", false)
	victim := m.Token(t, "victim")
	h, p, s := strings.Split(victim, ".")[0], strings.Split(victim, ".")[1], strings.Split(victim, ".")[2]
	enc := base64.RawURLEncoding.EncodeToString
	victimClaims, _ := base64.RawURLEncoding.DecodeString(p)

	// An attacker's own key, and tokens made with it.
	evil := jwttest.NewAttacker(t)
	es256 := func(header string) string { return evil.ES256(header, victimClaims) }
	evilJWK := evil.JWK()
	hs256 := func(key []byte) string {
		return jwttest.SignHS256(key, `{"alg":"HS256","kid":"rsa","typ":"JWT"}`, victimClaims)
	}
	// The attacker's own ES256 token, its signature spelt another way.
	ah, ap, as := func() (string, string, string) {
		x := strings.Split(m.Token(t, "attacker"), ".")
		return x[0], x[1], x[2]
	}()
	asig, _ := base64.RawURLEncoding.DecodeString(as)

	ip := []string{"api=ip:127.0.0.1"}
	var attacks []attack
	for _, a := range []struct{ name, token string }{
		{"alg none", enc([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + p + "."},
		{"alg none with the victim's signature", enc([]byte(`{"alg":"none","kid":"rsa"}`)) + "." + p + "." + s},
		{"HS256 signed with the RSA public key", hs256([]byte(m.PEM["rsa"]))},
		{"HS256 signed with the RSA public JWK", hs256(m.JWK["rsa"])},
		{"an attacker's key in an embedded jwk", es256(`{"alg":"ES256","jwk":` + evilJWK + `}`)},
		{"an embedded jwk with the issuer's kid", es256(`{"alg":"ES256","kid":"ec","jwk":` + evilJWK + `}`)},
		{"jku pointing at the attacker's server", m.Token(t, "jku")},
		{"x5u pointing at the attacker's server", m.Token(t, "x5u")},
		{"the attacker's key under the issuer's kid", m.Token(t, "evil-key")},
		{"expired", m.Token(t, "expired")},
		{"exp of 0", m.Token(t, "exp-0")},
		{"no exp", m.Token(t, "no-exp")},
		{"not yet valid", m.Token(t, "nbf-future")},
		{"nbf of 1e300", m.Token(t, "nbf-1e300")},
		{"wrong issuer", m.Token(t, "wrong-iss")},
		{"wrong audience", m.Token(t, "wrong-aud")},
		{"crit", m.Token(t, "crit")},
		{"oversize", m.Token(t, "oversize")},
		{"stripped signature", h + "." + p + "."},
		{"two segments", h + "." + p},
		{"JWE", h + ".." + enc([]byte("iv")) + "." + p + "." + enc([]byte("tag"))},
		{"payload swapped into the attacker's token", ah + "." + p + "." + as},
		{"duplicate sub", m.Token(t, "dup-sub")},
		{"case-variant sub", m.Token(t, "case-sub")},
		{"ES256 signature as DER", ah + "." + ap + "." + enc(jwttest.DER(asig))},
		{"ES256 signature with a byte more", ah + "." + ap + "." + enc(append([]byte{0}, asig...))},
		{"made-up kid", enc([]byte(`{"alg":"RS256","kid":"made-up"}`)) + "." + p + "." + s},
	} {
		attacks = append(attacks, attack{name: a.name, msg: get("/api/x", bearer(a.token)), status: 200, keys: ip})
	}
	attacks = append(attacks,
		attack{name: "two Authorization headers", msg: get("/api/x", bearer(m.Token(t, "attacker")), bearer(victim)), status: 400},
		attack{name: "Authorization in two spellings", msg: get("/api/x", bearer(m.Token(t, "attacker")), "authorization: Bearer "+victim), status: 400},
		attack{name: "two tokens in one header", msg: get("/api/x", "Authorization: Bearer "+m.Token(t, "attacker")+", Bearer "+victim), status: 400},
		attack{name: "two tokens after one scheme", msg: get("/api/x", "Authorization: Bearer "+m.Token(t, "attacker")+" "+victim), status: 400},
		attack{name: "scheme without a token", msg: get("/api/x", "Authorization: Bearer"), status: 400},
	)
	replay(t, g.testGateway, g.up, attacks)
	if hits := proxyMinter.Trap().Hits(); hits != 0 {
		t.Errorf("the attacker's server was contacted %d times", hits)
	}

	// ECDSA lets anyone turn a signature (r, s) into (r, n−s): the same
	// signature of the same claims, so it keys the same user, the
	// attacker, never the victim and never a fresh key.
	g.store.lastChecks()
	if res, _ := g.send(t, get("/api/x", bearer(ah+"."+ap+"."+enc(jwttest.Malleated(asig)))), false); res.StatusCode != 200 {
		t.Fatalf("malleated ES256 signature: %d", res.StatusCode)
	}
	if got := g.store.lastChecks(); len(got) != 1 || got[0] != g.jwtKey("api", "sub", "attacker") {
		t.Fatalf("a malleated signature counted as %v, want the attacker's own key", got)
	}

	// The victim's counter is untouched; the forgers' IP spent one request
	// for each forgery.
	forgeries := 0
	for _, a := range attacks {
		if a.status == 200 {
			forgeries++
		}
	}
	rule := g.proxy.Policy().Rules()[0]
	for key, used := range map[string]int{g.hasher.JWTKey(jwtIssuer, "sub", "victim"): 0, g.hasher.Key("ip", "127.0.0.1"): forgeries} {
		res, err := g.memory.Peek(context.Background(), limiter.Check{Rule: rule, Key: key})
		if err != nil {
			t.Fatal(err)
		}
		if res.Remaining != 1000-int64(used) {
			t.Errorf("key %.8s: %d remaining, want %d", key, res.Remaining, 1000-used)
		}
	}
}

// TestJWTUnknownKidFlood: made-up kids are limited by their IP, never
// wait on a fetch, and cost the issuer at most one fetch per 30 s.
func TestJWTUnknownKidFlood(t *testing.T) {
	m := mintProxyTokens(t)
	g := newJWTGateway(t, "api: GET /api/* by jwt 100000/1h", false)
	g.jwks.WaitFetches(t, 1) // the start-up fetch
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.verifier.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	_, p, s := func() (string, string, string) {
		x := strings.Split(m.Token(t, "victim"), ".")
		return x[0], x[1], x[2]
	}()
	flood := func(round int) {
		t.Helper()
		for i := range 100 {
			h := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"alg":"RS256","kid":"made-up-%d-%d"}`, round, i)))
			g.store.lastChecks()
			if res, _ := g.send(t, get("/api/x", bearer(h+"."+p+"."+s)), false); res.StatusCode != 200 {
				t.Fatalf("made-up kid: %d", res.StatusCode)
			}
			if got := g.store.lastChecks(); len(got) != 1 || got[0] != g.key("api=ip:127.0.0.1") {
				t.Fatalf("made-up kid counted as %v", got)
			}
		}
	}
	flood(0) // within 30 s of the start-up fetch: none
	g.clock.Advance(jwt.EarlyRefreshGap)
	flood(1) // one
	g.jwks.WaitFetches(t, 2)
	g.clock.Advance(jwt.EarlyRefreshGap / 2)
	flood(2) // within 30 s of that: none
	if got := g.jwks.Fetches(); got != 2 {
		t.Fatalf("%d fetches of the JWKS, want 2 (the start-up fetch and one early refresh)", got)
	}
}

// TestJWTPlans: a verified plan claim picks the limit; a claim the user
// can edit (user_metadata) does not; a forged "pro" token gets the rule's
// own limit under the client's IP.
func TestJWTPlans(t *testing.T) {
	m := mintProxyTokens(t)
	g := newJWTGateway(t, "api: GET /api/* by jwt 2/1h plans(app_metadata.plan)=pro:5/1h,team:50/1d", false)
	exhaust := func(name, token string, limit int) {
		t.Helper()
		for i := 1; i <= limit+1; i++ {
			msg := get("/api/x")
			if token != "" {
				msg = get("/api/x", bearer(token))
			}
			res, body := g.send(t, msg, false)
			want := map[bool]int{true: 200, false: 429}[i <= limit]
			if res.StatusCode != want {
				t.Fatalf("%s request %d: %d, want %d: %s", name, i, res.StatusCode, want, body)
			}
			if got := res.Header.Get("X-RateLimit-Limit"); got != strconv.Itoa(limit) {
				t.Fatalf("%s request %d: X-RateLimit-Limit %s, want %d", name, i, got, limit)
			}
		}
	}
	exhaust("pro", m.Token(t, "pro"), 5)
	exhaust("free", m.Token(t, "free"), 2)
	exhaust("a pro plan in user_metadata", m.Token(t, "self-made-pro"), 2)
	// A forged pro token: the victim's pro claims under the attacker's
	// key, or signed by nobody. The rule's own limit, by IP.
	victim := strings.Split(m.Token(t, "victim"), ".")
	forged := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." + victim[1] + "."
	g.store.lastChecks()
	exhaust("forged pro", forged, 2)
	if got := g.store.lastChecks(); len(got) != 1 || got[0] != g.key("api=ip:127.0.0.1") {
		t.Fatalf("a forged pro token counted as %v", got)
	}
	// The victim, a real pro user, still has all 5.
	exhaust("victim (pro)", m.Token(t, "victim"), 5)
}

// TestJWTReject: with SLUICE_JWT_INVALID=reject, a present but invalid
// token is answered 401 with a Bearer challenge, counted nowhere and not
// forwarded; a missing one is counted by IP; a valid one by its user.
func TestJWTReject(t *testing.T) {
	m := mintProxyTokens(t)
	g := newJWTGateway(t, "api: GET /api/* by jwt 1000/1h", true)
	for _, tt := range []struct {
		name, token string
		status      int
		key         string
		result      string
	}{
		{"valid", m.Token(t, "alice"), 200, g.jwtKey("api", "sub", "alice"), ""},
		{"missing", "", 200, g.key("api=ip:127.0.0.1"), ""},
		{"expired", m.Token(t, "expired"), 401, "", "expired"},
		{"bad signature", m.Token(t, "evil-key"), 401, "", "bad_signature"},
		{"malformed", "not-a-token", 401, "", "malformed"},
		{"made-up kid", base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","kid":"x"}`)) + ".e30.c2ln", 401, "", "unknown_key"},
		{"alg none", base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + ".e30.", 401, "", "algorithm_refused"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			msg := get("/api/x")
			if tt.token != "" {
				msg = get("/api/x", bearer(tt.token))
			}
			g.store.lastChecks()
			res, body := g.send(t, msg, false)
			if res.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", res.StatusCode, tt.status, body)
			}
			got := g.store.lastChecks()
			if tt.status == 401 {
				if h := res.Header.Values("WWW-Authenticate"); len(h) != 1 || h[0] != `Bearer error="invalid_token"` {
					t.Errorf("WWW-Authenticate %q", h)
				}
				var p Problem
				if err := json.Unmarshal([]byte(body), &p); err != nil || p.Status != 401 || res.Header.Get("Content-Type") != "application/problem+json" {
					t.Errorf("problem %s (%v)", body, err)
				}
				if !strings.Contains(p.Detail, tt.result) || strings.Contains(body, "eyJ") {
					t.Errorf("detail %q", p.Detail)
				}
				if len(got) != 0 {
					t.Errorf("a rejected request was counted: %v", got)
				}
				return
			}
			if len(got) != 1 || got[0] != tt.key {
				t.Errorf("counted %v, want %v", got, tt.key)
			}
		})
	}
	// Routes without a jwt rule never look at the token.
	g2 := newJWTGateway(t, "api: GET /api/* by ip 1000/1h", true)
	if res, _ := g2.send(t, get("/api/x", bearer(m.Token(t, "expired"))), false); res.StatusCode != 200 {
		t.Errorf("an expired token on an IP route: %d, want 200", res.StatusCode)
	}
}

// TestJWTVerifiedOncePerRequest: however many rules read the token, it is
// verified once, and counted once in sluice_jwt_tokens_total.
func TestJWTVerifiedOncePerRequest(t *testing.T) {
	m := mintProxyTokens(t)
	g := newJWTGateway(t, "a: GET /api/* by jwt 1000/1h; b: GET /api/* by jwt(app_metadata.plan) 1000/1h; c: GET /api/* by ip 1000/1h plans(app_metadata.plan)=pro:5000/1h", false)
	g.send(t, get("/api/x", bearer(m.Token(t, "victim"))), false)
	g.send(t, get("/api/x"), false)
	g.send(t, get("/other", bearer(m.Token(t, "victim"))), false) // no rule: not read
	verified := proctest.Metric(t, g.reg, `sluice_jwt_tokens_total{result="valid"}`)
	missing := proctest.Metric(t, g.reg, `sluice_jwt_tokens_total{result="missing"}`)
	if verified != 1 || missing != 1 {
		t.Fatalf("tokens_total valid %v and missing %v, want 1 each", verified, missing)
	}
}

// TestJWTWithoutVerifier: a jwt rule without a verifier counts every
// request by its IP, and plans never apply.
func TestJWTWithoutVerifier(t *testing.T) {
	m := mintProxyTokens(t)
	up := newUpstream(t)
	g := newGateway(t, up, "api: GET /api/* by jwt 1000/1h plans(app_metadata.plan)=pro:5000/1h", gatewayOpts{})
	replay(t, g, up, []attack{
		{name: "valid token, no verifier", msg: get("/api/x", bearer(m.Token(t, "victim"))), status: 200, keys: []string{"api=ip:127.0.0.1"}},
		{name: "two headers are still ambiguous", msg: get("/api/x", bearer("a"), bearer("b")), status: 400},
	})
	res, _ := g.send(t, get("/api/x", bearer(m.Token(t, "victim"))), false)
	if got := res.Header.Get("X-RateLimit-Limit"); got != "1000" {
		t.Errorf("limit %s, want the rule's own 1000", got)
	}
}
