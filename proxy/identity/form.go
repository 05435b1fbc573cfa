package identity

import (
	"net/url"
	"strings"
)

// errMalformedForm marks a form body or query string that does not parse,
// so that a sniffed (undeclared) form can be treated as a body sluice does
// not read instead of being refused.
var errMalformedForm = &Error{Detail: "malformed form"}

// formField finds field in s, an application/x-www-form-urlencoded form
// body or query string; where names it in details ("the query string").
// present reports whether the field's name appears at all, even with an
// empty value; value is its decoded value, not canonicalised.
//
// It rejects what url.ParseQuery rejects (bad escapes; ';' as a separator,
// which some servers honour and Go does not), without building the map:
// that error is errMalformedForm, and the caller decides what a malformed
// form means. The field given twice (matchName spellings included, even
// with equal values) or in array syntax is an *Error.
func formField(s, field, where string) (value string, present bool, err error) {
	for s != "" {
		var pair string
		pair, s, _ = strings.Cut(s, "&")
		if pair == "" {
			continue
		}
		key, val, ok := formPair(pair)
		if !ok {
			return "", false, errMalformedForm
		}
		switch matchName(key, field) {
		case nameOther:
			continue
		case nameNested:
			return "", false, errorf("field ", quote(field), " in ", where, " is given as an array or object")
		}
		if present {
			return "", false, errorf("field ", quote(field), " appears more than once in ", where, " (names match case-insensitively, with white space trimmed)")
		}
		present, value = true, val
	}
	return value, present, nil
}

// QueryValid reports whether the query string s parses as url.ParseQuery
// parses it: no ';' separator, no bad escape. One that does not is what
// Go's reverse proxy rewrites before forwarding (it drops the pairs that
// do not parse and re-encodes the rest), and what other readers split
// otherwise.
func QueryValid(s string) bool { return formValid(s) }

// formValid reports whether s parses as a form (see formField).
func formValid(s string) bool {
	for s != "" {
		var pair string
		pair, s, _ = strings.Cut(s, "&")
		if _, _, ok := formPair(pair); !ok {
			return false
		}
	}
	return true
}

// formPair decodes one "key=value" pair of a form, as url.ParseQuery does.
func formPair(pair string) (key, value string, ok bool) {
	if strings.IndexByte(pair, ';') >= 0 {
		return "", "", false
	}
	k, v, _ := strings.Cut(pair, "=")
	key, err := url.QueryUnescape(k)
	if err != nil {
		return "", "", false
	}
	value, err = url.QueryUnescape(v)
	if err != nil {
		return "", "", false
	}
	return key, value, true
}
