package identity

import (
	"net/http"
	"strings"
)

// Bearer returns the token of the request's "Authorization: Bearer"
// credentials (RFC 6750 section 2.1), the scheme matched
// case-insensitively, for a jwt identity or a plans option. found is
// false when the request has no Authorization header, or one of another
// scheme (Basic, Digest, ...): the caller then counts the client IP.
//
// It is an *Error, which the proxy answers with 400, when sluice cannot
// be sure which token the upstream will read: the header sent more than
// once (HTTP would join the lines into a list; upstreams take the first,
// the last or both), or Bearer credentials that are not one b64token
// after one or more spaces (nothing, a tab, a list such as "a, Bearer b",
// two tokens, or characters a token cannot hold). The token itself is not
// checked here: that is the verifier's job, and a token that does not
// verify is no error of the request's.
//
// The caller removes hop-by-hop headers first, so that credentials the
// upstream will never see count as absent.
func Bearer(h http.Header) (token string, found bool, err error) {
	const name = "Authorization"
	n, value := 0, ""
	for k, vs := range h {
		if HeaderNameEqual(k, name) {
			n += len(vs)
			if len(vs) > 0 {
				value = vs[0]
			}
		}
	}
	switch {
	case n == 0:
		return "", false, nil
	case n > 1:
		return "", false, errorf("header ", quote(name), " is sent more than once")
	}
	end := strings.IndexAny(value, " \t")
	if end < 0 {
		end = len(value)
	}
	if !strings.EqualFold(value[:end], "Bearer") {
		return "", false, nil
	}
	token = strings.TrimLeft(value[end:], " ")
	if token == "" || len(token) == len(value[end:]) || !isB64Token(token) {
		return "", false, errorf("header ", quote(name), " does not hold a single bearer token")
	}
	return token, true, nil
}

// isB64Token reports whether s is an RFC 6750 b64token:
// 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
func isB64Token(s string) bool {
	body := strings.TrimRight(s, "=")
	if body == "" {
		return false
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~+/", c) >= 0) {
			return false
		}
	}
	return true
}
