// Package hashing turns raw identifiers (client IPs, emails, tenant ids,
// header values) into the opaque keys that sluice counts by.
//
// A raw identifier never leaves the request that carried it: the proxy
// canonicalises it (IPGroup, CanonicalEmail), then Hasher.Key turns it into a
// keyed HMAC-SHA256 that is the only form stored, logged or exported as a
// metric. Every gateway instance must share the key so that they count the
// same client under the same key.
//
// It imports nothing of sluice but internal/textfold (the case folding it
// shares with path matching).
package hashing

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"hash"
	"strconv"
	"sync"
)

// KeyLen is the length of every key returned by Hasher.Key: a 32-byte
// HMAC-SHA256 in unpadded base64url.
const KeyLen = 43

// Hasher computes keyed hashes of identifiers. It is safe for simultaneous
// use by multiple goroutines. The zero value is not usable; call New.
type Hasher struct {
	// pool holds *hasherState values. hmac.New precomputes the inner and
	// outer keyed SHA-256 states, and Reset returns to them, so a pooled
	// state costs no key schedule per call.
	pool sync.Pool
}

// hasherState is one goroutine's scratch space for Key.
type hasherState struct {
	mac hash.Hash
	msg []byte // kind name, 0, value; reused to avoid a per-call conversion
	sum [sha256.Size]byte
	out [KeyLen]byte
}

// New returns a Hasher keyed with key. The key is copied. It returns an
// error when key is empty, since an unkeyed hash of a small identifier
// space such as IPv4 addresses is trivially reversible.
func New(key []byte) (*Hasher, error) {
	if len(key) == 0 {
		return nil, errors.New("hashing: empty key")
	}
	k := append([]byte(nil), key...)
	h := &Hasher{}
	h.pool.New = func() any {
		return &hasherState{mac: hmac.New(sha256.New, k), msg: make([]byte, 0, 128)}
	}
	return h, nil
}

// Key returns the HMAC-SHA256, under the Hasher's key, of domain, a zero
// byte and value, as 43 characters of unpadded base64url.
//
// The domain separates kinds of identifier (sluice passes the identity
// kind's name: "ip", "email", "tenant"...), so the same value counted by
// two kinds (a tenant id that looks like an email, say) gives two
// unrelated keys; a domain must contain no zero byte, so that the message
// is an unambiguous encoding of the pair. Callers canonicalise value first
// (see IPGroup and CanonicalEmail): Key hashes bytes as given.
func (h *Hasher) Key(domain, value string) string {
	st := h.pool.Get().(*hasherState)
	st.msg = append(st.msg[:0], domain...)
	return h.sum(st, value)
}

// JWTKey returns the key of a verified token's claim: Key of the domain
// JWTDomain(issuer, claim) and the claim's value, built without
// allocating the domain. The kind of identity, the issuer and the claim
// are all part of the HMAC input, so a user whose sub is "1.2.3.4" never
// shares a key with the IP 1.2.3.4, a header or email of that value, a
// user of another issuer, or the same value of another claim.
func (h *Hasher) JWTKey(issuer, claim, value string) string {
	st := h.pool.Get().(*hasherState)
	st.msg = appendJWTDomain(st.msg[:0], issuer, claim)
	return h.sum(st, value)
}

// JWTDomain returns the Key domain of a claim of tokens verified against
// issuer ("" when tokens of any issuer are accepted): "jwt:", the length
// of issuer in decimal, ":", issuer, ":", claim. The length makes the
// encoding of the pair unambiguous whatever the issuer holds (an issuer
// "a:b" with claim "c" is not issuer "a" with claim "b:c"), and the "jwt:"
// prefix keeps it apart from every other kind's domain ("ip", "email",
// ...), none of which holds a colon. Like every domain, issuer and claim
// must contain no zero byte.
func JWTDomain(issuer, claim string) string {
	return string(appendJWTDomain(nil, issuer, claim))
}

func appendJWTDomain(b []byte, issuer, claim string) []byte {
	b = append(b, "jwt:"...)
	b = strconv.AppendInt(b, int64(len(issuer)), 10)
	b = append(b, ':')
	b = append(b, issuer...)
	b = append(b, ':')
	return append(b, claim...)
}

// sum finishes Key: st.msg holds the domain; it appends the zero byte and
// value, and returns the encoded HMAC of the whole, putting st back.
func (h *Hasher) sum(st *hasherState, value string) string {
	st.mac.Reset()
	st.msg = append(st.msg, 0)
	st.msg = append(st.msg, value...)
	st.mac.Write(st.msg)
	sum := st.mac.Sum(st.sum[:0])
	base64.RawURLEncoding.Encode(st.out[:], sum)
	key := string(st.out[:])
	// Do not let one huge value pin a large buffer in the pool forever.
	if cap(st.msg) > 4096 {
		st.msg = make([]byte, 0, 128)
	}
	h.pool.Put(st)
	return key
}

// JoinValues encodes a list of values as one string that no other list
// encodes to, for Key: each value is preceded by its length in bytes and
// a colon. The values of an Envoy rate limit descriptor, which may hold
// any character (commas, colons, zero bytes), form one key so, and
// ["a", "b"] never shares a key with ["a,b"] or ["ab"].
func JoinValues(values []string) string {
	n := 0
	for _, v := range values {
		n += len(v) + 4
	}
	b := make([]byte, 0, n)
	for _, v := range values {
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(b, ':')
		b = append(b, v...)
	}
	return string(b)
}
