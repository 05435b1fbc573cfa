package identity

import (
	"errors"
	"strings"
	"testing"
)

const (
	jsonCT = "application/json"
	formCT = "application/x-www-form-urlencoded"
	mpCT   = "multipart/form-data; boundary=XyZ"
)

// newRequest returns a Request for a body with Content-Type ct ("" sends
// none) and a raw query string.
func newRequest(ct, body, query string) *Request {
	var cts []string
	if ct != "" {
		cts = []string{ct}
	}
	r := new(Request)
	r.Reset(query, cts, []byte(body), false)
	return r
}

// mp builds a multipart body with boundary XyZ from parts, each its header
// lines and its content.
func mp(parts ...[2]string) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString("--XyZ\r\n" + p[0] + "\r\n\r\n" + p[1] + "\r\n")
	}
	b.WriteString("--XyZ--\r\n")
	return b.String()
}

// field is a multipart part holding a plain field.
func field(name, value string) [2]string {
	return [2]string{`Content-Disposition: form-data; name="` + name + `"`, value}
}

// expectError checks that err is an *Error whose detail quotes none of
// the client's values.
func expectError(t *testing.T, err error, values ...string) {
	t.Helper()
	var ie *Error
	if !errors.As(err, &ie) || !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("err = %v (%T), want an *Error wrapping ErrAmbiguous", err, err)
	}
	for _, raw := range append(values, "@example.com", "victim", "fresh") {
		if raw != "" && strings.Contains(ie.Detail, raw) {
			t.Errorf("detail %q quotes a client value %q", ie.Detail, raw)
		}
	}
}

// expectLookup checks what a lookup of an identifier returned: with
// wantErr, an ambiguity error that quotes none of values, and nothing
// found; otherwise want, found exactly when want is not empty.
func expectLookup(t *testing.T, got string, found bool, err error, want string, wantErr bool, values ...string) {
	t.Helper()
	if wantErr {
		expectError(t, err, values...)
		if found || got != "" {
			t.Errorf("with an error, got %q, %v", got, found)
		}
		return
	}
	if err != nil {
		t.Fatalf("unexpected error %v", err)
	}
	if got != want || found != (want != "") {
		t.Errorf("got %q, %v; want %q", got, found, want)
	}
}

func TestEmail(t *testing.T) {
	tests := []struct {
		name  string
		ct    string
		body  string
		query string
		field string // default "email"
		want  string // canonical; "" with err false means not found
		err   bool
	}{
		// JSON.
		{name: "json", ct: jsonCT, body: `{"email":"a@example.com","password":"x"}`, want: "a@example.com"},
		{name: "json charset", ct: "Application/JSON; charset=utf-8", body: `{"email":"a@example.com"}`, want: "a@example.com"},
		{name: "+json type", ct: "application/vnd.api+JSON", body: `{"email":"a@example.com"}`, want: "a@example.com"},
		{name: "json canonical value", ct: jsonCT, body: `{"email":" A@Example.com "}`, want: "a@example.com"},
		{name: "json fullwidth value", ct: jsonCT, body: `{"email":"ａ＠ｅｘａｍｐｌｅ．ｃｏｍ"}`, want: "a@example.com"},
		{name: "json case variant alone", ct: jsonCT, body: `{"EMAIL":"a@example.com"}`, want: "a@example.com"},
		{name: "json escaped key", ct: jsonCT, body: `{"\u0065mail":"a@example.com"}`, want: "a@example.com"},
		{name: "json key with white space", ct: jsonCT, body: `{" email\t":"a@example.com"}`, want: "a@example.com"},
		{name: "json escaped value", ct: jsonCT, body: `{"email":"a\u0040example.com"}`, want: "a@example.com"},
		{name: "json surrogate pair", ct: jsonCT, body: `{"email":"a\ud83d\ude00@example.com"}`, want: "a😀@example.com"},
		{name: "json nested email ignored", ct: jsonCT, body: `{"user":{"email":"n@example.com","x":[{"email":1}]},"email":"a@example.com"}`, want: "a@example.com"},
		{name: "json only nested email", ct: jsonCT, body: `{"user":{"email":"n@example.com"},"list":["email"]}`},
		{name: "json missing", ct: jsonCT, body: `{"password":"x"}`},
		{name: "json empty object", ct: jsonCT, body: `{}`},
		{name: "json null", ct: jsonCT, body: `{"email":null}`, err: true},
		{name: "json blank string is absent", ct: jsonCT, body: `{"email":"  \u00a0"}`},
		{name: "json white space around object", ct: jsonCT, body: "\n {\"email\":\"a@example.com\"} \n", want: "a@example.com"},
		{name: "json duplicate", ct: jsonCT, body: `{"email":"a@example.com","email":"b@example.com"}`, err: true},
		{name: "json duplicate equal values", ct: jsonCT, body: `{"email":"a@example.com","email":"a@example.com"}`, err: true},
		{name: "json duplicate with null", ct: jsonCT, body: `{"email":null,"email":"a@example.com"}`, err: true},
		{name: "json case variant duplicate", ct: jsonCT, body: `{"email":"a@example.com","Email":"b@example.com"}`, err: true},
		{name: "json padded key duplicate", ct: jsonCT, body: `{"email":"a@example.com"," email":"b@example.com"}`, err: true},
		{name: "json escaped duplicate", ct: jsonCT, body: `{"email":"a@example.com","\u0065mail":"b@example.com"}`, err: true},
		{name: "json Kelvin sign duplicate", ct: jsonCT, field: "kontakt", body: `{"kontakt":"a@example.com","\u212Aontakt":"b@example.com"}`, err: true},
		{name: "json Kelvin sign alone", ct: jsonCT, field: "kontakt", body: `{"` + "\u212A" + `ontakt":"a@example.com"}`, want: "a@example.com"},
		{name: "json long s duplicate", ct: jsonCT, field: "username", body: `{"username":"a@example.com","uſername":"b@example.com"}`, err: true},
		{name: "json array", ct: jsonCT, body: `{"email":["a@example.com","b@example.com"]}`, err: true},
		{name: "json object", ct: jsonCT, body: `{"email":{"address":"a@example.com"}}`, err: true},
		{name: "json number", ct: jsonCT, body: `{"email":12}`, err: true},
		{name: "json bool", ct: jsonCT, body: `{"email":true}`, err: true},
		{name: "json array-syntax key", ct: jsonCT, body: `{"email[]":"a@example.com"}`, err: true},
		{name: "json malformed", ct: jsonCT, body: `{"email":"a@example.com"`, err: true},
		{name: "json missing comma", ct: jsonCT, body: `{"x":1 "email":"a@example.com"}`, err: true},
		{name: "json malformed nested", ct: jsonCT, body: `{"x":{"y":}, "email":"a@example.com"}`, err: true},
		{name: "json not an object", ct: jsonCT, body: `["email","a@example.com"]`, err: true},
		{name: "json string top level", ct: jsonCT, body: `"a@example.com"`, err: true},
		{name: "json trailing object", ct: jsonCT, body: `{"email":"a@example.com"}{"email":"b@example.com"}`, err: true},
		{name: "json trailing garbage", ct: jsonCT, body: `{"email":"a@example.com"} x`, err: true},
		{name: "json invalid UTF-8 anywhere", ct: jsonCT, body: "{\"email\":\"a@example.com\",\"x\":\"\xff\"}", err: true},
		{name: "json lone high surrogate", ct: jsonCT, body: `{"email":"a\ud800@example.com"}`, err: true},
		{name: "json lone low surrogate", ct: jsonCT, body: `{"email":"a\udc00@example.com"}`, err: true},
		{name: "json reversed surrogates", ct: jsonCT, body: `{"email":"\ude00\ud83d@example.com"}`, err: true},
		{name: "json escaped backslash is no surrogate", ct: jsonCT, body: `{"email":"a\\ud800@example.com"}`, want: `a\ud800@example.com`},
		{name: "json empty body is absent", ct: jsonCT, body: ""},
		{name: "json blank body is absent", ct: jsonCT, body: " \n"},

		// Invisible and control characters: refused wherever they are.
		{name: "json BOM", ct: jsonCT, body: `{"email":"\ufeffvictim@example.com"}`, err: true},
		{name: "json zero width space", ct: jsonCT, body: `{"email":"vic\u200btim@example.com"}`, err: true},
		{name: "json soft hyphen", ct: jsonCT, body: `{"email":"vic\u00adtim@example.com"}`, err: true},
		{name: "json C0 control first", ct: jsonCT, body: `{"email":"\u0001victim@example.com"}`, err: true},
		{name: "json C1 control last", ct: jsonCT, body: `{"email":"victim@example.com\u0085x"}`, err: true},
		{name: "json NEL trimmed", ct: jsonCT, body: `{"email":"victim@example.com\u0085"}`, want: "victim@example.com"},
		{name: "form NUL", ct: formCT, body: "email=victim%40example.com%00", err: true},
		{name: "form zero width space", ct: formCT, body: "email=victim%E2%80%8B%40example.com", err: true},
		{name: "form invalid UTF-8", ct: formCT, body: "email=victim%FF%40example.com", err: true},
		{name: "query BOM", query: "email=%EF%BB%BFvictim%40example.com", err: true},
		{name: "query tab inside", query: "email=victim%09%40example.com", err: true},
		{name: "query tab trimmed", query: "email=%09victim%40example.com%09", want: "victim@example.com"},

		// Forms.
		{name: "form", ct: formCT, body: "email=a%40example.com&password=x", want: "a@example.com"},
		{name: "form plus is space", ct: formCT, body: "email=a+b%40example.com", want: "a b@example.com"},
		{name: "form case variant alone", ct: formCT, body: "Email=a%40example.com", want: "a@example.com"},
		{name: "form escaped key", ct: formCT, body: "%65mail=a%40example.com", want: "a@example.com"},
		{name: "form missing", ct: formCT, body: "password=x"},
		{name: "form empty value", ct: formCT, body: "email=&password=x"},
		{name: "form duplicate", ct: formCT, body: "email=a%40example.com&email=b%40example.com", err: true},
		{name: "form duplicate equal", ct: formCT, body: "email=a%40example.com&email=a%40example.com", err: true},
		{name: "form case variant duplicate", ct: formCT, body: "email=a%40example.com&EMAIL=b%40example.com", err: true},
		{name: "form leading space duplicate (PHP)", ct: formCT, body: "email=a%40example.com&+email=b%40example.com", err: true},
		{name: "form escaped space duplicate (PHP)", ct: formCT, body: "%20email=b%40example.com&email=a%40example.com", err: true},
		{name: "form leading space alone", ct: formCT, body: "+email=a%40example.com", want: "a@example.com"},
		{name: "form array syntax", ct: formCT, body: "email[]=a%40example.com", err: true},
		{name: "form hash syntax", ct: formCT, body: "email[x]=a%40example.com&email=b%40example.com", err: true},
		{name: "form bad escape", ct: formCT, body: "email=a%40example.com&x=%zz", err: true},
		{name: "form semicolon separator", ct: formCT, body: "x=1;email=b%40example.com&email=a%40example.com", err: true},

		// Multipart.
		{name: "multipart", ct: mpCT, body: mp(field("email", "A@Example.com"), field("password", "x")), want: "a@example.com"},
		{name: "multipart quoted boundary", ct: `multipart/form-data; boundary="XyZ"`, body: mp(field("email", "a@example.com")), want: "a@example.com"},
		{name: "multipart unquoted name", ct: mpCT, body: mp([2]string{"Content-Disposition: form-data; name=email", "a@example.com"}), want: "a@example.com"},
		{name: "multipart missing", ct: mpCT, body: mp(field("name", "x"))},
		{name: "multipart file part is no field", ct: mpCT, body: mp([2]string{`Content-Disposition: form-data; name="avatar"; filename="a.txt"` + "\r\nContent-Type: text/plain", `{"email":"x@example.com"}`}, field("email", "a@example.com")), want: "a@example.com"},
		{name: "multipart field as a file", ct: mpCT, body: mp([2]string{`Content-Disposition: form-data; name="email"; filename="e.txt"`, "b@example.com"}), err: true},
		{name: "multipart field as an empty file", ct: mpCT, body: mp([2]string{`Content-Disposition: form-data; name="email"; filename=""`, "b@example.com"}), err: true},
		{name: "multipart field with filename*", ct: mpCT, body: mp([2]string{`Content-Disposition: form-data; name="email"; filename*=UTF-8''e.txt`, "b@example.com"}), err: true},
		{name: "multipart name*", ct: mpCT, body: mp([2]string{`Content-Disposition: form-data; name="email"; name*=UTF-8''other`, "b@example.com"}), err: true},
		{name: "multipart name given twice", ct: mpCT, body: mp([2]string{`Content-Disposition: form-data; name="other"; name="email"`, "b@example.com"}), err: true},
		{name: "multipart two dispositions", ct: mpCT, body: mp([2]string{"Content-Disposition: form-data; name=\"other\"\r\nContent-Disposition: form-data; name=\"email\"", "b@example.com"}), err: true},
		{name: "multipart duplicate", ct: mpCT, body: mp(field("email", "a@example.com"), field("Email", "b@example.com")), err: true},
		{name: "multipart padded duplicate", ct: mpCT, body: mp(field("email", "a@example.com"), field(" email", "b@example.com")), err: true},
		{name: "multipart array syntax", ct: mpCT, body: mp(field("email[]", "a@example.com")), err: true},
		{name: "multipart quoted-printable", ct: mpCT, body: mp([2]string{"Content-Disposition: form-data; name=\"email\"\r\nContent-Transfer-Encoding: quoted-printable", "a=40example.com"}), err: true},
		{name: "multipart base64", ct: mpCT, body: mp([2]string{"Content-Disposition: form-data; name=\"email\"\r\nContent-Transfer-Encoding: base64", "YUBleGFtcGxlLmNvbQ=="}), err: true},
		{name: "multipart 8bit", ct: mpCT, body: mp([2]string{"Content-Disposition: form-data; name=\"email\"\r\nContent-Transfer-Encoding: 8bit", "a@example.com"}), want: "a@example.com"},
		{name: "multipart UTF-16 charset", ct: mpCT, body: mp([2]string{"Content-Disposition: form-data; name=\"email\"\r\nContent-Type: text/plain; charset=utf-16", "a@example.com"}), err: true},
		{name: "multipart UTF-8 charset", ct: mpCT, body: mp([2]string{"Content-Disposition: form-data; name=\"email\"\r\nContent-Type: text/plain; charset=UTF-8", "a@example.com"}), want: "a@example.com"},
		{name: "multipart zero width space", ct: mpCT, body: mp(field("email", "vic\u200btim@example.com")), err: true},
		{name: "multipart no closing delimiter", ct: mpCT, body: "--XyZ\r\nContent-Disposition: form-data; name=\"email\"\r\n\r\na@example.com", err: true},
		{name: "multipart bad part header", ct: mpCT, body: "--XyZ\r\nContent-Disposition form-data\r\n\r\na@example.com\r\n--XyZ--", err: true},
		{name: "multipart no boundary", ct: "multipart/form-data", body: mp(field("email", "a@example.com")), err: true},
		{name: "multipart field hidden after a bare LF (PHP)", ct: mpCT, body: "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nfoo\n--XyZ\r\nContent-Disposition: form-data; name=\"email\"\r\n\r\nvictim@example.com\r\n--XyZ--\r\n", err: true},
		{name: "multipart boundary prefix", ct: mpCT, body: "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--XyZW\r\nContent-Disposition: form-data; name=\"email\"\r\n\r\nvictim@example.com\r\n--XyZ--", err: true},
		{name: "multipart epilogue with a part", ct: mpCT, body: mp(field("a", "1")) + "--XyZ\r\nContent-Disposition: form-data; name=\"email\"\r\n\r\nvictim@example.com\r\n--XyZ--", err: true},
		{name: "multipart and query agree", ct: mpCT, body: mp(field("email", "a@example.com")), query: "EMAIL=A%40example.com", want: "a@example.com"},
		{name: "multipart and query differ", ct: mpCT, body: mp(field("email", "victim@example.com")), query: "email=fresh%40example.com", err: true},

		// No Content-Type: sniffed.
		{name: "sniffed json", body: ` {"email":"a@example.com"}`, want: "a@example.com"},
		{name: "sniffed json duplicate", body: `{"email":"a@example.com","EMAIL":"b@example.com"}`, err: true},
		{name: "sniffed json malformed", body: `{"email":`, err: true},
		{name: "sniffed form", body: "email=a%40example.com", want: "a@example.com"},
		{name: "sniffed form duplicate", body: "email=a&email=b", err: true},
		{name: "sniffed non-form, query absent", body: "100% sure; email=x"},
		{name: "sniffed non-form beside a query field", body: "100% sure; email=victim@example.com", query: "email=q%40example.com", err: true},

		// Bodies in a type sluice does not read: the upstream might read
		// the field there, so a query that carries it is ambiguous.
		{name: "text body, query field", ct: "text/plain", body: `email=victim@example.com`, query: "email=fresh%40example.com", err: true},
		{name: "text/json body, query field", ct: "text/json", body: `{"email":"victim@example.com"}`, query: "email=fresh%40example.com", err: true},
		{name: "jsonp body, query field", ct: "application/jsonp", body: `{"email":"a@example.com"}`, query: "email=a%40example.com", err: true},
		{name: "multipart/mixed body, query field", ct: "multipart/mixed; boundary=XyZ", body: mp(field("email", "victim@example.com")), query: "email=fresh%40example.com", err: true},
		{name: "text body, query field empty", ct: "text/plain", body: "x", query: "email=", err: true},
		{name: "text body alone", ct: "text/plain", body: `{"email":"a@example.com"}`},
		{name: "text body, query without the field", ct: "text/plain", body: `email=a`, query: "page=2"},
		{name: "text type, empty body, query field", ct: "text/plain", query: "email=q%40example.com", want: "q@example.com"},

		// Query string.
		{name: "query", query: "email=q%40example.com", want: "q@example.com"},
		{name: "query case variant alone", query: "EMail=q%40example.com", want: "q@example.com"},
		{name: "query duplicate", query: "email=q%40example.com&email=r%40example.com", err: true},
		{name: "query duplicate equal", query: "email=q%40example.com&email=q%40example.com", err: true},
		{name: "query case duplicate", query: "email=q%40example.com&Email=q%40example.com", err: true},
		{name: "query padded duplicate", query: "email=q%40example.com&email%20=r%40example.com", err: true},
		{name: "query array syntax", query: "email[0]=q%40example.com", err: true},
		{name: "query empty", query: "email="},
		{name: "query other field", query: "mail=q%40example.com"},
		{name: "query malformed", query: "email=q%40example.com&x=%zz", err: true},
		{name: "query semicolon", query: "x=1;email=q%40example.com", err: true},

		// Body and query together.
		{name: "body and query agree", ct: jsonCT, body: `{"email":"A@Example.com"}`, query: "email=a%40example.com", want: "a@example.com"},
		{name: "body and query agree fullwidth", ct: formCT, body: "email=a%40example.com", query: "email=%EF%BD%81%EF%BC%A0example.com", want: "a@example.com"},
		{name: "body and query conflict", ct: jsonCT, body: `{"email":"a@example.com"}`, query: "email=b%40example.com", err: true},
		{name: "form and query conflict", ct: formCT, body: "email=a%40example.com", query: "email=b%40example.com", err: true},
		{name: "body empty beside the query", ct: jsonCT, body: `{"email":""}`, query: "email=q%40example.com", err: true},
		{name: "form empty beside the query", ct: formCT, body: "email=", query: "email=q%40example.com", err: true},
		{name: "query empty beside the body", ct: jsonCT, body: `{"email":"q@example.com"}`, query: "email=", err: true},
		{name: "json null beside the query", ct: jsonCT, body: `{"email":null}`, query: "email=q%40example.com", err: true},
		{name: "both blank", ct: formCT, body: "email=+", query: "email=", want: ""},
		{name: "json dotted capital I duplicate", ct: jsonCT, body: `{"email":"a@example.com","EMA\u0130L":"b@example.com"}`, err: true},
		{name: "json dotless i duplicate", ct: jsonCT, field: "kiss", body: `{"kiss":"a@example.com","k\u0131ss":"b@example.com"}`, err: true},
		{name: "json dotted capital I alone", ct: jsonCT, body: `{"EMA\u0130L":"a@example.com"}`, want: "a@example.com"},
		{name: "form dotted capital I duplicate", ct: formCT, body: "EMA%C4%B0L=b%40example.com&email=a%40example.com", err: true},
		{name: "query dotless i duplicate", query: "ema%C4%B1l=b%40example.com&email=a%40example.com", err: true},
		{name: "body error wins over query", ct: jsonCT, body: `{"email":1}`, query: "email=q%40example.com", err: true},

		// Custom field.
		{name: "custom field", ct: jsonCT, field: "login", body: `{"email":"x@example.com","login":"a@example.com"}`, want: "a@example.com"},
		{name: "custom field absent", ct: jsonCT, field: "login", body: `{"email":"x@example.com"}`},
		{name: "custom field, PHP dot spelling", ct: formCT, field: "user_email", body: "user.email=a%40example.com&user_email=b%40example.com", err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			field := tt.field
			if field == "" {
				field = "email"
			}
			r := newRequest(tt.ct, tt.body, tt.query)
			got, found, err := r.Email(field)
			expectLookup(t, got, found, err, tt.want, tt.err)
			if tt.err {
				return
			}
			// A Request caches what it parsed: asking again gives the
			// same answer.
			if again, found2, err := r.Email(field); again != got || found2 != found || err != nil {
				t.Errorf("second call: %q, %v, %v", again, found2, err)
			}
		})
	}
}

// TestContentTypeTwice: a body whose Content-Type is sent twice may be read
// as either type upstream.
func TestContentTypeTwice(t *testing.T) {
	r := new(Request)
	r.Reset("", []string{formCT, "text/plain"}, []byte("email=a%40example.com"), false)
	_, _, err := r.Email("email")
	expectError(t, err)
	// Without a body, the Content-Type does not matter.
	r.Reset("email=a%40example.com", []string{formCT, "text/plain"}, nil, false)
	if got, found, err := r.Email("email"); got != "a@example.com" || !found || err != nil {
		t.Fatalf("no body: %q, %v, %v", got, found, err)
	}
}

func TestMethod(t *testing.T) {
	tests := []struct {
		name, ct, body, query string
		want                  string
		err                   bool
	}{
		{name: "none", ct: formCT, body: "a=1"},
		{name: "form", ct: formCT, body: "_method=delete", want: "DELETE"},
		{name: "form padded", ct: formCT, body: "_method=+Delete+", want: "DELETE"},
		{name: "query", query: "_method=PUT", want: "PUT"},
		{name: "json", ct: jsonCT, body: `{"_method":"patch"}`, want: "PATCH"},
		{name: "multipart", ct: mpCT, body: mp(field("_method", "DELETE")), want: "DELETE"},
		{name: "PHP dot spelling", ct: formCT, body: ".method=DELETE", want: "DELETE"},
		{name: "PHP bracket spelling", query: "[method=DELETE", want: "DELETE"},
		{name: "PHP space spelling", ct: formCT, body: "+_method=DELETE", want: "DELETE"},
		{name: "case variant", query: "_METHOD=delete", want: "DELETE"},
		{name: "twice in the form", ct: formCT, body: "_method=DELETE&_method=PUT", err: true},
		{name: "twice, two spellings", ct: formCT, body: "_method=DELETE&.method=PUT", err: true},
		{name: "twice in the query", query: "_method=DELETE&_Method=DELETE", err: true},
		{name: "body and query disagree", ct: formCT, body: "_method=DELETE", query: "_method=PUT", err: true},
		{name: "body and query agree", ct: formCT, body: "_method=delete", query: "_method=DELETE", want: "DELETE"},
		{name: "json not a string", ct: jsonCT, body: `{"_method":["DELETE"]}`, err: true},
		{name: "not a token", ct: formCT, body: "_method=DE+LETE", err: true},
		{name: "list", query: "_method=DELETE,PUT", err: true},
		{name: "control", query: "_method=DELETE%00", err: true},
		{name: "unread body beside a query field", ct: "text/plain", body: "_method=PUT", query: "_method=DELETE", err: true},
		{name: "empty is none", query: "_method="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := newRequest(tt.ct, tt.body, tt.query).Method()
			expectLookup(t, got, got != "", err, tt.want, tt.err, "DELETE", "PUT", "delete")
		})
	}
}

func TestMatchName(t *testing.T) {
	tests := []struct {
		name, field string
		want        nameMatch
	}{
		{"email", "email", nameSame},
		{"EMAIL", "email", nameSame},
		{" email\t", "email", nameSame},
		{"\u00a0email\u3000", "email", nameSame},
		{"emails", "email", nameOther},
		{"e mail", "email", nameOther},
		{"email[]", "email", nameNested},
		{"email [x]", "email", nameNested},
		{"email[", "email", nameOther},
		{"emai[l]", "email", nameOther},
		{".method", "_method", nameSame},
		{"[method", "_method", nameSame},
		{" _method", "_method", nameSame},
		{"_METHOD", "_method", nameSame},
		{"-method", "_method", nameOther},
		{"user.email", "user_email", nameSame},
		{"user email", "user.email", nameSame},
		{"\u212Aontakt", "kontakt", nameSame},
		{"kontakt", "\u212Aontakt", nameSame},
		{"uſername", "USERNAME", nameSame},
		{"\xff", "\xfe", nameSame}, // both U+FFFD, as strings.EqualFold reads them
		{"", "email", nameOther},
		{"é", "É", nameSame},
		{"EMA\u0130L", "email", nameSame},
		{"ema\u0131l", "EMAIL", nameSame},
		{"email", "ema\u0131l", nameSame},
		{"é", "e", nameOther},
	}
	for _, tt := range tests {
		if got := matchName(tt.name, tt.field); got != tt.want {
			t.Errorf("matchName(%q, %q) = %d, want %d", tt.name, tt.field, got, tt.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { matchName(" E-MAIL ", "e-mail") }); n != 0 {
		t.Errorf("matchName allocates %v times", n)
	}
}

// TestStreamedBody: a body too large to buffer counts as one sluice does
// not read, whatever its type: a query that carries the field beside it is
// ambiguous, and without one the caller counts the client IP.
func TestStreamedBody(t *testing.T) {
	var r Request
	r.Reset("email=a%40example.com", []string{jsonCT}, nil, true)
	_, _, err := r.Email("email")
	expectError(t, err)
	r.Reset("page=2", []string{jsonCT}, nil, true)
	if v, found, err := r.Email("email"); v != "" || found || err != nil {
		t.Fatalf("streamed body, no query field: %q, %v, %v", v, found, err)
	}
}

func TestReadsBody(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                  true,
		"Application/JSON; charset=utf-8":   true,
		"application/merge-patch+json":      true,
		"application/x-www-form-urlencoded": true,
		"multipart/form-data; boundary=x":   true,
		"":                                  true, // sniffed
		"text/plain":                        false,
		"text/json":                         false,
		"application/octet-stream":          false,
		"multipart/mixed; boundary=x":       false,
	} {
		if got := ReadsBody([]string{ct}); got != want {
			t.Errorf("ReadsBody(%q) = %v, want %v", ct, got, want)
		}
	}
	if !ReadsBody(nil) || !ReadsBody([]string{"text/plain", "text/plain"}) {
		t.Error("no Content-Type, or two, must be read")
	}
}
