package policy

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Policy is a parsed set of rules. It is immutable and safe for
// simultaneous use by multiple goroutines; the rules it hands out are
// shared and must not be modified. A nil *Policy has no rules.
type Policy struct {
	rules  []*Rule
	byName map[string]*Rule
}

func newPolicy(rules []*Rule) *Policy {
	byName := make(map[string]*Rule, len(rules))
	for _, r := range rules {
		byName[r.Name] = r
	}
	return &Policy{rules: rules, byName: byName}
}

// Rules returns the rules in source order. The slice is the caller's; the
// rules are shared.
func (p *Policy) Rules() []*Rule {
	if p == nil {
		return nil
	}
	return slices.Clone(p.rules)
}

// Len returns the number of rules.
func (p *Policy) Len() int {
	if p == nil {
		return 0
	}
	return len(p.rules)
}

// Lookup returns the rule with the given name.
func (p *Policy) Lookup(name string) (*Rule, bool) {
	if p == nil {
		return nil, false
	}
	r, ok := p.byName[name]
	return r, ok
}

// Match appends to dst every rule that applies to a request with this
// method and match-form path (see MatchPath and Rule.Matches), in source
// order, and returns the extended slice. It does not allocate when dst has
// room for the result.
func (p *Policy) Match(method, matchPath string, dst []*Rule) []*Rule {
	return p.appendMatching(dst, func(r *Rule) bool { return r.Matches(method, matchPath) })
}

// appendMatching appends to dst every rule for which matches holds, in
// source order. matches does not escape, so a closure costs no allocation.
func (p *Policy) appendMatching(dst []*Rule, matches func(*Rule) bool) []*Rule {
	if p == nil {
		return dst
	}
	for _, r := range p.rules {
		if matches(r) {
			dst = append(dst, r)
		}
	}
	return dst
}

// MatchAny is Match for a request that an upstream may treat as any of
// several methods (its own, and the one a "_method" field asks for): every
// rule that applies under at least one of them, each once, in source order.
func (p *Policy) MatchAny(methods []string, matchPath string, dst []*Rule) []*Rule {
	if p == nil {
		return dst
	}
	for _, r := range p.rules {
		if !r.matchesPath(matchPath) {
			continue
		}
		for _, m := range methods {
			if r.matchesMethod(m) {
				dst = append(dst, r)
				break
			}
		}
	}
	return dst
}

// MethodMatters reports whether a rule applies to matchPath under another
// method than this one: whether a request that asks to be treated as
// another method could bring more rules into play. When it does not, a
// "_method" field cannot change the decision and need not be read.
func (p *Policy) MethodMatters(method, matchPath string) bool {
	if p == nil {
		return false
	}
	for _, r := range p.rules {
		if !r.matchesMethod(method) && r.matchesPath(matchPath) {
			return true
		}
	}
	return false
}

// Matches reports whether r applies to a request with this method and
// match-form path.
//
// Methods are compared case-sensitively, as RFC 9110 defines them, so a
// caller that forwards a method in another case than upper case should
// normalise it first. A rule without methods ("*") matches every method,
// and a rule that lists GET also matches HEAD, because most servers answer
// HEAD by running the GET handler.
//
// An exact rule matches its path only. A prefix rule "/api/*" (Path "/api")
// matches "/api" and every path below it ("/api/", "/api/x"), but not
// "/apix"; "/*" matches every path.
//
// When the last segment of the rule's path has no dot, a format suffix on
// the request's last segment is ignored: "/api/login" also matches
// "/api/login.json" and "/api/login.tar.gz", as Rails routes with their
// optional "(.:format)" and Spring's suffix pattern matching serve them
// there. A rule such as "/robots.txt" matches its own path only.
func (r *Rule) Matches(method, matchPath string) bool {
	return r.matchesMethod(method) && r.matchesPath(matchPath)
}

func (r *Rule) matchesMethod(method string) bool {
	if r.Methods == nil {
		return true
	}
	for _, m := range r.Methods {
		if m == method || m == "GET" && method == "HEAD" {
			return true
		}
	}
	return false
}

func (r *Rule) matchesPath(p string) bool {
	switch {
	case r.IsRLS(): // descriptors only
		return false
	case r.Prefix && r.Path == "/":
		return strings.HasPrefix(p, "/")
	case !strings.HasPrefix(p, r.Path):
		return false
	case len(p) == len(r.Path):
		return true
	case p[len(r.Path)] == '/':
		return r.Prefix
	case p[len(r.Path)] == '.':
		// A format suffix: the rest is the last segment, and the rule's
		// own last segment has no suffix of its own.
		return strings.IndexByte(p[len(r.Path):], '/') < 0 &&
			strings.IndexByte(r.Path[strings.LastIndexByte(r.Path, '/')+1:], '.') < 0
	}
	return false
}

// Spec returns the rule's limit as written in the rule language, such as
// "5/15m", or "1000/1mo" for a calendar window.
func (r *Rule) Spec() string {
	return strconv.FormatInt(r.Limit, 10) + "/" + r.WindowString()
}

// MethodString returns the rule's methods as written in the rule language:
// "*" or a comma-separated list.
func (r *Rule) MethodString() string {
	if r.Methods == nil {
		return "*"
	}
	return strings.Join(r.Methods, ",")
}

// PathString returns the rule's path as written in the rule language, in
// match form with the characters that the language or MatchPath give a
// meaning to percent-encoded, and "/*" after a prefix rule's path. Parsing
// it gives the rule's path again.
func (r *Rule) PathString() string {
	if r.IsRLS() {
		return rlsPrefix + r.Domain
	}
	var b strings.Builder
	for i := 0; i < len(r.Path); i++ {
		c := r.Path[i]
		if c == '/' || isPathChar(c) && c != ';' && c != '*' {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteByte(upperHex[c>>4])
			b.WriteByte(upperHex[c&15])
		}
	}
	if r.Prefix {
		if r.Path != "/" {
			b.WriteByte('/')
		}
		b.WriteByte('*')
	}
	return b.String()
}

// String returns the identity as written in the rule language, leaving out
// default arguments: "ip", "email", "email(login)", "tenant",
// "tenant(X-Org)", "header(X-Api-Key)", "jwt", "jwt(app_metadata.tenant)",
// "global" or "descriptor(generic_key=login,remote_address)".
func (id Identity) String() string {
	switch {
	case id.Kind == ByEmail && id.Field != defaultEmailField,
		id.Kind == ByTenant && id.Field != defaultTenantHeader,
		id.Kind == ByJWT && id.Field != defaultJWTClaim,
		id.Kind == ByHeader, id.Kind == ByDescriptor:
		return id.Kind.String() + "(" + id.Field + ")"
	}
	return id.Kind.String()
}

// AlgorithmString returns the rule's algorithm as written in the rule
// language, with a sliding rule's bucket: "fixed", "sliding(15s)", "reset"
// or "token".
func (r *Rule) AlgorithmString() string {
	if r.Algorithm == Sliding {
		return "sliding(" + FormatWindow(r.Bucket) + ")"
	}
	return r.Algorithm.String()
}

// options returns the rule's options other than the algorithm, as written
// in the rule language, leaving out defaults except a token rule's burst.
func (r *Rule) options() []string {
	var opts []string
	if r.Algorithm == Token {
		opts = append(opts, "burst="+strconv.FormatInt(r.Burst, 10))
	}
	if r.Fail != FailDefault {
		opts = append(opts, "fail="+r.Fail.String())
	}
	if r.Shadow {
		opts = append(opts, "shadow")
	}
	if r.Cost != 1 {
		opts = append(opts, "cost="+strconv.FormatInt(r.Cost, 10))
	}
	if r.CountAll {
		opts = append(opts, "count=all")
	}
	if len(r.Plans) > 0 {
		opts = append(opts, r.PlansString())
	}
	if cal := r.Calendar; cal != nil {
		// 1d is a calendar day only with tz= (tz=UTC included); 1w and 1mo
		// always are, in UTC unless tz= says otherwise.
		if cal.Zone != time.UTC || cal.Unit == Day {
			opts = append(opts, "tz="+cal.Zone.String())
		}
		if cal.Unit == Month && cal.Anchor != 1 {
			opts = append(opts, "anchor="+strconv.Itoa(cal.Anchor))
		}
	}
	if r.Charge != nil {
		opts = append(opts, "charge="+r.Charge.String())
	}
	return opts
}

// Spec returns the plan's limit as written in the rule language, such as
// "10000/1d".
func (p Plan) Spec() string {
	return strconv.FormatInt(p.Limit, 10) + "/" + FormatWindow(p.Window)
}

// PlansString returns the rule's plans option as written in the rule
// language, such as "plans(tier)=pro:10000/1d,team:50000/1d", or "" when
// the rule has no plans.
func (r *Rule) PlansString() string {
	if len(r.Plans) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("plans(" + r.PlanClaim + ")=")
	for i, p := range r.Plans {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(p.Name + ":" + p.Spec())
	}
	return b.String()
}

// String returns the rule in the rule language, with every default that
// matters made explicit, such as
// "global: * /api/* by global 1000/1m sliding(1s) fail=closed". Parsing it
// gives the same rule (except for Line).
func (r *Rule) String() string {
	fields := []string{r.Name + ":", r.MethodString(), r.PathString(), "by", r.Identity.String(), r.Spec()}
	if r.Algorithm != Fixed {
		fields = append(fields, r.AlgorithmString())
	}
	return strings.Join(append(fields, r.options()...), " ")
}

// WriteTable writes the rules to w as an aligned table with the columns
// NAME, METHODS, PATH, IDENTITY, LIMIT, ALGORITHM and OPTIONS, one rule per
// row in source order, as `sluice check-config` prints them.
func (p *Policy) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if _, err := fmt.Fprintln(tw, "NAME\tMETHODS\tPATH\tIDENTITY\tLIMIT\tALGORITHM\tOPTIONS"); err != nil {
		return err
	}
	for _, r := range p.Rules() {
		opts := "-"
		if o := r.options(); len(o) > 0 {
			opts = strings.Join(o, " ")
		}
		if _, err := fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			r.Name, r.MethodString(), r.PathString(), r.Identity, r.Spec(), r.AlgorithmString(), opts); err != nil {
			return err
		}
	}
	return tw.Flush()
}

// String returns the table that WriteTable writes.
func (p *Policy) String() string {
	var b strings.Builder
	_ = p.WriteTable(&b) // a strings.Builder never fails
	return b.String()
}
