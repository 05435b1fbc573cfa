package jwt

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/jwt/jwttest"
	"github.com/sluicehq/sluice/limiter/storetest"
)

// T0 is the instant every test's clock starts at.
var T0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	issuer   = "https://issuer.example/"
	audience = "sluice-api"
	// secret allows HS256, HS384 and HS512 (64 bytes).
	secret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// newClock returns a clock at T0 that only moves when told to.
func newClock() *storetest.Clock { return storetest.NewClock(T0) }

// valid are the registered claims of a valid token at T0.
var valid = jwttest.Claims{Issuer: issuer, Audience: audience, IssuedAt: T0.Add(-time.Minute), Expires: T0.Add(time.Hour)}

// claims returns the claims of a valid token for sub at T0, changed by
// the pairs of set (a nil value deletes the claim).
func claims(sub string, set ...any) map[string]any { return valid.For(sub, set...) }

// payload is claims as exact JSON text with more members appended as
// written, for payloads Python's json would not write.
func payload(sub, more string) string { return valid.Text(sub, more) }

func itoa(n int64) string { return strings.TrimSpace(string(must(json.Marshal(n)))) }

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// keys are the keys Python makes: their names are their kids.
var keys = []jwttest.Key{
	{Name: "rsa", Type: "RSA"},
	{Name: "rsa2", Type: "RSA"},
	{Name: "rsa-rs256", Type: "RSA", Alg: "RS256"},
	{Name: "ec256", Type: "EC:P-256"},
	{Name: "ec384", Type: "EC:P-384"},
	{Name: "ec521", Type: "EC:P-521"},
	{Name: "ed", Type: "Ed25519"},
	{Name: "attacker", Type: "EC:P-256"}, // never in the issuer's set
}

// issuerKeys are the keys of the issuer's JWK set in most tests.
var issuerKeys = []string{"rsa", "rsa-rs256", "ec256", "ec384", "ec521", "ed"}

// validTokens are, by name, tokens that verify, each for a user of that
// name, and the algorithm and key that signed them.
var validTokens = []jwttest.Token{
	{Name: "RS256", Alg: "RS256", Key: "rsa"},
	{Name: "RS384", Alg: "RS384", Key: "rsa"},
	{Name: "RS512", Alg: "RS512", Key: "rsa"},
	{Name: "PS256", Alg: "PS256", Key: "rsa"},
	{Name: "PS384", Alg: "PS384", Key: "rsa"},
	{Name: "PS512", Alg: "PS512", Key: "rsa"},
	{Name: "ES256", Alg: "ES256", Key: "ec256"},
	{Name: "ES384", Alg: "ES384", Key: "ec384"},
	{Name: "ES512", Alg: "ES512", Key: "ec521"},
	{Name: "EdDSA", Alg: "EdDSA", Key: "ed"},
	{Name: "HS256", Alg: "HS256", Key: "secret"},
	{Name: "HS384", Alg: "HS384", Key: "secret"},
	{Name: "HS512", Alg: "HS512", Key: "secret"},
	{Name: "RS256-pinned", Alg: "RS256", Key: "rsa-rs256"},
	{Name: "RS256-no-kid", Alg: "RS256", Key: "rsa", Kid: "-"},
	{Name: "EdDSA-no-kid", Alg: "EdDSA", Key: "ed", Kid: "-"},
	{Name: "HS256-with-kid", Alg: "HS256", Key: "secret", Kid: "some-kid"},
}

// attackTokens are tokens signed by Python that must not verify; the
// trap's URL is filled in by mintAll.
func attackTokens(trap string) []jwttest.Token {
	return []jwttest.Token{
		{Name: "expired", Alg: "RS256", Key: "rsa", Claims: claims("victim", "exp", T0.Unix()-3600)},
		{Name: "expired-within-leeway", Alg: "RS256", Key: "rsa", Claims: claims("victim", "exp", T0.Unix()-10)},
		{Name: "exp-0", Alg: "RS256", Key: "rsa", Claims: claims("victim", "exp", 0)},
		{Name: "no-exp", Alg: "RS256", Key: "rsa", Claims: claims("victim", "exp", nil)},
		{Name: "exp-string", Alg: "RS256", Key: "rsa", Claims: claims("victim", "exp", "9999999999")},
		{Name: "exp-1e999", Alg: "RS256", Key: "rsa", Payload: strings.Replace(payload("victim", ""), `"exp":`+itoa(T0.Unix()+3600), `"exp":1e999`, 1)},
		{Name: "nbf-future", Alg: "RS256", Key: "rsa", Claims: claims("victim", "nbf", T0.Unix()+3600)},
		{Name: "nbf-within-leeway", Alg: "RS256", Key: "rsa", Claims: claims("victim", "nbf", T0.Unix()+10)},
		{Name: "nbf-1e300", Alg: "RS256", Key: "rsa", Payload: payload("victim", `,"nbf":1e300`)},
		{Name: "nbf-string", Alg: "RS256", Key: "rsa", Claims: claims("victim", "nbf", "0")},
		{Name: "iat-future", Alg: "RS256", Key: "rsa", Claims: claims("victim", "iat", T0.Unix()+3600)},
		{Name: "wrong-iss", Alg: "RS256", Key: "rsa", Claims: claims("victim", "iss", "https://evil.example/")},
		{Name: "no-iss", Alg: "RS256", Key: "rsa", Claims: claims("victim", "iss", nil)},
		{Name: "wrong-aud", Alg: "RS256", Key: "rsa", Claims: claims("victim", "aud", "other-api")},
		{Name: "aud-list", Alg: "RS256", Key: "rsa", Claims: claims("victim", "aud", []any{"other-api", audience})},
		{Name: "aud-list-wrong", Alg: "RS256", Key: "rsa", Claims: claims("victim", "aud", []any{"other-api", 7})},
		{Name: "crit", Alg: "RS256", Key: "rsa", Header: map[string]any{"crit": []any{"exp"}}, Claims: claims("victim")},
		{Name: "jku", Alg: "ES256", Key: "attacker", Header: map[string]any{"jku": trap + "/jwks.json"}, Claims: claims("victim")},
		{Name: "x5u", Alg: "ES256", Key: "attacker", Header: map[string]any{"x5u": trap + "/cert.pem"}, Claims: claims("victim")},
		{Name: "jku-issuer-kid", Alg: "ES256", Key: "attacker", Kid: "ec256", Header: map[string]any{"jku": trap + "/jwks.json"}, Claims: claims("victim")},
		{Name: "x5c", Alg: "ES256", Key: "attacker", Header: map[string]any{"x5c": []any{"MIIBszCCAVmgAwIBAgIUW"}}, Claims: claims("victim")},
		{Name: "es384-on-p256", Alg: "ES384", Key: "ec256", Claims: claims("victim")},
		{Name: "ps256-on-rs256-key", Alg: "PS256", Key: "rsa-rs256", Claims: claims("victim")},
		{Name: "es256-kid-of-rsa", Alg: "ES256", Key: "ec256", Kid: "rsa", Claims: claims("victim")},
		{Name: "rotated", Alg: "RS256", Key: "rsa2", Claims: claims("rotated-user")},
		{Name: "attacker-kid", Alg: "ES256", Key: "attacker", Claims: claims("victim")},
		{Name: "attacker-issuer-kid", Alg: "ES256", Key: "attacker", Kid: "ec256", Claims: claims("victim")},
		{Name: "dup-sub", Alg: "RS256", Key: "rsa", Payload: payload("attacker", `,"sub":"victim"`)},
		{Name: "case-sub", Alg: "RS256", Key: "rsa", Payload: payload("attacker", `,"SUB":"victim"`)},
		{Name: "escaped-dup-sub", Alg: "RS256", Key: "rsa", Payload: payload("attacker", `,"\u0073ub":"victim"`)},
		{Name: "kelvin-dup", Alg: "RS256", Key: "rsa", Payload: payload("attacker", `,"kid":1,"\u212aid":2`)},
		{Name: "nested-dup", Alg: "RS256", Key: "rsa", Payload: payload("attacker", `,"app_metadata":{"plan":"free","plan":"pro"}`)},
		{Name: "lone-surrogate", Alg: "RS256", Key: "rsa", Payload: payload(`victim\ud800`, "")},
		{Name: "payload-array", Alg: "RS256", Key: "rsa", Payload: `["victim"]`},
		{Name: "big", Alg: "RS256", Key: "rsa", Claims: claims("victim", "pad", strings.Repeat("x", 5500))},
		{Name: "oversize", Alg: "RS256", Key: "rsa", Claims: claims("victim", "pad", strings.Repeat("x", 6000))},
		{Name: "attacker", Alg: "RS256", Key: "rsa", Claims: claims("attacker")},
		{Name: "attacker-es256", Alg: "ES256", Key: "ec256", Claims: claims("attacker")},
		{Name: "victim", Alg: "RS256", Key: "rsa", Claims: claims("victim")},
		{Name: "victim-again", Alg: "RS256", Key: "rsa", Claims: claims("victim", "iat", T0.Unix()-30)},
	}
}

// minted mints the package's tokens once.
var minted jwttest.Minter

// mintAll mints every token of the package's tests once, with Python.
func mintAll(t testing.TB) *jwttest.Minted {
	t.Helper()
	return minted.Mint(t, secret, keys, func(trapURL string) []jwttest.Token {
		var specs []jwttest.Token
		for _, v := range validTokens {
			v.Claims = claims(v.Name)
			specs = append(specs, v)
		}
		return append(specs, attackTokens(trapURL)...)
	})
}

// newVerifier returns a Verifier for cfg on clock c. Unless cfg sets an
// issuer or audiences (an empty, non-nil list sets none), it checks the
// tests' issuer and audience.
func newVerifier(t testing.TB, cfg Config, c *storetest.Clock) *Verifier {
	t.Helper()
	if cfg.Issuer == "" && cfg.Audiences == nil {
		cfg.Issuer, cfg.Audiences = issuer, []string{audience}
	}
	cfg.Now = c.Now
	v, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// served returns a Verifier of the JWK set of names served by a new
// server, fetched once.
func served(t testing.TB, m *jwttest.Minted, c *storetest.Clock, cfg Config, names ...string) (*Verifier, *jwttest.Server) {
	t.Helper()
	srv := jwttest.NewServer(t, m.JWKS(names...))
	cfg.JWKSURL = srv.URL
	v := newVerifier(t, cfg, c)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	return v, srv
}

// runServed runs a Verifier, on clock c, of the JWK set of m's rsa key,
// served by a new server; Run has not fetched yet.
func runServed(t *testing.T, m *jwttest.Minted, c *storetest.Clock) (*Verifier, *jwttest.Server, *runner) {
	t.Helper()
	srv := jwttest.NewServer(t, m.JWKS("rsa"))
	v := newVerifier(t, Config{JWKSURL: srv.URL}, c)
	return v, srv, startRun(t, v)
}

// writeFile writes data to a file of the test's and returns its name.
func writeFile(t testing.TB, data []byte) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

// segments splits a compact token.
func segments(token string) (header, payload, sig string) {
	parts := strings.SplitN(token, ".", 3)
	for len(parts) < 3 {
		parts = append(parts, "")
	}
	return parts[0], parts[1], parts[2]
}

// b64 encodes a segment.
func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// unb64 decodes a segment.
func unb64(t testing.TB, s string) []byte {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withHeader returns token with its header replaced by the JSON text h,
// keeping its payload and signature.
func withHeader(token, h string) string {
	_, p, s := segments(token)
	return b64([]byte(h)) + "." + p + "." + s
}
