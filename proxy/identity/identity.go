// Package identity reads the identifiers that sluice's rules count by from
// an HTTP request: the client IP (behind trusted proxies), an email from
// the body or the query string, a tenant id or other header value, the
// bearer token a verified identity comes from (see Bearer; verifying it is
// package jwt's job), and the method a request asks to be treated as (a
// "_method" field).
//
// Everything here reads the request as the upstream behind sluice will
// read it, and where upstreams disagree it refuses to guess: a field given
// twice, in two spellings that some framework merges, in a body that does
// not parse, or in both the body and the query string with different values
// is an *Error, which the proxy answers with 400. Values are returned in
// their canonical form (see hashing.CanonicalEmail and
// hashing.CanonicalText), ready to be hashed; they are never logged.
//
// The package knows nothing of rules, hashing keys or forwarding: the proxy
// decides which identifiers a request needs and buffers its body.
//
// It imports only hashing and internal/jsontext (the JSON text checks it
// shares with jwt) of sluice.
package identity

import (
	"errors"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/hashing"
)

// ErrAmbiguous is wrapped by every *Error.
var ErrAmbiguous = errors.New("ambiguous identity")

// Error is an identifier that cannot be read unambiguously: sluice and the
// upstream might read different values, so sluice cannot know whom to
// count. Detail says what is wrong; it names the configured field or header
// but never quotes a value the client sent.
type Error struct {
	Detail string
}

func (e *Error) Error() string { return e.Detail }

// Unwrap makes errors.Is(err, ErrAmbiguous) hold.
func (e *Error) Unwrap() error { return ErrAmbiguous }

func errorf(parts ...string) error { return &Error{Detail: strings.Join(parts, "")} }

// quote quotes a configured field or header name for a detail.
func quote(s string) string { return `"` + s + `"` }

// canonError turns an error of hashing.CanonicalText or CanonicalEmail into
// an *Error about what (`field "email" in the JSON body`).
func canonError(what string, err error) error {
	return errorf(what, " ", err.Error())
}

// Header returns the canonical value (hashing.CanonicalText: trimmed, case
// kept) of the request header name, for a tenant or header(...) identity.
// found is false when the header is absent or blank; the caller counts the
// client IP instead.
//
// Several lines of the header, or a comma-separated list in one line, are
// ambiguous (HTTP treats them as one list, and upstreams disagree on which
// element they use), as is a value with a control or format character or
// invalid UTF-8: each is an *Error.
//
// Names match as HeaderNameEqual matches them, so "X_Tenant_ID" sent beside
// "X-Tenant-ID" is ambiguous too: a CGI-style upstream sees both as one
// variable. The caller removes hop-by-hop headers first, so that a header
// the upstream will never see counts as absent.
func Header(h http.Header, name string) (value string, found bool, err error) {
	n := 0
	for k, vs := range h {
		if HeaderNameEqual(k, name) {
			n += len(vs)
			if len(vs) > 0 {
				value = vs[0]
			}
		}
	}
	if n > 1 {
		return "", false, errorf("header ", quote(name), " is sent more than once")
	}
	if strings.IndexByte(value, ',') >= 0 {
		return "", false, errorf("header ", quote(name), " holds a list of values")
	}
	value, err = hashing.CanonicalText(value)
	if err != nil {
		return "", false, canonError("header "+quote(name), err)
	}
	return value, value != "", nil
}

// HeaderNameEqual reports whether two header names are the same for a
// CGI-style upstream (PHP, Python WSGI, Ruby Rack): ASCII case-insensitive,
// with '_' equal to '-', because such upstreams fold both "X-Tenant-ID" and
// "x_tenant_id" into one HTTP_X_TENANT_ID variable. Go canonicalises only
// names it considers valid tokens, so both spellings can reach a handler.
func HeaderNameEqual(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if headerFold(a[i]) != headerFold(b[i]) {
			return false
		}
	}
	return true
}

// headerFold maps a header name byte to its CGI-style comparison form.
func headerFold(c byte) byte {
	switch {
	case 'a' <= c && c <= 'z':
		return c - ('a' - 'A')
	case c == '_':
		return '-'
	}
	return c
}
