package identity

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/jsontext"
)

// refJSONField is the reference for jsonField: the same contract,
// implemented with json.Decoder.Token, slow but obviously faithful to
// encoding/json. (The unpaired-surrogate rule is left out of both sides of
// the comparison; its own table cases cover it.)
func refJSONField(body []byte, field string) (string, bool, error) {
	fail := errors.New("ref")
	if !utf8.Valid(body) {
		return "", false, fail
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return "", false, fail
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return "", false, fail
	}
	var (
		value   string
		present bool
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false, fail
		}
		key, ok := tok.(string)
		if !ok {
			return "", false, fail
		}
		switch matchName(key, field) {
		case nameOther:
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return "", false, fail
			}
			continue
		case nameNested:
			return "", false, fail
		}
		if present {
			return "", false, fail
		}
		present = true
		tok, err = dec.Token()
		if err != nil {
			return "", false, fail
		}
		switch v := tok.(type) {
		case string:
			value = v
		default: // null included
			return "", false, fail
		}
	}
	if _, err := dec.Token(); err != nil {
		return "", false, fail
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", false, fail
	}
	return value, present, nil
}

// sameAsRef compares jsonField with refJSONField on body.
func sameAsRef(t *testing.T, body []byte, field string) {
	t.Helper()
	if jsontext.LoneSurrogate(body) {
		return
	}
	jv, jp, jerr := jsonField(body, field)
	rv, rp, rerr := refJSONField(body, field)
	if jv != rv || jp != rp || (jerr == nil) != (rerr == nil) {
		t.Errorf("body %.80q: jsonField = %q, %v, %v; json.Decoder walk: %q, %v, %v", body, jv, jp, jerr, rv, rp, rerr)
	}
}

// TestJSONFieldMatchesDecoder runs awkward bodies through both walks.
func TestJSONFieldMatchesDecoder(t *testing.T) {
	bodies := []string{
		`{"email":"a@example.com","password":"x"}`,
		`{"a":{"b":[1,2,{"email":"x"}],"c":"}\"]"},"email":"a"}`,
		`{"a":"\"email\":\"x\"","email":"b"}`,
		`{"a":-1.5e+10,"b":true,"c":false,"d":null,"email":"e"}`,
		`{"a":[],"b":{},"email":"x\u00e9\n"}`,
		"{\"email\":\"\xff\xfe\"}",
		"{\"\xffemail\":\"x\"}",
		`{"email":"x"} `,
		`{"email":"x"}]`,
		`{"email" "x"}`,
		`{"email":"x",}`,
		`{,"email":"x"}`,
		`{"email":01}`,
		`{"x":01,"email":"a"}`,
		`{"x":1e999,"email":"a"}`,
		`{"email":1e999}`,
		`[{"email":"x"}]`,
		`{"email":"x"`,
		`{" EMAIL ":"x","e":1}`,
		`{"email[]":"x"}`,
		`{"email":null}`,
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		`{"x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `,"email":"a"}`,
	}
	for _, b := range bodies {
		sameAsRef(t, []byte(b), "email")
	}
}

func BenchmarkEmail(b *testing.B) {
	// A typical login body of about 200 bytes.
	body := []byte(`{"email":"victim@example.com","password":"correct horse battery staple","remember_me":true,` +
		`"device":{"id":"3f1a9c2e-0b7d-4e11-9a6f-5c2d8e7b1a40","platform":"web"},"captcha":"03AGdBq25xYz"}`)
	ct := []string{"application/json"}
	var r Request
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset("", ct, body, false)
		v, found, err := r.Email("email")
		if err != nil || !found || v != "victim@example.com" {
			b.Fatal(v, found, err)
		}
	}
}
