package policy

import (
	"errors"
	"fmt"
	"net/textproto"
	"slices"
	"strings"
	"time"
	"unicode"
)

// ParseError is one problem in a rule source. Parse joins every problem it
// finds with errors.Join, so callers can list them with errors.As or by
// splitting the message on newlines.
type ParseError struct {
	Line int // 1-based line of the problem
	// Column is the 1-based byte column where the rule starts when its line
	// holds more than one ";"-separated rule, so that each has its own
	// position; 0 when the rule has its line to itself.
	Column int
	Rule   string // name of the rule, when it was read and valid; else empty
	// Msg names the part of the rule at fault and what was expected and
	// found, such as `limit: expected N/window such as 5/15m, got "5/15x"`.
	Msg string
}

// Error returns `line N: rule "name": msg`, or `line N: msg` when the
// rule's name is not known; "line N" reads "line N, column C" when the
// Column is known.
func (e *ParseError) Error() string {
	if e.Rule != "" {
		return fmt.Sprintf("%s: rule %q: %s", position(e.Line, e.Column), e.Rule, e.Msg)
	}
	return fmt.Sprintf("%s: %s", position(e.Line, e.Column), e.Msg)
}

// position is "line N", or "line N, column C" when column is not 0.
func position(line, column int) string {
	if column == 0 {
		return fmt.Sprintf("line %d", line)
	}
	return fmt.Sprintf("line %d, column %d", line, column)
}

// Parse parses a policy in sluice's rule language (docs/rules.md):
//
//	# name   methods   path         identity   limit   options
//	login:   POST      /api/login   by ip      5/15m
//	global:  *         /api/*       by global  1000/1m sliding fail=closed
//
// Rules are separated by newlines or ";", "#" starts a comment that runs to
// the end of the line, and fields are separated by white space. An empty
// source is a valid policy without rules, and a leading UTF-8 byte order
// mark is ignored.
//
// Parse reports every problem in src, not just the first: the error joins
// one *ParseError per problem (in source order) with errors.Join, so its
// message is the problems' messages, one per line. A rule with a problem
// is never half-accepted: on any error Parse returns a nil Policy.
//
// See the field documentation of Rule for what each part becomes and the
// tests for every message.
func Parse(src string) (*Policy, error) {
	p := &parser{names: make(map[string]string)}
	src = strings.TrimPrefix(src, "\ufeff")
	for i, line := range strings.Split(src, "\n") {
		line, _, _ = strings.Cut(line, "#")
		type segment struct {
			column int
			fields []string
		}
		var rules []segment
		offset := 0
		for text := range strings.SplitSeq(line, ";") {
			if fields := strings.Fields(text); len(fields) > 0 {
				lead := len(text) - len(strings.TrimLeftFunc(text, unicode.IsSpace))
				rules = append(rules, segment{offset + lead + 1, fields})
			}
			offset += len(text) + 1
		}
		for _, r := range rules {
			column := 0
			if len(rules) > 1 {
				column = r.column
			}
			p.rule(i+1, column, r.fields)
		}
	}
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return newPolicy(p.rules), nil
}

// parser collects the rules and the problems of one source.
type parser struct {
	rules []*Rule
	errs  []error
	names map[string]string // position each valid name was first used at
}

// ruleParser parses one rule, recording its problems in the parser.
type ruleParser struct {
	*parser
	line   int
	column int          // see ParseError.Column
	name   string       // the rule's name once read and valid
	onRLS  bool         // the path is rls:DOMAIN
	unit   CalendarUnit // the limit's window is 1d, 1w or 1mo
	window string       // the limit's window as written ("24h", "1d")
	failed bool
}

func (rp *ruleParser) problem(format string, args ...any) {
	rp.failed = true
	rp.errs = append(rp.errs, &ParseError{Line: rp.line, Column: rp.column, Rule: rp.name, Msg: fmt.Sprintf(format, args...)})
}

// rule parses one rule from its white-space separated fields. It checks
// the rule's shape first ("name:", two fields, "by", two fields, options);
// when that is right, it checks every field and reports each problem, but
// when it is wrong, fields cannot be told apart and only the shape is
// reported.
func (p *parser) rule(line, column int, fields []string) {
	rp := &ruleParser{parser: p, line: line, column: column}
	r := &Rule{Line: line, Cost: 1}

	name, first, ok := strings.Cut(fields[0], ":")
	if !ok {
		rp.problem(`name: expected "name:" at the start of the rule, got %q`, fields[0])
		return
	}
	rest := fields[1:]
	if first != "" { // "login:POST" with no space after the colon
		rest = append([]string{first}, rest...)
	}
	if !validName(name) {
		rp.problem("name: expected [a-z0-9-]+, got %q", name)
	} else {
		rp.name, r.Name = name, name
		if prev, dup := p.names[name]; dup {
			rp.problem("name: expected a unique name, got a duplicate of %s", prev)
		} else {
			p.names[name] = position(line, column)
		}
	}

	by := slices.Index(rest, "by")
	switch {
	case by < 0:
		rp.problem(`syntax: expected "by" before the identity, got %q`, strings.Join(rest, " "))
		return
	case by != 2:
		rp.problem(`syntax: expected methods and path before "by", got %q`, strings.Join(rest[:by], " "))
		return
	case len(rest) < by+3:
		rp.problem(`syntax: expected identity and limit after "by", got %q`, strings.Join(rest[by+1:], " "))
		return
	}
	if strings.HasPrefix(rest[1], rlsPrefix) {
		rp.onRLS = true
		rp.rls(r, rest[0], rest[1], rest[3])
	} else {
		rp.methods(r, rest[0])
		rp.path(r, rest[1])
		rp.identity(r, rest[3])
	}
	limitOK, windowOK := rp.limit(r, rest[4])
	rp.options(r, rest[5:], limitOK, windowOK)
	if !rp.failed {
		p.rules = append(p.rules, r)
	}
}

// validName reports whether s matches [a-z0-9-]+.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// methods parses "*" or a comma-separated list of methods. Methods are
// upper-cased and must be known (see knownMethods): a typo such as GETT
// would otherwise be a rule that silently matches nothing.
func (rp *ruleParser) methods(r *Rule, s string) {
	if s == "*" {
		return
	}
	list := strings.Split(s, ",")
	if slices.Contains(list, "") || slices.Contains(list, "*") {
		rp.problem("methods: expected * or a comma-separated list such as GET,POST, got %q", s)
		return
	}
	methods := make([]string, 0, len(list))
	for _, m := range list {
		if !isToken(m) {
			rp.problem("methods: expected a method name (an RFC 9110 token), got %q", m)
			continue
		}
		m = strings.ToUpper(m)
		if !slices.Contains(knownMethods, m) {
			rp.problem("methods: expected a method of the IANA HTTP Method Registry (such as GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS) or PURGE, got %q", m)
			continue
		}
		if slices.Contains(methods, m) {
			rp.problem("methods: expected each method once, got %q twice", m)
			continue
		}
		methods = append(methods, m)
	}
	r.Methods = methods
}

// knownMethods are the methods a rule may name: those of the IANA HTTP
// Method Registry (https://www.iana.org/assignments/http-methods), less
// "*", which the rule language reads as every method, plus PURGE, which
// caches such as Varnish, Fastly and nginx accept.
var knownMethods = []string{
	"ACL", "BASELINE-CONTROL", "BIND", "CHECKIN", "CHECKOUT", "CONNECT", "COPY",
	"DELETE", "GET", "HEAD", "LABEL", "LINK", "LOCK", "MERGE", "MKACTIVITY",
	"MKCALENDAR", "MKCOL", "MKREDIRECTREF", "MKWORKSPACE", "MOVE", "OPTIONS",
	"ORDERPATCH", "PATCH", "POST", "PRI", "PROPFIND", "PROPPATCH", "PUT", "REBIND",
	"REPORT", "SEARCH", "TRACE", "UNBIND", "UNCHECKOUT", "UNLINK", "UNLOCK",
	"UPDATE", "UPDATEREDIRECTREF", "VERSION-CONTROL",
	"PURGE",
}

// path parses an exact path or a prefix ending in "/*" and stores it in
// match form, so that it compares equal to every request path spelled the
// same way.
func (rp *ruleParser) path(r *Rule, s string) {
	if !strings.HasPrefix(s, "/") {
		rp.problem("path: expected an absolute path such as /api/login or a prefix such as /api/*, got %q", s)
		return
	}
	p := s
	if strings.HasSuffix(p, "/*") {
		r.Prefix = true
		p = p[:len(p)-1] // keep the "/": "/api/" canonicalises like a directory
	}
	if strings.Contains(p, "*") {
		rp.problem(`path: expected "*" only in a final "/*", got %q`, s)
		return
	}
	if strings.Contains(p, "?") {
		rp.problem("path: expected a path without a query, got %q", s)
		return
	}
	canonical, err := CanonicalPath(p)
	if err != nil {
		var pe *PathError
		errors.As(err, &pe)
		rp.problem("path: expected a valid path, got %q: %s at byte %d", s, pe.Reason, pe.Offset)
		return
	}
	m := MatchPath(canonical)
	switch {
	case strings.Contains(m, "*"):
		// An encoded "*" would print like a prefix rule.
		rp.problem(`path: expected "*" only in a final "/*", got %q`, s)
		return
	case strings.ContainsFunc(m, func(c rune) bool { return c < 0x20 || c == 0x7f }):
		// A doubly encoded control character (%2500) decodes to one.
		rp.problem("path: expected a path without control characters, got %q", s)
		return
	}
	r.Path = m
}

const (
	defaultEmailField   = "email"
	defaultTenantHeader = "X-Tenant-Id" // canonical form of X-Tenant-ID
	defaultJWTClaim     = "sub"
)

// fieldIdentities are the identities whose argument, optional, says where
// the identifier is: the field of the body (email) or the header (tenant).
var fieldIdentities = map[string]struct {
	kind      IdentityKind
	def       string                  // without an argument
	valid     func(arg string) bool   // whether an argument is valid
	canonical func(arg string) string // the Field of a valid argument
	expected  string                  // for the message of an invalid one
}{
	"email":  {ByEmail, defaultEmailField, validField, func(f string) string { return f }, "email(field) with a field of [A-Za-z0-9_.-]+"},
	"tenant": {ByTenant, defaultTenantHeader, isToken, textproto.CanonicalMIMEHeaderKey, "tenant(Header-Name) with an RFC 9110 token as the header name"},
	"jwt":    {ByJWT, defaultJWTClaim, validClaim, func(c string) string { return c }, "jwt(claim) with a claim name or dotted path of [A-Za-z0-9_:/-] segments"},
}

// identity parses ip, email, email(field), tenant, tenant(Header),
// header(Name), jwt, jwt(claim) or global.
func (rp *ruleParser) identity(r *Rule, s string) {
	const expected = "identity: expected ip, email, email(field), tenant, tenant(Header-Name), header(Name), jwt, jwt(claim) or global, got %q"
	kind, arg, hasArg := s, "", false
	if open := strings.IndexByte(s, '('); open >= 0 {
		if !strings.HasSuffix(s, ")") {
			rp.problem(expected, s)
			return
		}
		kind, arg, hasArg = s[:open], s[open+1:len(s)-1], true
	}
	switch kind {
	case "ip", "global":
		if hasArg {
			rp.problem("identity: expected %s without an argument, got %q", kind, s)
			return
		}
		r.Identity.Kind = ByIP
		if kind == "global" {
			r.Identity.Kind = ByGlobal
		}
	case "email", "tenant", "jwt":
		f := fieldIdentities[kind]
		r.Identity = Identity{Kind: f.kind, Field: f.def}
		if hasArg {
			if !f.valid(arg) {
				rp.problem("identity: expected %s, got %q", f.expected, s)
				return
			}
			r.Identity.Field = f.canonical(arg)
		}
	case "header":
		if !hasArg || !isToken(arg) {
			rp.problem("identity: expected header(Name) with an RFC 9110 token as the header name, got %q", s)
			return
		}
		r.Identity = Identity{Kind: ByHeader, Field: textproto.CanonicalMIMEHeaderKey(arg)}
	case "descriptor":
		rp.problem(descriptorOnHTTP, s)
	default:
		rp.problem(expected, s)
	}
}

// validField reports whether s matches [A-Za-z0-9_.-]+.
func validField(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(isUnreserved(c) && c != '~') {
			return false
		}
	}
	return true
}

// validClaim reports whether s names a claim of a token: segments of
// [A-Za-z0-9_:/-]+ separated by single dots, such as "sub",
// "app_metadata.tenant_id" or Auth0's namespaced
// "https://example.com/plan" (see the jwt package for how a dotted path
// is read).
func validClaim(s string) bool {
	if s == "" || s[0] == '.' || s[len(s)-1] == '.' || strings.Contains(s, "..") {
		return false
	}
	return strings.Trim(s, claimChars) == ""
}

// claimChars are the bytes a claim's name may hold: its segments' and the
// dots between them.
const claimChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_:/-."

// validPlanName reports whether s matches [A-Za-z0-9_.-]+.
func validPlanName(s string) bool {
	return validField(s)
}

// isToken reports whether s is an RFC 9110 token: one or more tchar.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

// limit parses "N/window". It reports whether the count and the window
// are valid, so that the options that depend on them are only checked
// against valid values.
func (rp *ruleParser) limit(r *Rule, s string) (countOK, windowOK bool) {
	const syntax = "limit: expected N/window such as 5/15m, got %q"
	count, window, ok := strings.Cut(s, "/")
	if !ok {
		rp.problem(syntax, s)
		return false, false
	}
	n, nErr := parseCount(count)
	w, wErr := parseWindow(window)
	unit, calendar := calendarUnit(window)
	rp.unit = unit // 1d is a calendar window too when tz= says so
	rp.window = window
	if calendar {
		w, wErr = unit.nominal(), nil
	} else if num, ok := strings.CutSuffix(window, "mo"); ok && parseWindowNumber(num) {
		rp.problem("limit: expected a calendar month as 1mo (a count of months other than 1 is not a calendar window), got %q", s)
		return nErr == nil, false
	} else if num, ok := strings.CutSuffix(window, "w"); ok && parseWindowNumber(num) {
		rp.problem("limit: expected a calendar week as 1w (a count of weeks other than 1 is not a calendar window), got %q", s)
		return nErr == nil, false
	}
	if nErr == errSyntax || wErr == errSyntax {
		rp.problem(syntax, s)
		return false, false
	}
	if nErr != nil {
		rp.problem("limit: expected a count from 1 to %d, got %q", MaxCount, s)
	}
	if wErr != nil {
		rp.problem("limit: expected a window from 1s to %s, got %q", FormatWindow(MaxWindow), s)
	}
	r.Limit, r.Window = n, w
	return nErr == nil, wErr == nil
}

// options parses the options after the limit, in any order, each at most
// once, and fills in the defaults of those not given.
func (rp *ruleParser) options(r *Rule, opts []string, limitOK, windowOK bool) {
	seen := make(map[string]bool, len(opts))
	once := func(key string) bool {
		if seen[key] {
			rp.problem("options: expected each option once, got %q twice", key)
			return false
		}
		seen[key] = true
		return true
	}
	var (
		algo            string // the algorithm option as written, if any
		algoOK          = true // false after a second algorithm
		bucket          string // the argument of sliding(...), if any
		burst, cost     int64
		burstOK, costOK = true, true
		plans           []planSpec     // as written; checked once the rest is known
		tz, anchor      string         // tz= and anchor= as written, if given
		zone            *time.Location // tz='s zone, when it loaded
		anchorDay       = 1
	)
	for _, o := range opts {
		switch {
		case o == "fixed" || o == "reset" || o == "token" || o == "sliding" || strings.HasPrefix(o, "sliding("):
			kind := algoKind(o)
			if algo != "" && algoKind(algo) != kind {
				rp.problem("options: expected at most one algorithm, got %q and %q", algo, o)
				algoOK = false
				continue
			}
			if !once(kind) {
				continue
			}
			if kind == "sliding" && o != "sliding" {
				if !strings.HasSuffix(o, ")") {
					rp.problem("sliding: expected sliding(bucket) such as sliding(10s), got %q", o)
					algoOK = false
					continue
				}
				bucket = o[len("sliding(") : len(o)-1]
			}
			algo = o
		case o == "shadow":
			if once(o) {
				r.Shadow = true
			}
		case o == "plans" || strings.HasPrefix(o, "plans(") || strings.HasPrefix(o, "plans="):
			switch {
			case !once("plans"):
			case rp.onRLS:
				// A descriptor carries no bearer token to read a plan from.
				rp.problem("plans: expected plans only on a rule whose path is an HTTP path (a descriptor has no token), got %q", o)
			default:
				plans = rp.plans(r, o)
			}
		default:
			key, val, _ := strings.Cut(o, "=")
			switch key {
			case "burst", "cost":
				n, err := int64(0), errSyntax
				if strings.HasPrefix(o, key+"=") {
					n, err = parseCount(val)
				}
				if !once(key) {
					continue
				}
				if err != nil {
					rp.problem("%s: expected %s=N with N from 1 to %d, got %q", key, key, MaxCount, o)
				}
				if key == "burst" {
					burst, burstOK = n, err == nil
				} else {
					cost, costOK = n, err == nil
				}
			case "fail":
				if !once(key) {
					continue
				}
				switch o {
				case "fail=open":
					r.Fail = FailOpen
				case "fail=closed":
					r.Fail = FailClosed
				case "fail=local":
					r.Fail = FailLocal
				default:
					rp.problem("fail: expected fail=open, fail=closed or fail=local, got %q", o)
				}
			case "count":
				if !once(key) {
					continue
				}
				if o != "count=all" {
					rp.problem("count: expected count=all, got %q", o)
				}
				r.CountAll = true
			case "tz":
				if once(key) {
					tz = o
					zone = rp.zone(o, val)
				}
			case "anchor":
				if !once(key) {
					continue
				}
				anchor = o
				if n, err := parseDigits(val, 31); err != nil {
					rp.problem("anchor: expected anchor=D with a day from 1 to 31, got %q", o)
				} else {
					anchorDay = int(n)
				}
			case "charge":
				if once(key) {
					r.Charge = rp.charge(o, val)
				}
			default:
				rp.problem("options: expected fixed, sliding, sliding(bucket), reset, token, burst=N, fail=open|closed|local, shadow, cost=N, count=all, tz=Area/City, anchor=D, charge=header(Name)|json(path) or plans(claim)=name:N/window,..., got %q", o)
			}
		}
	}

	switch algoKind(algo) {
	case "", "fixed":
		r.Algorithm = Fixed
	case "reset":
		r.Algorithm = Reset
	case "sliding":
		r.Algorithm = Sliding
		rp.bucket(r, algo, bucket, windowOK)
	case "token":
		r.Algorithm = Token
	}

	rp.calendar(r, tz, anchor, zone, anchorDay, algoOK)
	if r.Charge != nil && rp.onRLS {
		rp.problem("charge: expected charge= only on a rule whose path is an HTTP path (a descriptor's answer has no response to read), got %q", "charge="+r.Charge.String())
	}

	if seen["burst"] {
		switch {
		case r.Algorithm != Token:
			if algoOK {
				rp.problem("burst: expected only with token, got algorithm %q", r.Algorithm)
			}
		case burstOK && limitOK && windowOK:
			if most := maxBurst(r.Limit, r.Window); burst > most {
				rp.problem("burst: expected at most %d so that a full burst refills within %s, got \"burst=%d\"", most, FormatWindow(MaxWindow), burst)
				burstOK = false
			}
		}
	}
	if r.Algorithm == Token {
		r.Burst = r.Limit
		if seen["burst"] {
			r.Burst = burst
		}
	}

	if seen["cost"] {
		r.Cost = cost
		switch {
		case !costOK:
		case r.Algorithm == Token:
			if limitOK && burstOK && cost > r.Burst {
				rp.problem("cost: expected at most the burst %d, got \"cost=%d\"", r.Burst, cost)
			}
		case limitOK && cost > r.Limit:
			rp.problem("cost: expected at most the limit %d, got \"cost=%d\"", r.Limit, cost)
		}
	}

	if len(plans) > 0 && limitOK && windowOK && burstOK && costOK && algoOK {
		rp.planRules(r, plans)
	}
}

// planSpec is one "name:N/window" of a plans option.
type planSpec struct {
	entry string // as written, for messages
	Plan
}

// plans parses "plans(claim)=name:N/window,...", setting r.PlanClaim and
// returning the plans that parsed; it reports each problem of the syntax,
// the claim and every entry.
func (rp *ruleParser) plans(r *Rule, o string) []planSpec {
	const syntax = "plans: expected plans(claim)=name:N/window,... such as plans(tier)=pro:10000/1d, got %q"
	inner, list, ok := strings.Cut(strings.TrimPrefix(o, "plans("), ")=")
	if !ok || !strings.HasPrefix(o, "plans(") || list == "" {
		rp.problem(syntax, o)
		return nil
	}
	if !validClaim(inner) {
		rp.problem("plans: expected plans(claim) with a claim name or dotted path of [A-Za-z0-9_:/-] segments, got %q", o)
	} else {
		r.PlanClaim = inner
	}
	var specs []planSpec
	for entry := range strings.SplitSeq(list, ",") {
		name, limit, ok := strings.Cut(entry, ":")
		if !ok {
			rp.problem("plans: expected name:N/window such as pro:10000/1d, got %q", entry)
			continue
		}
		if !validPlanName(name) {
			rp.problem("plans: expected a plan name of [A-Za-z0-9_.-]+, got %q", entry)
			continue
		}
		count, window, ok := strings.Cut(limit, "/")
		n, nErr := parseCount(count)
		w, wErr := parseWindow(window)
		if unit, calendar := calendarUnit(window); calendar {
			w, wErr = unit.nominal(), nil
		}
		if !ok || nErr == errSyntax || wErr == errSyntax {
			rp.problem("plans: expected name:N/window such as pro:10000/1d, got %q", entry)
			continue
		}
		if nErr != nil {
			rp.problem("plans: expected a count from 1 to %d, got %q", MaxCount, entry)
		}
		if wErr != nil {
			rp.problem("plans: expected a window from 1s to %s, got %q", FormatWindow(MaxWindow), entry)
		}
		if nErr != nil || wErr != nil {
			continue
		}
		if slices.ContainsFunc(specs, func(s planSpec) bool { return s.Name == name }) {
			rp.problem("plans: expected each plan once, got %q twice", name)
			continue
		}
		specs = append(specs, planSpec{entry: entry, Plan: Plan{Name: name, Limit: n, Window: w}})
	}
	return specs
}

// planRules checks each plan against the rest of the rule, whose limit,
// algorithm, burst and cost parsed without a problem, and gives r its plans with their rules (see
// ForPlan). A request must be able to pass under every plan: the cost at
// most the plan's limit (or a token rule's own burst), and a token rule's
// own burst refilled within MaxWindow at the plan's rate.
func (rp *ruleParser) planRules(r *Rule, specs []planSpec) {
	ownBurst := r.Algorithm == Token && r.Burst != r.Limit
	plans := make([]Plan, 0, len(specs))
	for _, s := range specs {
		switch {
		case ownBurst && r.Burst > maxBurst(s.Limit, s.Window):
			rp.problem("plans: expected a plan under which the burst %d refills within %s, got %q", r.Burst, FormatWindow(MaxWindow), s.entry)
			continue
		case !ownBurst && r.Cost > s.Limit:
			rp.problem("plans: expected a limit of at least the cost %d, got %q", r.Cost, s.entry)
			continue
		case r.Calendar != nil && s.Window != r.Window:
			rp.problem("plans: expected the rule's calendar window %s in every plan, got %q", r.Calendar.Unit, s.entry)
			continue
		case r.Calendar == nil && (strings.HasSuffix(s.entry, "/1w") || strings.HasSuffix(s.entry, "/1mo")):
			rp.problem("plans: expected a calendar window (1w, 1mo) only on a rule with that window, got %q", s.entry)
			continue
		}
		p := s.Plan
		p.rule = r.planRule(p.Limit, p.Window)
		plans = append(plans, p)
	}
	r.Plans = plans
}

// algoKind returns the algorithm an option names: "sliding" for
// "sliding(10s)", the option itself otherwise.
func algoKind(option string) string {
	if strings.HasPrefix(option, "sliding(") {
		return "sliding"
	}
	return option
}

// bucket sets the bucket of a sliding rule: the one given in
// sliding(bucket), which must be from 1s to the window and divide it, or
// DefaultBucket of the window.
func (rp *ruleParser) bucket(r *Rule, option, bucket string, windowOK bool) {
	if bucket == "" && option == "sliding" {
		if windowOK {
			r.Bucket = DefaultBucket(r.Window)
		}
		return
	}
	b, err := parseWindow(bucket)
	switch {
	case err == errSyntax:
		rp.problem("sliding: expected sliding(bucket) such as sliding(10s), got %q", option)
	case err == errRange && strings.TrimLeft(bucket[:len(bucket)-1], "0") == "":
		rp.problem("sliding: expected a bucket of at least 1s, got %q", option)
	case !windowOK:
	case err == errRange || b > r.Window:
		rp.problem("sliding: expected a bucket no longer than the window %s, got %q", FormatWindow(r.Window), option)
	case r.Window%b != 0:
		rp.problem("sliding: expected a bucket that divides the window %s, got %q", FormatWindow(r.Window), option)
	default:
		r.Bucket = b
	}
}

// maxBurst is the largest burst a token rule with this limit and window
// may have: one whose refill, burst times the emission interval
// max(1µs, window/limit), takes at most MaxWindow. The default burst, the
// limit, always qualifies.
func maxBurst(limit int64, window time.Duration) int64 {
	interval := max(1, int64(window/time.Microsecond)/limit)
	return min(MaxCount, int64(MaxWindow/time.Microsecond)/interval)
}

// dayHint is what a tz= on window (not a calendar window) adds to its
// problem when window is a day's length written otherwise than 1d.
func dayHint(window time.Duration) string {
	if window == 24*time.Hour {
		return " (a calendar day is written 1d)"
	}
	return ""
}

// calendarUnit reports whether window is a calendar window: 1w or 1mo
// always, 1d when tz= makes it one (the options decide).
func calendarUnit(window string) (CalendarUnit, bool) {
	switch window {
	case "1d":
		return Day, false
	case "1w":
		return Week, true
	case "1mo":
		return Month, true
	}
	return 0, false
}

// parseWindowNumber reports whether s is the number of a window: one or
// more ASCII digits.
func parseWindowNumber(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// zone loads tz='s zone from the IANA name val.
func (rp *ruleParser) zone(o, val string) *time.Location {
	if val == "" || val == "Local" || strings.HasPrefix(val, "/") || strings.Contains(val, "..") {
		rp.problem("tz: expected an IANA time zone such as tz=Europe/Berlin, got %q", o)
		return nil
	}
	loc, err := time.LoadLocation(val)
	if err != nil {
		rp.problem("tz: expected an IANA time zone such as tz=Europe/Berlin, got %q (unknown zone)", o)
		return nil
	}
	return loc
}

// calendar makes r's window a calendar one when the limit or tz= says so,
// and reports tz= and anchor= where they do not apply.
func (rp *ruleParser) calendar(r *Rule, tz, anchor string, zone *time.Location, anchorDay int, algoOK bool) {
	switch {
	case rp.unit == 0 && tz != "":
		rp.problem("tz: expected only with a calendar window (1d, 1w or 1mo), got %q on %s%s", tz, rp.window, dayHint(r.Window))
		return
	case rp.unit == 0 && anchor != "":
		rp.problem("anchor: expected only with a monthly window (1mo), got %q on %s", anchor, rp.window)
		return
	case rp.unit == 0 || (rp.unit == Day && tz == "" && anchor == ""):
		return // an ordinary window; 1d in UTC is the epoch-aligned day
	}
	ok := true
	if anchor != "" && rp.unit != Month {
		rp.problem("anchor: expected only with a monthly window (1mo), got %q on %s", anchor, rp.unit)
		ok = false
	}
	if r.Algorithm != Fixed && algoOK {
		rp.problem("limit: expected a calendar window (%s) with the fixed algorithm only, got %q", rp.unit, r.Algorithm)
		ok = false
	}
	if tz != "" && zone == nil {
		ok = false // reported by zone
	}
	if !ok {
		return
	}
	if zone == nil {
		zone = time.UTC
	}
	r.Calendar = &Calendar{Unit: rp.unit, Zone: zone, Anchor: anchorDay}
}
