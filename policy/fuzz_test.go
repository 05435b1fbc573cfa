package policy

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// parseSeeds are FuzzParse's seed corpus: docs/rules.md's example, every
// option, and rules malformed in several ways at once.
var parseSeeds = []string{
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
	"rls-login: * rls:edge by descriptor(generic_key=login,remote_address) 5/1m token fail=closed\nip: * rls:e.2 by descriptor(a=x=y,b) 1/1s shadow",
	"d: GET rls:a/b by descriptor(k=,=v,(x)) 1/1s; h: * /a by descriptor(k) 1/1s",
	"j: * /v1/* by jwt(app_metadata.tenant_id) 100/1d sliding(1h) plans(app_metadata.plan)=pro:10000/1d,team:5/7s,x:1/1s cost=2",
	"k: * /v1/* by jwt 10/1m token burst=20 plans(https://example.com/plan)=pro:100/1m,slow:1/1000d",
	"l: * /v1/* by jwt(a..b) 1/1s plans(t)=p:0/1s,:1/1s,p:1/1s,p:1/1s, plans=x",
	"m: * /v1/* by jwt(org_id) 5000000/1mo tz=Europe/Berlin anchor=31 charge=json(usage.total_tokens+a.b)",
	"w: GET /a by tenant 10/1w charge=header(x-credits-used) plans(t)=pro:100/1w\nd: * /b by ip 5/1d tz=UTC; e: * /c by ip 5/1d tz=Asia/Kolkata; f: * /d by ip 5/1mo anchor=1; g: * /e by ip 5/1mo tz=UTC anchor=15",
}

func FuzzParse(f *testing.F) {
	for _, s := range parseSeeds {
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
			setLine(back, r.Line)
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
	if r.IsRLS() {
		checkRLSRule(t, r)
	} else if !strings.HasPrefix(r.Path, "/") || MatchPath(r.Path) != r.Path || strings.Contains(r.Path, "*") {
		t.Fatalf("rule %q: path %q not in match form", r.Name, r.Path)
	}
	switch r.Identity.Kind {
	case ByDescriptor:
		if !r.IsRLS() {
			t.Fatalf("rule %q: descriptor identity on path %q", r.Name, r.Path)
		}
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
	case ByJWT:
		if !validClaim(r.Identity.Field) {
			t.Fatalf("rule %q: bad claim %q", r.Name, r.Identity.Field)
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
	if (r.PlanClaim == "") != (len(r.Plans) == 0) || r.PlanClaim != "" && !validClaim(r.PlanClaim) {
		t.Fatalf("rule %q: plan claim %q with %d plans", r.Name, r.PlanClaim, len(r.Plans))
	}
	names := make(map[string]bool)
	for _, p := range r.Plans {
		if !validPlanName(p.Name) || names[p.Name] {
			t.Fatalf("rule %q: bad or duplicate plan name %q", r.Name, p.Name)
		}
		names[p.Name] = true
		// A plan's rule is a rule like any other, of the same name and
		// identity, with the plan's limit.
		v := r.ForPlan(p.Name)
		if v == r || v.Name != r.Name || v.Identity != r.Identity || v.Limit != p.Limit || v.Window != p.Window || v.Plans != nil {
			t.Fatalf("rule %q: plan %q counts as %+v", r.Name, p.Name, *v)
		}
		checkRule(t, v)
	}
}

func FuzzCanonicalPath(f *testing.F) {
	for _, s := range []string{
		"/", "", "*", "/api/login", "/API/Login/", "/api//login", "/api/./login", "/api/x/../login",
		"/api/%6Cogin", "/api/login;a=b", "/api%2Flogin", "/api/%2e%2e/api/login", "//api/login",
		`/api\login`, "/a/%7e/b", "/a/%2f", "/a%252F..%252F", "/a/..;/b", "/%", "/%4", "/%zz", "/%00",
		"/a\x00", "/caf\xc3\xa9", "/\xff\xfe", "/%E2%84%AA", "/a%25%34%31", "/../..//./", "/.%2E/%2e.",
		"/a?b#c", "/a[0] b",
		"/api/log%C4%B1n", "/API/LOG%C4%B0N", "/%C5%BFecret", "/%EF%BD%81dmin%EF%BC%8Fx", "/stra%C3%9Fe",
		"/admin::$DATA/x", "/admin:$i30:$INDEX_ALLOCATION/", "/a%C2%A0/b%E3%80%80.", "/a/%EF%BC%8E%EF%BC%8E/b",
		"/a/%E2%80%A5", "/%C0%AE%C0%AE/", "/%EF%BC%85%EF%BC%94%EF%BC%91", "/%E1%8F%B8", "/%CD%85%CE%AE",
		"/\u00b4", "/a%CC%81b/%E2%84%AB",
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
		// A path and its canonical form match the same rules.
		if m != m0 {
			t.Fatalf("MatchPath(%q) = %q, but MatchPath of its canonical form %q = %q", in, m0, out, m)
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

// pathChars are the characters FuzzPathSpellings builds base paths from.
const pathChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_~."

// FuzzPathSpellings states what path matching promises: every spelling of
// a path that some upstream serves as that path (other case, escapes of
// unreserved characters, doubled slashes, "." and "x/.." segments, "%2F",
// "%252F", "\" or "%5C" for "/", ";" parameters, a trailing slash, trailing
// dots and spaces, a format suffix) matches every rule the path itself
// matches, or is refused with an error (400). Never another rule, never
// none.
func FuzzPathSpellings(f *testing.F) {
	f.Add("api/login", uint64(0), byte(2), false)
	f.Add("API/v1.2/Items", uint64(0xdeadbeefcafe), byte(1), true)
	f.Add("a/b/c/d", uint64(0x0123456789abcdef), byte(4), false)
	f.Add("x", ^uint64(0), byte(1), false)
	f.Fuzz(func(t *testing.T, raw string, variant uint64, ruleSegs byte, prefix bool) {
		// The base path: segments of pathChars, none made of dots only.
		var segs []string
		for s := range strings.SplitSeq(raw, "/") {
			var b strings.Builder
			for i := 0; i < len(s); i++ {
				b.WriteByte(pathChars[int(s[i])%len(pathChars)])
			}
			if seg := b.String(); strings.Trim(seg, ".") != "" {
				segs = append(segs, seg)
			}
		}
		if len(segs) == 0 || len(segs) > 12 {
			return
		}
		base := "/" + strings.Join(segs, "/")
		c, err := CanonicalPath(base)
		if err != nil {
			t.Fatalf("CanonicalPath(%q) of a plain path: %v", base, err)
		}
		// The rule: the base path, or a prefix rule on its first k segments.
		k := 1 + int(ruleSegs)%len(segs)
		if k < len(segs) {
			prefix = true
		}
		rc, err := CanonicalPath("/" + strings.Join(segs[:k], "/"))
		if err != nil {
			t.Fatal(err)
		}
		rule := &Rule{Path: MatchPath(rc), Prefix: prefix}
		if !rule.matchesPath(MatchPath(c)) {
			t.Fatalf("rule %q (prefix %v) does not match its own path %q", rule.Path, prefix, base)
		}

		bit := func(i uint) bool { return variant>>(i%64)&1 == 1 }
		var b strings.Builder
		for i, seg := range segs {
			switch { // the slash before the segment
			case i == 0:
				b.WriteString("/")
			case bit(uint(8 * i)):
				b.WriteString([]string{"%2F", "%2f", `\`, "%5C", "%252F", "//", "/./", "/x/../", "%EF%BC%8F", "\uff3c"}[variant>>(8*i%64+1)%10])
			default:
				b.WriteString("/")
			}
			for j := 0; j < len(seg); j++ {
				ch := seg[j]
				switch n := uint(8*i + j); {
				case bit(n+3) && bit(n+4) && !bit(n+5):
					b.WriteString(unicodeSpelling(ch, bit(n+6)))
				case bit(n+3) && bit(n+5):
					b.WriteString(fmt.Sprintf("%%%02x", ch)) // lower-case hex
				case bit(n + 3):
					b.WriteString(fmt.Sprintf("%%%02X", ch))
				case bit(n+4) && 'a' <= ch && ch <= 'z':
					b.WriteByte(ch - 'a' + 'A')
				case bit(n+4) && 'A' <= ch && ch <= 'Z':
					b.WriteByte(ch - 'A' + 'a')
				default:
					b.WriteByte(ch)
				}
			}
			// A format suffix goes on the last segment before anything
			// else: "login.json." is IIS's "login.json", then Rails'
			// "login"; "login .json" is nobody's "login".
			if i == len(segs)-1 && bit(61) && !strings.Contains(seg, ".") {
				b.WriteString([]string{".json", ".xml", ".tar.gz", ".JSON"}[variant>>62&3])
			}
			if bit(uint(8*i + 6)) {
				b.WriteString(";jsessionid=1")
			}
			if bit(uint(8*i + 7)) {
				b.WriteString([]string{".", "%20", ".%20", "%2E", "%C2%A0", "%E3%80%80.", "::$DATA", ":$i30:$INDEX_ALLOCATION"}[variant>>(8*i%64+2)&7])
			}
		}
		if bit(60) {
			b.WriteString("/")
		}
		spelled := b.String()
		sc, err := CanonicalPath(spelled)
		if err != nil {
			return // refused: a 400, allowed
		}
		if m := MatchPath(sc); !rule.matchesPath(m) {
			t.Fatalf("%q is a spelling of %q, but its match form %q does not match rule %q (prefix %v)", spelled, base, m, rule.Path, prefix)
		}
	})
}

// unicodeSpelling returns a character that readers which ignore case or
// fold compatibility forms take for the ASCII ch: "ı" or "İ" for i, "ſ"
// for s, the Kelvin sign for k, else the fullwidth form; percent-encoded
// or raw.
func unicodeSpelling(ch byte, encode bool) string {
	var r rune
	switch ch | 0x20 {
	case 'i':
		r = 'ı'
		if ch == 'I' {
			r = 'İ'
		}
	case 's':
		r = 'ſ'
	case 'k':
		r = '\u212a'
	default:
		r = 0xff01 + rune(ch) - 0x21
	}
	if !encode {
		return string(r)
	}
	var b strings.Builder
	for _, c := range []byte(string(r)) {
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// checkRLSRule fails t unless r, an rls:DOMAIN rule, has the invariants
// of one: no methods or path, a valid domain, and a descriptor pattern of
// valid keys that its identity's Field spells.
func checkRLSRule(t *testing.T, r *Rule) {
	t.Helper()
	if r.Methods != nil || r.Path != "" || r.Prefix || !validField(r.Domain) || r.Identity.Kind != ByDescriptor || len(r.Descriptor) == 0 {
		t.Fatalf("rls rule %+v", r)
	}
	var spelled []string
	for _, e := range r.Descriptor {
		if !validField(e.Key) || strings.ContainsAny(e.Value, "(), \t") {
			t.Fatalf("rule %q: descriptor entry %+v", r.Name, e)
		}
		if e.Value == "" {
			spelled = append(spelled, e.Key)
		} else {
			spelled = append(spelled, e.Key+"="+e.Value)
		}
	}
	if strings.Join(spelled, ",") != r.Identity.Field {
		t.Fatalf("rule %q: descriptor %+v spelled %q", r.Name, r.Descriptor, r.Identity.Field)
	}
}
