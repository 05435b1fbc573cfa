// Package jwttest is test support for verified identities: tokens minted
// by PyJWT with keys made by jwcrypto (an implementation other than the
// one sluice verifies with), minted once per test binary (Minter), the
// claims of valid tokens, a JWKS server that counts its fetches and can
// go down, a trap server that records whether anything contacted it, and
// forgeries made with the standard library (an attacker's key, HMAC over
// any header, ES256 signatures spelt another way).
//
// It is for tests only, and imports nothing of sluice.
package jwttest

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

//go:embed mint.py
var mintScript string

// Python returns the path of a python3 that imports jwt and jwcrypto
// (Debian: python3-jwt and python3-jwcrypto, which .ci/run installs).
// When there is none the test is skipped, or failed when the CI
// environment variable is set.
func Python(t testing.TB) string {
	t.Helper()
	candidates := []string{"/usr/bin/python3"}
	if p, err := exec.LookPath("python3"); err == nil {
		candidates = append(candidates, p)
	}
	for _, p := range candidates {
		if exec.Command(p, "-c", "import jwt, jwcrypto").Run() == nil {
			return p
		}
	}
	msg := "no python3 with PyJWT and jwcrypto; install them (Debian: apt-get install python3-jwt python3-jwcrypto), or run .ci/run, which does"
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set: this test may not be skipped)", msg)
	}
	t.Skipf("%s; skipping (this fails when CI is set)", msg)
	return ""
}

// Key is a key for Mint to make: its name is its kid. Type is "RSA"
// (2048 bits), "EC:P-256", "EC:P-384", "EC:P-521" or "Ed25519"; Alg, when
// set, is the JWK's own "alg".
type Key struct {
	Name, Type, Alg string
}

// Token is a token for Mint to sign.
type Token struct {
	Name string
	Alg  string
	// Key names the Key that signs it, or is "secret" for the HMAC secret.
	Key string
	// Kid is the header's kid: by default the key's name (none for the
	// secret); "-" for none.
	Kid string
	// Header holds more header members.
	Header map[string]any
	// Claims is the payload, serialised by Python's json; Payload, when
	// set, is the payload's exact bytes instead (a name given twice, say).
	Claims  map[string]any
	Payload string
}

// Minted is what Mint made.
type Minted struct {
	JWK    map[string]json.RawMessage // each key's public JWK, with "use": "sig"
	PEM    map[string]string          // each key's public key in PEM
	Tokens map[string]string          // each token by name
}

// Mint makes keys and signs tokens with Python, in one run.
func Mint(t testing.TB, secret string, keys []Key, tokens []Token) *Minted {
	t.Helper()
	python := Python(t)
	type tokenReq struct {
		Name    string         `json:"name"`
		Alg     string         `json:"alg"`
		Key     string         `json:"key"`
		Kid     *string        `json:"kid,omitempty"`
		Header  map[string]any `json:"header,omitempty"`
		Claims  map[string]any `json:"claims,omitempty"`
		Payload *string        `json:"payload,omitempty"`
	}
	type keyReq struct {
		Name string `json:"name"`
		Type string `json:"type"`
		Alg  string `json:"alg,omitempty"`
	}
	req := struct {
		Secret string     `json:"secret"`
		Keys   []keyReq   `json:"keys"`
		Tokens []tokenReq `json:"tokens"`
	}{Secret: secret, Keys: []keyReq{}, Tokens: []tokenReq{}}
	for _, k := range keys {
		req.Keys = append(req.Keys, keyReq(k))
	}
	for _, tk := range tokens {
		r := tokenReq{Name: tk.Name, Alg: tk.Alg, Key: tk.Key, Header: tk.Header, Claims: tk.Claims}
		switch tk.Kid {
		case "":
		case "-":
			r.Kid = new(string)
		default:
			r.Kid = &tk.Kid
		}
		if tk.Payload != "" {
			r.Payload = &tk.Payload
		} else if r.Claims == nil {
			r.Claims = map[string]any{}
		}
		req.Tokens = append(req.Tokens, r)
	}
	in, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "-c", mintScript)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("minting tokens with Python: %v\n%s", err, stderr.String())
	}
	var m Minted
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("reading what Python minted: %v", err)
	}
	return &m
}

// Minter mints a test package's keys and tokens once, with Python,
// however many of its tests ask; its zero value is ready to use. Its
// Trap, the server that the jku and x5u headers of tokens point at,
// lives as long as the test binary.
type Minter struct {
	once   sync.Once
	minted *Minted
	trap   *Trap
}

// Mint returns what Mint(t, secret, keys, tokens(the trap's URL)) made
// on the first call. It skips t (or fails it when the CI environment
// variable is set) when there is no Python, and fails t when the first
// call failed.
func (m *Minter) Mint(t testing.TB, secret string, keys []Key, tokens func(trap string) []Token) *Minted {
	t.Helper()
	Python(t) // skips (or fails in CI) before the Once
	m.once.Do(func() {
		m.trap = NewTrap(forever{t})
		m.minted = Mint(t, secret, keys, tokens(m.trap.URL))
	})
	if m.minted == nil {
		t.Fatal("minting failed in an earlier test")
	}
	return m.minted
}

// Trap returns the trap of the tokens Mint made (nil before Mint).
func (m *Minter) Trap() *Trap { return m.trap }

// forever is a testing.TB whose cleanups never run, for a server that
// outlives the test that started it.
type forever struct{ testing.TB }

func (forever) Cleanup(func()) {}

// Claims are the registered claims that make a token valid for a
// verifier: its issuer and audience, and when the tokens were issued and
// expire.
type Claims struct {
	Issuer, Audience  string
	IssuedAt, Expires time.Time
}

// For returns the claims of a valid token for sub, changed by the pairs
// of set: a claim's name and its value, nil deleting the claim.
func (c Claims) For(sub any, set ...any) map[string]any {
	m := map[string]any{"sub": sub, "iss": c.Issuer, "aud": c.Audience, "iat": c.IssuedAt.Unix(), "exp": c.Expires.Unix()}
	for i := 0; i+1 < len(set); i += 2 {
		if set[i+1] == nil {
			delete(m, set[i].(string))
		} else {
			m[set[i].(string)] = set[i+1]
		}
	}
	return m
}

// Text is For(sub) as exact JSON text, sub and more (members, each after
// a comma) written as they are before the closing brace: the payloads
// Python's json would not write (a name twice, 1e300, a lone surrogate).
func (c Claims) Text(sub, more string) string {
	return `{"sub":"` + sub + `","iss":"` + c.Issuer + `","aud":"` + c.Audience + `","iat":` + strconv.FormatInt(c.IssuedAt.Unix(), 10) +
		`,"exp":` + strconv.FormatInt(c.Expires.Unix(), 10) + more + `}`
}

// Attacks are tokens for the user "victim", valid by c but for their
// attack, that a verifier must refuse whatever it is in front of: from
// the wrong issuer or for the wrong audience, with a crit header, and
// signed with a key the issuer never published under the kid of one it
// did, alone and with jku or x5u pointing at trapURL. Their keys are
// named as a caller's must be: "rsa" and "ec" published, "evil" not.
func Attacks(c Claims, trapURL string) []Token {
	victim := c.For("victim")
	return []Token{
		{Name: "wrong-iss", Alg: "RS256", Key: "rsa", Claims: c.For("victim", "iss", "https://evil.example/")},
		{Name: "wrong-aud", Alg: "RS256", Key: "rsa", Claims: c.For("victim", "aud", "other")},
		{Name: "crit", Alg: "RS256", Key: "rsa", Header: map[string]any{"crit": []any{"exp"}}, Claims: victim},
		{Name: "jku", Alg: "ES256", Key: "evil", Kid: "ec", Header: map[string]any{"jku": trapURL + "/jwks.json"}, Claims: victim},
		{Name: "x5u", Alg: "ES256", Key: "evil", Kid: "ec", Header: map[string]any{"x5u": trapURL + "/cert.pem"}, Claims: victim},
		{Name: "evil-key", Alg: "ES256", Key: "evil", Kid: "ec", Claims: victim},
	}
}

// Token returns the token of this name, failing t when there is none.
func (m *Minted) Token(t testing.TB, name string) string {
	t.Helper()
	tok, ok := m.Tokens[name]
	if !ok {
		t.Fatalf("no token %q was minted", name)
	}
	return tok
}

// JWKS returns a JWK set of the public keys of these names.
func (m *Minted) JWKS(names ...string) []byte {
	set := struct {
		Keys []json.RawMessage `json:"keys"`
	}{Keys: []json.RawMessage{}}
	for _, n := range names {
		k, ok := m.JWK[n]
		if !ok {
			panic(fmt.Sprintf("jwttest: no key %q", n))
		}
		set.Keys = append(set.Keys, k)
	}
	b, _ := json.Marshal(set)
	return b
}

// Server serves a JWK set, counting the fetches.
type Server struct {
	*httptest.Server
	mu           sync.Mutex
	body         []byte
	down         bool
	cacheControl string
	fetches      atomic.Int64
	fetched      chan struct{} // one value per fetch answered
	answered     int64         // the values WaitFetches took; only it uses this
}

// NewServer serves jwks until the test ends.
func NewServer(t testing.TB, jwks []byte) *Server {
	s := &Server{body: jwks, fetched: make(chan struct{}, 1<<16)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { s.fetched <- struct{}{} }()
		s.fetches.Add(1)
		s.mu.Lock()
		body, down, cc := s.body, s.down, s.cacheControl
		s.mu.Unlock()
		if down {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		if cc != "" {
			w.Header().Set("Cache-Control", cc)
		}
		w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

// Set serves jwks from now on.
func (s *Server) Set(jwks []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.body = jwks
}

// SetDown makes the server answer 503 (down) or the JWK set again.
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// SetCacheControl sets the Cache-Control of the responses.
func (s *Server) SetCacheControl(cc string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cacheControl = cc
}

// Fetches returns how many requests the server answered.
func (s *Server) Fetches() int64 { return s.fetches.Load() }

// WaitFetches waits until the server has answered n requests in all,
// failing t after 10 seconds.
func (s *Server) WaitFetches(t testing.TB, n int64) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for s.answered < n {
		select {
		case <-s.fetched:
			s.answered++
		case <-timeout:
			t.Fatalf("the JWKS server answered %d requests, want %d", s.answered, n)
		}
	}
}

// Trap is a server that must never be contacted: it counts every
// connection and request.
type Trap struct {
	*httptest.Server
	hits atomic.Int64
}

// NewTrap starts a Trap until the test ends.
func NewTrap(t testing.TB) *Trap {
	tr := &Trap{}
	tr.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.hits.Add(1)
	}))
	tr.Server.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			tr.hits.Add(1)
		}
	}
	tr.Start()
	t.Cleanup(tr.Close)
	return tr
}

// Hits returns how many connections and requests reached the trap.
func (tr *Trap) Hits() int64 { return tr.hits.Load() }

// HS256 signs claims with secret in Go, for tests of what surrounds
// verification (the keys a token gives, the admin API, what logs show)
// that need a valid token without Python. Tests of verification itself use
// tokens Mint made, with another implementation than sluice's.
func HS256(t testing.TB, secret string, claims map[string]any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	return SignHS256([]byte(secret), `{"alg":"HS256","typ":"JWT"}`, payload)
}
