package jwt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/jwt/jwttest"
)

// runner runs a Verifier's Run loop on timers the test fires, and hears of
// every fetch it makes. Nothing waits for time to pass: the test's clock
// moves when the test moves it.
type runner struct {
	timers  chan timerReq
	fetched chan error
}

type timerReq struct {
	d    time.Duration
	fire chan time.Time
}

// startRun starts v.Run until the test ends.
func startRun(t *testing.T, v *Verifier) *runner {
	t.Helper()
	r := &runner{timers: make(chan timerReq, 100), fetched: make(chan error, 100)}
	v.onFetch = func(err error) { r.fetched <- err }
	v.after = func(d time.Duration) (<-chan time.Time, func() bool) {
		fire := make(chan time.Time, 1)
		r.timers <- timerReq{d, fire}
		return fire, func() bool { return true }
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		v.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return r
}

// timer returns the next timer Run waits on.
func (r *runner) timer(t *testing.T) timerReq {
	t.Helper()
	return receive(t, r.timers, "Run set no timer")
}

// fetch waits for Run's next fetch and returns its error.
func (r *runner) fetch(t *testing.T) error {
	t.Helper()
	return receive(t, r.fetched, "Run made no fetch")
}

// receive returns the next value on c, failing t with msg when none
// comes within 10 s: Run's goroutine sends it.
func receive[T any](t *testing.T, c <-chan T, msg string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal(msg)
	}
	var zero T
	return zero
}

// noFetch checks that Run has made no fetch that the test has not seen
// (the tests check the server's count of fetches too).
func (r *runner) noFetch(t *testing.T) {
	t.Helper()
	select {
	case err := <-r.fetched:
		t.Fatalf("an unexpected fetch (%v)", err)
	default:
	}
}

// TestRunRotation: Run fetches the set at once; a token of a key added
// later names an unknown kid, which starts an early refresh (once
// EarlyRefreshGap has passed since the last fetch), after which it
// verifies; a key removed from the set stops verifying at the next
// refresh.
func TestRunRotation(t *testing.T) {
	m, c := mintAll(t), newClock()
	v, srv, r := runServed(t, m, c)
	if tr := r.timer(t); tr.d != 0 {
		t.Fatalf("first wait %v, want none", tr.d)
	} else {
		tr.fire <- c.Now()
	}
	if err := r.fetch(t); err != nil {
		t.Fatal(err)
	}
	if tr := r.timer(t); tr.d != DefaultRefresh {
		t.Fatalf("wait after a fetch without Cache-Control: %v, want %v", tr.d, DefaultRefresh)
	}
	check(t, v, []verdict{{"old key", m.Token(t, "victim"), Valid}})

	// The issuer adds rsa2 and signs with it.
	srv.Set(m.JWKS("rsa", "rsa2"))
	rotated := m.Token(t, "rotated")
	check(t, v, []verdict{{"new key, too soon after the fetch", rotated, UnknownKey}})
	r.noFetch(t)
	c.Advance(EarlyRefreshGap)
	check(t, v, []verdict{{"new key, the gap passed", rotated, UnknownKey}})
	if err := r.fetch(t); err != nil {
		t.Fatal(err)
	}
	tr := r.timer(t)
	check(t, v, []verdict{{"new key after the refresh", rotated, Valid}, {"old key still", m.Token(t, "victim"), Valid}})

	// The issuer removes rsa: at the next scheduled refresh its tokens stop.
	srv.Set(m.JWKS("rsa2"))
	c.Advance(tr.d)
	tr.fire <- c.Now()
	if err := r.fetch(t); err != nil {
		t.Fatal(err)
	}
	r.timer(t)
	check(t, v, []verdict{{"removed key", m.Token(t, "victim"), UnknownKey}, {"new key", rotated, Valid}})
	if got := srv.Fetches(); got != 3 {
		t.Errorf("%d fetches, want 3", got)
	}
}

// TestRunSchedule: the wait after a fetch is what Cache-Control asks,
// bounded; after failures, 5 s doubling to a minute; a success restores
// the schedule.
func TestRunSchedule(t *testing.T) {
	m, c := mintAll(t), newClock()
	v, srv, r := runServed(t, m, c)
	srv.SetCacheControl("public, max-age=300, stale-while-revalidate=60") // before the first fetch
	step := func(want time.Duration, wantErr bool) {
		t.Helper()
		tr := r.timer(t)
		if tr.d != want {
			t.Fatalf("wait %v, want %v", tr.d, want)
		}
		c.Advance(tr.d)
		tr.fire <- c.Now()
		if err := r.fetch(t); (err != nil) != wantErr {
			t.Fatalf("fetch error %v, want one: %v", err, wantErr)
		}
	}
	step(0, false)
	srv.SetDown(true)
	step(300*time.Second, true)
	for _, d := range []time.Duration{5, 10, 20, 40, 60, 60} {
		step(d*time.Second, true)
	}
	srv.SetDown(false)
	srv.SetCacheControl("no-cache")
	step(time.Minute, false)
	srv.SetCacheControl("max-age=86400")
	step(MinRefresh, false)
	if tr := r.timer(t); tr.d != MaxRefresh {
		t.Fatalf("wait %v after max-age=86400, want %v", tr.d, MaxRefresh)
	}
	check(t, v, []verdict{{"token", m.Token(t, "victim"), Valid}})
}

func TestRefreshInterval(t *testing.T) {
	for _, tt := range []struct {
		cc   []string
		want time.Duration
	}{
		{nil, DefaultRefresh},
		{[]string{"public"}, DefaultRefresh},
		{[]string{"max-age=300"}, 5 * time.Minute},
		{[]string{"public, MAX-AGE = 900 , must-revalidate"}, 15 * time.Minute},
		{[]string{`max-age="600"`}, 10 * time.Minute},
		{[]string{"max-age=15, stale-if-error=86400"}, MinRefresh},
		{[]string{"max-age=0"}, MinRefresh},
		{[]string{"max-age=99999999999999999999"}, DefaultRefresh}, // unreadable: ignored
		{[]string{"max-age=86400"}, MaxRefresh},
		{[]string{"max-age=-5"}, DefaultRefresh},
		{[]string{"no-store"}, MinRefresh},
		{[]string{"max-age=900", "no-cache"}, MinRefresh},
	} {
		h := http.Header{"Cache-Control": tt.cc}
		if got := refreshInterval(h); got != tt.want {
			t.Errorf("refreshInterval(%q) = %v, want %v", tt.cc, got, tt.want)
		}
	}
}

// TestRunJWKSDown: when the JWKS server goes down, the last good keys keep
// verifying, a WARN line and the error counter say so, and the age of the
// set grows; when it comes back, the set is fresh again.
func TestRunJWKSDown(t *testing.T) {
	m := mintAll(t)
	c := newClock()
	core, logs := observer.New(zap.WarnLevel)
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	srv := jwttest.NewServer(t, m.JWKS("rsa", "ec256"))
	v := newVerifier(t, Config{JWKSURL: srv.URL, Logger: zap.New(core), Metrics: metrics}, c)
	if got := proctest.Metric(t, reg, "sluice_jwt_jwks_age_seconds"); !math.IsInf(got, 1) {
		t.Errorf("age before the first fetch: %v, want +Inf", got)
	}
	r := startRun(t, v)
	r.timer(t).fire <- c.Now()
	if err := r.fetch(t); err != nil {
		t.Fatal(err)
	}
	srv.SetDown(true)
	c.Advance(DefaultRefresh)
	tr := r.timer(t)
	tr.fire <- c.Now()
	if err := r.fetch(t); err == nil || !strings.Contains(err.Error(), "status 503") {
		t.Fatalf("fetch from a server that is down: %v", err)
	}
	check(t, v, []verdict{
		{"RS256 on the last good set", m.Token(t, "victim"), Valid},
		{"ES256 on the last good set", m.Token(t, "ES256"), Valid},
	})
	if got := proctest.Metric(t, reg, "sluice_jwt_jwks_age_seconds"); got != DefaultRefresh.Seconds() {
		t.Errorf("age %v, want %v", got, DefaultRefresh.Seconds())
	}
	if got := counterValue(t, reg, "sluice_jwt_jwks_refreshes_total", "error"); got != 1 {
		t.Errorf("refresh errors %v, want 1", got)
	}
	if got := counterValue(t, reg, "sluice_jwt_jwks_refreshes_total", "ok"); got != 1 {
		t.Errorf("refreshes %v, want 1", got)
	}
	entries := logs.FilterMessage("JWKS refresh failed; the last good key set stays in force").All()
	if len(entries) != 1 {
		t.Fatalf("%d WARN lines about the failure, want 1: %v", len(entries), logs.All())
	}
	if f := entries[0].ContextMap(); f["keys_in_force"] != int64(2) || f["source"] != srv.URL {
		t.Errorf("log fields %v", f)
	}

	// Back up.
	srv.SetDown(false)
	tr = r.timer(t)
	c.Advance(tr.d)
	tr.fire <- c.Now()
	if err := r.fetch(t); err != nil {
		t.Fatal(err)
	}
	if got := proctest.Metric(t, reg, "sluice_jwt_jwks_age_seconds"); got != 0 {
		t.Errorf("age after a good fetch %v, want 0", got)
	}
}

// TestRunUnknownKidFlood: a flood of tokens with made-up kids costs the
// issuer at most one fetch per EarlyRefreshGap, and no request waits on
// one.
func TestRunUnknownKidFlood(t *testing.T) {
	m, c := mintAll(t), newClock()
	v, srv, r := runServed(t, m, c)
	r.timer(t).fire <- c.Now()
	if err := r.fetch(t); err != nil {
		t.Fatal(err)
	}
	r.timer(t)
	victim := m.Token(t, "victim")
	flood := func(round int) {
		t.Helper()
		for i := range 1000 {
			tok := withHeader(victim, fmt.Sprintf(`{"alg":"RS256","kid":"made-up-%d-%d"}`, round, i))
			if _, res := v.Verify(tok); res != UnknownKey {
				t.Fatalf("made-up kid: %v", res)
			}
		}
	}
	flood(0) // within the gap after the first fetch: no refresh at all
	r.noFetch(t)
	if got := srv.Fetches(); got != 1 {
		t.Fatalf("%d fetches after a flood within the gap, want 1", got)
	}
	for round := 1; round <= 3; round++ {
		c.Advance(EarlyRefreshGap)
		flood(round)
		if err := r.fetch(t); err != nil {
			t.Fatal(err)
		}
		r.timer(t)
		c.Advance(EarlyRefreshGap / 2)
		flood(round + 10)
		r.noFetch(t)
		if got := srv.Fetches(); got != int64(1+round) {
			t.Fatalf("round %d: %d fetches, want %d", round, got, 1+round)
		}
	}
	select {
	case tr := <-r.timers:
		t.Fatalf("Run set a timer (%v) without a fetch", tr.d)
	default:
	}
}

// TestRefreshErrors: a failed fetch says why, without the URL's password
// or query, and keeps the set.
func TestRefreshErrors(t *testing.T) {
	m := mintAll(t)
	c := newClock()
	srv := jwttest.NewServer(t, m.JWKS("rsa"))
	u := strings.Replace(srv.URL, "http://", "http://user:hunter2@", 1) + "/jwks.json?token=s3cret"
	v := newVerifier(t, Config{JWKSURL: u}, c)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		body string
		want string
	}{
		{`{"keys":[]}`, "no usable signature key"},
		{`not json`, "not a JSON object"},
		{`{"keys":{}}`, `no "keys" array`},
		{`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`, "no usable signature key"},
		{strings.Repeat(" ", maxJWKSBytes+1), "larger than"},
	} {
		srv.Set([]byte(tt.body))
		err := v.Refresh(context.Background())
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("body %.30q: %v, want %q", tt.body, err, tt.want)
		}
		if err != nil && (strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cret")) {
			t.Errorf("the error shows the URL's secrets: %v", err)
		}
		check(t, v, []verdict{{"last good set", m.Token(t, "victim"), Valid}})
	}
	srv.Close()
	err := v.Refresh(context.Background())
	if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("unreachable server: %v", err)
	}
}

// TestReloadFile: a JWKS file is read by New and again by Reload; a file
// that no longer reads keeps the last good set.
func TestReloadFile(t *testing.T) {
	m := mintAll(t)
	name := writeFile(t, m.JWKS("rsa"))
	reg := prometheus.NewRegistry()
	v := newVerifier(t, Config{JWKSFile: name, Metrics: NewMetrics(reg)}, newClock())
	check(t, v, []verdict{{"rsa", m.Token(t, "victim"), Valid}, {"rsa2", m.Token(t, "rotated"), UnknownKey}})
	must(0, os.WriteFile(name, m.JWKS("rsa2"), 0o600))
	check(t, v, []verdict{{"rsa before the reload", m.Token(t, "victim"), Valid}})
	if err := v.Reload(); err != nil {
		t.Fatal(err)
	}
	check(t, v, []verdict{{"rsa removed", m.Token(t, "victim"), UnknownKey}, {"rsa2 added", m.Token(t, "rotated"), Valid}})
	must(0, os.WriteFile(name, []byte(`{"keys":[`), 0o600))
	if err := v.Reload(); err == nil {
		t.Fatal("a broken file reloaded")
	}
	check(t, v, []verdict{{"last good set", m.Token(t, "rotated"), Valid}})
	if err := os.Remove(name); err != nil {
		t.Fatal(err)
	}
	if err := v.Reload(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing file: %v", err)
	}
	if ok, bad := counterValue(t, reg, "sluice_jwt_jwks_refreshes_total", "ok"), counterValue(t, reg, "sluice_jwt_jwks_refreshes_total", "error"); ok != 2 || bad != 2 {
		t.Errorf("refreshes ok %v error %v, want 2 and 2", ok, bad)
	}
	// New refuses a file it cannot read.
	if _, err := New(Config{JWKSFile: name}); err == nil {
		t.Error("New read a missing file")
	}
}

// TestParseJWKS: keys sluice must not use are left out, each with its
// reason.
func TestParseJWKS(t *testing.T) {
	m := mintAll(t)
	jwk := func(name string, set ...any) json.RawMessage {
		k := map[string]any{}
		must(0, json.Unmarshal(m.JWK[name], &k))
		for i := 0; i+1 < len(set); i += 2 {
			if set[i+1] == nil {
				delete(k, set[i].(string))
			} else {
				k[set[i].(string)] = set[i+1]
			}
		}
		return must(json.Marshal(k))
	}
	small := `{"kty":"RSA","kid":"small","n":"` + b64(make([]byte, 128)) + `","e":"AQAB"}`
	small = strings.Replace(small, `"n":"AAAA`, `"n":"wAAA`, 1)
	set := `{"keys":[` + strings.Join([]string{
		string(jwk("rsa")),
		string(jwk("ec256", "use", "enc")),
		string(jwk("ed", "key_ops", []any{"sign"})),
		`{"kty":"oct","kid":"hmac","k":"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"}`,
		string(jwk("ec384", "d", "AAAA")),
		small,
		string(jwk("ec521", "alg", "ES256")),
		string(jwk("rsa2", "alg", "HS256")),
		`{"kty":"EC","crv":"secp256k1","kid":"k1","x":"AAAA","y":"AAAA"}`,
		`"not an object"`,
		string(jwk("ec256", "kid", "ok-ec", "key_ops", []any{"verify"})),
	}, ",") + `]}`
	keys, skipped, err := parseJWKS([]byte(set))
	if err != nil {
		t.Fatal(err)
	}
	var kids []string
	for _, k := range keys {
		kids = append(kids, k.kid)
	}
	if got := strings.Join(kids, ","); got != "rsa,ok-ec" {
		t.Errorf("keys %s, want rsa,ok-ec", got)
	}
	want := []string{
		`key 1: kid "ec256": not a signature key (use "enc")`,
		`key 2: kid "ed": key_ops does not allow verify`,
		`key 3: kid "hmac": a symmetric (oct) key; HMAC keys come from the secret, never from a JWK set`,
		`key 4: kid "ec384": `,
		`key 5: kid "small": an RSA key of 1024 bits, fewer than 2048`,
		`key 6: kid "ec521": alg "ES256" does not fit the key`,
		`key 7: kid "rsa2": alg "HS256" does not fit the key`,
		`key 8: kid "k1": `,
		`key 9: not a JSON object`,
	}
	if len(skipped) != len(want) {
		t.Fatalf("skipped %q, want %d", skipped, len(want))
	}
	for i := range want {
		if !strings.HasPrefix(skipped[i], want[i]) {
			t.Errorf("skipped[%d] = %q, want %q...", i, skipped[i], want[i])
		}
	}
	// Duplicate member names make the set unreadable.
	if _, _, err := parseJWKS([]byte(`{"keys":[],"keys":[` + string(jwk("rsa")) + `]}`)); err == nil {
		t.Error("a set with keys twice was read")
	}
}

// TestNewErrors: every invalid field is named, all at once.
func TestNewErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"nothing", Config{}, []string{"jwt: a JWKS URL, a JWKS file or a secret is required"}},
		{"url and file", Config{JWKSURL: "https://a/", JWKSFile: "/nonexistent"}, []string{"jwt: a JWKS URL and a JWKS file exclude each other"}},
		{"bad url", Config{JWKSURL: "ftp://a/jwks"}, []string{"jwt: JWKS URL: expected an http or https URL"}},
		{"relative url", Config{JWKSURL: "/jwks"}, []string{"jwt: JWKS URL: expected an http or https URL"}},
		{"short secret", Config{Secret: []byte("short")}, []string{"jwt: secret: expected at least 32 bytes (the length of HS256's hash), got 5"}},
		{"issuer", Config{Secret: []byte(secret), Issuer: "a\x00b"}, []string{"jwt: issuer: expected no control characters"}},
		{"audience", Config{Secret: []byte(secret), Audiences: []string{"a", ""}}, []string{"jwt: audience: expected a non-empty value without control characters"}},
		{"leeway", Config{Secret: []byte(secret), Leeway: -2}, []string{"jwt: leeway: must be Off or not negative, got -2ns"}},
		{"cache size", Config{Secret: []byte(secret), CacheSize: -2}, []string{"jwt: cache size: must be Off or not negative, got -2"}},
		{"algorithms", Config{Secret: []byte(secret[:40]), Algorithms: []string{"none", "RS1", "HS256", "HS256", "HS512", "RS256"}}, []string{
			`jwt: algorithms: "none" is never allowed`,
			`jwt: algorithms: unknown algorithm "RS1" (expected RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, EdDSA, HS256, HS384 or HS512)`,
			"jwt: algorithms: HS256 given twice",
			"jwt: algorithms: HS512 needs a secret of at least 64 bytes, got 40",
			"jwt: algorithms: RS256 needs a JWKS URL or file",
		}},
		{"hs without secret", Config{JWKSURL: "https://a/jwks", Algorithms: []string{"HS256"}}, []string{"jwt: algorithms: HS256 needs a secret"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v, err := New(tt.cfg)
			if err == nil || v != nil {
				t.Fatalf("New = %v, %v", v, err)
			}
			if got := err.Error(); got != strings.Join(tt.want, "\n") {
				t.Errorf("error\n%s\nwant\n%s", got, strings.Join(tt.want, "\n"))
			}
		})
	}
}

// TestNewConfigErrors: each problem is a *ConfigError naming its field,
// so that a gateway can name its own settings; a JWKS file that cannot be
// read is one of them, reported with the others, its cause kept.
func TestNewConfigErrors(t *testing.T) {
	_, err := New(Config{JWKSFile: filepath.Join(t.TempDir(), "missing.json"), Secret: []byte("short"), Algorithms: []string{"RS1"}})
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ce *ConfigError
		if !errors.As(e, &ce) {
			t.Fatalf("%v is no *ConfigError", e)
		}
		fields = append(fields, ce.Field)
		if strings.Contains(ce.Problem, fieldNames[ce.Field]+":") {
			t.Errorf("the problem %q names its field", ce.Problem)
		}
	}
	if got := strings.Join(fields, " "); got != "Secret Algorithms JWKSFile" {
		t.Errorf("fields %s, want Secret Algorithms JWKSFile", got)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the missing file's cause is lost: %v", err)
	}
	if !strings.Contains(err.Error(), "jwt: JWKS file: open ") {
		t.Errorf("error %q", err)
	}
	// A file holding no usable key is a problem of the file too.
	_, err = New(Config{JWKSFile: writeFile(t, []byte(`{"keys":[]}`))})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "JWKSFile" || !strings.Contains(ce.Problem, "no usable signature key") {
		t.Errorf("an empty set: %v", err)
	}
}

// TestFirstFetch: the channel a gateway waits on at start-up closes once
// the first fetch ends, failed or not, and at once without a URL;
// HasKeySet tells the two outcomes apart; Sources names the key sources
// without the URL's secrets.
func TestFirstFetch(t *testing.T) {
	m := mintAll(t)
	closed := func(v *Verifier) bool {
		select {
		case <-v.FirstFetch():
			return true
		default:
			return false
		}
	}
	hs := newVerifier(t, Config{Secret: []byte(secret)}, newClock())
	if !closed(hs) || hs.HasKeySet() || strings.Join(hs.Sources(), ", ") != "HMAC secret" {
		t.Fatalf("secret only: closed %v, key set %v, sources %q", closed(hs), hs.HasKeySet(), hs.Sources())
	}
	file := writeFile(t, m.JWKS("rsa"))
	f := newVerifier(t, Config{JWKSFile: file, Secret: []byte(secret)}, newClock())
	if !closed(f) || !f.HasKeySet() || strings.Join(f.Sources(), ", ") != "JWKS file "+file+", HMAC secret" {
		t.Fatalf("file: closed %v, key set %v, sources %q", closed(f), f.HasKeySet(), f.Sources())
	}

	srv := jwttest.NewServer(t, m.JWKS("rsa"))
	srv.SetDown(true)
	u := strings.Replace(srv.URL, "http://", "http://user:hunter2@", 1) + "/jwks.json?token=s3cret#x"
	v := newVerifier(t, Config{JWKSURL: u}, newClock())
	if closed(v) || v.HasKeySet() {
		t.Fatal("closed before any fetch")
	}
	if got := strings.Join(v.Sources(), ", "); got != "JWKS URL "+srv.URL+"/jwks.json" {
		t.Errorf("sources %q", got)
	}
	if err := v.Refresh(context.Background()); err == nil {
		t.Fatal("a fetch from a server that is down succeeded")
	}
	if !closed(v) || v.HasKeySet() {
		t.Fatalf("after a failed fetch: closed %v, key set %v", closed(v), v.HasKeySet())
	}
	srv.SetDown(false)
	if err := v.Refresh(context.Background()); err != nil || !v.HasKeySet() {
		t.Fatalf("after a good fetch: %v, key set %v", err, v.HasKeySet())
	}
}

// TestMetrics: every result is counted under its label, and every series
// exists from the start.
func TestMetrics(t *testing.T) {
	m := mintAll(t)
	reg := prometheus.NewRegistry()
	v := newVerifier(t, Config{JWKSFile: writeFile(t, m.JWKS(issuerKeys...)), Metrics: NewMetrics(reg)}, newClock())
	for r := range Result(numResults) {
		if got := counterValue(t, reg, "sluice_jwt_tokens_total", r.String()); got != 0 {
			t.Errorf("%v: %v before any token", r, got)
		}
	}
	for _, tok := range []string{"", m.Token(t, "victim"), m.Token(t, "victim"), m.Token(t, "expired"), m.Token(t, "attacker-kid")} {
		v.Verify(tok)
	}
	for label, want := range map[string]float64{"missing": 1, "valid": 2, "expired": 1, "unknown_key": 1, "malformed": 0} {
		if got := counterValue(t, reg, "sluice_jwt_tokens_total", label); got != want {
			t.Errorf("%s: %v, want %v", label, got, want)
		}
	}
}

// counterValue reads one series of a counter vector from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	return proctest.Metric(t, reg, name+`{result="`+result+`"}`)
}
