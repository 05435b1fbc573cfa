package jwt

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
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
	if !utf8.Valid(data) || !json.Valid(data) || loneSurrogate(data) {
		return nil, false
	}
	w := jsonWalker{b: data}
	if w.next() != '{' {
		return nil, false
	}
	m, ok := w.object(1)
	return m, ok && w.next() == 0
}

// jsonWalker reads JSON text that json.Valid accepted. Every method still
// checks bounds and reports false on what it does not expect, so a bug
// cannot panic; the fuzz test holds it to encoding/json.
type jsonWalker struct {
	b []byte
	i int
}

// next skips white space and returns the next byte, or 0 at the end.
func (w *jsonWalker) next() byte {
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

// value reads the value at w.i.
func (w *jsonWalker) value(depth int) (any, bool) {
	switch c := w.next(); c {
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
			if bytes.HasPrefix(w.b[w.i:], []byte(lit)) {
				w.i += len(lit)
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
	start := w.i
	for w.i < len(w.b) && strings.IndexByte("+-.0123456789eE", w.b[w.i]) >= 0 {
		w.i++
	}
	if w.i == start {
		return nil, false
	}
	return json.Number(w.b[start:w.i]), true
}

// object reads the object whose '{' is at w.i.
func (w *jsonWalker) object(depth int) (map[string]any, bool) {
	w.i++
	m := make(map[string]any)
	var folded map[string]struct{} // of every name, once the object is large
	if w.next() == '}' {
		w.i++
		return m, true
	}
	for {
		if w.next() != '"' {
			return nil, false
		}
		name, ok := w.str()
		if !ok || w.next() != ':' {
			return nil, false
		}
		w.i++
		if !w.distinct(m, &folded, name) {
			return nil, false
		}
		v, ok := w.value(depth)
		if !ok {
			return nil, false
		}
		m[name] = v
		switch w.next() {
		case ',':
			w.i++
		case '}':
			w.i++
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
			(*folded)[foldName(other)] = struct{}{}
		}
	}
	f := foldName(name)
	if _, dup := (*folded)[f]; dup {
		return false
	}
	(*folded)[f] = struct{}{}
	return true
}

// array reads the array whose '[' is at w.i.
func (w *jsonWalker) array(depth int) ([]any, bool) {
	w.i++
	var a []any
	if w.next() == ']' {
		w.i++
		return a, true
	}
	for {
		v, ok := w.value(depth)
		if !ok {
			return nil, false
		}
		a = append(a, v)
		switch w.next() {
		case ',':
			w.i++
		case ']':
			w.i++
			return a, true
		default:
			return nil, false
		}
	}
}

// str reads the string whose '"' is at w.i, unescaped: by encoding/json
// when it holds an escape.
func (w *jsonWalker) str() (string, bool) {
	start := w.i
	escaped := false
	for w.i++; w.i < len(w.b); w.i++ {
		switch w.b[w.i] {
		case '\\':
			escaped = true
			w.i++ // the escaped byte cannot end the string
		case '"':
			w.i++
			raw := w.b[start:w.i]
			if !escaped {
				return string(raw[1 : len(raw)-1]), true
			}
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", false
			}
			return s, true
		}
	}
	return "", false
}

// foldName returns a form of name that two names share exactly when they
// are equal under Unicode simple case folding (as strings.EqualFold
// compares them): each rune replaced by the least rune of its folding
// orbit. It does not allocate for an ASCII name without lower-case
// letters.
func foldName(name string) string {
	plain := true
	for i := 0; i < len(name); i++ {
		if c := name[i]; c >= utf8.RuneSelf || 'a' <= c && c <= 'z' {
			plain = false
			break
		}
	}
	if plain {
		return name
	}
	var b strings.Builder
	b.Grow(len(name))
	for _, r := range name {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}

// loneSurrogate reports whether the JSON text data holds a \u escape of a
// surrogate (U+D800–U+DFFF) that is not a high surrogate followed at once
// by an escaped low one.
func loneSurrogate(data []byte) bool {
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		i++
		if i >= len(data) || data[i] != 'u' {
			continue // a one-character escape, "\\" included; the loop steps past it
		}
		r, ok := hex4(data, i+1)
		if !ok {
			return true // json.Valid rules this out
		}
		i += 4
		switch {
		case r < 0xD800 || r > 0xDFFF:
		case r >= 0xDC00:
			return true // a low surrogate first
		default:
			lo, ok := hex4(data, i+3)
			if i+2 >= len(data) || data[i+1] != '\\' || data[i+2] != 'u' || !ok || lo < 0xDC00 || lo > 0xDFFF {
				return true
			}
			i += 6
		}
	}
	return false
}

// hex4 decodes the four hex digits at data[i:].
func hex4(data []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
