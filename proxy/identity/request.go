package identity

import (
	"bytes"
	"mime"
	"strings"

	"github.com/sluicehq/sluice/hashing"
)

// MethodField is the body or query field that Rails, Laravel, Symfony and
// Express's method-override read as the method a request asks to be
// treated as.
const MethodField = "_method"

// bodyFormat is how sluice reads a request body.
type bodyFormat uint8

const (
	formatNone      bodyFormat = iota // no body, or only white space
	formatJSON                        // application/json, */*+json, or sniffed
	formatForm                        // application/x-www-form-urlencoded, or sniffed
	formatMultipart                   // multipart/form-data
	formatUnread                      // any other type: text/plain, text/json, ...
)

// Request is what identity extraction sees of one HTTP request: its query
// string, its Content-Type lines and its buffered body. Reset it for each
// request; it caches what it parsed. A Request is not safe for concurrent
// use; it is meant to be pooled by the caller.
type Request struct {
	query       string
	contentType []string
	body        []byte

	parsed bool // format and what follows are set
	format bodyFormat
	err    error // the body cannot be read at all (Content-Type given twice, ...)
	parts  []part
}

// Reset makes r describe a request with this raw query string (as in
// url.URL.RawQuery), these Content-Type header lines, and this body, which
// must be the whole body as sent. body is retained until the next Reset and
// must not change.
//
// streamed reports a body that was not buffered because it is over the
// caller's limit (where the caller's rules need no body; elsewhere it
// answers 413). sluice cannot read it, so it counts as a body in a type
// sluice does not read, whatever its Content-Type.
func (r *Request) Reset(rawQuery string, contentType []string, body []byte, streamed bool) {
	clear(r.parts)
	*r = Request{query: rawQuery, contentType: contentType, body: body, parts: r.parts[:0]}
	if streamed {
		r.parsed, r.format = true, formatUnread
	}
}

// ReadsBody reports whether sluice reads bodies sent with these
// Content-Type lines (see Email): whether an identifier or a "_method"
// field could be found in one, so that a caller must buffer it to know.
func ReadsBody(contentType []string) bool {
	if len(contentType) != 1 {
		return true // none is sniffed; two are refused, which needs the body too
	}
	return mediaFormat(contentType[0]) != formatUnread
}

// mediaFormat returns the format of a body of Content-Type ct, with
// formatNone for a body to be sniffed (no media type).
func mediaFormat(ct string) bodyFormat {
	mt, _, _ := strings.Cut(ct, ";")
	switch mt = strings.TrimSpace(mt); {
	case mt == "":
		return formatNone
	case strings.EqualFold(mt, "application/json") || hasSuffixFold(mt, "+json"):
		return formatJSON
	case strings.EqualFold(mt, "application/x-www-form-urlencoded"):
		return formatForm
	case strings.EqualFold(mt, "multipart/form-data"):
		return formatMultipart
	}
	return formatUnread
}

// Email returns the canonical email (hashing.CanonicalEmail) in field, read
// from the body and the query string. found is false when neither carries
// a non-blank value; the caller then counts the client IP instead, so that
// leaving the identifier out never escapes a limit.
//
// Where it looks:
//   - a JSON body: Content-Type application/json or any +json type, read
//     at the top level of an object;
//   - a form body: application/x-www-form-urlencoded;
//   - a multipart/form-data body: its fields, never its files;
//   - with no Content-Type, a body whose first non-white-space byte is '{'
//     is read as JSON, any other body as a form, and one that does not
//     parse as a form as a body sluice does not read;
//   - the query string, always.
//
// Field names match as matchName says: case-insensitively, with white space
// trimmed, with PHP's '.', ' ' and '[' for '_'.
//
// The error is an *Error when the identifier is ambiguous: a body that does
// not parse (in a type sluice reads), the field given twice in the body or
// twice in the query string, given in array syntax, given as a non-string
// JSON value (null included), a value refused by hashing.CanonicalEmail
// (control or format characters, invalid UTF-8), the body and the query
// string both carrying it with values that differ once canonical (a blank
// one beside another included), or the query string carrying
// it while the body is in a type sluice does not read (text/plain,
// text/json, ...), where the upstream might read the field from the body.
// A query string that does not parse (a bad escape, ';' as a separator) is
// an *Error too, since the upstream may still read it.
func (r *Request) Email(field string) (string, bool, error) {
	return r.field(field, hashing.CanonicalEmail)
}

// Method returns the method that the request's "_method" field asks for,
// trimmed and upper-cased, or "" when there is none. It reads the body and
// the query string as Email does, with the same ambiguities (the field
// given twice, body and query disagreeing, a body sluice does not read
// beside a query that carries it), and a value that is not a method name
// (an RFC 9110 token) is an *Error as well.
func (r *Request) Method() (string, error) {
	m, _, err := r.field(MethodField, CanonicalMethod)
	return m, err
}

// CanonicalMethod trims v and upper-cases it, as Rails and Symfony do
// before they use it. A value that is not a method name (an RFC 9110
// token) once trimmed, or that holds a control or format character, is an
// *Error.
func CanonicalMethod(v string) (string, error) {
	v, err := hashing.CanonicalText(v)
	if err != nil {
		return "", err
	}
	for i := 0; i < len(v); i++ {
		if !isTokenChar(v[i]) {
			return "", errNotMethod
		}
	}
	return strings.ToUpper(v), nil
}

// errNotMethod reads as the end of "field "_method" in the query string ...".
var errNotMethod = &Error{Detail: "is not a method name"}

// field reads field from the body and the query string, canonicalised with
// canon; see Email.
func (r *Request) field(field string, canon func(string) (string, error)) (string, bool, error) {
	r.parse()
	if r.err != nil {
		return "", false, r.err
	}
	var (
		bv       string
		bpresent bool
		err      error
		where    string
	)
	switch r.format {
	case formatJSON:
		where = "in the JSON body"
		bv, bpresent, err = jsonField(r.body, field)
	case formatForm:
		where = "in the form body"
		bv, bpresent, err = formField(string(r.body), field, "the form body")
		if err == errMalformedForm {
			err = errorf("the form body is malformed")
		}
	case formatMultipart:
		where = "in the multipart body"
		bv, bpresent, err = multipartField(r.parts, field)
	}
	if err != nil {
		return "", false, err
	}
	qv, qpresent, err := formField(r.query, field, "the query string")
	if err == errMalformedForm {
		return "", false, errorf("the query string is malformed")
	}
	if err != nil {
		return "", false, err
	}
	if qpresent && r.format == formatUnread {
		return "", false, errorf("field ", quote(field), " is in the query string, and the body is in a Content-Type sluice does not read (it reads JSON, forms and multipart forms)")
	}
	var bc, qc string
	if bpresent {
		if bc, err = canon(bv); err != nil {
			return "", false, canonError("field "+quote(field)+" "+where, err)
		}
	}
	if qpresent {
		if qc, err = canon(qv); err != nil {
			return "", false, canonError("field "+quote(field)+" in the query string", err)
		}
	}
	switch {
	case bpresent && qpresent && bc != qc:
		// A blank value beside another is a difference too: an upstream
		// that takes the body's over the query's reads the blank one.
		return "", false, errorf("field ", quote(field), " has different values in the body and the query string")
	case bc != "":
		return bc, true, nil
	case qc != "":
		return qc, true, nil
	}
	return "", false, nil
}

// parse works out the body's format once, and splits a multipart body.
func (r *Request) parse() {
	if r.parsed {
		return
	}
	r.parsed = true
	trimmed := bytes.TrimLeft(r.body, " \t\r\n")
	if len(trimmed) == 0 {
		r.format = formatNone
		return
	}
	if len(r.contentType) > 1 {
		// Go reads the first line, others the last or both.
		r.err = errorf("the body's Content-Type is sent more than once")
		return
	}
	ct := ""
	if len(r.contentType) == 1 {
		ct = r.contentType[0]
	}
	r.format = mediaFormat(ct)
	switch {
	case r.format == formatNone && trimmed[0] == '{':
		r.format = formatJSON
	case r.format == formatNone:
		// Not a form after all if it does not parse: the upstream would
		// not read it as one either.
		r.format = formatForm
		if !formValid(string(r.body)) {
			r.format = formatUnread
		}
	case r.format == formatMultipart:
		_, params, err := mime.ParseMediaType(ct)
		if err != nil || params["boundary"] == "" {
			r.err = errorf("the multipart body's Content-Type has no valid boundary")
			return
		}
		r.parts, r.err = parseMultipart(r.parts, r.body, params["boundary"])
	}
}

// hasSuffixFold reports whether s ends in suffix, ASCII case-insensitively.
func hasSuffixFold(s, suffix string) bool {
	return len(s) >= len(suffix) && strings.EqualFold(s[len(s)-len(suffix):], suffix)
}

// isTokenChar reports whether c is an RFC 9110 tchar.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
