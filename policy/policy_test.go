package policy

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
)

const matchRules = `
login:   POST       /api/login     by ip      5/15m
items:   GET,PUT    /api/items     by ip      10/1m
below:   GET        /api/items/*   by ip      10/1m
api:     *          /api/*         by global  1000/1m
root:    *          /*             by global  5000/1m
purge:   PURGE      /cache/*       by ip      1/1s
`

func names(rules []*Rule) []string {
	var out []string
	for _, r := range rules {
		out = append(out, r.Name)
	}
	return out
}

func TestMatch(t *testing.T) {
	p, err := Parse(matchRules)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		method, path string
		want         []string
	}{
		{"POST", "/api/login", []string{"login", "api", "root"}},
		{"GET", "/api/login", []string{"api", "root"}},
		{"post", "/api/login", []string{"api", "root"}}, // methods are case-sensitive
		{"GET", "/api/items", []string{"items", "below", "api", "root"}},
		{"PUT", "/api/items", []string{"items", "api", "root"}},
		{"HEAD", "/api/items", []string{"items", "below", "api", "root"}}, // GET rules cover HEAD
		{"DELETE", "/api/items", []string{"api", "root"}},
		{"GET", "/api/items/1", []string{"below", "api", "root"}},
		{"GET", "/api/items/1/2", []string{"below", "api", "root"}},
		{"GET", "/api/items/", []string{"below", "api", "root"}}, // not match form: exact rules miss it
		{"GET", "/api/itemsx", []string{"api", "root"}},
		{"GET", "/api", []string{"api", "root"}},
		{"GET", "/api/", []string{"api", "root"}},
		{"GET", "/apix", []string{"root"}},
		{"GET", "/ap", []string{"root"}},
		{"GET", "/", []string{"root"}},
		{"PURGE", "/cache", []string{"root", "purge"}}, // source order
		{"PURGE", "/cache/x", []string{"root", "purge"}},
		{"PURGE", "/cachex", []string{"root"}},
		{"GET", "/cache/x", []string{"root"}},
		// Format suffixes on the last segment.
		{"POST", "/api/login.json", []string{"login", "api", "root"}},
		{"POST", "/api/login.tar.gz", []string{"login", "api", "root"}},
		{"POST", "/api/login.json/x", []string{"api", "root"}},
		{"POST", "/api/loginx.json", []string{"api", "root"}},
		{"GET", "/api/items.xml", []string{"items", "below", "api", "root"}}, // a prefix rule's path itself
		{"GET", "/api/items.xml/1", []string{"api", "root"}},
		{"GET", "/api.json", []string{"api", "root"}},
		{"GET", "/robots.txt.json", []string{"root"}},
	}
	for _, tt := range tests {
		got := names(p.Match(tt.method, tt.path, nil))
		if !slices.Equal(got, tt.want) {
			t.Errorf("Match(%q, %q) = %v, want %v", tt.method, tt.path, got, tt.want)
		}
	}

	// Match appends to dst.
	dst := p.Match("GET", "/api/items/1", p.Rules()[:1])
	if got, want := names(dst), []string{"login", "below", "api", "root"}; !slices.Equal(got, want) {
		t.Errorf("Match appended to %v, want %v", got, want)
	}

	// An exact root rule matches only the root.
	exact, err := Parse("r: * / by ip 1/1s")
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]int{"/": 1, "/a": 0} {
		if got := len(exact.Match("GET", path, nil)); got != want {
			t.Errorf("exact root rule: Match(%q) found %d rules, want %d", path, got, want)
		}
	}
}

func TestFormatSuffixOnlyWithoutOwnSuffix(t *testing.T) {
	p, err := Parse("robots: GET /robots.txt by ip 1/1s; v: GET /api/v1.2/* by ip 1/1s")
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string][]string{
		"/robots.txt":      {"robots"},
		"/robots.txt.json": nil, // the rule has a suffix of its own
		"/robots.json":     nil,
		"/api/v1.2":        {"v"},
		"/api/v1.2/x.json": {"v"},
		"/api/v1.2.json":   nil,
	} {
		if got := names(p.Match("GET", path, nil)); !slices.Equal(got, want) {
			t.Errorf("Match(%q) = %v, want %v", path, got, want)
		}
	}
}

// TestMatchAny: a request with a "_method" field is checked against the
// rules of both methods, each rule once.
func TestMatchAny(t *testing.T) {
	p, err := Parse(matchRules)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		methods []string
		path    string
		want    []string
	}{
		{[]string{"POST"}, "/api/items", []string{"api", "root"}},
		{[]string{"POST", "PUT"}, "/api/items", []string{"items", "api", "root"}},
		{[]string{"POST", "GET"}, "/api/items", []string{"items", "below", "api", "root"}},
		{[]string{"GET", "PUT"}, "/api/items", []string{"items", "below", "api", "root"}},
		{[]string{"DELETE", "POST"}, "/api/login", []string{"login", "api", "root"}},
		{nil, "/api/login", nil},
	}
	for _, tt := range tests {
		if got := names(p.MatchAny(tt.methods, tt.path, nil)); !slices.Equal(got, tt.want) {
			t.Errorf("MatchAny(%q, %q) = %v, want %v", tt.methods, tt.path, got, tt.want)
		}
	}
	for _, tt := range []struct {
		method, path string
		want         bool
	}{
		{"POST", "/api/items", true},   // items and below apply to other methods
		{"GET", "/api/items/1", false}, // every rule there applies to GET
		{"PUT", "/api/items/1", true},  // below applies to GET
		{"POST", "/api/login", false},
		{"GET", "/api/login", true},
		{"GET", "/static", false},
	} {
		if got := p.MethodMatters(tt.method, tt.path); got != tt.want {
			t.Errorf("MethodMatters(%q, %q) = %v, want %v", tt.method, tt.path, got, tt.want)
		}
	}
	var none *Policy
	if none.MethodMatters("GET", "/") || len(none.MatchAny([]string{"GET"}, "/", nil)) != 0 {
		t.Error("a nil policy matches")
	}
}

func TestMatchAllocations(t *testing.T) {
	p, err := Parse(matchRules)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]*Rule, 0, p.Len())
	n := testing.AllocsPerRun(100, func() {
		dst = p.Match("GET", "/api/items/1", dst[:0])
	})
	if n != 0 {
		t.Errorf("Match with room in dst: %v allocations, want 0", n)
	}
	if len(dst) != 3 {
		t.Errorf("Match found %d rules, want 3", len(dst))
	}
	methods := [2]string{"POST", "PUT"}
	n = testing.AllocsPerRun(100, func() {
		dst = p.MatchAny(methods[:], "/api/items", dst[:0])
	})
	if n != 0 {
		t.Errorf("MatchAny with room in dst: %v allocations, want 0", n)
	}
}

func TestPolicyAccessors(t *testing.T) {
	p, err := Parse(matchRules)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(p.Rules()), []string{"login", "items", "below", "api", "root", "purge"}; !slices.Equal(got, want) {
		t.Errorf("Rules() = %v, want %v", got, want)
	}
	if p.Len() != 6 {
		t.Errorf("Len() = %d, want 6", p.Len())
	}
	// The slice Rules returns is the caller's.
	rules := p.Rules()
	rules[0] = nil
	if p.Rules()[0] == nil {
		t.Error("changing the slice Rules returned changed the policy")
	}
	if r, ok := p.Lookup("api"); !ok || r.Name != "api" || r.Line != 5 {
		t.Errorf("Lookup(api) = %+v, %v", r, ok)
	}
	if r, ok := p.Lookup("nope"); ok || r != nil {
		t.Errorf("Lookup(nope) = %+v, %v", r, ok)
	}

	// A nil policy and an empty one have no rules.
	for _, q := range []*Policy{nil, mustParse(t, "")} {
		if q.Len() != 0 || q.Rules() != nil || len(q.Match("GET", "/", nil)) != 0 {
			t.Errorf("%#v has rules", q)
		}
		if _, ok := q.Lookup("x"); ok {
			t.Errorf("%#v has rule x", q)
		}
		if got, want := q.String(), "NAME  METHODS  PATH  IDENTITY  LIMIT  ALGORITHM  OPTIONS\n"; got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

func mustParse(t testing.TB, src string) *Policy {
	t.Helper()
	p, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestWriteTable(t *testing.T) {
	p := mustParse(t, specExample+"keys: get,HEAD /V1/* by header(x-api-key) 10/1s token burst=20 cost=2 shadow count=all\n"+
		"who: POST /who by email(login) 1/90s reset fail=local; org: * /org by tenant(X-Org) 1/1s\n"+
		"user: * /v2/* by jwt 100/1d plans(app_metadata.plan)=pro:10000/1d,team:50000/1d; tid: * /v2/* by jwt(app_metadata.tenant_id) 10/1s")
	want := `NAME      METHODS   PATH                 IDENTITY                     LIMIT    ALGORITHM    OPTIONS
login     POST      /api/login           ip                           5/15m    fixed        -
register  POST      /api/register        ip                           3/1h     fixed        -
reset     POST      /api/password-reset  email                        3/1h     sliding(1m)  -
reset-ip  POST      /api/password-reset  ip                           5/1m     fixed        -
send      *         /api/send-email      tenant                       100/1h   fixed        -
query     GET,POST  /api/query           tenant                       1000/1d  fixed        -
global    *         /api/*               global                       1000/1m  sliding(1s)  fail=closed
keys      GET,HEAD  /v1/*                header(X-Api-Key)            10/1s    token        burst=20 shadow cost=2 count=all
who       POST      /who                 email(login)                 1/90s    reset        fail=local
org       *         /org                 tenant(X-Org)                1/1s     fixed        -
user      *         /v2/*                jwt                          100/1d   fixed        plans(app_metadata.plan)=pro:10000/1d,team:50000/1d
tid       *         /v2/*                jwt(app_metadata.tenant_id)  10/1s    fixed        -
`
	var b strings.Builder
	if err := p.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if b.String() != want {
		t.Errorf("WriteTable:\n%s\nwant:\n%s", b.String(), want)
	}
	if p.String() != want {
		t.Errorf("String:\n%s\nwant:\n%s", p.String(), want)
	}

	errBroken := errors.New("broken")
	if err := p.WriteTable(failingWriter{errBroken}); !errors.Is(err, errBroken) {
		t.Errorf("WriteTable to a failing writer: %v, want %v", err, errBroken)
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

func TestRuleSpec(t *testing.T) {
	p := mustParse(t, "a: * /a by ip 5/900s; b: * /a by ip 1000/1440m; c: * /a by ip 7/90s")
	for i, want := range []string{"5/15m", "1000/1d", "7/90s"} {
		if got := p.Rules()[i].Spec(); got != want {
			t.Errorf("Spec() = %q, want %q", got, want)
		}
	}
}

// TestConcurrentUse runs readers of one policy at once; with -race it
// checks that a Policy is safe for simultaneous use.
func TestConcurrentUse(t *testing.T) {
	p := mustParse(t, matchRules)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			dst := make([]*Rule, 0, 8)
			for range 200 {
				dst = p.Match("GET", "/api/items/1", dst[:0])
				if len(dst) != 3 {
					t.Errorf("Match found %d rules, want 3", len(dst))
					return
				}
				_ = p.String()
				_, _ = p.Lookup("api")
			}
		})
	}
	wg.Wait()
}

// TestMatchDescriptor: rls:DOMAIN rules match descriptors of their domain
// with exactly their keys in order and their fixed values, never HTTP
// requests; HTTP rules never match descriptors.
func TestMatchDescriptor(t *testing.T) {
	p, err := Parse(`
login:  * rls:edge by descriptor(generic_key=login,remote_address) 5/1m
ip:     * rls:edge by descriptor(remote_address) 100/1m
other:  * rls:api  by descriptor(remote_address) 100/1m
root:   * /*       by global 5000/1m
`)
	if err != nil {
		t.Fatal(err)
	}
	type e = DescriptorEntry
	tests := []struct {
		domain  string
		entries []e
		want    []string
		values  []string // the counted values of the first rule matched
	}{
		{"edge", []e{{"generic_key", "login"}, {"remote_address", "10.0.0.1"}}, []string{"login"}, []string{"10.0.0.1"}},
		{"edge", []e{{"generic_key", "signup"}, {"remote_address", "10.0.0.1"}}, nil, nil},
		{"edge", []e{{"remote_address", "10.0.0.1"}, {"generic_key", "login"}}, nil, nil}, // order matters
		{"edge", []e{{"generic_key", "login"}}, nil, nil},
		{"edge", []e{{"generic_key", "login"}, {"remote_address", "1"}, {"x", "y"}}, nil, nil},
		{"edge", []e{{"remote_address", "10.0.0.1"}}, []string{"ip"}, []string{"10.0.0.1"}},
		{"api", []e{{"remote_address", "10.0.0.1"}}, []string{"other"}, []string{"10.0.0.1"}},
		{"EDGE", []e{{"remote_address", "10.0.0.1"}}, nil, nil},
		{"", nil, nil, nil},
	}
	for _, tt := range tests {
		got := p.MatchDescriptor(tt.domain, tt.entries, nil)
		if !slices.Equal(names(got), tt.want) {
			t.Errorf("MatchDescriptor(%q, %v) = %v, want %v", tt.domain, tt.entries, names(got), tt.want)
		}
		if len(got) > 0 {
			if v := got[0].DescriptorValues(tt.entries, nil); !slices.Equal(v, tt.values) {
				t.Errorf("DescriptorValues(%v) = %q, want %q", tt.entries, v, tt.values)
			}
		}
	}
	for _, path := range []string{"/", "/rls:edge", "/edge", ""} {
		if got := p.Match("GET", path, nil); !slices.Equal(names(got), []string{"root"}) && path != "" {
			t.Errorf("Match(GET, %q) = %v, want only the HTTP rule", path, names(got))
		}
		if p.MethodMatters("GET", path) {
			t.Errorf("MethodMatters(GET, %q): an rls rule took part", path)
		}
	}
	if got := p.MatchAny([]string{"GET", "POST"}, "/x", nil); !slices.Equal(names(got), []string{"root"}) {
		t.Errorf("MatchAny = %v, want only the HTTP rule", names(got))
	}
}
