package gateway

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/jwt"
	"github.com/sluicehq/sluice/jwt/jwttest"
	"github.com/sluicehq/sluice/limiter/storetest"
)

// The tests in this file are issue 21's acceptance run through whole
// gateways assembled from their settings (SLUICE_JWT_*), as main runs
// them: tokens PyJWT signed with keys jwcrypto made (jwt/jwttest), served
// by a JWKS server or read from a file. Where a test needs the verifier's
// clock to move (the 30 s between early refreshes), it sets the clock of
// the verifier's Config (jwtConfig.Now) before the gateway is built; the
// rest of the gateway keeps the real clock.

const (
	jwtIssuer   = "https://auth.example/"
	jwtAudience = "api"
)

// gatewayMinter mints the tokens of the tests once.
var gatewayMinter jwttest.Minter

// mintGateway mints the keys and tokens of this package's tests once,
// with Python, their times around the instant they are minted (valid for
// two hours).
func mintGateway(t *testing.T) *jwttest.Minted {
	t.Helper()
	return gatewayMinter.Mint(t, testJWTSecret, []jwttest.Key{
		{Name: "rsa", Type: "RSA"}, {Name: "ec", Type: "EC:P-256"}, {Name: "ed", Type: "Ed25519"},
		{Name: "rsa-new", Type: "RSA"}, {Name: "evil", Type: "EC:P-256"},
	}, func(trapURL string) []jwttest.Token {
		now := time.Now()
		valid := jwttest.Claims{Issuer: jwtIssuer, Audience: jwtAudience, IssuedAt: now.Add(-time.Minute), Expires: now.Add(2 * time.Hour)}
		c := valid.For
		meta := func(plan string) map[string]any { return map[string]any{"plan": plan} }
		return append([]jwttest.Token{
			{Name: "rs-user", Alg: "RS256", Key: "rsa", Claims: c("rs-user")},
			{Name: "es-user", Alg: "ES256", Key: "ec", Claims: c("es-user")},
			{Name: "ed-user", Alg: "EdDSA", Key: "ed", Claims: c("ed-user")},
			{Name: "hs-user", Alg: "HS256", Key: "secret", Claims: c("hs-user")},
			{Name: "alice-rs", Alg: "RS256", Key: "rsa", Claims: c("alice")},
			{Name: "alice-es", Alg: "ES256", Key: "ec", Claims: c("alice", "jti", "2")},
			{Name: "alice-ed", Alg: "EdDSA", Key: "ed", Claims: c("alice", "jti", "3")},
			{Name: "alice-hs", Alg: "HS256", Key: "secret", Claims: c("alice", "jti", "4")},
			{Name: "victim", Alg: "RS256", Key: "rsa", Claims: c("victim", "app_metadata", meta("pro"))},
			{Name: "new-key", Alg: "RS256", Key: "rsa-new", Claims: c("rotated-user")},
			{Name: "pro", Alg: "ES256", Key: "ec", Claims: c("pro-user", "app_metadata", meta("pro"))},
			{Name: "free", Alg: "ES256", Key: "ec", Claims: c("free-user", "app_metadata", meta("free"))},
			{Name: "self-made-pro", Alg: "ES256", Key: "ec", Claims: c("sneaky-user", "app_metadata", meta("free"), "user_metadata", meta("pro"))},
			{Name: "forged-pro", Alg: "ES256", Key: "evil", Kid: "ec", Claims: c("mallory", "app_metadata", meta("pro"))},
			{Name: "expired", Alg: "RS256", Key: "rsa", Claims: c("victim", "exp", now.Add(-time.Hour).Unix())},
		}, jwttest.Attacks(valid, trapURL)...)
	})
}

// writeJWKS writes a JWK set to a file of the test's and returns its name.
func writeJWKS(t *testing.T, jwks []byte) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "jwks.json")
	replaceFile(t, name, jwks)
	return name
}

// replaceFile writes data whole and renames it into place, as a
// ConfigMap update does: a reader never sees half a file.
func replaceFile(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name+".new", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(name+".new", name); err != nil {
		t.Fatal(err)
	}
}

// okUpstream is an upstream that answers 200 to everything until the
// test ends.
func okUpstream(t *testing.T) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(up.Close)
	return up.URL
}

// jwtEnv is the environment of a gateway on the memory store in front of
// upstream with rules, whose tokens are verified with the JWK set at
// jwksURL and the secret.
func jwtEnv(upstream, jwksURL, rules string) map[string]string {
	env := base()
	env["SLUICE_UPSTREAM"] = upstream
	env["SLUICE_RULES"] = rules
	env["SLUICE_JWT_JWKS_URL"] = jwksURL
	env["SLUICE_JWT_SECRET"] = testJWTSecret
	env["SLUICE_JWT_ISSUER"] = jwtIssuer
	env["SLUICE_JWT_AUDIENCE"] = jwtAudience
	return env
}

// startJWT runs a gateway for env whose verifier reads clock (nil: the
// real one) and logs to log (nil: nowhere), and returns once its public
// listener is open.
func startJWT(t *testing.T, env map[string]string, clock *storetest.Clock, log *zap.Logger) (*Gateway, *running) {
	t.Helper()
	cfg, err := load(env)
	if err != nil {
		t.Fatal(err)
	}
	if clock != nil {
		cfg.jwtConfig.Now = clock.Now
	}
	if log == nil {
		log = zap.NewNop()
	}
	g, err := newGateway(cfg, Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	r, public := runGateway(t, g)
	select {
	case r.url = <-public:
	case <-time.After(60 * time.Second):
		t.Fatal("the public listener did not open within 60s")
	}
	return g, r
}

// send sends GET url with one Authorization: Bearer line per token ("":
// none) and returns the response, its body read and closed.
func send(t *testing.T, url string, tokens ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range tokens {
		if tok != "" {
			req.Header.Add("Authorization", "Bearer "+tok)
		}
	}
	return sendDiscard(t, req)
}

// sendDiscard sends req with the default client and returns its response, the
// body read and closed.
func sendDiscard(t *testing.T, req *http.Request) *http.Response {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res
}

// used is the count of a key, as GET /v1/keys?query shows it.
func used(t *testing.T, r *running, query string) int64 {
	t.Helper()
	code, body := proctest.Call(t, "GET", r.admin+"/v1/keys?"+query, "", "")
	var k struct{ Count int64 }
	if code != 200 || json.Unmarshal([]byte(body), &k) != nil {
		t.Fatalf("GET /v1/keys?%s: %d %s", query, code, body)
	}
	return k.Count
}

// metric is the value of one series of the gateway's /metrics.
func metric(t *testing.T, r *running, series string) float64 {
	t.Helper()
	v, ok := proctest.Scrape(t, http.DefaultClient, r.admin+"/metrics")[series]
	if !ok {
		t.Fatalf("/metrics lacks %s", series)
	}
	return v
}

// waitMetric waits until a series of the gateway's /metrics reaches at
// least want: the verifier fetches in the background.
func waitMetric(t *testing.T, r *running, series string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for metric(t, r, series) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s is %v after 10 s, want %v", series, metric(t, r, series), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const (
	refreshesOK    = `sluice_jwt_jwks_refreshes_total{result="ok"}`
	refreshesError = `sluice_jwt_jwks_refreshes_total{result="error"}`
)

// TestJWTTwoGatewaysOnePostgres: users whose tokens are signed with
// RS256, ES256, EdDSA and HS256 (PyJWT), verified with a JWKS served over
// HTTP and the secret, each get exactly the limit across two gateways on
// one Postgres; one user's tokens of four algorithms share one quota.
func TestJWTTwoGatewaysOnePostgres(t *testing.T) {
	m := mintGateway(t)
	db := pgtest.New(t)
	var hits atomic.Int64
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer counting.Close()
	up := counting.URL
	jwks := jwttest.NewServer(t, m.JWKS("rsa", "ec", "ed"))
	env := databaseEnv(db, up, "api: GET /api/* by jwt 3/1h")
	for k, v := range jwtEnv(up, jwks.URL, env["SLUICE_RULES"]) {
		if strings.HasPrefix(k, "SLUICE_JWT_") {
			env[k] = v
		}
	}
	env["SLUICE_FAIL_MODE"] = "closed"
	gws := []*running{start(t, env), start(t, env)}
	pgtest.ClearOf(t, time.Hour, 30*time.Second)

	users := []struct {
		sub    string
		tokens []string
	}{
		{"rs-user", []string{"rs-user"}},
		{"es-user", []string{"es-user"}},
		{"ed-user", []string{"ed-user"}},
		{"hs-user", []string{"hs-user"}},
		{"alice", []string{"alice-rs", "alice-es", "alice-ed", "alice-hs"}},
	}
	for _, u := range users {
		var tokens []string
		for _, name := range u.tokens {
			tokens = append(tokens, m.Token(t, name))
		}
		codes := proctest.CountStatuses(t, 12, func(i int) (int, error) {
			req, _ := http.NewRequest("GET", gws[i%2].url+"/api/x", nil)
			req.Header.Set("Authorization", "Bearer "+tokens[(i/2)%len(tokens)])
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, err
			}
			res.Body.Close()
			return res.StatusCode, nil
		})
		if codes[200] != 3 || codes[429] != 9 {
			t.Fatalf("%s (%d tokens): %v, want 3 allowed and 9 limited across both gateways", u.sub, len(tokens), codes)
		}
		// Either gateway's admin API finds the user's key in the shared store.
		if n := used(t, gws[1], "rule=api&jwt="+u.sub); n != 3 {
			t.Fatalf("%s: count %d, want 3", u.sub, n)
		}
	}
	if hits.Load() != 15 {
		t.Fatalf("the upstream saw %d requests, want 15", hits.Load())
	}
	// Every token verified on both: nothing was counted by the client IP.
	if n := used(t, gws[0], "rule=api&ip=127.0.0.1"); n != 0 {
		t.Fatalf("the client IP was counted %d times", n)
	}
	if got := jwks.Fetches(); got != 2 {
		t.Errorf("%d fetches of the JWKS, want 2 (one at each gateway's start)", got)
	}
}

// TestJWTAttacksThroughGateway replays attacks of issue 21's table
// through a gateway: each forged or invalid token is counted by its
// client's IP and never under the victim's key; jku and x5u are never
// fetched; a flood of made-up kids costs the issuer at most one fetch per
// 30 s.
func TestJWTAttacksThroughGateway(t *testing.T) {
	m := mintGateway(t)
	up := okUpstream(t)
	jwks := jwttest.NewServer(t, m.JWKS("rsa", "ec", "ed"))
	clock := storetest.NewClock(time.Now())
	_, r := startJWT(t, jwtEnv(up, jwks.URL, "api: GET /api/* by jwt 1000/1h"), clock, nil)
	jwks.WaitFetches(t, 1)

	enc := base64.RawURLEncoding.EncodeToString
	parts := strings.Split(m.Token(t, "victim"), ".")
	h, p, s := parts[0], parts[1], parts[2]
	payload, _ := base64.RawURLEncoding.DecodeString(p)
	var victimClaims map[string]any
	if err := json.Unmarshal(payload, &victimClaims); err != nil {
		t.Fatal(err)
	}
	// The attacker's key in the header, under the issuer's kid.
	evil := jwttest.NewAttacker(t)
	embedded := evil.ES256(`{"alg":"ES256","kid":"ec","jwk":`+evil.JWK()+`}`, payload)
	forgeries := []struct{ name, token string }{
		{"alg none", enc([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + p + "."},
		{"HS256 signed with the RSA public key", jwttest.HS256(t, m.PEM["rsa"], victimClaims)},
		{"an embedded jwk", embedded},
		{"jku pointing at the attacker's server", m.Token(t, "jku")},
		{"x5u pointing at the attacker's server", m.Token(t, "x5u")},
		{"the attacker's key under the issuer's kid", m.Token(t, "evil-key")},
		{"expired", m.Token(t, "expired")},
		{"wrong issuer", m.Token(t, "wrong-iss")},
		{"wrong audience", m.Token(t, "wrong-aud")},
		{"crit", m.Token(t, "crit")},
		{"stripped signature", h + "." + p + "."},
	}
	for _, f := range forgeries {
		if res := send(t, r.url+"/api/x", f.token); res.StatusCode != 200 {
			t.Fatalf("%s: %d, want 200 (counted by IP)", f.name, res.StatusCode)
		}
	}
	if res := send(t, r.url+"/api/x", m.Token(t, "alice-rs"), m.Token(t, "victim")); res.StatusCode != 400 {
		t.Fatalf("two Authorization headers: %d, want 400", res.StatusCode)
	}
	if n := used(t, r, "rule=api&jwt=victim"); n != 0 {
		t.Fatalf("the victim's key was counted %d times", n)
	}
	if n := used(t, r, "rule=api&ip=127.0.0.1"); n != int64(len(forgeries)) {
		t.Fatalf("the client IP was counted %d times, want %d (one per forgery)", n, len(forgeries))
	}

	// Made-up kids: counted by IP, and no fetch within 30 s of the last.
	flood := func(round int) {
		t.Helper()
		for i := range 50 {
			kid := enc([]byte(fmt.Sprintf(`{"alg":"RS256","kid":"made-up-%d-%d"}`, round, i)))
			if res := send(t, r.url+"/api/x", kid+"."+p+"."+s); res.StatusCode != 200 {
				t.Fatalf("made-up kid: %d", res.StatusCode)
			}
		}
	}
	flood(0) // within 30 s of the start-up fetch: none
	clock.Advance(jwt.EarlyRefreshGap)
	flood(1) // one
	jwks.WaitFetches(t, 2)
	waitMetric(t, r, refreshesOK, 2)
	if got := jwks.Fetches(); got != 2 {
		t.Fatalf("%d fetches of the JWKS, want 2 (the start-up fetch and one early refresh)", got)
	}
	if n := used(t, r, "rule=api&ip=127.0.0.1"); n != int64(len(forgeries)+100) {
		t.Fatalf("the client IP was counted %d times, want %d", n, len(forgeries)+100)
	}
	if got := metric(t, r, `sluice_jwt_tokens_total{result="unknown_key"}`); got != 100 {
		t.Errorf("unknown_key %v, want 100", got)
	}
	if hits := gatewayMinter.Trap().Hits(); hits != 0 {
		t.Errorf("the attacker's server was contacted %d times", hits)
	}
}

// TestJWTKeyRotation: a key added to the JWKS verifies once the set is
// fetched again (early, when a token names its kid, 30 s after the last
// fetch); a key removed from it stops verifying at once, a token it
// verified before included.
func TestJWTKeyRotation(t *testing.T) {
	m := mintGateway(t)
	up := okUpstream(t)
	jwks := jwttest.NewServer(t, m.JWKS("rsa"))
	clock := storetest.NewClock(time.Now())
	_, r := startJWT(t, jwtEnv(up, jwks.URL, "api: GET /api/* by jwt 1000/1h"), clock, nil)
	alice, rotated := m.Token(t, "alice-rs"), m.Token(t, "new-key")
	expect := func(step, token, query string, want int64) {
		t.Helper()
		if res := send(t, r.url+"/api/x", token); res.StatusCode != 200 {
			t.Fatalf("%s: %d", step, res.StatusCode)
		}
		if n := used(t, r, "rule=api&"+query); n != want {
			t.Fatalf("%s: %s counted %d times, want %d", step, query, n, want)
		}
	}
	expect("the old key", alice, "jwt=alice", 1)
	expect("the new key before it is published", rotated, "ip=127.0.0.1", 1)

	jwks.Set(m.JWKS("rsa-new")) // rsa removed, rsa-new added
	clock.Advance(jwt.EarlyRefreshGap)
	// The request that names the new kid does not wait for the fetch it
	// starts: it is counted by IP.
	expect("the new key's first request", rotated, "ip=127.0.0.1", 2)
	waitMetric(t, r, refreshesOK, 2)
	expect("the new key", rotated, "jwt=rotated-user", 1)
	expect("the removed key", alice, "ip=127.0.0.1", 3)
	if n := used(t, r, "rule=api&jwt=alice"); n != 1 {
		t.Fatalf("alice's key counted %d times after her key was removed, want 1", n)
	}
}

// TestJWTKeysDown: a JWKS server that goes down leaves the last good keys
// in force, says so in sluice_jwt_jwks_refreshes_total and the key set's
// age; one that is down at start-up does not hold the gateway back: jwt
// rules count by IP (the secret's tokens still verify) until a fetch
// succeeds; one that never answers holds start-up no longer than
// SLUICE_START_TIMEOUT.
func TestJWTKeysDown(t *testing.T) {
	m := mintGateway(t)
	up := okUpstream(t)
	const rules = "api: GET /api/* by jwt 1000/1h"
	alice := m.Token(t, "alice-rs")

	t.Run("goes down", func(t *testing.T) {
		jwks := jwttest.NewServer(t, m.JWKS("rsa"))
		clock := storetest.NewClock(time.Now())
		_, r := startJWT(t, jwtEnv(up, jwks.URL, rules), clock, nil)
		send(t, r.url+"/api/x", alice)
		jwks.SetDown(true)
		clock.Advance(jwt.EarlyRefreshGap)
		made := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","kid":"made-up"}`)) + "." + strings.SplitN(alice, ".", 2)[1]
		send(t, r.url+"/api/x", made) // asks for an early refresh, which fails
		waitMetric(t, r, refreshesError, 1)
		send(t, r.url+"/api/x", alice)
		if n := used(t, r, "rule=api&jwt=alice"); n != 2 {
			t.Fatalf("alice counted %d times, want 2: the last good keys stay in force", n)
		}
		if age := metric(t, r, "sluice_jwt_jwks_age_seconds"); age != jwt.EarlyRefreshGap.Seconds() {
			t.Errorf("key set age %v, want %v", age, jwt.EarlyRefreshGap.Seconds())
		}
	})

	t.Run("down at start-up", func(t *testing.T) {
		jwks := jwttest.NewServer(t, m.JWKS("rsa"))
		jwks.SetDown(true)
		clock := storetest.NewClock(time.Now())
		core, logs := observer.New(zapcore.InfoLevel)
		env := jwtEnv(up, jwks.URL, rules)
		env["SLUICE_START_TIMEOUT"] = "30s"
		began := time.Now()
		g, r := startJWT(t, env, clock, zap.New(core))
		if d := time.Since(began); d > 15*time.Second {
			t.Fatalf("the public listener opened %s after the start: a failed fetch must not be waited out", d)
		}
		if logs.FilterMessageSnippet("no JWK set from SLUICE_JWT_JWKS_URL yet").Len() != 1 || logs.FilterMessageSnippet("JWKS refresh failed").Len() == 0 {
			t.Errorf("the missing key set was not logged: %v", logs.All())
		}
		if age := metric(t, r, "sluice_jwt_jwks_age_seconds"); !math.IsInf(age, 1) {
			t.Errorf("key set age %v, want +Inf", age)
		}
		send(t, r.url+"/api/x", alice)
		send(t, r.url+"/api/x", m.Token(t, "hs-user"))
		if a, ip, hs := used(t, r, "rule=api&jwt=alice"), used(t, r, "rule=api&ip=127.0.0.1"), used(t, r, "rule=api&jwt=hs-user"); a != 0 || ip != 1 || hs != 1 {
			t.Fatalf("without a key set: alice %d, the IP %d, the secret's user %d; want 0, 1, 1", a, ip, hs)
		}
		jwks.SetDown(false)
		clock.Advance(jwt.EarlyRefreshGap)
		send(t, r.url+"/api/x", alice) // asks for the fetch
		deadline := time.Now().Add(10 * time.Second)
		for !g.jwt.HasKeySet() {
			if time.Now().After(deadline) {
				t.Fatal("no key set 10 s after the JWKS server came back")
			}
			time.Sleep(10 * time.Millisecond)
		}
		send(t, r.url+"/api/x", alice)
		if n := used(t, r, "rule=api&jwt=alice"); n != 1 {
			t.Fatalf("alice counted %d times once the keys were fetched, want 1", n)
		}
	})

	t.Run("never answers", func(t *testing.T) {
		release := make(chan struct{})
		hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		defer hang.Close()
		defer close(release)
		env := jwtEnv(up, hang.URL, rules)
		env["SLUICE_START_TIMEOUT"] = "1s"
		core, logs := observer.New(zapcore.InfoLevel)
		began := time.Now()
		_, r := startJWT(t, env, nil, zap.New(core))
		if d := time.Since(began); d < 900*time.Millisecond || d > 6*time.Second {
			t.Fatalf("the public listener opened %s after the start, want about SLUICE_START_TIMEOUT (1s)", d)
		}
		if logs.FilterMessageSnippet("no JWK set from SLUICE_JWT_JWKS_URL yet").Len() != 1 {
			t.Errorf("the missing key set was not logged: %v", logs.All())
		}
		send(t, r.url+"/api/x", alice)
		if n := used(t, r, "rule=api&ip=127.0.0.1"); n != 1 {
			t.Fatalf("the client IP counted %d times, want 1", n)
		}
		if err := r.stop(); err != nil {
			t.Fatalf("stop with a fetch in flight: %v", err)
		}
	})
}

// TestJWTPlansThroughGateway: a verified plan claim picks the limit; a
// plan the user can write (user_metadata) does not; a forged "pro" token
// gets the rule's own limit, under its sender's IP.
func TestJWTPlansThroughGateway(t *testing.T) {
	m := mintGateway(t)
	up := okUpstream(t)
	jwks := jwttest.NewServer(t, m.JWKS("rsa", "ec"))
	_, r := startJWT(t, jwtEnv(up, jwks.URL, "api: GET /api/* by jwt 2/1h plans(app_metadata.plan)=pro:5/1h,team:50/1d"), nil, nil)
	pgtest.ClearOf(t, time.Hour, 10*time.Second)
	exhaust := func(name, token string, limit int) {
		t.Helper()
		for i := 1; i <= limit+1; i++ {
			res := send(t, r.url+"/api/x", token)
			want := map[bool]int{true: 200, false: 429}[i <= limit]
			if res.StatusCode != want || res.Header.Get("X-RateLimit-Limit") != fmt.Sprint(limit) {
				t.Fatalf("%s request %d: %d with X-RateLimit-Limit %s, want %d with %d", name, i, res.StatusCode, res.Header.Get("X-RateLimit-Limit"), want, limit)
			}
		}
	}
	exhaust("pro", m.Token(t, "pro"), 5)
	exhaust("free", m.Token(t, "free"), 2)
	exhaust("a pro plan in user_metadata", m.Token(t, "self-made-pro"), 2)
	exhaust("a pro token signed by the attacker", m.Token(t, "forged-pro"), 2)
	if n := used(t, r, "rule=api&ip=127.0.0.1"); n != 2 {
		t.Fatalf("the forged token's IP counted %d times, want 2", n)
	}
	if n := used(t, r, "rule=api&jwt=mallory&plan=pro"); n != 0 {
		t.Fatalf("the forger's claimed key counted %d times", n)
	}
	if n := used(t, r, "rule=api&jwt=pro-user&plan=pro"); n != 5 {
		t.Fatalf("the pro user counted %d times under pro, want 5", n)
	}
}

// TestReloadRefusesJWTRulesWithoutKeys: a rules file reloaded with a rule
// that needs a token, on a gateway without keys, is refused as it would
// be at start-up; the running rules stay.
func TestReloadRefusesJWTRulesWithoutKeys(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "rules")
	replaceFile(t, rules, []byte("a: GET /a by ip 5/1m\n"))
	env := base()
	delete(env, "SLUICE_RULES")
	env["SLUICE_RULES_FILE"] = rules
	g, err := New(env, Options{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.backend.close()
	replaceFile(t, rules, []byte("a: GET /a by ip 5/1m\nb: GET /b by ip 5/1m plans(tier)=pro:50/1m\nc: GET /c by jwt 5/1m\n"))
	err = g.reloadRules()
	want := "SLUICE_RULES_FILE " + rules + `: line 2: rule "b": plans(tier) needs keys to verify tokens: set SLUICE_JWT_JWKS_URL, SLUICE_JWT_JWKS_FILE or SLUICE_JWT_SECRET` +
		"\n  SLUICE_RULES_FILE " + rules + `: line 3: rule "c": by jwt needs keys to verify tokens: set SLUICE_JWT_JWKS_URL, SLUICE_JWT_JWKS_FILE or SLUICE_JWT_SECRET`
	if err == nil || !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("reload: %v\nwant it to end with\n%s", err, want)
	}
	if n := g.dec.Policy().Len(); n != 1 {
		t.Fatalf("%d rules in force after a refused reload, want 1", n)
	}
}

// TestJWTInvalidReject: with SLUICE_JWT_INVALID=reject, a present but
// invalid token is answered 401 with a Bearer challenge and counted
// nowhere; a missing one is counted by IP.
func TestJWTInvalidReject(t *testing.T) {
	m := mintGateway(t)
	up := okUpstream(t)
	jwks := jwttest.NewServer(t, m.JWKS("rsa"))
	env := jwtEnv(up, jwks.URL, "api: GET /api/* by jwt 1000/1h")
	env["SLUICE_JWT_INVALID"] = "reject"
	_, r := startJWT(t, env, nil, nil)
	for _, tc := range []struct {
		name, token string
		status      int
	}{
		{"expired", m.Token(t, "expired"), 401},
		{"signed by another key", m.Token(t, "evil-key"), 401},
		{"valid", m.Token(t, "alice-rs"), 200},
		{"missing", "", 200},
	} {
		res := send(t, r.url+"/api/x", tc.token)
		if res.StatusCode != tc.status {
			t.Fatalf("%s: %d, want %d", tc.name, res.StatusCode, tc.status)
		}
		if tc.status == 401 && res.Header.Get("WWW-Authenticate") != `Bearer error="invalid_token"` {
			t.Errorf("%s: WWW-Authenticate %q", tc.name, res.Header.Get("WWW-Authenticate"))
		}
	}
	if a, ip := used(t, r, "rule=api&jwt=alice"), used(t, r, "rule=api&ip=127.0.0.1"); a != 1 || ip != 1 {
		t.Fatalf("alice %d, the IP %d; want 1 and 1: rejected tokens are counted nowhere", a, ip)
	}
}
