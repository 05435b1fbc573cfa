package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestCanonicalPath(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"/", "/"},
		{"/api/login", "/api/login"},
		{"/API/Login", "/API/Login"}, // case is the upstream's business
		{"/a/%7e/b", "/a/~/b"},
		{"/a/%7E/b", "/a/~/b"},
		{"/api/%6Cogin", "/api/login"},
		{"/%41%42%63%2D%2e%5F%7E%30", "/ABc-._~0"},
		{"/a/%2f", "/a/%2F"},
		{"/a/%2F", "/a/%2F"},
		{"/a%3bb", "/a%3Bb"},
		{"/caf%c3%a9", "/caf%C3%A9"},
		{"/a%25", "/a%25"},
		{"/a%2525", "/a%2525"},
		{"//a///b//", "/a/b/"},
		{"//", "/"},
		{"/api/login/", "/api/login/"},
		{"/a/./b/../c", "/a/c"},
		{"/a/b/..", "/a/"},
		{"/a/b/.", "/a/b/"},
		{"/a/b/./", "/a/b/"},
		{"/.", "/"},
		{"/..", "/"},
		{"/../../a", "/a"},
		{"/a/../..//../b", "/b"},
		{"/a/.b/..c", "/a/.b/..c"},
		{"/a/b./c..", "/a/b./c.."},     // MatchPath drops trailing dots
		{"/a/%2e%2ejson", "/a/..json"}, // a file name, not a dot segment
		{"/a/%20", "/a/%20"},
		{"/a;b=c/d", "/a;b=c/d"},
		{"/!$&'()*+,;=:@-._~", "/!$&'()*+,;=:@-._~"},
		// Raw bytes that a path may not hold are encoded, not refused.
		{"/a b", "/a%20b"},
		{`/a\b`, "/a%5Cb"},
		{"/caf\xc3\xa9", "/caf%C3%A9"},
		{"/\xff", "/%FF"},
		{"/a[0]", "/a%5B0%5D"},
		{`/a"<>^{|}` + "`", "/a%22%3C%3E%5E%7B%7C%7D%60"},
		{"/a?b#c", "/a%3Fb%23c"},
	}
	for _, tt := range tests {
		got, err := CanonicalPath(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("CanonicalPath(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			continue
		}
		if again, err := CanonicalPath(got); again != got || err != nil {
			t.Errorf("CanonicalPath(%q) = %q, %v; not idempotent", got, again, err)
		}
	}
}

func TestCanonicalPathErrors(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", `invalid path: expected "/" at byte 0`},
		{"api/login", `invalid path: expected "/" at byte 0`},
		{"*", `invalid path: expected "/" at byte 0`},
		{"http://example.com/", `invalid path: expected "/" at byte 0`},
		{"/%", "invalid path: malformed percent-escape at byte 1"},
		{"/a%4", "invalid path: malformed percent-escape at byte 2"},
		{"/a/%zz", "invalid path: malformed percent-escape at byte 3"},
		{"/a/%4g", "invalid path: malformed percent-escape at byte 3"},
		{"/a/%%41", "invalid path: malformed percent-escape at byte 3"},
		{"/a%00", "invalid path: encoded control character at byte 2"},
		{"/a%0d%0aX-Injected:%20x", "invalid path: encoded control character at byte 2"},
		{"/a%1F", "invalid path: encoded control character at byte 2"},
		{"/a%7f", "invalid path: encoded control character at byte 2"},
		{"/a\x00", "invalid path: control character at byte 2"},
		{"/a\nb", "invalid path: control character at byte 2"},
		{"/a\tb", "invalid path: control character at byte 2"},
		{"/a\x7f", "invalid path: control character at byte 2"},
		// Segments some upstream reads as dot segments.
		{"/%2e%2E/a", "invalid path: encoded or disguised dot segment at byte 1"},
		{`/0\0/..`, `invalid path: ".." after a segment that some upstream reads as none or several at byte 5`},
		{"/a%5Cb/../c", `invalid path: ".." after a segment that some upstream reads as none or several at byte 7`},
		{"/a%255Cb/..", `invalid path: ".." after a segment that some upstream reads as none or several at byte 9`},
		{"/0/ /..", `invalid path: ".." after a segment that some upstream reads as none or several at byte 5`},
		{"/a/%20%C2%A0/../b", `invalid path: ".." after a segment that some upstream reads as none or several at byte 13`},
		{"/a/;x/..", `invalid path: ".." after a segment that some upstream reads as none or several at byte 6`},
		{"/a/::$DATA/..", `invalid path: ".." after a segment that some upstream reads as none or several at byte 11`},
		{"/a/b%2Fc/..", `invalid path: ".." after a segment that some upstream reads as none or several at byte 9`},
		{"/a/b%252Fc/..", `invalid path: ".." after a segment that some upstream reads as none or several at byte 11`},
		{"/a/b%EF%BC%8Fc/..", `invalid path: ".." after a segment that some upstream reads as none or several at byte 15`},
		{"/.%2e/a", "invalid path: encoded or disguised dot segment at byte 1"},
		{"/api/%2E/login", "invalid path: encoded or disguised dot segment at byte 5"},
		{"/api/%2e%2e/api/login", "invalid path: encoded or disguised dot segment at byte 5"},
		{"/a/%252e%252e/b", "invalid path: encoded or disguised dot segment at byte 3"},
		{"/a/%2e%2e%2fb", "invalid path: encoded or disguised dot segment at byte 3"},
		{"/admin/..%2F..%2Fpublic", "invalid path: encoded or disguised dot segment at byte 7"},
		{"/admin%2F..%2Fpublic", "invalid path: encoded or disguised dot segment at byte 1"},
		{"/admin%2f.", "invalid path: encoded or disguised dot segment at byte 1"},
		{"/a/.%2Fb", "invalid path: encoded or disguised dot segment at byte 3"},
		{"/a%5C..%5Cb", "invalid path: encoded or disguised dot segment at byte 1"},
		{`/a\..\b`, "invalid path: encoded or disguised dot segment at byte 1"},
		{"/a/..;/b", "invalid path: encoded or disguised dot segment at byte 3"},
		{"/a/.;x/b", "invalid path: encoded or disguised dot segment at byte 3"},
		{"/a/...", "invalid path: encoded or disguised dot segment at byte 3"},
		{"/a/..%20/b", "invalid path: encoded or disguised dot segment at byte 3"},
		{"/a/.%20./b", "invalid path: encoded or disguised dot segment at byte 3"},
		{"/a/x%2F%20.%20", "invalid path: encoded or disguised dot segment at byte 3"},
		// Dot segments once compatibility forms are folded, or with what
		// Windows and trimming readers drop.
		{"/a/%EF%BC%8E%EF%BC%8E/b", "invalid path: encoded or disguised dot segment at byte 3"},          // fullwidth "．．"
		{"/a/%E2%80%A5/b", "invalid path: encoded or disguised dot segment at byte 3"},                   // "‥"
		{"/a%EF%BC%8F..%EF%BC%8Fb", "invalid path: encoded or disguised dot segment at byte 1"},          // "／..／"
		{"/a/\uff0e/b", "invalid path: encoded or disguised dot segment at byte 3"},                      // raw
		{"/a/%25EF%25BC%258E/b", "invalid path: encoded or disguised dot segment at byte 3"},             // doubly encoded
		{"/a/%EF%BC%85%EF%BC%92%EF%BD%85/b", "invalid path: encoded or disguised dot segment at byte 3"}, // "％２ｅ"
		{"/a/..%C2%A0/b", "invalid path: encoded or disguised dot segment at byte 3"},
		{"/a/.%E3%80%80./b", "invalid path: encoded or disguised dot segment at byte 3"},
		{"/a/..::$DATA/b", "invalid path: encoded or disguised dot segment at byte 3"},
		{"/a/..:$i30:$INDEX_ALLOCATION/b", "invalid path: encoded or disguised dot segment at byte 3"},
		// Lenient decoders read these as "." or "/".
		{"/a/%C0%AE%C0%AE/b", "invalid path: overlong or surrogate UTF-8 encoding at byte 3"},
		{"/a%C0%AFb", "invalid path: overlong or surrogate UTF-8 encoding at byte 1"},
		{"/a%E0%80%AEb", "invalid path: overlong or surrogate UTF-8 encoding at byte 1"},
		{"/a%F0%80%80%AEb", "invalid path: overlong or surrogate UTF-8 encoding at byte 1"},
		{"/a%ED%A0%80b", "invalid path: overlong or surrogate UTF-8 encoding at byte 1"},
		{"/a%25C0%25AEb", "invalid path: overlong or surrogate UTF-8 encoding at byte 1"},
	}
	for _, tt := range tests {
		got, err := CanonicalPath(tt.in)
		if err == nil {
			t.Errorf("CanonicalPath(%q) = %q, want error %q", tt.in, got, tt.want)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("CanonicalPath(%q) error %q, want %q", tt.in, err, tt.want)
		}
		if !errors.Is(err, ErrInvalidPath) {
			t.Errorf("CanonicalPath(%q) error %v is not ErrInvalidPath", tt.in, err)
		}
		var pe *PathError
		if !errors.As(err, &pe) {
			t.Errorf("CanonicalPath(%q) error %T is not a *PathError", tt.in, err)
		}
	}
}

func TestMatchPath(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"/", "/"},
		{"", "/"},
		{"/api/login", "/api/login"},
		{"/API/Login/", "/api/login"},
		{"/a%2Fb", "/a/b"},
		{"/a%252Fb", "/a/b"},               // decoded twice
		{"/a%25252Fb", "/a/b"},             // and more
		{"/a%2541", "/aa"},                 // "%25" "41" is "%41" is "A"
		{"/a%25%34%31", "/aa"},             // the escape can be completed by decoded bytes
		{"/a%25", "/a%"},                   // a lone "%" stays
		{"/a%25zz", "/a%zz"},               // so does a malformed escape
		{"/a%5Cb", "/a/b"},                 // encoded backslash
		{`/a\b\\c`, "/a/b/c"},              // raw backslash (not canonical, but handled)
		{"/a;x/b;y=1;z", "/a/b"},           // parameters of every segment
		{"/a/..;/b", "/b"},                 // Tomcat's "..;"
		{"/a/%3B/b", "/a/b"},               // an encoded ";" as well
		{"/a/..%2Fb", "/b"},                // dot segments again after decoding
		{"/%2E%2E%2F%2E%2E%2Fetc", "/etc"}, // never above the root
		{"/a/b/..", "/a"},
		{"/a/b/c/", "/a/b/c"},
		{"/caf%C3%89", "/café"},
		{"/%E2%84%AA", "/k"}, // KELVIN SIGN lower-cases to "k"
		{"/\xff", "/\uFFFD"}, // invalid UTF-8, as strings.ToLower
		{"/a%3Fb%23c", "/a?b#c"},
		{"api", "/api"},
		{"/api/login.", "/api/login"},          // trailing dots and spaces go (IIS)
		{"/api/login%20", "/api/login"},        //
		{"/api/login.%20.", "/api/login"},      //
		{"/api./login", "/api/login"},          // in every segment
		{"/api/login.json", "/api/login.json"}, // a format suffix stays; Rule.Matches handles it
		{"/api/login.json.", "/api/login.json"},
		{"/a/...", "/a"},
		{"/a/. ./b", "/a/b"},
		// Case and compatibility forms, folded.
		{"/api/log%C4%B1n", "/api/login"},                       // dotless ı: Java's equalsIgnoreCase
		{"/API/LOG%C4%B0N", "/api/login"},                       // İ
		{"/api/logi%CC%87n", "/api/login"},                      // i and a dot above, as Java lowers İ
		{"/api/%C5%BFecret", "/api/secret"},                     // long ſ
		{"/%EF%BC%A1%EF%BD%90%EF%BD%89/x", "/api/x"},            // fullwidth
		{"/admin%EF%BC%8Fx", "/admin/x"},                        // fullwidth solidus
		{"/admin%EF%BC%BCx", "/admin/x"},                        // fullwidth reverse solidus
		{"/stra%C3%9Fe", "/strasse"},                            // ß: full case folding
		{"/%EF%AC%81le", "/file"},                               // the ligature ﬁ
		{"/%CE%A3%CF%82", "/σσ"},                                // final sigma
		{"/caf%C3%A9", "/café"},                                 // composed
		{"/cafe%CC%81", "/café"},                                // decomposed
		{"/%EF%BC%85%EF%BC%94%EF%BC%91", "/a"},                  // "％４１" is "%41" once folded
		{"/a%FFb", "/a\uFFFDb"},                                 // invalid UTF-8
		{"/%E1%8F%B8", "/\u13f0"},                               // Cherokee folds to upper case
		{"/api/login%C2%A0", "/api/login"},                      // White_Space at a segment's end
		{"/api/login%E3%80%80.%E2%80%83", "/api/login"},         //
		{"/api%E1%9A%80/login", "/api/login"},                   //
		{"/api/%C2%A0login", "/api/ login"},                     // only at the end
		{"/admin::$DATA/x", "/admin/x"},                         // NTFS streams
		{"/admin::$INDEX_ALLOCATION/x", "/admin/x"},             //
		{"/admin:$i30:$index_allocation/x", "/admin/x"},         //
		{"/admin:$DATA", "/admin"},                              //
		{"/admin:s:$DATA", "/admin"},                            //
		{"/admin.::$DATA./", "/admin"},                          //
		{"/admin%EF%BC%9A%EF%BC%9A%EF%BC%84DATA/x", "/admin/x"}, // fullwidth ":" and "$"
		{"/v1/x:batchGet", "/v1/x:batchget"},                    // a ":" alone is kept
	}
	for _, tt := range tests {
		got := MatchPath(tt.in)
		if got != tt.want {
			t.Errorf("MatchPath(%q) = %q, want %q", tt.in, got, tt.want)
			continue
		}
		if again := MatchPath(got); again != got {
			t.Errorf("MatchPath(%q) = %q; not idempotent", got, again)
		}
	}
}

// TestPathSpellings checks that every spelling of a path that an upstream
// may treat as /api/login is matched as /api/login, by the rule written in
// either of two spellings, and that other paths are not.
func TestPathSpellings(t *testing.T) {
	p := mustParse(t, "plain: POST /api/login by ip 5/15m\nodd: POST /API//Login/ by ip 5/15m")
	same := []string{
		"/api/login",
		"/API/Login",
		"/api//login",
		"/api/./login",
		"/api/x/../login",
		"/api/%6Cogin",
		"/api/%6cOGIN",
		"/api/login/",
		"/api/login;a=b",
		"/api/login;a=b/",
		"/api%2Flogin",
		"/api%2flogin",
		"/api%252Flogin",
		"//api/login",
		"/../api/login",
		`/api\login`,
		"/api%5Clogin",
		"/api;x/login",
		"/api/login.",
		"/api/login%20",
		"/api/login%2E",
		"/api/login.%20",
		"/API/LOGIN./",
		"/api./login",
	}
	for _, s := range same {
		c, err := CanonicalPath(s)
		if err != nil {
			t.Errorf("CanonicalPath(%q): %v", s, err)
			continue
		}
		m := MatchPath(c)
		if m != "/api/login" {
			t.Errorf("MatchPath(CanonicalPath(%q)) = %q, want /api/login", s, m)
		}
		if got := p.Match("POST", m, nil); len(got) != 2 {
			t.Errorf("%q matched %d rules, want 2", s, len(got))
		}
	}
	// Format suffixes (Rails' "(.:format)", Spring's suffix patterns): the
	// rules' last segment has no dot, so they match these too.
	for _, s := range []string{"/api/login.json", "/api/login.xml", "/API/Login.JSON/", "/api/login.tar.gz", "/api/login.json;x", "/api/login%2Ejson", "/api/login.json.", "/api/login."} {
		c, err := CanonicalPath(s)
		if err != nil {
			t.Errorf("CanonicalPath(%q): %v", s, err)
			continue
		}
		if got := p.Match("POST", MatchPath(c), nil); len(got) != 2 {
			t.Errorf("%q matched %d rules, want 2", s, len(got))
		}
	}
	// Spellings that would climb out of the path for some upstream are
	// refused, not matched under another path.
	for _, s := range []string{"/api/%2e%2e/api/login", "/api/%2E/login", "/api/x/..%2Flogin", "/api/x%2F..%2Flogin", "/api/x/..;/login", "/api/x/...%2F../login"} {
		if c, err := CanonicalPath(s); err == nil {
			t.Errorf("CanonicalPath(%q) = %q, want an error", s, c)
		}
	}
	different := []string{"/api/loginx", "/api/login2", "/api/log", "/apilogin", "/api/login/x", "/api/login%2Fx", "/login", "/api", "/api/logi%6E%6E",
		"/api/loginjson", "/api/login.json/x", "/api/log.in", "/api/login-json", "/api/.login"}
	for _, s := range different {
		c, err := CanonicalPath(s)
		if err != nil {
			t.Errorf("CanonicalPath(%q): %v", s, err)
			continue
		}
		if m := MatchPath(c); m == "/api/login" {
			t.Errorf("MatchPath(CanonicalPath(%q)) = %q, want another path", s, m)
		}
		if got := p.Match("POST", MatchPath(c), nil); len(got) != 0 {
			t.Errorf("%q matched %d rules, want none", s, len(got))
		}
	}
}

func TestCheckTarget(t *testing.T) {
	for _, target := range []string{"/api/login", "/api/login?x=1", "https://example.com/api/login?x=%23", "/a%23b", "*"} {
		if err := CheckTarget(target); err != nil {
			t.Errorf("CheckTarget(%q) = %v, want nil", target, err)
		}
	}
	for target, want := range map[string]string{
		"/api/x#/../secret": `invalid path: raw "#" in the request target at byte 6`,
		"/api/x?a=#b":       `invalid path: raw "#" in the request target at byte 9`,
		"#":                 `invalid path: raw "#" in the request target at byte 0`,
	} {
		err := CheckTarget(target)
		if err == nil || err.Error() != want || !errors.Is(err, ErrInvalidPath) {
			t.Errorf("CheckTarget(%q) = %v, want %q", target, err, want)
		}
	}
}

func TestPathAllocations(t *testing.T) {
	canonical := "/api/v1/users/42/orders;v=2/%2F/~x"
	if got, err := CanonicalPath(canonical); got != canonical || err != nil {
		t.Fatalf("CanonicalPath(%q) = %q, %v; want it unchanged", canonical, got, err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = CanonicalPath(canonical) }); n != 0 {
		t.Errorf("CanonicalPath of a canonical path: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = CanonicalPath("/API//v1/./%7Eusers/") }); n != 1 {
		t.Errorf("CanonicalPath of a short path: %v allocations, want 1", n)
	}
	match := "/api/v1/users/42/orders"
	if n := testing.AllocsPerRun(100, func() { _ = MatchPath(match) }); n != 0 {
		t.Errorf("MatchPath of a match-form path: %v allocations, want 0", n)
	}
	// Long paths work the same, past the stack buffers.
	long := "/" + strings.Repeat("Abc%2F/", 200)
	c, err := CanonicalPath(long)
	if err != nil || c != long {
		t.Errorf("CanonicalPath(long) = %q, %v", c, err)
	}
	if m, want := MatchPath(c), "/"+strings.TrimSuffix(strings.Repeat("abc/", 200), "/"); m != want {
		t.Errorf("MatchPath(long) = %q, want %q", m, want)
	}
}
