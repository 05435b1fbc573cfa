package jwt

// Result is what Verify made of a token: Valid, or why it does not count.
// Its String is the result label of sluice_jwt_tokens_total.
type Result uint8

const (
	// Valid: the token verified and every check passed; its claims count.
	Valid Result = iota
	// Missing: the request carried no bearer token.
	Missing
	// Malformed: not a token sluice accepts: not a JWS in compact form
	// (a JWE, a JSON serialization, a stripped signature), over
	// MaxTokenBytes, non-canonical base64url, a header or payload that is
	// not a JSON object of distinct names (a name given twice, also in
	// another case, is malformed), a header that names a critical
	// extension ("crit") or carries or points at its own key ("jwk",
	// "jku", "x5u", "x5c"), or claims without a numeric "exp" or with a
	// non-numeric "nbf" or "iat".
	Malformed
	// BadSignature: the signature does not verify with the key it names.
	BadSignature
	// Expired: "exp" is past, by more than the leeway.
	Expired
	// NotYetValid: "nbf" or "iat" is in the future, by more than the
	// leeway.
	NotYetValid
	// WrongIssuer: an issuer is configured and "iss" is not it.
	WrongIssuer
	// WrongAudience: audiences are configured and "aud" holds none of them.
	WrongAudience
	// UnknownKey: no key of the key set has the token's "kid" (which
	// starts a refresh of a JWKS URL, at most once per EarlyRefreshGap), or
	// the key set is empty, or a token without a "kid" fits more keys than
	// sluice tries.
	UnknownKey
	// AlgorithmRefused: "alg" is "none", not among the allowed algorithms,
	// or does not fit the key: HMAC only with the secret, RS and PS with an
	// RSA key, ES256, ES384 and ES512 with a P-256, P-384 and P-521 key,
	// EdDSA with an Ed25519 key, and only the algorithm a key's own "alg"
	// names.
	AlgorithmRefused

	numResults = iota
)

var resultNames = [numResults]string{
	Valid:            "valid",
	Missing:          "missing",
	Malformed:        "malformed",
	BadSignature:     "bad_signature",
	Expired:          "expired",
	NotYetValid:      "not_yet_valid",
	WrongIssuer:      "wrong_issuer",
	WrongAudience:    "wrong_audience",
	UnknownKey:       "unknown_key",
	AlgorithmRefused: "algorithm_refused",
}

func (r Result) String() string {
	if int(r) < len(resultNames) {
		return resultNames[r]
	}
	return "unknown"
}
