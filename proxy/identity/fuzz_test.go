package identity

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"

	"github.com/sluicehq/sluice/hashing"
)

// FuzzRequest: whatever the body, type, query and field, Email and Method
// either return a canonical value or an *Error, deterministically, and the
// fast JSON walk agrees with a json.Decoder walk.
func FuzzRequest(f *testing.F) {
	seeds := []struct{ ct, body, query, field string }{
		{"application/json", `{"email":"a@example.com","password":"x"}`, "", "email"},
		{"application/json", `{"email":"a@example.com","Email":"b"}`, "", "email"},
		{"application/json", `{"\u0065mail":"a","n":{"email":[1,{"email":null}]}}`, "email=a", "email"},
		{"application/json", `{"\u212Aontakt":"a"}`, "", "kontakt"},
		{"application/problem+json", `{"email":null} {}`, "", "email"},
		{"application/json", `{"email":["a"]}`, "", "email"},
		{"application/json", `{"email":"\ud800"}`, "", "email"},
		{"application/x-www-form-urlencoded", "email=a%40b&x=%zz;y", "", "email"},
		{"application/x-www-form-urlencoded", "EMAIL=a&email=a", "email=b", "email"},
		{"application/x-www-form-urlencoded", "_method=DELETE&.method=put", "", "_method"},
		{"", " {\"email\":\"a\"}", "", "email"},
		{"", "email=a", "email=A", "email"},
		{mpCT, mp(field("email", "a"), field("x", "y")), "email=a&email=b", "email"},
		{mpCT, "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nfoo\n--XyZ\r\n\r\n--XyZ--", "", "email"},
		{"text/plain", "x", "Email=%EF%BD%81", "email"},
	}
	for _, s := range seeds {
		f.Add(s.ct, []byte(s.body), s.query, s.field)
	}
	f.Fuzz(func(t *testing.T, ct string, body []byte, rawQuery, field string) {
		var r Request
		r.Reset(rawQuery, []string{ct}, body, false)
		v, found, err := r.Email(field)
		if err != nil {
			var ie *Error
			if !errors.As(err, &ie) || !errors.Is(err, ErrAmbiguous) {
				t.Fatalf("error %v (%T) is not an *Error", err, err)
			}
			if found || v != "" {
				t.Fatalf("error with value %q, %v", v, found)
			}
		}
		if found != (v != "") {
			t.Fatalf("found %v with value %q", found, v)
		}
		if found {
			if c, err := hashing.CanonicalEmail(v); c != v || err != nil {
				t.Fatalf("value %q is not canonical: %q, %v", v, c, err)
			}
		}
		m, merr := r.Method()
		if merr == nil && m != strings.ToUpper(strings.TrimSpace(m)) {
			t.Fatalf("method %q is not canonical", m)
		}
		sameAsRef(t, body, field)
		var r2 Request
		r2.Reset(rawQuery, []string{ct}, body, false)
		v2, found2, err2 := r2.Email(field)
		if v2 != v || found2 != found || (err2 == nil) != (err == nil) || (err != nil && err.Error() != err2.Error()) {
			t.Fatalf("not deterministic: %q %v %v, then %q %v %v", v, found, err, v2, found2, err2)
		}
	})
}

// whiteSpace are Unicode White_Space characters a client may pad a value
// with; every upstream's trim removes some of them, sluice all.
var whiteSpace = []string{" ", "\t", "\n", "\r", "\v", "\f", "\u0085", "\u00a0", "\u1680", "\u2000", "\u2007", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"}

// spelling turns the choices in c into one way a client may write the
// address e that every upstream reads as e (given its canonicalisation):
// another ASCII case, padding with White_Space, NFD or fullwidth forms.
func spelling(e string, c []byte) string {
	pick := func(i int) byte {
		if i < len(c) {
			return c[i]
		}
		return 0
	}
	s := e
	switch pick(0) % 4 {
	case 1:
		s = asciiUpperAt(s, 0xff)
	case 2:
		s = asciiLower(s)
	case 3:
		s = asciiUpperAt(s, pick(5))
	}
	switch pick(1) % 3 {
	case 1:
		s = norm.NFD.String(s)
	case 2:
		s = fullwidth(s, pick(6))
	}
	if n := int(pick(2) % 3); n > 0 {
		s = strings.Repeat(whiteSpace[int(pick(3))%len(whiteSpace)], n) + s
	}
	if n := int(pick(4) % 3); n > 0 {
		s += strings.Repeat(whiteSpace[int(pick(7))%len(whiteSpace)], n)
	}
	return s
}

// asciiLower lower-cases the ASCII letters of s. Only ASCII case is
// changed: Unicode upper-casing does not round-trip (U+0345 upper-cases to
// U+0399), so it is no spelling of the same address.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + ('a' - 'A')
		}
	}
	return string(b)
}

// asciiUpperAt upper-cases the ASCII letters of s at positions where the
// bits of mask (repeating) are set.
func asciiUpperAt(s string, mask byte) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' && mask&(1<<(i%8)) != 0 {
			b[i] = c - ('a' - 'A')
		}
	}
	return string(b)
}

// fullwidth replaces the printable ASCII characters of s at positions
// where the bits of mask are set by their fullwidth forms, which NFKC maps
// back.
func fullwidth(s string, mask byte) string {
	var b strings.Builder
	for i, r := range s {
		if 0x21 <= r && r <= 0x7e && mask&(1<<(i%8)) != 0 {
			r += 0xff01 - 0x21
		}
		b.WriteRune(r)
	}
	return b.String()
}

// keySpellings are ways to write the field name "email" that some
// upstream reads as that field.
var keySpellings = []string{"email", "EMAIL", "Email", " email", "email ", "eMaIl"}

// encode builds a request that carries the address value under key in the
// format chosen by how: a JSON body (also with an escaped key, and a +json
// type), a form body, a multipart body, the query string alone, or a body
// and the query string together.
func encode(value, key string, how byte) *Request {
	q := func(k, v string) string { return url.QueryEscape(k) + "=" + url.QueryEscape(v) }
	j := func(k, v string) string {
		kb, _ := json.Marshal(k)
		vb, _ := json.Marshal(v)
		return `{"password":"x",` + string(kb) + ":" + string(vb) + `,"n":{"email":1}}`
	}
	switch how % 7 {
	case 0:
		return newRequest("application/json", j(key, value), "")
	case 1:
		escaped := `{"\u0065mail":` + strings.TrimPrefix(j("", value), `{"password":"x","":`)
		return newRequest("application/vnd.api+json; charset=utf-8", escaped, "")
	case 2:
		return newRequest(formCT, "a=1&"+q(key, value), "")
	case 3:
		return newRequest(mpCT, mp(field("password", "x"), field(strings.NewReplacer(`"`, "", "\r", "", "\n", "").Replace(key), value)), "")
	case 4:
		return newRequest("", "", "page=1&"+q(key, value))
	case 5:
		return newRequest("application/json", j(key, value), q(key, value))
	default:
		return newRequest("text/plain", "", q(key, value)) // a type with no body is no ambiguity
	}
}

// FuzzEquivalentSpellings states the rule the identity package exists
// for: two requests that an upstream reads as the same address (spelled in
// another case, padded with white space, in NFD or fullwidth forms, under
// another spelling of the field name, in another body format or in the
// query string) get the same key, or at least one of them gets a 400.
// Never two different keys, and never a key for one and the client IP
// (absent) for the other.
func FuzzEquivalentSpellings(f *testing.F) {
	f.Add("victim@example.com", []byte{0, 0, 0, 0, 0, 0, 0, 0}, []byte{1, 2, 1, 2, 1, 3, 7, 9}, byte(0), byte(2), byte(1), byte(3))
	f.Add("Élodie@Example.com", []byte{1, 1, 2, 16, 1, 0, 255, 4}, []byte{2, 2, 0, 0, 2, 0, 85, 0}, byte(3), byte(4), byte(0), byte(5))
	f.Add("a\u00b4b@x.io", []byte{3, 2, 1, 7, 1, 9, 170, 8}, []byte{0, 1, 0, 0, 0, 0, 0, 0}, byte(5), byte(1), byte(2), byte(4))
	f.Add(" ", []byte{}, []byte{1}, byte(2), byte(3), byte(0), byte(0))
	f.Fuzz(func(t *testing.T, e string, ca, cb []byte, howA, howB, keyA, keyB byte) {
		va, vb := spelling(e, ca), spelling(e, cb)
		ka, kb := keySpellings[int(keyA)%len(keySpellings)], keySpellings[int(keyB)%len(keySpellings)]
		ra, rb := encode(va, ka, howA), encode(vb, kb, howB)
		a, foundA, errA := ra.Email("email")
		b, foundB, errB := rb.Email("email")
		if errA != nil || errB != nil {
			return
		}
		if foundA != foundB || a != b {
			t.Fatalf("one address, two keys:\n  %q as %q (format %d) -> %q, %v\n  %q as %q (format %d) -> %q, %v",
				va, ka, howA%7, a, foundA, vb, kb, howB%7, b, foundB)
		}
	})
}

// FuzzEquivalentHeaders: a tenant id padded with white space is the same
// tenant, or a 400.
func FuzzEquivalentHeaders(f *testing.F) {
	f.Add("acme", byte(0), byte(3))
	f.Add("Acme Corp", byte(7), byte(16))
	f.Fuzz(func(t *testing.T, v string, left, right byte) {
		padded := whiteSpace[int(left)%len(whiteSpace)] + v + whiteSpace[int(right)%len(whiteSpace)]
		a, foundA, errA := Header(http.Header{"X-Tenant-Id": {v}}, "X-Tenant-Id")
		b, foundB, errB := Header(http.Header{"X_tenant_id": {padded}}, "X-Tenant-Id")
		if errA != nil || errB != nil {
			return
		}
		if a != b || foundA != foundB {
			t.Fatalf("%q -> %q, %v but %q -> %q, %v", v, a, foundA, padded, b, foundB)
		}
	})
}

// FuzzBearer: whatever the Authorization lines, Bearer returns a single
// b64token that the one line ends with, nothing, or an *Error.
func FuzzBearer(f *testing.F) {
	for _, s := range []string{"Bearer a.b.c", "bearer  x", "Basic x", "Bearer", "Bearer a, Bearer b", "Bearer\tx", "Bearer ==", "BEARER a=="} {
		f.Add(s, "")
	}
	f.Add("Bearer a", "Bearer b")
	f.Fuzz(func(t *testing.T, first, second string) {
		h := http.Header{"Authorization": {first}}
		if second != "" {
			h["Authorization"] = append(h["Authorization"], second)
		}
		tok, found, err := Bearer(h)
		switch {
		case err != nil:
			var ie *Error
			if !errors.As(err, &ie) || found || tok != "" {
				t.Fatalf("error %v with %q, %v", err, tok, found)
			}
		case found:
			if second != "" || !isB64Token(tok) || !strings.HasSuffix(first, " "+tok) || !strings.EqualFold(first[:6], "bearer") {
				t.Fatalf("%q gave the token %q", first, tok)
			}
		case tok != "" || second != "":
			t.Fatalf("not found, yet %q (two lines: %v)", tok, second != "")
		}
	})
}
