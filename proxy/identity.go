package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/sluicehq/sluice/hashing"
)

// errAmbiguousIdentity is wrapped by every *identityError: the request
// names its identifier in a way that sluice and the upstream might read
// differently (more than once, not as a string, or in a body that does not
// parse), so sluice cannot know whom to count and refuses the request.
var errAmbiguousIdentity = errors.New("ambiguous identity")

// identityError is an identifier that cannot be read unambiguously. The
// proxy answers it with 400 and Detail as the problem detail. Detail names
// the configured field or header, never the value the client sent.
type identityError struct {
	Detail string
}

func (e *identityError) Error() string { return e.Detail }

// Unwrap makes errors.Is(err, errAmbiguousIdentity) hold.
func (e *identityError) Unwrap() error { return errAmbiguousIdentity }

// identErr returns an *identityError with detail.
func identErr(detail string) error { return &identityError{Detail: detail} }

// emailFromRequest finds the identifier named field in a request whose body
// has already been buffered (at most SLUICE_MAX_BODY_BYTES; the caller
// answers 413 beyond that). It returns the raw value; the caller
// canonicalises it with hashing.CanonicalEmail.
//
// Where it looks:
//   - a JSON body: Content-Type application/json or any +json type;
//   - a form body: application/x-www-form-urlencoded;
//   - with no Content-Type, a body whose first non-whitespace byte is '{'
//     is read as JSON, any other body as a form (if it does not parse as
//     one, it is ignored, since no common framework would read it as a form);
//   - other content types (multipart/form-data, text/plain, ...): the body
//     is not consulted; an empty body never is;
//   - the query string, always.
//
// Field names match case-insensitively with Unicode simple folding
// (strings.EqualFold), because encoding/json and many frameworks match keys
// that way: "Email", "EMAIL" and "\u0065mail" are all the field "email".
//
// A value that is empty after canonicalisation, and a JSON null, count as
// absent; found is false then, and the caller falls back to the client IP.
//
// The error is an *identityError (400) when the identifier is ambiguous:
// the field appears more than once at the top level of a JSON object
// (whatever the values), its JSON value is not a string, the JSON body is
// malformed, not an object or followed by more data, the field appears more
// than once in a form or in the query string (even with equal values), a
// declared form body does not parse, or body and query both carry the field
// with values that differ after canonicalisation. A hostile body must not
// make sluice count one identity while the upstream serves another.
func emailFromRequest(contentType string, body []byte, query url.Values, field string) (value string, found bool, err error) {
	bv, bfound, err := identFromBody(contentType, body, field)
	if err != nil {
		return "", false, err
	}
	qv, qfound, err := identFromQuery(query, field)
	if err != nil {
		return "", false, err
	}
	switch {
	case bfound && qfound:
		if hashing.CanonicalEmail(bv) != hashing.CanonicalEmail(qv) {
			return "", false, identErr("field " + identQuote(field) + " has different values in the body and the query string")
		}
		return bv, true, nil
	case bfound:
		return bv, true, nil
	case qfound:
		return qv, true, nil
	}
	return "", false, nil
}

// identQuote quotes a configured field or header name for a detail.
func identQuote(s string) string { return `"` + s + `"` }

// identPresent reports whether v counts as a value rather than as absent.
func identPresent(v string) bool { return hashing.CanonicalEmail(v) != "" }

// identFromBody finds field in body according to contentType.
func identFromBody(contentType string, body []byte, field string) (string, bool, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return "", false, nil
	}
	mt := contentType
	if i := strings.IndexByte(mt, ';'); i >= 0 {
		mt = mt[:i]
	}
	mt = strings.TrimSpace(mt)
	switch {
	case mt == "":
		if trimmed[0] == '{' {
			return identFromJSON(body, field)
		}
		v, found, err := identFromForm(body, field)
		if errors.Is(err, identErrMalformedForm) {
			return "", false, nil // not a form after all; the upstream would not read it as one either
		}
		return v, found, err
	case strings.EqualFold(mt, "application/json") || identHasSuffixFold(mt, "+json"):
		return identFromJSON(body, field)
	case strings.EqualFold(mt, "application/x-www-form-urlencoded"):
		return identFromForm(body, field)
	}
	return "", false, nil
}

// identHasSuffixFold reports whether s ends in suffix, ASCII
// case-insensitively.
func identHasSuffixFold(s, suffix string) bool {
	return len(s) >= len(suffix) && strings.EqualFold(s[len(s)-len(suffix):], suffix)
}

// identFromJSON reads field from the top level of a JSON object.
//
// json.Valid first checks the whole body with encoding/json's own scanner
// (the grammar, nesting depth, and that nothing but whitespace follows the
// value), so sluice and a Go upstream agree on what is malformed. The top
// level of the now known-valid body is then walked by identJSONWalker,
// which skips every value it does not need without building it; keys and
// the one value it needs are unescaped by encoding/json whenever they hold
// an escape or invalid UTF-8 ("\u0065mail" is "email"). A json.Decoder.Token
// walk gives the same answers (the tests hold it to that) but costs dozens
// of allocations per body, where this costs one or two.
func identFromJSON(body []byte, field string) (string, bool, error) {
	if !json.Valid(body) {
		return "", false, identErr("the JSON body is malformed")
	}
	w := identJSONWalker{b: body}
	if w.next() != '{' {
		return "", false, identErr("the JSON body is not an object")
	}
	w.i++
	var (
		value string
		seen  bool
	)
	if w.next() == '}' {
		return "", false, nil
	}
	for {
		key, ok := w.str()
		if !ok {
			return "", false, identErr("the JSON body is malformed")
		}
		match := identJSONKeyIs(key, field)
		if w.next() != ':' {
			return "", false, identErr("the JSON body is malformed")
		}
		w.i++
		switch c := w.next(); {
		case !match:
			w.skip()
		case seen:
			return "", false, identErr("field " + identQuote(field) + " appears more than once in the JSON body (keys match case-insensitively)")
		case c == '"':
			seen = true
			raw, _ := w.str()
			if value, ok = identJSONString(raw); !ok {
				return "", false, identErr("the JSON body is malformed")
			}
		case c == 'n':
			seen = true // null: absent, as for encoding/json decoding into a string
			w.skip()
		default:
			// A number, bool, or the start of an array or object. Do not
			// guess which element or member the upstream would take.
			return "", false, identErr("field " + identQuote(field) + " in the JSON body is not a string")
		}
		switch w.next() {
		case ',':
			w.i++
			continue
		case '}':
		default:
			return "", false, identErr("the JSON body is malformed")
		}
		break
	}
	if !identPresent(value) {
		return "", false, nil
	}
	return value, true, nil
}

// identJSONWalker steps through a body that json.Valid accepted. Every
// method still checks bounds, so a walker bug cannot panic; it would only
// misread, which the differential fuzz test against json.Decoder guards.
type identJSONWalker struct {
	b []byte
	i int
}

// next skips whitespace and returns the next byte, or 0 at the end.
func (w *identJSONWalker) next() byte {
	for w.i < len(w.b) {
		switch c := w.b[w.i]; c {
		case ' ', '\t', '\r', '\n':
			w.i++
		default:
			return c
		}
	}
	return 0
}

// str consumes the string at w.i, returning it with its quotes.
func (w *identJSONWalker) str() ([]byte, bool) {
	if w.next() != '"' {
		return nil, false
	}
	start := w.i
	for w.i++; w.i < len(w.b); w.i++ {
		switch w.b[w.i] {
		case '\\':
			w.i++ // the escaped byte cannot end the string
		case '"':
			w.i++
			return w.b[start:w.i], true
		}
	}
	return nil, false
}

// skip consumes the value at w.i: a string, an object or array with
// everything nested in it, or a literal (number, true, false, null).
func (w *identJSONWalker) skip() {
	depth := 0
	for {
		switch w.next() {
		case 0:
			return
		case '"':
			if _, ok := w.str(); !ok {
				return
			}
		case '{', '[':
			depth++
			w.i++
		case '}', ']':
			depth--
			w.i++
		case ',', ':':
			if depth == 0 {
				return
			}
			w.i++
		default: // a literal: up to the next delimiter
			for w.i < len(w.b) && !identJSONDelim(w.b[w.i]) {
				w.i++
			}
		}
		if depth <= 0 {
			return
		}
	}
}

// identJSONDelim reports whether c ends a JSON literal.
func identJSONDelim(c byte) bool {
	switch c {
	case ',', '}', ']', ':', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}

// identJSONKeyIs reports whether the quoted JSON string raw, once
// unescaped, equals field under Unicode simple case folding.
func identJSONKeyIs(raw []byte, field string) bool {
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		// The conversion does not escape, so short keys do not allocate.
		return strings.EqualFold(string(inner), field)
	}
	key, ok := identJSONString(raw)
	return ok && strings.EqualFold(key, field)
}

// identJSONString unescapes the quoted JSON string raw exactly as
// encoding/json does (invalid UTF-8 and lone surrogates become U+FFFD).
func identJSONString(raw []byte) (string, bool) {
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), true
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// identErrMalformedForm marks a form body that does not parse, so that a
// sniffed (undeclared) form can be ignored instead of refused.
var identErrMalformedForm = identErr("the form body is malformed")

// identFromForm finds field in an application/x-www-form-urlencoded body.
// It rejects what url.ParseQuery rejects (bad escapes; ';' as a separator,
// which some servers honour and Go does not), without building the map.
func identFromForm(body []byte, field string) (string, bool, error) {
	var (
		value string
		seen  bool
	)
	for s := string(body); s != ""; {
		var pair string
		pair, s, _ = strings.Cut(s, "&")
		if strings.IndexByte(pair, ';') >= 0 {
			return "", false, identErrMalformedForm
		}
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		key, err := url.QueryUnescape(k)
		if err != nil {
			return "", false, identErrMalformedForm
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			return "", false, identErrMalformedForm
		}
		if !strings.EqualFold(key, field) {
			continue
		}
		if seen {
			return "", false, identErr("field " + identQuote(field) + " appears more than once in the form body (names match case-insensitively)")
		}
		seen, value = true, val
	}
	if !identPresent(value) {
		return "", false, nil
	}
	return value, true, nil
}

// identFromQuery finds field in the parsed query string.
func identFromQuery(query url.Values, field string) (string, bool, error) {
	var (
		value string
		n     int
	)
	for k, vs := range query {
		if strings.EqualFold(k, field) {
			n += len(vs)
			if len(vs) > 0 {
				value = vs[0]
			}
		}
	}
	if n > 1 {
		return "", false, identErr("field " + identQuote(field) + " appears more than once in the query string (names match case-insensitively)")
	}
	if !identPresent(value) {
		return "", false, nil
	}
	return value, true, nil
}

// headerIdentity returns the value of the request header name, trimmed.
// Several lines of it, or a comma-separated list in one line, are ambiguous
// (HTTP treats them as the same list, and upstreams disagree on which
// element they use): an *identityError. An empty value counts as absent.
//
// Names match as stripClientHeaders matches them, case-insensitively and
// with '_' equal to '-', so "X_Tenant_ID" sent beside "X-Tenant-ID" is
// ambiguous too: a CGI-style upstream sees both as one variable.
func headerIdentity(h http.Header, name string) (value string, found bool, err error) {
	n := 0
	for k, vs := range h {
		if hdrNameEqual(k, name) {
			n += len(vs)
			if len(vs) > 0 {
				value = vs[0]
			}
		}
	}
	if n > 1 {
		return "", false, identErr("header " + identQuote(name) + " is sent more than once")
	}
	if strings.IndexByte(value, ',') >= 0 {
		return "", false, identErr("header " + identQuote(name) + " holds a list of values")
	}
	value = strings.TrimSpace(value)
	if value == "" {
		return "", false, nil
	}
	return value, true, nil
}
