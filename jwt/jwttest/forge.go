package jwttest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/asn1"
	"encoding/base64"
	"math/big"
	"testing"
)

// Forgeries: tokens and signatures an attacker makes with the standard
// library, for the tests that check that a verifier refuses them.

// Attacker is a P-256 key that no issuer published.
type Attacker struct{ key *ecdsa.PrivateKey }

// NewAttacker makes an Attacker, failing t when it cannot.
func NewAttacker(t testing.TB) *Attacker {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &Attacker{key}
}

// JWK returns the attacker's public key as a JWK's JSON text, for a
// header's embedded jwk.
func (a *Attacker) JWK() string {
	return `{"kty":"EC","crv":"P-256","x":"` + enc(a.key.X.FillBytes(make([]byte, 32))) + `","y":"` + enc(a.key.Y.FillBytes(make([]byte, 32))) + `"}`
}

// ES256 returns the token of header (JSON text) and payload (the claims'
// JSON text) that the attacker's key signed with ES256.
func (a *Attacker) ES256(header string, payload []byte) string {
	in := enc([]byte(header)) + "." + enc(payload)
	return in + "." + enc(SignES256(a.key, []byte(in)))
}

// SignES256 signs in with key as JWS's ES256 does (RFC 7518 section
// 3.4): r and s, 32 bytes each.
func SignES256(key *ecdsa.PrivateKey, in []byte) []byte {
	sum := sha256.Sum256(in)
	r, s, err := ecdsa.Sign(rand.Reader, key, sum[:])
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return append(r.FillBytes(make([]byte, 32)), s.FillBytes(make([]byte, 32))...)
}

// SignHS256 returns the token of header (JSON text) and payload (the
// claims' JSON text) signed with key by HMAC-SHA256, whatever the header
// says: what an attacker makes of a public key taken for a secret.
func SignHS256(key []byte, header string, payload []byte) string {
	in := enc([]byte(header)) + "." + enc(payload)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(in))
	return in + "." + enc(mac.Sum(nil))
}

// DER returns the ES256 signature sig (r and s, 32 bytes each) as ASN.1
// DER, a spelling JWS does not use.
func DER(sig []byte) []byte {
	r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
	der, err := asn1.Marshal(struct{ R, S *big.Int }{r, s})
	if err != nil {
		panic(err) // two integers always marshal
	}
	return der
}

// Malleated returns the ES256 signature sig with s replaced by n−s, which
// ECDSA takes for the same signature of the same message.
func Malleated(sig []byte) []byte {
	s := new(big.Int).SetBytes(sig[32:])
	n := elliptic.P256().Params().N
	return append(append([]byte{}, sig[:32]...), new(big.Int).Sub(n, s).FillBytes(make([]byte, 32))...)
}

// enc is a JWS segment of b: base64url without padding.
func enc(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
