package identity

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/jsontext"
)

// jsonField reads field from the top level of the JSON object body.
// present reports whether a key matching the field appears (see
// matchName); value is its string value, not canonicalised.
//
// json.Valid first checks the whole body with encoding/json's own scanner
// (the grammar, nesting depth, and that nothing but white space follows the
// value), so sluice and a Go upstream agree on what is malformed. The top
// level of the now known-valid body is then walked by jsonWalker, which
// skips every value it does not need without building it; keys and the one
// value it needs are unescaped by encoding/json whenever they hold an escape
// or invalid UTF-8 ("\u0065mail" is "email"). A json.Decoder.Token walk
// gives the same answers (the tests hold it to that) but costs dozens of
// allocations per body, where this costs one or two.
//
// *Errors: a malformed body, one that is not an object, the field given
// twice (whatever the values), in array syntax, or with a value that is
// not a string: a number, bool, array or object, since sluice must not
// guess which element or member the upstream would take, and null, which
// upstreams read as missing, as empty or as the string "null" (SPEC 4:
// a non-string value is ambiguous). A body that is
// not valid UTF-8, and a value with an unpaired surrogate escape
// ("\ud800"), are refused as well: Go and JavaScript decoders replace or
// keep what Python and PHP refuse, so upstreams read different values.
func jsonField(body []byte, field string) (value string, present bool, err error) {
	if !json.Valid(body) {
		return "", false, errorf("the JSON body is malformed")
	}
	if !utf8.Valid(body) {
		return "", false, errorf("the JSON body is not valid UTF-8")
	}
	w := jsonWalker{jsontext.Walker{B: body}}
	if w.Next() != '{' {
		return "", false, errorf("the JSON body is not an object")
	}
	w.I++
	if w.Next() == '}' {
		return "", false, nil
	}
	for {
		key, ok := w.str()
		if !ok {
			return "", false, errorf("the JSON body is malformed")
		}
		m := jsonKeyMatch(key, field)
		if w.Next() != ':' {
			return "", false, errorf("the JSON body is malformed")
		}
		w.I++
		switch c := w.Next(); {
		case m == nameOther:
			w.skip()
		case m == nameNested:
			return "", false, errorf("field ", quote(field), " in the JSON body is given as an array or object")
		case present:
			return "", false, errorf("field ", quote(field), " appears more than once in the JSON body (keys match case-insensitively, with white space trimmed)")
		case c == '"':
			present = true
			raw, _ := w.str()
			if jsontext.LoneSurrogate(raw) {
				return "", false, errorf("field ", quote(field), " in the JSON body is not valid UTF-16 (an unpaired surrogate)")
			}
			if value, ok = jsonString(raw); !ok {
				return "", false, errorf("the JSON body is malformed")
			}
		default:
			return "", false, errorf("field ", quote(field), " in the JSON body is not a string")
		}
		switch w.Next() {
		case ',':
			w.I++
			continue
		case '}':
		default:
			return "", false, errorf("the JSON body is malformed")
		}
		return value, present, nil
	}
}

// jsonWalker steps through a body that json.Valid accepted. Every method
// still checks bounds, so a walker bug cannot panic; it would only misread,
// which the differential fuzz test against json.Decoder guards.
type jsonWalker struct{ jsontext.Walker }

// str consumes the string at w.I, returning it with its quotes.
func (w *jsonWalker) str() ([]byte, bool) {
	if w.Next() != '"' {
		return nil, false
	}
	raw, _, ok := w.String()
	return raw, ok
}

// skip consumes the value at w.I: a string, an object or array with
// everything nested in it, or a literal (number, true, false, null).
func (w *jsonWalker) skip() {
	depth := 0
	for {
		switch w.Next() {
		case 0:
			return
		case '"':
			if _, ok := w.str(); !ok {
				return
			}
		case '{', '[':
			depth++
			w.I++
		case '}', ']':
			depth--
			w.I++
		case ',', ':':
			if depth == 0 {
				return
			}
			w.I++
		default: // a literal: up to the next delimiter
			for w.I < len(w.B) && !jsonDelim(w.B[w.I]) {
				w.I++
			}
		}
		if depth <= 0 {
			return
		}
	}
}

// jsonDelim reports whether c ends a JSON literal.
func jsonDelim(c byte) bool {
	switch c {
	case ',', '}', ']', ':', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}

// jsonKeyMatch compares the quoted JSON string raw, once unescaped, with
// field (see matchName).
func jsonKeyMatch(raw []byte, field string) nameMatch {
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		// The conversion does not escape, so short keys do not allocate.
		return matchName(string(inner), field)
	}
	key, ok := jsonString(raw)
	if !ok {
		return nameOther
	}
	return matchName(key, field)
}

// jsonString unescapes the quoted JSON string raw exactly as encoding/json
// does (invalid UTF-8 and lone surrogates become U+FFFD).
func jsonString(raw []byte) (string, bool) {
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
