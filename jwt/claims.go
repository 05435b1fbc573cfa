package jwt

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/jsontext"
)

// Claims are the claims of a verified token. They are read-only and safe
// for simultaneous use by multiple goroutines. A nil *Claims has no
// claims.
type Claims struct {
	m map[string]any // members as decodeObject builds them
}

// maxSafeInteger is the largest integer every JSON reader agrees on:
// 2^53−1, the limit of I-JSON (RFC 7493, section 2.2), since readers that
// hold numbers as IEEE 754 doubles (JavaScript, many others) merge larger
// neighbours.
const maxSafeInteger = 1<<53 - 1

// Claim returns the value of the claim path names, and whether it counts
// as an identifier: a non-empty string, or an integer written in
// canonical decimal (no sign but a minus, no leading zero, no fraction,
// no exponent, no "-0") within ±(2^53−1). A string is returned exactly as
// the token holds it; an integer as its decimal. Anything else (a number
// such as 1e3, 1000.0, 01 or 2^53, true, null, an array, an object, "")
// does not count, so two spellings of one number never give one user two
// keys, and a value some readers would round never merges two users.
//
// path is a claim name, or a dotted path through nested objects:
// "app_metadata.tenant_id" is the member tenant_id of the object
// app_metadata. A claim whose own name holds dots (Auth0's namespaced
// "https://example.com/plan") is read whole: a top-level claim named path
// is used when the token has one. When a token has both such a claim and
// the nested one, the claim is ambiguous and does not count.
//
// Claim does not allocate.
func (c *Claims) Claim(path string) (string, bool) {
	if c == nil {
		return "", false
	}
	whole, hasWhole := c.m[path]
	if strings.IndexByte(path, '.') < 0 {
		if hasWhole {
			return identifier(whole)
		}
		return "", false
	}
	nested, hasNested := lookup(c.m, path)
	switch {
	case hasWhole && hasNested:
		return "", false
	case hasWhole:
		return identifier(whole)
	case hasNested:
		return identifier(nested)
	}
	return "", false
}

// lookup walks the dotted path through nested objects.
func lookup(m map[string]any, path string) (any, bool) {
	for {
		name, rest, more := strings.Cut(path, ".")
		v, ok := m[name]
		if !ok || !more {
			return v, ok
		}
		if m, ok = v.(map[string]any); !ok {
			return nil, false
		}
		path = rest
	}
}

// identifier returns v as an identifier, as Claim describes.
func identifier(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, v != ""
	case json.Number:
		if canonicalInteger(string(v)) {
			return string(v), true
		}
	}
	return "", false
}

// canonicalInteger reports whether s is an integer in canonical decimal
// within ±maxSafeInteger.
func canonicalInteger(s string) bool {
	digits := strings.TrimPrefix(s, "-")
	if digits == "" || len(digits) > 16 || digits[0] == '0' && (len(digits) > 1 || len(digits) < len(s)) {
		return false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return false
		}
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	return err == nil && n <= maxSafeInteger
}

// number returns the claim name as a NumericDate (RFC 7519, section 2):
// seconds since the epoch, possibly fractional. present is false when the
// claim is absent; ok is false when it is present but not a JSON number
// that a float64 holds (1e999 is not).
func (c *Claims) number(name string) (secs float64, present, ok bool) {
	v, present := c.m[name]
	if !present {
		return 0, false, false
	}
	n, isNum := v.(json.Number)
	if !isNum {
		return 0, true, false
	}
	f, err := strconv.ParseFloat(string(n), 64)
	return f, true, err == nil
}

// maxDepth bounds how deeply a header or payload may nest objects and
// arrays: far beyond any real token, and a bound on the decoder's stack.
const maxDepth = 32

// decodeObject decodes a JWS header or payload: a JSON object (RFC 8259)
// in UTF-8, nested at most maxDepth deep, whose objects each have distinct
// member names, also under Unicode case folding. Numbers are kept as
// json.Number, objects are map[string]any and arrays []any. It reports
// false for anything else.
//
// Names given twice are refused because JSON readers disagree on them
// (encoding/json and JavaScript keep the last, others the first or
// refuse), and names that differ only in case because some readers match
// names case-insensitively (encoding/json does): either way the issuer,
// sluice and the upstream could read two different users from one
// token. Invalid UTF-8 and unpaired surrogate escapes ("\ud800") are
// refused because decoders replace them, which would make two spellings
// one value.
//
// json.Valid checks the grammar first, with encoding/json's own scanner;
// the text, now known to be valid, is then walked by a jsonWalker, which
// costs a fraction of json.Decoder's allocations.
func decodeObject(data []byte) (map[string]any, bool) {
	if !utf8.Valid(data) || !json.Valid(data) || jsontext.LoneSurrogate(data) {
		return nil, false
	}
	w := jsonWalker{jsontext.Walker{B: data}}
	if w.Next() != '{' {
		return nil, false
	}
	m, ok := w.object(1)
	return m, ok && w.Next() == 0
}

// jsonWalker reads JSON text that json.Valid accepted into values. Every
// method still checks bounds and reports false on what it does not
// expect, so a bug cannot panic; the fuzz test holds it to encoding/json.
type jsonWalker struct{ jsontext.Walker }

// value reads the value at w.I.
func (w *jsonWalker) value(depth int) (any, bool) {
	switch c := w.Next(); c {
	case '{', '[':
		if depth >= maxDepth {
			return nil, false
		}
		if c == '{' {
			return w.object(depth + 1)
		}
		return w.array(depth + 1)
	case '"':
		return w.str()
	case 't', 'f', 'n':
		for _, lit := range [...]string{"true", "false", "null"} {
			if bytes.HasPrefix(w.B[w.I:], []byte(lit)) {
				w.I += len(lit)
				switch lit {
				case "true":
					return true, true
				case "false":
					return false, true
				}
				return nil, true
			}
		}
		return nil, false
	case 0:
		return nil, false
	}
	start := w.I
	for w.I < len(w.B) && strings.IndexByte("+-.0123456789eE", w.B[w.I]) >= 0 {
		w.I++
	}
	if w.I == start {
		return nil, false
	}
	return json.Number(w.B[start:w.I]), true
}

// object reads the object whose '{' is at w.I.
func (w *jsonWalker) object(depth int) (map[string]any, bool) {
	w.I++
	m := make(map[string]any)
	var folded map[string]struct{} // of every name, once the object is large
	if w.Next() == '}' {
		w.I++
		return m, true
	}
	for {
		if w.Next() != '"' {
			return nil, false
		}
		name, ok := w.str()
		if !ok || w.Next() != ':' {
			return nil, false
		}
		w.I++
		if !w.distinct(m, &folded, name) {
			return nil, false
		}
		v, ok := w.value(depth)
		if !ok {
			return nil, false
		}
		m[name] = v
		switch w.Next() {
		case ',':
			w.I++
		case '}':
			w.I++
			return m, true
		default:
			return nil, false
		}
	}
}

// smallObject is the number of members up to which names are compared
// pairwise; beyond it, through a map of folded names.
const smallObject = 8

// distinct reports whether name differs, under Unicode simple case
// folding, from every name of m, an object being read.
func (w *jsonWalker) distinct(m map[string]any, folded *map[string]struct{}, name string) bool {
	if len(m) < smallObject {
		for other := range m {
			if strings.EqualFold(other, name) {
				return false
			}
		}
		return true
	}
	if *folded == nil {
		*folded = make(map[string]struct{}, 2*len(m))
		for other := range m {
			(*folded)[jsontext.FoldName(other)] = struct{}{}
		}
	}
	f := jsontext.FoldName(name)
	if _, dup := (*folded)[f]; dup {
		return false
	}
	(*folded)[f] = struct{}{}
	return true
}

// array reads the array whose '[' is at w.I.
func (w *jsonWalker) array(depth int) ([]any, bool) {
	w.I++
	var a []any
	if w.Next() == ']' {
		w.I++
		return a, true
	}
	for {
		v, ok := w.value(depth)
		if !ok {
			return nil, false
		}
		a = append(a, v)
		switch w.Next() {
		case ',':
			w.I++
		case ']':
			w.I++
			return a, true
		default:
			return nil, false
		}
	}
}

// str reads the string whose '"' is at w.I, unescaped: by encoding/json
// when it holds an escape.
func (w *jsonWalker) str() (string, bool) {
	raw, escaped, ok := w.String()
	switch {
	case !ok:
		return "", false
	case !escaped:
		return string(raw[1 : len(raw)-1]), true
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}
