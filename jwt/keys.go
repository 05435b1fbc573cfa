package jwt

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// keyKind is the type of a verification key.
type keyKind uint8

const (
	kindHMAC keyKind = iota
	kindRSA
	kindEC
	kindEd25519
)

// algorithm is a JWS signature algorithm (RFC 7518, RFC 8037) sluice
// verifies, and the key it needs.
type algorithm struct {
	name    string
	kind    keyKind
	curve   elliptic.Curve // kindEC: the curve the algorithm is defined on
	hmacMin int            // kindHMAC: the least key length, the hash's output (RFC 7518, section 3.2)
	// allowed is the one-element list go-jose's parser takes, made once so
	// that a verification does not allocate it.
	allowed []jose.SignatureAlgorithm
}

// algorithms are every algorithm sluice can verify, asymmetric first.
var algorithms = func() []*algorithm {
	as := []*algorithm{
		{name: "RS256", kind: kindRSA}, {name: "RS384", kind: kindRSA}, {name: "RS512", kind: kindRSA},
		{name: "PS256", kind: kindRSA}, {name: "PS384", kind: kindRSA}, {name: "PS512", kind: kindRSA},
		{name: "ES256", kind: kindEC, curve: elliptic.P256()},
		{name: "ES384", kind: kindEC, curve: elliptic.P384()},
		{name: "ES512", kind: kindEC, curve: elliptic.P521()},
		{name: "EdDSA", kind: kindEd25519},
		{name: "HS256", kind: kindHMAC, hmacMin: 32},
		{name: "HS384", kind: kindHMAC, hmacMin: 48},
		{name: "HS512", kind: kindHMAC, hmacMin: 64},
	}
	for _, a := range as {
		a.allowed = []jose.SignatureAlgorithm{jose.SignatureAlgorithm(a.name)}
	}
	return as
}()

// algorithmNamed returns the algorithm of this exact name, or nil.
func algorithmNamed(name string) *algorithm {
	for _, a := range algorithms {
		if a.name == name {
			return a
		}
	}
	return nil
}

// verifyKey is one public key of a key set.
type verifyKey struct {
	kid  string
	alg  string // the JWK's own "alg", "" when it names none
	kind keyKind
	// pub is a *rsa.PublicKey, *ecdsa.PublicKey or ed25519.PublicKey, as
	// go-jose's Verify takes them.
	pub any
}

// fits reports whether the key may verify a signature of algorithm a:
// of a's key type (and curve), and a itself when the key names an
// algorithm of its own.
func (k *verifyKey) fits(a *algorithm) bool {
	if k.kind != a.kind || k.alg != "" && k.alg != a.name {
		return false
	}
	if a.kind == kindEC {
		return k.pub.(*ecdsa.PublicKey).Curve == a.curve
	}
	return true
}

// keySet is one key set in force: the keys of one fetch of the JWKS URL or
// one read of the JWKS file. It is immutable.
type keySet struct {
	keys []verifyKey
	at   time.Time // when it was fetched or read, on the Verifier's clock
}

// Limits on a JWK set.
const (
	// maxJWKSBytes bounds the body of a JWKS response or file.
	maxJWKSBytes = 1 << 20
	// maxKeys bounds the keys sluice keeps of one set.
	maxKeys = 100
	// minRSABits is the smallest RSA modulus sluice accepts (NIST SP
	// 800-131A, RFC 7518 section 3.3).
	minRSABits = 2048
)

// parseJWKS reads a JWK set (RFC 7517, section 5): the public signature
// keys it holds, and a reason for each key it leaves out. As the RFC
// says, keys sluice cannot use (another key type, an encryption key, a
// malformed one) are left out rather than failing the set; a set with no
// usable key is an error. So are keys that must never be trusted from a
// set: symmetric ("oct") keys, since an HMAC key in a published set is a
// secret everyone can read, and keys with private parts.
func parseJWKS(data []byte) (keys []verifyKey, skipped []string, err error) {
	if len(data) > maxJWKSBytes {
		return nil, nil, fmt.Errorf("larger than %d bytes", maxJWKSBytes)
	}
	doc, ok := decodeObject(data)
	if !ok {
		return nil, nil, errors.New("not a JSON object with distinct member names")
	}
	list, ok := doc["keys"].([]any)
	if !ok {
		return nil, nil, errors.New(`not a JWK set: no "keys" array`)
	}
	for i, raw := range list {
		if len(keys) == maxKeys {
			skipped = append(skipped, fmt.Sprintf("keys %d to %d: more than %d keys", i, len(list)-1, maxKeys))
			break
		}
		k, err := parseJWK(raw)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("key %d: %v", i, err))
			continue
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, skipped, errors.New("no usable signature key")
	}
	return keys, skipped, nil
}

// parseJWK reads one member of a set's "keys" as decodeObject decoded it.
// go-jose parses the key material; the checks around it are sluice's.
func parseJWK(raw any) (verifyKey, error) {
	m, ok := raw.(map[string]any)
	if !ok {
		return verifyKey{}, errors.New("not a JSON object")
	}
	str := func(name string) (string, error) {
		v, present := m[name]
		s, isStr := v.(string)
		if present && !isStr {
			return "", fmt.Errorf("%q is not a string", name)
		}
		return s, nil
	}
	kty, err := str("kty")
	if err != nil {
		return verifyKey{}, err
	}
	kid, err := str("kid")
	if err != nil {
		return verifyKey{}, err
	}
	if use, err := str("use"); err != nil || use != "" && use != "sig" {
		return verifyKey{}, fmt.Errorf("kid %q: not a signature key (use %q)", kid, use)
	}
	if ops, present := m["key_ops"]; present {
		list, _ := ops.([]any)
		if !slices.Contains(list, any("verify")) {
			return verifyKey{}, fmt.Errorf("kid %q: key_ops does not allow verify", kid)
		}
	}
	if kty == "oct" {
		return verifyKey{}, fmt.Errorf("kid %q: a symmetric (oct) key; HMAC keys come from the secret, never from a JWK set", kid)
	}
	alg, err := str("alg")
	if err != nil {
		return verifyKey{}, fmt.Errorf("kid %q: %w", kid, err)
	}
	// go-jose reads the key from JSON: the member again, as decodeObject
	// checked it.
	material, err := json.Marshal(m)
	if err != nil {
		return verifyKey{}, fmt.Errorf("kid %q: %w", kid, err)
	}
	var jk jose.JSONWebKey
	if err := jk.UnmarshalJSON(material); err != nil {
		return verifyKey{}, fmt.Errorf("kid %q: %w", kid, err)
	}
	if !jk.IsPublic() {
		return verifyKey{}, fmt.Errorf("kid %q: holds private key material, which a JWK set must never publish", kid)
	}
	if !jk.Valid() {
		return verifyKey{}, fmt.Errorf("kid %q: not a valid key", kid)
	}
	k := verifyKey{kid: kid, alg: alg, pub: jk.Key}
	switch pub := jk.Key.(type) {
	case *rsa.PublicKey:
		if bits := pub.N.BitLen(); bits < minRSABits {
			return verifyKey{}, fmt.Errorf("kid %q: an RSA key of %d bits, fewer than %d", kid, bits, minRSABits)
		}
		k.kind = kindRSA
	case *ecdsa.PublicKey:
		k.kind = kindEC
	case ed25519.PublicKey:
		k.kind = kindEd25519
	default:
		return verifyKey{}, fmt.Errorf("kid %q: key type %q is not one sluice verifies with", kid, kty)
	}
	if alg != "" {
		a := algorithmNamed(alg)
		if a == nil || a.kind == kindHMAC || !k.fits(a) {
			return verifyKey{}, fmt.Errorf("kid %q: alg %q does not fit the key", kid, alg)
		}
	}
	return k, nil
}
