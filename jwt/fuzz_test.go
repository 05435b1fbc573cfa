package jwt

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluicehq/sluice/jwt/jwttest"
)

// fuzzKeys are fixed keys, so that every fuzzing process (the coordinator
// and its workers) verifies the seeds the same way: an RSA key from
// testdata (made with openssl; rsa.GenerateKey is never deterministic),
// a P-256 key and an Ed25519 key from fixed bytes, and the secret.
type fuzzKeys struct {
	rsa *rsa.PrivateKey
	ec  *ecdsa.PrivateKey
	ed  ed25519.PrivateKey
}

func loadFuzzKeys(t testing.TB) fuzzKeys {
	t.Helper()
	data, err := os.ReadFile("testdata/fuzz-rsa-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	ec, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return fuzzKeys{rsa: k.(*rsa.PrivateKey), ec: ec, ed: ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, 32))}
}

// jwks is the public set of the keys, kids "rsa", "ec" and "ed".
func (k fuzzKeys) jwks() []byte {
	pad := func(b []byte, n int) []byte { return append(make([]byte, n-len(b)), b...) }
	set := map[string]any{"keys": []any{
		map[string]string{"kty": "RSA", "kid": "rsa", "n": b64(k.rsa.N.Bytes()), "e": "AQAB"},
		map[string]string{"kty": "EC", "kid": "ec", "crv": "P-256", "x": b64(pad(k.ec.X.Bytes(), 32)), "y": b64(pad(k.ec.Y.Bytes(), 32))},
		map[string]string{"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": b64(k.ed.Public().(ed25519.PublicKey))},
	}}
	return must(json.Marshal(set))
}

// sign makes a token with the standard library's primitives (never
// go-jose's), as an issuer would.
func (k fuzzKeys) sign(alg, kid string, claims []byte) string {
	h := `{"alg":"` + alg + `","typ":"JWT"`
	if kid != "" {
		h += `,"kid":"` + kid + `"`
	}
	in := b64([]byte(h+"}")) + "." + b64(claims)
	sum := sha256.Sum256([]byte(in))
	var sig []byte
	switch alg {
	case "HS256":
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(in))
		sig = mac.Sum(nil)
	case "RS256":
		sig = must(rsa.SignPKCS1v15(nil, k.rsa, crypto.SHA256, sum[:]))
	case "ES256":
		sig = jwttest.SignES256(k.ec, []byte(in))
	case "EdDSA":
		sig = ed25519.Sign(k.ed, []byte(in))
	}
	return in + "." + b64(sig)
}

// FuzzVerify: Verify never panics, never gives claims with a result other
// than Valid, and never verifies a token that a key holder did not sign.
// Every token that verifies has the header and payload of one of the
// seeds signed below; and it is that seed exactly, except for ES256,
// whose signatures ECDSA lets anyone turn into another valid one of the
// same header and payload (see TestVerifyReencodedSignatures).
func FuzzVerify(f *testing.F) {
	keys := loadFuzzKeys(f)
	c := newClock()
	v, err := New(Config{JWKSFile: writeFile(f, keys.jwks()), Secret: []byte(secret), Issuer: issuer, Audiences: []string{audience}, Now: c.Now})
	if err != nil {
		f.Fatal(err)
	}
	signed := map[string]string{} // header.payload → the token signed
	add := func(tok string) {
		h, p, _ := segments(tok)
		signed[h+"."+p] = tok
		f.Add(tok)
	}
	body := must(json.Marshal(claims("victim", "app_metadata", map[string]any{"plan": "pro", "tenant_id": 7})))
	for _, alg := range []string{"HS256", "RS256", "ES256", "EdDSA"} {
		add(keys.sign(alg, map[string]string{"RS256": "rsa", "ES256": "ec", "EdDSA": "ed"}[alg], body))
	}
	add(keys.sign("RS256", "", body))
	for _, tok := range signed { // the seeds so far are genuine, so the fuzzer starts from valid tokens
		if _, res := v.Verify(tok); res != Valid {
			f.Fatalf("seed %q: %v", tok, res)
		}
	}
	add(keys.sign("HS256", "", []byte(payload("dup", `,"sub":"victim"`))))
	add(keys.sign("HS256", "", []byte(payload("case", `,"Sub":"victim"`))))
	add(keys.sign("HS256", "", must(json.Marshal(claims("expired", "exp", T0.Unix()-3600)))))
	for _, s := range []string{
		"", ".", "..", "a.b.c", "e30.e30.", "e30.e30.e30", "eyJhbGciOiJub25lIn0.e30.",
		b64([]byte(`{"alg":"HS256","crit":["exp"]}`)) + "." + b64(body) + ".AAAA",
		b64([]byte(`{"alg":"RS256","kid":"rsa","alg":"none"}`)) + "." + b64(body) + ".AAAA",
		b64([]byte(`{"alg":"ES256","jwk":{"kty":"EC"}}`)) + "." + b64(body) + ".AAAA",
	} {
		f.Add(s)
	}
	for _, seed := range signed {
		for _, op := range []func(string) string{
			func(s string) string { return s[:len(s)-1] },
			func(s string) string { return s + "A" },
			func(s string) string { return strings.Replace(s, ".", "..", 1) },
		} {
			f.Add(op(seed))
		}
	}
	f.Fuzz(func(t *testing.T, token string) {
		claims, res := v.Verify(token)
		if (claims != nil) != (res == Valid) {
			t.Fatalf("claims %v with result %v", claims, res)
		}
		if res != Valid {
			return
		}
		h, p, _ := segments(token)
		orig, ok := signed[h+"."+p]
		if !ok {
			t.Fatalf("verified a token nobody signed: %q", token)
		}
		if token != orig {
			if hdr, _ := decodeObject(unb64(t, h)); hdr["alg"] != "ES256" {
				t.Fatalf("verified %q, another spelling of the signed %q", token, orig)
			}
		}
		if sub, ok := claims.Claim("sub"); !ok || sub != "victim" {
			t.Fatalf("verified claims with sub %q %v", sub, ok)
		}
	})
}

// FuzzDecodeObject: decodeObject never panics; what it accepts, encoding/json
// reads the same way; every object it accepts has names distinct under
// case folding; Claim never panics and returns only identifiers.
func FuzzDecodeObject(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"sub":"a"}`, `{"sub":"a","sub":"b"}`, `{"sub":"a","SUB":"b"}`, `{"\u212aid":1,"kid":2}`,
		`{"a":{"b":[1,2.5,-0,1e3,true,false,null,"x\ud83d\ude00"]}}`, `{"a":"\ud800"}`, `{"a.b":"x","a":{"b":"y"}}`,
		`{"uid":9007199254740991,"big":9007199254740992}`, " {\"a\" : 1 } ", `[1]`, `{"a":1}x`,
		strings.Repeat(`{"a":`, 40) + "1" + strings.Repeat("}", 40), "{\"a\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, ok := decodeObject(data)
		if !ok {
			return
		}
		if m == nil || !utf8.Valid(data) {
			t.Fatalf("accepted %q as %v", data, m)
		}
		var ref map[string]any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(&ref); err != nil {
			t.Fatalf("decodeObject accepted %q, encoding/json: %v", data, err)
		}
		if !reflect.DeepEqual(normalize(m), normalize(ref)) {
			t.Fatalf("decodeObject read %q as\n%#v\nencoding/json as\n%#v", data, m, ref)
		}
		checkDistinct(t, m)
		c := &Claims{m: m}
		for name := range m {
			for _, path := range []string{name, name + ".a", "a." + name} {
				if v, ok := c.Claim(path); ok && v == "" {
					t.Fatalf("Claim(%q) = empty identifier", path)
				}
			}
		}
	})
}

// normalize makes empty arrays nil, as decodeObject leaves them.
func normalize(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = normalize(e)
		}
		return out
	case []any:
		if len(v) == 0 {
			return []any(nil)
		}
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = normalize(e)
		}
		return out
	}
	return v
}

// checkDistinct fails t unless every object in v has names distinct under
// Unicode case folding.
func checkDistinct(t *testing.T, v any) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		var names []string
		for k, e := range v {
			for _, n := range names {
				if strings.EqualFold(n, k) {
					t.Fatalf("names %q and %q in one object", n, k)
				}
			}
			names = append(names, k)
			checkDistinct(t, e)
		}
	case []any:
		for _, e := range v {
			checkDistinct(t, e)
		}
	}
}
