package jwt

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/jwt/jwttest"
)

// TestVerifyAlgorithms: a token of every algorithm, minted by PyJWT, verifies
// with the key set served by a JWKS server or with the secret, and its
// claims are the ones it was signed with.
func TestVerifyAlgorithms(t *testing.T) {
	m := mintAll(t)
	v, _ := served(t, m, newClock(), Config{Secret: []byte(secret)}, issuerKeys...)
	for _, tk := range validTokens {
		t.Run(tk.Name, func(t *testing.T) {
			c, res := v.Verify(m.Token(t, tk.Name))
			if res != Valid {
				t.Fatalf("Verify = %v, want valid", res)
			}
			if sub, ok := c.Claim("sub"); !ok || sub != tk.Name {
				t.Fatalf("sub = %q %v, want %q", sub, ok, tk.Name)
			}
			if iat, ok := c.Claim("iat"); !ok || iat != itoa(T0.Unix()-60) {
				t.Fatalf("iat = %q %v", iat, ok)
			}
		})
	}
}

// verdict is what a token must come to.
type verdict struct {
	name  string
	token string
	want  Result
}

// check verifies each token and checks its result; only a Valid result
// has claims.
func check(t *testing.T, v *Verifier, tests []verdict) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, res := v.Verify(tt.token)
			if res != tt.want {
				t.Fatalf("Verify = %v, want %v", res, tt.want)
			}
			if (c != nil) != (res == Valid) {
				t.Fatalf("claims %v with result %v", c, res)
			}
		})
	}
}

// TestVerifyPythonAttacks: tokens a signer made that must not count, each
// for its own reason; the result says which.
func TestVerifyPythonAttacks(t *testing.T) {
	m := mintAll(t)
	v, _ := served(t, m, newClock(), Config{}, issuerKeys...)
	want := map[string]Result{
		"expired": Expired, "expired-within-leeway": Valid, "exp-0": Expired, "no-exp": Malformed,
		"exp-string": Malformed, "exp-1e999": Malformed,
		"nbf-future": NotYetValid, "nbf-within-leeway": Valid, "nbf-1e300": NotYetValid, "nbf-string": Malformed,
		"iat-future": NotYetValid,
		"wrong-iss":  WrongIssuer, "no-iss": WrongIssuer,
		"wrong-aud": WrongAudience, "aud-list": Valid, "aud-list-wrong": WrongAudience,
		"crit": Malformed, "jku": Malformed, "x5u": Malformed, "jku-issuer-kid": Malformed, "x5c": Malformed,
		"es384-on-p256": AlgorithmRefused, "ps256-on-rs256-key": AlgorithmRefused, "es256-kid-of-rsa": AlgorithmRefused,
		"rotated": UnknownKey, "attacker-kid": UnknownKey, "attacker-issuer-kid": BadSignature,
		"dup-sub": Malformed, "case-sub": Malformed, "escaped-dup-sub": Malformed, "kelvin-dup": Malformed,
		"nested-dup": Malformed, "lone-surrogate": Malformed, "payload-array": Malformed,
		"big": Valid, "oversize": Malformed,
		"attacker": Valid, "attacker-es256": Valid, "victim": Valid, "victim-again": Valid,
	}
	var tests []verdict
	for _, tk := range attackTokens("") {
		w, ok := want[tk.Name]
		if !ok {
			t.Fatalf("no expected result for %q", tk.Name)
		}
		tests = append(tests, verdict{tk.Name, m.Token(t, tk.Name), w})
	}
	check(t, v, tests)
	if n := len(m.Token(t, "big")); n > MaxTokenBytes {
		t.Errorf("the big token has %d bytes, more than MaxTokenBytes", n)
	}
	if n := len(m.Token(t, "oversize")); n <= MaxTokenBytes {
		t.Errorf("the oversize token has only %d bytes", n)
	}
	if hits := minted.Trap().Hits(); hits != 0 {
		t.Errorf("the server that jku and x5u point at was contacted %d times", hits)
	}

	// Without leeway, a token expired ten seconds ago is expired.
	strict, _ := served(t, m, newClock(), Config{Leeway: Off}, issuerKeys...)
	check(t, strict, []verdict{
		{"expired-within-leeway", m.Token(t, "expired-within-leeway"), Expired},
		{"nbf-within-leeway", m.Token(t, "nbf-within-leeway"), NotYetValid},
	})
	// Without an issuer or audience configured, neither is checked.
	open := newVerifier(t, Config{JWKSFile: writeFile(t, m.JWKS(issuerKeys...)), Audiences: []string{}}, newClock())
	check(t, open, []verdict{
		{"wrong-iss", m.Token(t, "wrong-iss"), Valid},
		{"wrong-aud", m.Token(t, "wrong-aud"), Valid},
	})
}

// TestVerifyCraftedAttacks: tokens an attacker puts together by hand.
func TestVerifyCraftedAttacks(t *testing.T) {
	m := mintAll(t)
	v, _ := served(t, m, newClock(), Config{}, issuerKeys...)
	withSecret, _ := served(t, m, newClock(), Config{Secret: []byte(secret)}, issuerKeys...)
	victim := m.Token(t, "victim")
	h, p, s := segments(victim)
	victimClaims := unb64(t, p)
	hs256 := func(key []byte, header string) string { return jwttest.SignHS256(key, header, victimClaims) }
	attacker := jwttest.NewAttacker(t)
	es256, attackerJWK := attacker.ES256, attacker.JWK()

	tests := []verdict{
		{"alg none, no signature", b64([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + p + ".", AlgorithmRefused},
		{"alg none with a signature", withHeader(victim, `{"alg":"none","kid":"rsa"}`), AlgorithmRefused},
		{"alg None", withHeader(victim, `{"alg":"None"}`), AlgorithmRefused},
		{"alg NONE", withHeader(victim, `{"alg":"NONE"}`), AlgorithmRefused},
		{"alg unknown", withHeader(victim, `{"alg":"RS1","kid":"rsa"}`), AlgorithmRefused},
		{"alg ES256K", withHeader(victim, `{"alg":"ES256K","kid":"ec256"}`), AlgorithmRefused},
		{"alg rs256 in lower case", withHeader(victim, `{"alg":"rs256","kid":"rsa"}`), AlgorithmRefused},
		{"alg missing", withHeader(victim, `{"kid":"rsa"}`), Malformed},
		{"alg not a string", withHeader(victim, `{"alg":256,"kid":"rsa"}`), Malformed},
		{"kid not a string", withHeader(victim, `{"alg":"RS256","kid":1}`), Malformed},
		{"alg given twice", withHeader(victim, `{"alg":"HS256","alg":"RS256","kid":"rsa"}`), Malformed},
		{"alg in two cases", withHeader(victim, `{"alg":"RS256","ALG":"none","kid":"rsa"}`), Malformed},
		{"HS256 signed with the RSA public key (PEM)", hs256([]byte(m.PEM["rsa"]), `{"alg":"HS256","kid":"rsa","typ":"JWT"}`), AlgorithmRefused},
		{"HS256 signed with the RSA public key (JWK)", hs256(m.JWK["rsa"], `{"alg":"HS256","kid":"rsa","typ":"JWT"}`), AlgorithmRefused},
		{"embedded jwk of the attacker", es256(`{"alg":"ES256","jwk":`+attackerJWK+`}`, victimClaims), Malformed},
		{"embedded jwk with the issuer's kid", es256(`{"alg":"ES256","kid":"ec256","jwk":`+attackerJWK+`}`, victimClaims), Malformed},
		{"attacker's key, the issuer's kid", es256(`{"alg":"ES256","kid":"ec256"}`, victimClaims), BadSignature},
		{"stripped signature", h + "." + p + ".", Malformed},
		{"two segments", h + "." + p, Malformed},
		{"one segment", h, Malformed},
		{"four segments", victim + "." + s, Malformed},
		{"JWE compact (five segments)", h + ".." + b64([]byte("iv")) + "." + p + "." + b64([]byte("tag")), Malformed},
		{"JSON serialization", `{"payload":"` + p + `","protected":"` + h + `","signature":"` + s + `"}`, Malformed},
		{"padding", victim + "==", Malformed},
		{"standard base64 alphabet", strings.NewReplacer("-", "+", "_", "/").Replace(victim), Malformed},
		{"leading white space", " " + victim, Malformed},
		{"line break inside", h + "." + p[:10] + "\n" + p[10:] + "." + s, Malformed},
		{"empty header", "." + p + "." + s, Malformed},
		{"header not JSON", b64([]byte("RS256")) + "." + p + "." + s, Malformed},
		{"another token's signature", h + "." + p + "." + segment3(m.Token(t, "attacker")), BadSignature},
		{"another token's payload", h + "." + segment2(m.Token(t, "attacker")) + "." + s, BadSignature},
		{"payload edited", h + "." + b64([]byte(strings.Replace(string(victimClaims), "victim", "victin", 1))) + "." + s, BadSignature},
		{"signature truncated", h + "." + p + "." + b64(unb64(t, s)[:250]), BadSignature},
		{"the victim's token", victim, Valid},
	}
	check(t, v, tests)
	check(t, withSecret, []verdict{
		// With a secret configured, HS256 is allowed, and checked with the
		// secret only: never with the key the kid names.
		{"HS256 signed with the RSA public key (PEM)", hs256([]byte(m.PEM["rsa"]), `{"alg":"HS256","kid":"rsa","typ":"JWT"}`), BadSignature},
		{"HS256 signed with the RSA public key, no kid", hs256([]byte(m.PEM["rsa"]), `{"alg":"HS256","typ":"JWT"}`), BadSignature},
		{"HS256 with the secret", hs256([]byte(secret), `{"alg":"HS256","kid":"rsa"}`), Valid},
	})
}

func segment2(token string) string { _, p, _ := segments(token); return p }
func segment3(token string) string { _, _, s := segments(token); return s }

// TestVerifyReencodedSignatures: an ES256 signature spelt another way
// must not make a new token. DER instead of r||s, padded or shortened
// fields, base64 with other unused bits: none verifies. s replaced by n−s
// is the same signature to ECDSA and does verify (ECDSA is malleable, and
// issuers make high and low s alike, so refusing either would refuse
// genuine tokens), but it is the same signed claims, so the same user and
// the same key: never someone else's, never a fresh one.
func TestVerifyReencodedSignatures(t *testing.T) {
	m := mintAll(t)
	v, _ := served(t, m, newClock(), Config{}, issuerKeys...)
	token := m.Token(t, "attacker-es256")
	h, p, s := segments(token)
	sig := unb64(t, s)
	if len(sig) != 64 {
		t.Fatalf("ES256 signature of %d bytes", len(sig))
	}
	der, flipped := jwttest.DER(sig), jwttest.Malleated(sig)
	// 64 bytes are 86 characters of which the last carries 4 unused bits.
	last := strings.IndexByte(base64Alphabet, s[len(s)-1])
	otherBits := s[:len(s)-1] + string(base64Alphabet[last^1])
	if string(must(base64.RawURLEncoding.DecodeString(otherBits))) != string(sig) {
		t.Fatal("a lenient decoder should read the same signature from the other spelling")
	}
	check(t, v, []verdict{
		{"DER", h + "." + p + "." + b64(der), BadSignature},
		{"r||s with a zero byte more", h + "." + p + "." + b64(append([]byte{0}, sig...)), BadSignature},
		{"r||s, 33 bytes each", h + "." + p + "." + b64(append(append([]byte{0}, sig[:32]...), append([]byte{0}, sig[32:]...)...)), BadSignature},
		{"zero signature", h + "." + p + "." + b64(make([]byte, 64)), BadSignature},
		{"r and s swapped", h + "." + p + "." + b64(append(append([]byte{}, sig[32:]...), sig[:32]...)), BadSignature},
		{"unused bits set", h + "." + p + "." + otherBits, Malformed},
		{"the token itself", token, Valid},
	})
	c, res := v.Verify(h + "." + p + "." + b64(flipped))
	if res != Valid && res != BadSignature {
		t.Fatalf("s → n−s: %v", res)
	}
	if sub, _ := c.Claim("sub"); res == Valid && sub != "attacker" {
		t.Fatalf("s → n−s verified as %q, not as the signer's own claims", sub)
	}
	// The header and payload segments have unused bits too, when their
	// length leaves some: a second spelling is malformed.
	for i, seg := range []string{h, p} {
		if len(seg)%4 == 0 {
			continue
		}
		j := strings.IndexByte(base64Alphabet, seg[len(seg)-1])
		alt := seg[:len(seg)-1] + string(base64Alphabet[j^1])
		parts := []string{h, p, s}
		parts[i] = alt
		if _, res := v.Verify(strings.Join(parts, ".")); res != Malformed {
			t.Errorf("segment %d with other unused bits: %v", i, res)
		}
	}
}

const base64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// TestVerifySecretOnly: a verifier with a 40-byte secret, as Supabase's,
// accepts HS256 only (its length is too short for HS384 and HS512) and
// refuses every asymmetric algorithm.
func TestVerifySecretOnly(t *testing.T) {
	m := mintAll(t)
	key := []byte("a-supabase-style-jwt-secret-of-40-bytes!")
	v := newVerifier(t, Config{Secret: key}, newClock())
	if got := strings.Join(v.Algorithms(), ","); got != "HS256" {
		t.Fatalf("Algorithms() = %s, want HS256", got)
	}
	check(t, v, []verdict{
		{"HS256 with the secret", jwttest.SignHS256(key, `{"alg":"HS256","typ":"JWT"}`, must(json.Marshal(claims("supabase-user")))), Valid},
		{"HS512 with another secret", m.Token(t, "HS512"), AlgorithmRefused},
		{"RS256", m.Token(t, "RS256"), AlgorithmRefused},
		{"EdDSA", m.Token(t, "EdDSA"), AlgorithmRefused},
		{"none", "", Missing},
	})
}

// TestVerifyAlgorithmsConfig: an explicit list of algorithms refuses the
// others, even those the keys could verify.
func TestVerifyAlgorithmsConfig(t *testing.T) {
	m := mintAll(t)
	v, _ := served(t, m, newClock(), Config{Algorithms: []string{"ES256", "EdDSA"}}, issuerKeys...)
	check(t, v, []verdict{
		{"ES256", m.Token(t, "ES256"), Valid},
		{"EdDSA", m.Token(t, "EdDSA"), Valid},
		{"RS256", m.Token(t, "RS256"), AlgorithmRefused},
		{"PS256", m.Token(t, "PS256"), AlgorithmRefused},
		{"ES384", m.Token(t, "ES384"), AlgorithmRefused},
	})
}

// TestVerifyKeyChoice: a token without a kid is tried against the keys
// its algorithm fits, at most maxUntargeted of them.
func TestVerifyKeyChoice(t *testing.T) {
	m := mintAll(t)
	// Without a kid, among two RSA keys.
	v, _ := served(t, m, newClock(), Config{}, "rsa2", "rsa", "ed")
	check(t, v, []verdict{
		{"RS256 without a kid", m.Token(t, "RS256-no-kid"), Valid},
		{"EdDSA without a kid", m.Token(t, "EdDSA-no-kid"), Valid},
	})
	// With more RSA keys than are tried, a kid is needed.
	many := []json.RawMessage{}
	for i := range maxUntargeted {
		k := map[string]any{}
		json.Unmarshal(m.JWK["rsa2"], &k)
		k["kid"] = "copy-" + itoa(int64(i))
		many = append(many, must(json.Marshal(k)))
	}
	many = append(many, m.JWK["rsa"])
	set := must(json.Marshal(map[string]any{"keys": many}))
	crowded := newVerifier(t, Config{JWKSFile: writeFile(t, set)}, newClock())
	check(t, crowded, []verdict{
		{"RS256 without a kid among many keys", m.Token(t, "RS256-no-kid"), UnknownKey},
		{"RS256 with its kid among many keys", m.Token(t, "RS256"), Valid},
	})
}

// TestVerifyNoKeysYet: before the first fetch, every asymmetric token is
// of an unknown key; HMAC tokens verify.
func TestVerifyNoKeysYet(t *testing.T) {
	m := mintAll(t)
	v := newVerifier(t, Config{JWKSURL: "http://127.0.0.1:1/jwks.json", Secret: []byte(secret)}, newClock())
	check(t, v, []verdict{
		{"RS256", m.Token(t, "RS256"), UnknownKey},
		{"RS256 without a kid", m.Token(t, "RS256-no-kid"), UnknownKey},
		{"HS256", m.Token(t, "HS256"), Valid},
		{"HS256 with a kid", m.Token(t, "HS256-with-kid"), Valid},
	})
}

// TestVerifyAllocs keeps an eye on what one verification costs: a token
// seen before costs a hash and a lookup; a new one, go-jose's parsing and
// the claims'.
func TestVerifyAllocs(t *testing.T) {
	m := mintAll(t)
	cached, _ := served(t, m, newClock(), Config{Secret: []byte(secret)}, issuerKeys...)
	uncached, _ := served(t, m, newClock(), Config{Secret: []byte(secret), CacheSize: Off}, issuerKeys...)
	for _, name := range []string{"HS256", "RS256", "ES256"} {
		tok := m.Token(t, name)
		if n := testing.AllocsPerRun(50, func() { cached.Verify(tok) }); n > 1 {
			t.Errorf("Verify(%s) seen before allocates %v times", name, n)
		}
		n := testing.AllocsPerRun(50, func() { uncached.Verify(tok) })
		t.Logf("Verify(%s) without the cache allocates %v times", name, n)
		if n > 200 {
			t.Errorf("Verify(%s) without the cache allocates %v times", name, n)
		}
	}
}

// TestVerifyCache: a remembered token still expires, still becomes valid
// only at its nbf, and stops verifying once the key set that verified it
// is replaced by one without its key; the cache never makes a token valid
// that a fresh verification would refuse.
func TestVerifyCache(t *testing.T) {
	m := mintAll(t)
	for _, size := range []int{0, Off} {
		c := newClock()
		name := writeFile(t, m.JWKS("rsa", "rsa2"))
		v := newVerifier(t, Config{JWKSFile: name, Secret: []byte(secret), CacheSize: size}, c)
		c.Advance(10 * time.Second)
		check(t, v, []verdict{
			{"fresh", m.Token(t, "victim"), Valid},
			{"again", m.Token(t, "victim"), Valid},
			{"HS256", m.Token(t, "HS256"), Valid},
			{"nbf within the leeway", m.Token(t, "nbf-within-leeway"), Valid},
			{"rotated", m.Token(t, "rotated"), Valid},
		})
		// A clock set back before nbf makes a remembered token not yet valid.
		c.Advance(-time.Hour)
		check(t, v, []verdict{{"before nbf", m.Token(t, "nbf-within-leeway"), NotYetValid}})
		c.Advance(time.Hour)
		check(t, v, []verdict{{"at nbf again", m.Token(t, "nbf-within-leeway"), Valid}})
		// Past exp and its leeway, the remembered tokens expire.
		c.Advance(time.Hour + DefaultLeeway - 10*time.Second)
		check(t, v, []verdict{
			{"expired victim", m.Token(t, "victim"), Expired},
			{"expired HS256", m.Token(t, "HS256"), Expired},
		})
		// The issuer drops rsa2: its token stops at once, with or without a
		// cache.
		must(0, os.WriteFile(name, m.JWKS("rsa"), 0o600))
		c.Advance(-time.Hour)
		check(t, v, []verdict{{"rotated before the reload", m.Token(t, "rotated"), Valid}})
		if err := v.Reload(); err != nil {
			t.Fatal(err)
		}
		check(t, v, []verdict{{"rotated after the reload", m.Token(t, "rotated"), UnknownKey}})
	}
}
