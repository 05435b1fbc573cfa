package policy

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"",
		specExample,
		"a: * /* by ip 1/1s",
		"t: GET,HEAD /v1/* by header(X-Key) 10/90s token burst=30 cost=7 shadow count=all fail=open",
		"s: POST /a by email(user.name) 60/1h sliding(10m) cost=60",
		"r: * /a%2Fb/%7e;x by tenant(x-org) 3/1d reset fail=local",
		"x: GET,get /a/*/b by foo 0/0s fixed token burst=0 cost=99 sliding(7s)",
		"login: POST /api/login by ip 5/15x\nlogin: POST /api/login by ip 5/15m",
		"a:b: c d by e f; ;# comment\r\n: by",
		"t: * /a by ip 1/1000d token burst=3",
		"p: * /%2500/%25/%C3%A9/\\x by ip 1/1s",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		p, err := Parse(src)
		if err != nil {
			if p != nil {
				t.Fatal("Parse returned a policy with an error")
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T is not a *ParseError", err)
			}
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				if pe, ok := e.(*ParseError); !ok || pe.Line < 1 || pe.Msg == "" {
					t.Fatalf("bad problem %#v", e)
				}
			}
			return
		}
		names := make(map[string]bool)
		for _, r := range p.Rules() {
			checkRule(t, r)
			if names[r.Name] {
				t.Fatalf("duplicate name %q", r.Name)
			}
			names[r.Name] = true
			// A rule's String parses back to the same rule.
			q, err := Parse(r.String())
			if err != nil {
				t.Fatalf("Parse(%q) of a parsed rule: %v", r.String(), err)
			}
			back := q.Rules()[0]
			back.Line = r.Line
			if !reflect.DeepEqual(back, r) {
				t.Fatalf("%q parsed back as %+v, want %+v", r.String(), *back, *r)
			}
		}
		_ = p.String()
	})
}

// checkRule fails t unless r satisfies the invariants every parsed rule
// has.
func checkRule(t *testing.T, r *Rule) {
	t.Helper()
	if !validName(r.Name) {
		t.Fatalf("rule %+v: bad name", r)
	}
	if r.Methods != nil {
		if len(r.Methods) == 0 {
			t.Fatalf("rule %q: empty method list", r.Name)
		}
		seen := make(map[string]bool)
		for _, m := range r.Methods {
			if !isToken(m) || m != strings.ToUpper(m) || seen[m] {
				t.Fatalf("rule %q: bad methods %q", r.Name, r.Methods)
			}
			seen[m] = true
		}
	}
	if !strings.HasPrefix(r.Path, "/") || MatchPath(r.Path) != r.Path || strings.Contains(r.Path, "*") {
		t.Fatalf("rule %q: path %q not in match form", r.Name, r.Path)
	}
	switch r.Identity.Kind {
	case ByIP, ByGlobal:
		if r.Identity.Field != "" {
			t.Fatalf("rule %q: identity %+v has a field", r.Name, r.Identity)
		}
	case ByEmail:
		if !validField(r.Identity.Field) {
			t.Fatalf("rule %q: bad email field %q", r.Name, r.Identity.Field)
		}
	case ByTenant, ByHeader:
		if !isToken(r.Identity.Field) {
			t.Fatalf("rule %q: bad header %q", r.Name, r.Identity.Field)
		}
	default:
		t.Fatalf("rule %q: bad identity %+v", r.Name, r.Identity)
	}
	if r.Limit < 1 || r.Limit > MaxCount || r.Window < time.Second || r.Window > MaxWindow || r.Window%time.Second != 0 {
		t.Fatalf("rule %q: bad limit %d/%v", r.Name, r.Limit, r.Window)
	}
	if r.Cost < 1 {
		t.Fatalf("rule %q: cost %d", r.Name, r.Cost)
	}
	switch r.Algorithm {
	case Fixed, Reset, Sliding:
		if r.Cost > r.Limit || r.Burst != 0 {
			t.Fatalf("rule %q: cost %d, limit %d, burst %d", r.Name, r.Cost, r.Limit, r.Burst)
		}
	case Token:
		if r.Burst < 1 || r.Cost > r.Burst || r.Burst > maxBurst(r.Limit, r.Window) {
			t.Fatalf("rule %q: cost %d, burst %d", r.Name, r.Cost, r.Burst)
		}
	default:
		t.Fatalf("rule %q: algorithm %d", r.Name, r.Algorithm)
	}
	if r.Algorithm == Sliding {
		if r.Bucket < time.Second || r.Bucket > r.Window || r.Window%r.Bucket != 0 || r.Bucket%time.Second != 0 {
			t.Fatalf("rule %q: bucket %v of window %v", r.Name, r.Bucket, r.Window)
		}
	} else if r.Bucket != 0 {
		t.Fatalf("rule %q: bucket %v without sliding", r.Name, r.Bucket)
	}
	if r.Fail > FailLocal {
		t.Fatalf("rule %q: fail mode %d", r.Name, r.Fail)
	}
}

func FuzzCanonicalPath(f *testing.F) {
	for _, s := range []string{
		"/", "", "*", "/api/login", "/API/Login/", "/api//login", "/api/./login", "/api/x/../login",
		"/api/%6Cogin", "/api/login;a=b", "/api%2Flogin", "/api/%2e%2e/api/login", "//api/login",
		`/api\login`, "/a/%7e/b", "/a/%2f", "/a%252F..%252F", "/a/..;/b", "/%", "/%4", "/%zz", "/%00",
		"/a\x00", "/caf\xc3\xa9", "/\xff\xfe", "/%E2%84%AA", "/a%25%34%31", "/../..//./", "/.%2E/%2e.",
		"/a?b#c", "/a[0] b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		// MatchPath takes any string and is idempotent.
		m0 := MatchPath(in)
		if !strings.HasPrefix(m0, "/") || MatchPath(m0) != m0 {
			t.Fatalf("MatchPath(%q) = %q, MatchPath of that = %q", in, m0, MatchPath(m0))
		}

		out, err := CanonicalPath(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidPath) {
				t.Fatalf("CanonicalPath(%q) error %v is not ErrInvalidPath", in, err)
			}
			return
		}
		if !strings.HasPrefix(out, "/") || strings.Contains(out, "//") {
			t.Fatalf("CanonicalPath(%q) = %q", in, out)
		}
		for seg := range strings.SplitSeq(out, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("CanonicalPath(%q) = %q has a dot segment", in, out)
			}
		}
		for i := 0; i < len(out); i++ {
			if c := out[i]; c != '/' && c != '%' && !isPathChar(c) {
				t.Fatalf("CanonicalPath(%q) = %q has a raw %q", in, out, c)
			}
		}
		if again, err := CanonicalPath(out); again != out || err != nil {
			t.Fatalf("CanonicalPath(%q) = %q, CanonicalPath of that = %q, %v", in, out, again, err)
		}
		m := MatchPath(out)
		if !strings.HasPrefix(m, "/") || MatchPath(m) != m {
			t.Fatalf("MatchPath(%q) = %q, MatchPath of that = %q", out, m, MatchPath(m))
		}
		if m != "/" && strings.HasSuffix(m, "/") || strings.Contains(m, "//") || strings.Contains(m, ";") || strings.Contains(m, `\`) {
			t.Fatalf("MatchPath(%q) = %q", out, m)
		}
		for seg := range strings.SplitSeq(m, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("MatchPath(%q) = %q has a dot segment", out, m)
			}
		}
	})
}
