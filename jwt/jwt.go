// Package jwt verifies bearer tokens, so that sluice can count requests by
// who signed in: JWS verification of JSON Web Tokens (RFC 7515, 7519) in
// compact form, with keys from a JWKS URL, a JWKS file or an HMAC secret,
// and the refresh of those key sets.
//
// Nothing a token says about how to verify it is trusted: its "alg" must
// be allowed and fit the key it names, it never brings or points at a key
// of its own, and "crit" is refused. The signature itself is checked by
// go-jose (github.com/go-jose/go-jose/v4); this package decides which key
// and algorithm may check it, and what the verified claims say.
//
// A token, or any part of one, never appears in a log line, a metric or
// an error of this package.
//
// It imports only internal/jsontext of sluice (the JSON checks it shares
// with proxy/identity): the proxy reads the token and keys the verified
// claim (hashing.JWTKey), the gateway runs the key sets' refresh.
package jwt

import (
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	lru "github.com/hashicorp/golang-lru/v2"
	"go.uber.org/zap"
)

// Defaults and limits.
const (
	// MaxTokenBytes is the largest token Verify reads (8 KiB): far above a
	// real token, and a bound on the work an unverified one can cause.
	MaxTokenBytes = 8 << 10
	// DefaultLeeway is Config.Leeway's default: how far exp, nbf and iat
	// may be off, for clocks that disagree.
	DefaultLeeway = 30 * time.Second
	// DefaultRefresh is how often a JWKS URL is fetched when its response
	// says nothing of caching.
	DefaultRefresh = 10 * time.Minute
	// MinRefresh and MaxRefresh bound the refresh interval a JWKS
	// response's Cache-Control max-age asks for: no-cache, no-store or a
	// small max-age never make sluice fetch more often than once a minute,
	// and a long one never keeps a key the issuer removed for more than an
	// hour.
	MinRefresh = time.Minute
	MaxRefresh = time.Hour
	// EarlyRefreshGap is the least time between a refresh that a token with
	// an unknown "kid" asks for and the fetch before it, so that made-up
	// kids never flood the issuer.
	EarlyRefreshGap = 30 * time.Second
	// DefaultFetchTimeout bounds one fetch of a JWKS URL when Config.Client
	// is nil.
	DefaultFetchTimeout = 10 * time.Second
	// DefaultCacheSize is Config.CacheSize's default: how many verified
	// tokens are remembered.
	DefaultCacheSize = 10_000
	// maxUntargeted is how many keys a token without a "kid" is tried
	// against; a set with more keys of its algorithm needs the kid.
	maxUntargeted = 4
	// firstRetry and maxRetry are the waits after a failed fetch: 5 s,
	// doubled after each further failure, at most a minute.
	firstRetry = 5 * time.Second
	maxRetry   = time.Minute
)

// Off turns off an option that can be off (Config.Leeway,
// Config.CacheSize). It is not zero because zero means the option's
// default.
const Off = -1

// Config configures a Verifier. At least one of JWKSURL, JWKSFile and
// Secret is required; JWKSURL and JWKSFile exclude each other. Every other
// field documents its zero value.
type Config struct {
	// JWKSURL is fetched by Run: at once, then as often as its
	// Cache-Control says (DefaultRefresh without one, between MinRefresh
	// and MaxRefresh), and early when a token names an unknown kid. http
	// or https.
	JWKSURL string
	// JWKSFile is a JWK set read by New and again by Reload.
	JWKSFile string
	// Secret is the HMAC key of HS256, HS384 and HS512 tokens, its bytes
	// as they are; at least 32 bytes (HS256's hash length, RFC 7518
	// section 3.2).
	Secret []byte
	// Issuer, when set, is the only "iss" accepted. It is also part of
	// every key (see hashing.Hasher.JWTKey).
	Issuer string
	// Audiences, when set, are the values of which "aud" must hold one.
	Audiences []string
	// Algorithms are the allowed "alg" values. Empty means every algorithm
	// the configured keys can verify: RS256 to RS512, PS256 to PS512,
	// ES256, ES384, ES512 and EdDSA with a JWKS, and with a Secret the HS
	// algorithms its length allows. "none" is never allowed.
	Algorithms []string
	// Leeway is how far in the past exp, and in the future nbf and iat,
	// may be. Zero means DefaultLeeway; Off means none.
	Leeway time.Duration
	// Client fetches JWKSURL. Nil means an http.Client with a
	// DefaultFetchTimeout timeout.
	Client *http.Client
	// Now is the clock of exp, nbf, iat, the refresh schedule and the key
	// set's age. Nil means time.Now.
	Now func() time.Time
	// Logger logs refreshes and their failures. Nil means zap.NewNop().
	Logger *zap.Logger
	// Metrics counts verifications and refreshes. Nil counts nothing.
	Metrics *Metrics
	// CacheSize is how many valid tokens are remembered, so that a client
	// sending the same token again costs no signature check (see Verify).
	// Zero means DefaultCacheSize; Off remembers none.
	CacheSize int
}

// Verifier verifies bearer tokens. It is safe for simultaneous use by
// multiple goroutines. Run keeps the key set of a JWKS URL fresh; Reload
// re-reads a JWKS file.
type Verifier struct {
	jwksURL  string // "" without one
	urlLabel string // the URL for log lines: no user information, no query
	file     string
	secret   []byte
	issuer   string
	aud      []string
	allowed  []*algorithm
	leeway   time.Duration
	client   *http.Client
	now      func() time.Time
	log      *zap.Logger
	metrics  *Metrics

	set   atomic.Pointer[keySet]                  // the keys of the URL or the file; nil before the first
	cache *lru.Cache[[sha256.Size]byte, verified] // nil when off

	// nextEarly is the Unix nanosecond before which no early refresh may
	// start: EarlyRefreshGap after the start of the last fetch or of the
	// last early refresh asked for.
	nextEarly atomic.Int64
	kick      chan struct{} // asks Run for an early refresh

	fetched     chan struct{} // closed once the first fetch of the URL has ended
	fetchedOnce sync.Once

	fetchMu   sync.Mutex // one fetch or read at a time; guards the fields below
	lastFetch time.Time  // when the last fetch started; zero before the first
	wait      time.Duration
	failures  int

	// Seams for tests: the timer Run waits on, and a hook called after
	// every fetch or read with its error.
	after   func(time.Duration) (<-chan time.Time, func() bool)
	onFetch func(error)
}

// New returns a Verifier for cfg, having read cfg.JWKSFile if set, or an
// error that names every invalid field: errors.Join of one *ConfigError
// per problem, a JWKS file that cannot be read or holds no usable key
// among them. It starts nothing: Run fetches a JWKS URL.
func New(cfg Config) (*Verifier, error) {
	v := &Verifier{
		file:    cfg.JWKSFile,
		secret:  slices.Clone(cfg.Secret),
		issuer:  cfg.Issuer,
		aud:     slices.Clone(cfg.Audiences),
		leeway:  cfg.Leeway,
		client:  cfg.Client,
		now:     cfg.Now,
		log:     cfg.Logger,
		metrics: cfg.Metrics,
		kick:    make(chan struct{}, 1),
		fetched: make(chan struct{}),
		after:   timer,
		onFetch: func(error) {},
	}
	var errs []error
	problem := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)})
	}
	if cfg.JWKSURL == "" && cfg.JWKSFile == "" && len(cfg.Secret) == 0 {
		problem("", "a JWKS URL, a JWKS file or a secret is required")
	}
	if cfg.JWKSURL != "" && cfg.JWKSFile != "" {
		problem("", "a JWKS URL and a JWKS file exclude each other")
	}
	if cfg.JWKSURL != "" {
		u, err := url.Parse(cfg.JWKSURL)
		if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
			problem("JWKSURL", "expected an http or https URL")
		} else {
			v.jwksURL = cfg.JWKSURL
			v.urlLabel = (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
		}
	}
	if n := len(cfg.Secret); n > 0 && n < 32 {
		problem("Secret", "expected at least 32 bytes (the length of HS256's hash), got %d", n)
	}
	if strings.ContainsFunc(cfg.Issuer, isControl) {
		problem("Issuer", "expected no control characters")
	}
	for _, a := range cfg.Audiences {
		if a == "" || strings.ContainsFunc(a, isControl) {
			problem("Audiences", "expected a non-empty value without control characters")
			break
		}
	}
	if cfg.Leeway < 0 && cfg.Leeway != Off {
		problem("Leeway", "must be Off or not negative, got %v", cfg.Leeway)
	}
	if cfg.CacheSize < 0 && cfg.CacheSize != Off {
		problem("CacheSize", "must be Off or not negative, got %d", cfg.CacheSize)
	}
	jwks := cfg.JWKSURL != "" || cfg.JWKSFile != ""
	if len(cfg.Algorithms) == 0 {
		for _, a := range algorithms {
			if a.kind == kindHMAC && len(cfg.Secret) >= a.hmacMin || a.kind != kindHMAC && jwks {
				v.allowed = append(v.allowed, a)
			}
		}
	}
	for i, name := range cfg.Algorithms {
		a := algorithmNamed(name)
		switch {
		case strings.EqualFold(name, "none"):
			problem("Algorithms", `"none" is never allowed`)
		case a == nil:
			problem("Algorithms", "unknown algorithm %q (expected RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, EdDSA, HS256, HS384 or HS512)", name)
		case slices.Contains(cfg.Algorithms[:i], name):
			problem("Algorithms", "%s given twice", name)
		case a.kind == kindHMAC && len(cfg.Secret) == 0:
			problem("Algorithms", "%s needs a secret", name)
		case a.kind == kindHMAC && len(cfg.Secret) < a.hmacMin:
			problem("Algorithms", "%s needs a secret of at least %d bytes, got %d", name, a.hmacMin, len(cfg.Secret))
		case a.kind != kindHMAC && !jwks:
			problem("Algorithms", "%s needs a JWKS URL or file", name)
		default:
			v.allowed = append(v.allowed, a)
		}
	}
	switch v.leeway {
	case 0:
		v.leeway = DefaultLeeway
	case Off:
		v.leeway = 0
	}
	if v.client == nil {
		v.client = &http.Client{Timeout: DefaultFetchTimeout}
	}
	if v.now == nil {
		v.now = time.Now
	}
	if v.log == nil {
		v.log = zap.NewNop()
	}
	if v.file != "" && cfg.JWKSURL == "" {
		if err := v.readKeyFile(); err != nil {
			errs = append(errs, &ConfigError{Field: "JWKSFile", Problem: err.Error(), Err: err})
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.CacheSize != Off {
		c, err := lru.New[[sha256.Size]byte, verified](cmp.Or(cfg.CacheSize, DefaultCacheSize))
		if err != nil {
			return nil, fmt.Errorf("jwt: cache: %w", err)
		}
		v.cache = c
	}
	if v.jwksURL == "" {
		v.fetchedOnce.Do(func() { close(v.fetched) })
	}
	v.metrics.attach(v)
	return v, nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || 0x80 <= r && r < 0xa0 }

// Issuer returns Config.Issuer: the issuer every token is checked against
// ("" for any), which is part of every key of a claim.
func (v *Verifier) Issuer() string { return v.issuer }

// ConfigError is one problem New found in a Config: the field it is
// about, and what is wrong with it in words that do not name the field, so
// that a caller can name its own setting instead ("SLUICE_JWT_SECRET:
// expected at least 32 bytes ...").
type ConfigError struct {
	// Field is the name of the Config field: JWKSURL, JWKSFile, Secret,
	// Issuer, Audiences, Algorithms, Leeway or CacheSize; "" for a
	// problem of the key sources together (none given, or a URL and a
	// file).
	Field   string
	Problem string
	Err     error // the cause, for a JWKS file that could not be read; else nil
}

// fieldNames are the words ConfigError.Error names each field with.
var fieldNames = map[string]string{
	"JWKSURL": "JWKS URL", "JWKSFile": "JWKS file", "Secret": "secret", "Issuer": "issuer",
	"Audiences": "audience", "Algorithms": "algorithms", "Leeway": "leeway", "CacheSize": "cache size",
}

func (e *ConfigError) Error() string {
	if e.Field == "" {
		return "jwt: " + e.Problem
	}
	return "jwt: " + fieldNames[e.Field] + ": " + e.Problem
}

func (e *ConfigError) Unwrap() error { return e.Err }

// Sources describes where the keys come from, for display (check-config):
// "JWKS URL https://host/path" (without user information, query or
// fragment), "JWKS file /path" and "HMAC secret", in that order. It never
// shows a key or the secret.
func (v *Verifier) Sources() []string {
	var out []string
	if v.jwksURL != "" {
		out = append(out, "JWKS URL "+v.urlLabel)
	}
	if v.file != "" {
		out = append(out, "JWKS file "+v.file)
	}
	if len(v.secret) > 0 {
		out = append(out, "HMAC secret")
	}
	return out
}

// FirstFetch returns a channel closed once the first fetch of the JWKS
// URL (by Run or Refresh) has ended, whether it put a key set in force or
// failed; without a JWKS URL it is closed from the start. A gateway waits
// on it at start-up, within its own deadline.
func (v *Verifier) FirstFetch() <-chan struct{} { return v.fetched }

// HasKeySet reports whether a key set of the JWKS URL or file is in force.
// Until one is, only the secret's HMAC tokens can verify, and every other
// token fails as UnknownKey.
func (v *Verifier) HasKeySet() bool { return v.set.Load() != nil }

// Algorithms returns the allowed algorithms, for display.
func (v *Verifier) Algorithms() []string {
	names := make([]string, len(v.allowed))
	for i, a := range v.allowed {
		names[i] = a.name
	}
	return names
}

// Verify verifies token, a JWS in compact serialization (the credentials
// of "Authorization: Bearer"); "" means the request had none. It returns
// the token's claims when the result is Valid, and nil otherwise.
//
// A token is valid when: it is at most MaxTokenBytes of base64url in
// three canonical segments; its header and payload are JSON objects with
// distinct member names (see decodeObject); its header names no critical
// extension and carries no key and no key URL ("jwk", "jku", "x5u",
// "x5c"); its "alg" is allowed and fits a key (see Result); the signature
// verifies with that key; its payload is a JSON object too; "iss" is the
// Issuer and "aud" holds one of the Audiences when those are set; "exp" is
// a number not past by more than the leeway, "nbf" and "iat", when
// present, numbers not ahead by more than it. The result says which check
// failed first, in that order.
//
// A token whose kid no key has fails as UnknownKey at once, and asks Run
// for an early refresh: a request never waits on a fetch.
//
// A valid token is remembered (Config.CacheSize, by its SHA-256), so that
// the same token again costs no parsing and no signature check. A
// remembered token counts only while the key set that verified it is in
// force (the secret always is) and while its exp, nbf and iat still hold
// at the time of the new request; otherwise it is verified afresh. So a
// key removed from the set stops verifying at once, as without the cache.
func (v *Verifier) Verify(token string) (*Claims, Result) {
	var sum [sha256.Size]byte
	if v.cache != nil && token != "" && len(token) <= MaxTokenBytes {
		sum = sha256.Sum256([]byte(token))
		if c, ok := v.remembered(sum); ok {
			v.metrics.count(Valid)
			return c, Valid
		}
	}
	c, r, e := v.verify(token)
	if r == Valid && v.cache != nil {
		v.cache.Add(sum, e)
	}
	v.metrics.count(r)
	return c, r
}

// verified is a valid token as the cache remembers it: its claims, the
// key set that verified it (nil for the secret), and the instants, in
// seconds since the epoch and with the leeway, from which and until which
// it is valid.
type verified struct {
	claims    *Claims
	set       *keySet
	notBefore float64 // max(nbf, iat) − leeway; −Inf without either
	until     float64 // exp + leeway
}

// remembered returns the claims of the token of this SHA-256 if the cache
// holds it and it is still valid now.
func (v *Verifier) remembered(sum [sha256.Size]byte) (*Claims, bool) {
	e, ok := v.cache.Get(sum)
	if !ok {
		return nil, false
	}
	now := float64(v.now().UnixNano()) / 1e9
	if e.set != nil && e.set != v.set.Load() || now >= e.until || now < e.notBefore {
		v.cache.Remove(sum)
		return nil, false
	}
	return e.claims, true
}

// refusedHeaders are the header parameters whose presence makes a token
// malformed: "crit" (RFC 7515 section 4.1.11 lets a verifier refuse what
// it does not understand, and sluice understands no extension), the key
// and key URLs a token may carry (a token never chooses its own key, and
// sluice never fetches a URL a client wrote), "b64" (RFC 7797's unencoded
// payloads), and the JWE parameters "enc" and "zip".
var refusedHeaders = []string{"crit", "jwk", "jku", "x5u", "x5c", "b64", "enc", "zip"}

var segment = base64.RawURLEncoding.Strict()

// verify verifies token without the cache: its claims and what the cache
// would remember of it when it is valid.
func (v *Verifier) verify(token string) (*Claims, Result, verified) {
	c, res, e := v.verifyToken(token)
	if res != Valid {
		return nil, res, verified{}
	}
	return c, res, e
}

func (v *Verifier) verifyToken(token string) (*Claims, Result, verified) {
	var none verified
	if token == "" {
		return nil, Missing, none
	}
	if len(token) > MaxTokenBytes || !tokenChars(token) {
		return nil, Malformed, none
	}
	// Exactly three segments: a JWE (five) or anything else is refused.
	h, rest, _ := strings.Cut(token, ".")
	p, s, ok := strings.Cut(rest, ".")
	if !ok || strings.IndexByte(s, '.') >= 0 {
		return nil, Malformed, none
	}
	// Canonical base64url only, so that no token has a second spelling.
	// go-jose decodes the same segments again, to the same bytes.
	rawHeader, err := segment.DecodeString(h)
	if err != nil {
		return nil, Malformed, none
	}
	if _, err := segment.DecodeString(p); err != nil {
		return nil, Malformed, none
	}
	sig, err := segment.DecodeString(s)
	if err != nil {
		return nil, Malformed, none
	}
	header, ok := decodeObject(rawHeader)
	if !ok {
		return nil, Malformed, none
	}
	for _, name := range refusedHeaders {
		if _, present := header[name]; present {
			return nil, Malformed, none
		}
	}
	algName, ok := header["alg"].(string)
	if !ok {
		return nil, Malformed, none
	}
	kid, hasKid := header["kid"].(string)
	if _, present := header["kid"]; present && !hasKid {
		return nil, Malformed, none
	}
	a := v.allowedAlgorithm(algName)
	if a == nil {
		return nil, AlgorithmRefused, none
	}
	if len(sig) == 0 {
		return nil, Malformed, none // a stripped signature
	}
	var buf [maxUntargeted]any
	keys, set, res := v.keysFor(a, kid, hasKid, buf[:0])
	if res != Valid {
		return nil, res, none
	}
	jws, err := parseSigned(token, a)
	if err != nil {
		return nil, Malformed, none
	}
	var payload []byte
	for _, k := range keys {
		if payload, err = jws.Verify(k); err == nil {
			break
		}
	}
	if err != nil {
		return nil, BadSignature, none
	}
	// The claims are read from the bytes the signature covers, as go-jose
	// returned them.
	m, ok := decodeObject(payload)
	if !ok {
		return nil, Malformed, none
	}
	c := &Claims{m: m}
	e, res := v.checkClaims(c)
	e.claims, e.set = c, set
	return c, res, e
}

// parseSigned parses token with go-jose, allowing algorithm a only.
func parseSigned(token string, a *algorithm) (*jose.JSONWebSignature, error) {
	return jose.ParseSignedCompact(token, a.allowed)
}

// tokenChars reports whether s holds only base64url characters and dots.
func tokenChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// allowedAlgorithm returns the allowed algorithm of this exact name, or
// nil ("none" is never allowed).
func (v *Verifier) allowedAlgorithm(name string) *algorithm {
	for _, a := range v.allowed {
		if a.name == name {
			return a
		}
	}
	return nil
}

// keysFor appends to dst the keys that may verify a token of algorithm a
// and, when hasKid, key id kid: the secret for an HMAC algorithm (a kid
// is then ignored: the secret is the one HMAC key), else the keys of the
// set with that kid, or without a kid every key, that fit a. It returns
// the key set they come from (nil for the secret). Its result is Valid
// when there are keys to try.
func (v *Verifier) keysFor(a *algorithm, kid string, hasKid bool, dst []any) ([]any, *keySet, Result) {
	if a.kind == kindHMAC {
		if len(v.secret) < a.hmacMin {
			return nil, nil, AlgorithmRefused
		}
		return append(dst, v.secret), nil, Valid
	}
	set := v.set.Load()
	if set == nil || len(set.keys) == 0 {
		v.refreshSoon()
		return nil, nil, UnknownKey
	}
	named := false
	for i := range set.keys {
		k := &set.keys[i]
		if hasKid && k.kid != kid {
			continue
		}
		named = true
		if !k.fits(a) {
			continue
		}
		if len(dst) == maxUntargeted {
			if hasKid {
				break // a set that repeats a kid this often gets the first few tried
			}
			return nil, nil, UnknownKey
		}
		dst = append(dst, k.pub)
	}
	switch {
	case hasKid && !named:
		v.refreshSoon()
		return nil, nil, UnknownKey
	case len(dst) == 0:
		return nil, nil, AlgorithmRefused
	}
	return dst, set, Valid
}

// checkClaims checks the claims of a verified token: iss, aud, then exp,
// nbf and iat. It returns when the token is valid, as the cache keeps it.
func (v *Verifier) checkClaims(c *Claims) (verified, Result) {
	var e verified
	if v.issuer != "" {
		if iss, _ := c.m["iss"].(string); iss != v.issuer {
			return e, WrongIssuer
		}
	}
	if len(v.aud) > 0 && !v.audienceMatches(c.m["aud"]) {
		return e, WrongAudience
	}
	now := float64(v.now().UnixNano()) / 1e9
	leeway := v.leeway.Seconds()
	exp, present, ok := c.number("exp")
	if !present || !ok {
		return e, Malformed
	}
	if e.until = exp + leeway; now >= e.until {
		return e, Expired
	}
	e.notBefore = math.Inf(-1)
	for _, name := range [...]string{"nbf", "iat"} {
		t, present, ok := c.number(name)
		switch {
		case !present:
		case !ok:
			return e, Malformed
		case t > now+leeway:
			return e, NotYetValid
		default:
			e.notBefore = max(e.notBefore, t-leeway)
		}
	}
	return e, Valid
}

// audienceMatches reports whether aud, a string or an array of strings
// (RFC 7519 section 4.1.3), holds one of the configured audiences.
func (v *Verifier) audienceMatches(aud any) bool {
	switch aud := aud.(type) {
	case string:
		return slices.Contains(v.aud, aud)
	case []any:
		for _, a := range aud {
			if s, ok := a.(string); ok && slices.Contains(v.aud, s) {
				return true
			}
		}
	}
	return false
}

// timer is the production Verifier.after.
func timer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// readFile reads at most maxJWKSBytes+1 bytes of a JWKS file.
func readFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readLimited(f)
}
