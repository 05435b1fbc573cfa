package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func TestEmailFromRequest(t *testing.T) {
	const (
		jsonCT = "application/json"
		formCT = "application/x-www-form-urlencoded"
	)
	tests := []struct {
		name  string
		ct    string
		body  string
		query string
		field string // default "email"
		want  string
		found bool
		err   bool
	}{
		// JSON.
		{name: "json", ct: jsonCT, body: `{"email":"a@example.com","password":"x"}`, want: "a@example.com", found: true},
		{name: "json charset", ct: "Application/JSON; charset=utf-8", body: `{"email":"a@example.com"}`, want: "a@example.com", found: true},
		{name: "+json type", ct: "application/vnd.api+JSON", body: `{"email":"a@example.com"}`, want: "a@example.com", found: true},
		{name: "json raw value returned", ct: jsonCT, body: `{"email":" A@Example.com "}`, want: " A@Example.com ", found: true},
		{name: "json case variant alone", ct: jsonCT, body: `{"EMAIL":"a@example.com"}`, want: "a@example.com", found: true},
		{name: "json escaped key", ct: jsonCT, body: `{"\u0065mail":"a@example.com"}`, want: "a@example.com", found: true},
		{name: "json escaped value", ct: jsonCT, body: `{"email":"a\u0040example.com"}`, want: "a@example.com", found: true},
		{name: "json nested email ignored", ct: jsonCT, body: `{"user":{"email":"n@example.com","x":[{"email":1}]},"email":"a@example.com"}`, want: "a@example.com", found: true},
		{name: "json only nested email", ct: jsonCT, body: `{"user":{"email":"n@example.com"},"list":["email"]}`},
		{name: "json missing", ct: jsonCT, body: `{"password":"x"}`},
		{name: "json empty object", ct: jsonCT, body: `{}`},
		{name: "json null is absent", ct: jsonCT, body: `{"email":null}`},
		{name: "json empty string is absent", ct: jsonCT, body: `{"email":"  \u00a0"}`},
		{name: "json whitespace around object", ct: jsonCT, body: "\n {\"email\":\"a@example.com\"} \n", want: "a@example.com", found: true},
		{name: "json duplicate", ct: jsonCT, body: `{"email":"a@example.com","email":"b@example.com"}`, err: true},
		{name: "json duplicate equal values", ct: jsonCT, body: `{"email":"a@example.com","email":"a@example.com"}`, err: true},
		{name: "json duplicate with null", ct: jsonCT, body: `{"email":null,"email":"a@example.com"}`, err: true},
		{name: "json case variant duplicate", ct: jsonCT, body: `{"email":"a@example.com","Email":"b@example.com"}`, err: true},
		{name: "json escaped duplicate", ct: jsonCT, body: `{"email":"a@example.com","\u0065mail":"b@example.com"}`, err: true},
		{name: "json Kelvin sign duplicate", ct: jsonCT, field: "kontakt", body: `{"kontakt":"a@example.com","\u212Aontakt":"b@example.com"}`, err: true},
		{name: "json Kelvin sign alone", ct: jsonCT, field: "kontakt", body: `{"` + "\u212A" + `ontakt":"a@example.com"}`, want: "a@example.com", found: true},
		{name: "json long s duplicate", ct: jsonCT, field: "username", body: `{"username":"a@example.com","uſername":"b@example.com"}`, err: true},
		{name: "json array", ct: jsonCT, body: `{"email":["a@example.com","b@example.com"]}`, err: true},
		{name: "json object", ct: jsonCT, body: `{"email":{"address":"a@example.com"}}`, err: true},
		{name: "json number", ct: jsonCT, body: `{"email":12}`, err: true},
		{name: "json bool", ct: jsonCT, body: `{"email":true}`, err: true},
		{name: "json malformed", ct: jsonCT, body: `{"email":"a@example.com"`, err: true},
		{name: "json missing comma", ct: jsonCT, body: `{"x":1 "email":"a@example.com"}`, err: true},
		{name: "json malformed nested", ct: jsonCT, body: `{"x":{"y":}, "email":"a@example.com"}`, err: true},
		{name: "json not an object", ct: jsonCT, body: `["email","a@example.com"]`, err: true},
		{name: "json string top level", ct: jsonCT, body: `"a@example.com"`, err: true},
		{name: "json trailing object", ct: jsonCT, body: `{"email":"a@example.com"}{"email":"b@example.com"}`, err: true},
		{name: "json trailing garbage", ct: jsonCT, body: `{"email":"a@example.com"} x`, err: true},
		{name: "json empty body is absent", ct: jsonCT, body: ""},
		{name: "json blank body is absent", ct: jsonCT, body: " \n"},

		// Forms.
		{name: "form", ct: formCT, body: "email=a%40example.com&password=x", want: "a@example.com", found: true},
		{name: "form plus is space", ct: formCT, body: "email=a+b%40example.com", want: "a b@example.com", found: true},
		{name: "form case variant alone", ct: formCT, body: "Email=a%40example.com", want: "a@example.com", found: true},
		{name: "form escaped key", ct: formCT, body: "%65mail=a%40example.com", want: "a@example.com", found: true},
		{name: "form missing", ct: formCT, body: "password=x"},
		{name: "form empty value", ct: formCT, body: "email=&password=x"},
		{name: "form duplicate", ct: formCT, body: "email=a%40example.com&email=b%40example.com", err: true},
		{name: "form duplicate equal", ct: formCT, body: "email=a%40example.com&email=a%40example.com", err: true},
		{name: "form case variant duplicate", ct: formCT, body: "email=a%40example.com&EMAIL=b%40example.com", err: true},
		{name: "form bad escape", ct: formCT, body: "email=a%40example.com&x=%zz", err: true},
		{name: "form semicolon separator", ct: formCT, body: "x=1;email=b%40example.com&email=a%40example.com", err: true},

		// No Content-Type: sniffed.
		{name: "sniffed json", body: ` {"email":"a@example.com"}`, want: "a@example.com", found: true},
		{name: "sniffed json duplicate", body: `{"email":"a@example.com","EMAIL":"b@example.com"}`, err: true},
		{name: "sniffed json malformed", body: `{"email":`, err: true},
		{name: "sniffed form", body: "email=a%40example.com", want: "a@example.com", found: true},
		{name: "sniffed form duplicate", body: "email=a&email=b", err: true},
		{name: "sniffed non-form ignored", body: "100% sure; email=x", query: "email=q%40example.com", want: "q@example.com", found: true},

		// Other content types: body not consulted.
		{name: "multipart ignored", ct: "multipart/form-data; boundary=x", body: "--x\r\nContent-Disposition: form-data; name=\"email\"\r\n\r\na@example.com\r\n--x--"},
		{name: "text ignored", ct: "text/plain", body: `{"email":"a@example.com"}`},
		{name: "json-like type ignored", ct: "application/jsonp", body: `{"email":"a@example.com"}`},

		// Query string.
		{name: "query", query: "email=q%40example.com", want: "q@example.com", found: true},
		{name: "query case variant alone", query: "EMail=q%40example.com", want: "q@example.com", found: true},
		{name: "query duplicate", query: "email=q%40example.com&email=r%40example.com", err: true},
		{name: "query duplicate equal", query: "email=q%40example.com&email=q%40example.com", err: true},
		{name: "query case duplicate", query: "email=q%40example.com&Email=q%40example.com", err: true},
		{name: "query empty", query: "email="},
		{name: "query other field", query: "mail=q%40example.com"},

		// Body and query together.
		{name: "body and query agree", ct: jsonCT, body: `{"email":"A@Example.com"}`, query: "email=a%40example.com", want: "A@Example.com", found: true},
		{name: "body and query agree fullwidth", ct: formCT, body: "email=a%40example.com", query: "email=%EF%BD%81%EF%BC%A0example.com", want: "a@example.com", found: true},
		{name: "body and query conflict", ct: jsonCT, body: `{"email":"a@example.com"}`, query: "email=b%40example.com", err: true},
		{name: "form and query conflict", ct: formCT, body: "email=a%40example.com", query: "email=b%40example.com", err: true},
		{name: "body empty, query used", ct: jsonCT, body: `{"email":""}`, query: "email=q%40example.com", want: "q@example.com", found: true},
		{name: "body error wins over query", ct: jsonCT, body: `{"email":1}`, query: "email=q%40example.com", err: true},

		// Custom field.
		{name: "custom field", ct: jsonCT, field: "login", body: `{"email":"x@example.com","login":"a@example.com"}`, want: "a@example.com", found: true},
		{name: "custom field absent", ct: jsonCT, field: "login", body: `{"email":"x@example.com"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			field := tt.field
			if field == "" {
				field = "email"
			}
			q, err := url.ParseQuery(tt.query)
			if err != nil {
				t.Fatal(err)
			}
			got, found, err := emailFromRequest(tt.ct, []byte(tt.body), q, field)
			if tt.err {
				var ie *identityError
				if !errors.As(err, &ie) || !errors.Is(err, errAmbiguousIdentity) {
					t.Fatalf("err = %v (%T), want an *identityError wrapping errAmbiguousIdentity", err, err)
				}
				if found || got != "" {
					t.Errorf("with error, got %q, %v", got, found)
				}
				for _, raw := range []string{"@example.com", "a@", "b@", "q@"} {
					if strings.Contains(ie.Detail, raw) {
						t.Errorf("detail %q contains the identifier", ie.Detail)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if got != tt.want || found != tt.found {
				t.Errorf("got %q, %v; want %q, %v", got, found, tt.want, tt.found)
			}
		})
	}
}

func TestHeaderIdentity(t *testing.T) {
	tests := []struct {
		name  string
		h     http.Header
		want  string
		found bool
		err   bool
	}{
		{name: "present", h: http.Header{"X-Tenant-Id": {"acme"}}, want: "acme", found: true},
		{name: "trimmed", h: http.Header{"X-Tenant-Id": {"  acme\t"}}, want: "acme", found: true},
		{name: "missing", h: http.Header{"X-Other": {"acme"}}},
		{name: "empty", h: http.Header{"X-Tenant-Id": {""}}},
		{name: "blank", h: http.Header{"X-Tenant-Id": {"  "}}},
		{name: "two lines", h: http.Header{"X-Tenant-Id": {"acme", "evil"}}, err: true},
		{name: "two equal lines", h: http.Header{"X-Tenant-Id": {"acme", "acme"}}, err: true},
		{name: "list", h: http.Header{"X-Tenant-Id": {"acme, evil"}}, err: true},
		{name: "empty list element", h: http.Header{"X-Tenant-Id": {"acme,"}}, err: true},
		{name: "non-canonical key", h: http.Header{"x-tenant-id": {"acme"}}, want: "acme", found: true},
		{name: "underscore variant beside", h: http.Header{"X-Tenant-Id": {"acme"}, "X_tenant_id": {"evil"}}, err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found, err := headerIdentity(tt.h, "X-Tenant-Id")
			if tt.err {
				var ie *identityError
				if !errors.As(err, &ie) || !errors.Is(err, errAmbiguousIdentity) {
					t.Fatalf("err = %v, want an *identityError", err)
				}
				if strings.Contains(ie.Detail, "acme") || strings.Contains(ie.Detail, "evil") {
					t.Errorf("detail %q contains the identifier", ie.Detail)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if got != tt.want || found != tt.found {
				t.Errorf("got %q, %v; want %q, %v", got, found, tt.want, tt.found)
			}
		})
	}
}

func FuzzEmailFromRequest(f *testing.F) {
	seeds := []struct{ ct, body, query, field string }{
		{"application/json", `{"email":"a@example.com","password":"x"}`, "", "email"},
		{"application/json", `{"email":"a@example.com","Email":"b"}`, "", "email"},
		{"application/json", `{"\u0065mail":"a","n":{"email":[1,{"email":null}]}}`, "email=a", "email"},
		{"application/json", `{"\u212Aontakt":"a"}`, "", "kontakt"},
		{"application/problem+json", `{"email":null} {}`, "", "email"},
		{"application/json", `{"email":["a"]}`, "", "email"},
		{"application/x-www-form-urlencoded", "email=a%40b&x=%zz;y", "", "email"},
		{"application/x-www-form-urlencoded", "EMAIL=a&email=a", "email=b", "email"},
		{"", " {\"email\":\"a\"}", "", "email"},
		{"", "email=a", "email=A", "email"},
		{"multipart/form-data; boundary=x", "--x--", "email=a&email=b", "email"},
		{"text/plain", "", "Email=%EF%BD%81", "email"},
	}
	for _, s := range seeds {
		f.Add(s.ct, []byte(s.body), s.query, s.field)
	}
	f.Fuzz(func(t *testing.T, ct string, body []byte, rawQuery, field string) {
		q, _ := url.ParseQuery(rawQuery)
		v, found, err := emailFromRequest(ct, body, q, field)
		if err != nil {
			var ie *identityError
			if !errors.As(err, &ie) || !errors.Is(err, errAmbiguousIdentity) {
				t.Fatalf("error %v (%T) is not an *identityError", err, err)
			}
			if found || v != "" {
				t.Fatalf("error with value %q, %v", v, found)
			}
		}
		if found && strings.TrimSpace(v) == "" {
			t.Fatalf("found an empty value %q", v)
		}
		if !found && v != "" {
			t.Fatalf("not found but value %q", v)
		}
		// The fast JSON walk must agree with a json.Decoder.Token walk.
		jv, jfound, jerr := identFromJSON(body, field)
		rv, rfound, rerr := identRefJSON(body, field)
		if jv != rv || jfound != rfound || (jerr == nil) != (rerr == nil) {
			t.Fatalf("identFromJSON(%q, %q) = %q, %v, %v; json.Decoder walk: %q, %v, %v", body, field, jv, jfound, jerr, rv, rfound, rerr)
		}
		v2, found2, err2 := emailFromRequest(ct, body, q, field)
		if v2 != v || found2 != found || (err2 == nil) != (err == nil) || (err != nil && err.Error() != err2.Error()) {
			t.Fatalf("not deterministic: %q %v %v, then %q %v %v", v, found, err, v2, found2, err2)
		}
	})
}

func BenchmarkEmailFromRequest(b *testing.B) {
	// A typical login body of about 200 bytes.
	body := []byte(`{"email":"victim@example.com","password":"correct horse battery staple","remember_me":true,` +
		`"device":{"id":"3f1a9c2e-0b7d-4e11-9a6f-5c2d8e7b1a40","platform":"web"},"captcha":"03AGdBq25xYz"}`)
	q := url.Values{}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		v, found, err := emailFromRequest("application/json", body, q, "email")
		if err != nil || !found || v != "victim@example.com" {
			b.Fatal(v, found, err)
		}
	}
}

// identRefJSON is the reference for identFromJSON: the same contract,
// implemented with json.Decoder.Token, slow but obviously faithful to
// encoding/json.
func identRefJSON(body []byte, field string) (string, bool, error) {
	fail := errors.New("ref")
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return "", false, fail
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return "", false, fail
	}
	var (
		value string
		seen  bool
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
		if !strings.EqualFold(key, field) {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return "", false, fail
			}
			continue
		}
		if seen {
			return "", false, fail
		}
		seen = true
		tok, err = dec.Token()
		if err != nil {
			return "", false, fail
		}
		switch v := tok.(type) {
		case string:
			value = v
		case nil:
		default:
			return "", false, fail
		}
	}
	if _, err := dec.Token(); err != nil {
		return "", false, fail
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", false, fail
	}
	if !identPresent(value) {
		return "", false, nil
	}
	return value, true, nil
}

// TestIdentFromJSONMatchesDecoder runs the table's JSON bodies, and some
// awkward ones, through both walks.
func TestIdentFromJSONMatchesDecoder(t *testing.T) {
	bodies := []string{
		`{"email":"a@example.com","password":"x"}`,
		`{"a":{"b":[1,2,{"email":"x"}],"c":"}\"]"},"email":"a"}`,
		`{"a":"\"email\":\"x\"","email":"b"}`,
		`{"a":-1.5e+10,"b":true,"c":false,"d":null,"email":"e"}`,
		`{"a":[],"b":{},"email":"\ud800x\u00e9\n"}`,
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
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		`{"x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `,"email":"a"}`,
	}
	for _, b := range bodies {
		jv, jfound, jerr := identFromJSON([]byte(b), "email")
		rv, rfound, rerr := identRefJSON([]byte(b), "email")
		if jv != rv || jfound != rfound || (jerr == nil) != (rerr == nil) {
			t.Errorf("body %.60q: identFromJSON = %q, %v, %v; json.Decoder walk: %q, %v, %v", b, jv, jfound, jerr, rv, rfound, rerr)
		}
	}
}
