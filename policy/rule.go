// Package policy is sluice's rule language: parsing rules, canonicalising
// request paths and matching requests to the rules that apply to them.
//
// A Policy is immutable once parsed and safe for simultaneous use by
// multiple goroutines.
//
// It imports nothing of sluice but internal/textfold (the case folding it
// shares with hashing): the limiter, the proxy, the admin API and
// the gateway build on it.
package policy

import "time"

// Algorithm is the counting algorithm of a rule.
type Algorithm uint8

const (
	// Fixed counts in windows aligned to the Unix epoch.
	Fixed Algorithm = iota
	// Sliding counts in buckets over the last window.
	Sliding
	// Reset counts in one window per key that starts at the first request
	// after the previous one expired.
	Reset
	// Token is a token bucket (GCRA): Burst tokens, refilled at Limit per
	// Window.
	Token
)

func (a Algorithm) String() string {
	switch a {
	case Fixed:
		return "fixed"
	case Sliding:
		return "sliding"
	case Reset:
		return "reset"
	case Token:
		return "token"
	}
	return "unknown"
}

// FailMode says what a rule does when the store cannot decide in time.
type FailMode uint8

const (
	// FailDefault defers to the gateway-wide SLUICE_FAIL_MODE.
	FailDefault FailMode = iota
	// FailOpen lets the request through.
	FailOpen
	// FailClosed answers 503.
	FailClosed
	// FailLocal decides with a per-instance in-memory limiter.
	FailLocal
)

func (f FailMode) String() string {
	switch f {
	case FailDefault:
		return "default"
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	case FailLocal:
		return "local"
	}
	return "unknown"
}

// IdentityKind is what a rule counts by.
type IdentityKind uint8

const (
	// ByIP counts by the client IP, IPv6 grouped by /64 ("by ip").
	ByIP IdentityKind = iota
	// ByEmail counts by the canonical email in the body or query field
	// Identity.Field ("by email", "by email(field)").
	ByEmail
	// ByTenant counts by the value of the header Identity.Field ("by
	// tenant", "by tenant(Header-Name)").
	ByTenant
	// ByHeader counts by the value of the header Identity.Field ("by
	// header(Name)").
	ByHeader
	// ByGlobal counts every request under one key ("by global").
	ByGlobal
	// ByDescriptor counts by the values of an Envoy rate limit descriptor
	// that the rule's pattern leaves open ("by descriptor(k1,k2=v)", on
	// an rls:DOMAIN rule only); Identity.Field is the pattern as written.
	ByDescriptor
	// ByJWT counts by the claim Identity.Field of a verified bearer token
	// ("by jwt", "by jwt(claim)"; default claim "sub"). A dotted path
	// reads a nested claim: "app_metadata.tenant_id".
	ByJWT
)

func (k IdentityKind) String() string {
	switch k {
	case ByIP:
		return "ip"
	case ByEmail:
		return "email"
	case ByTenant:
		return "tenant"
	case ByHeader:
		return "header"
	case ByGlobal:
		return "global"
	case ByDescriptor:
		return "descriptor"
	case ByJWT:
		return "jwt"
	}
	return "unknown"
}

// Identity names the identifier a rule counts by.
type Identity struct {
	Kind IdentityKind
	// Field is the body or query field for ByEmail (default "email"), the
	// canonical header name for ByTenant (default "X-Tenant-Id") and
	// ByHeader, the claim name or dotted path for ByJWT (default "sub"),
	// and the pattern as written for ByDescriptor ("k1,k2=v"). It is
	// empty for ByIP and ByGlobal.
	Field string
}

// Rule is one parsed rule. Rules are shared, read-only values.
type Rule struct {
	Name string
	Line int // 1-based line of the rule in its source
	// Methods holds upper-case method names; nil matches every method.
	Methods []string
	// Path is the rule's path in match form (see MatchPath), without the
	// trailing "/*" of a prefix rule.
	Path   string
	Prefix bool // the rule's path ended in "/*"

	Identity  Identity
	Limit     int64
	Window    time.Duration
	Algorithm Algorithm
	Bucket    time.Duration // Sliding only: bucket width, divides Window
	Burst     int64         // Token only: bucket capacity
	Fail      FailMode
	Shadow    bool
	Cost      int64 // tokens one request consumes, at least 1
	CountAll  bool  // denied requests are counted too
	// Calendar makes a fixed rule's window a calendar one (1d with tz=,
	// 1w, 1mo); nil for windows aligned to the epoch. Window then holds
	// the unit's nominal length (see WindowString).
	Calendar *Calendar
	// Charge reads what a request cost from its response (charge=); nil
	// when the cost is known at admission.
	Charge *Charge

	// Domain is the Envoy rate limit domain of a rule whose path is
	// rls:DOMAIN (see IsRLS); Path is then empty. Empty for HTTP rules.
	Domain string
	// Descriptor is the descriptor(...) pattern of an rls: rule, in order
	// (see MatchesDescriptor); nil for HTTP rules.
	Descriptor []DescriptorEntry

	// PlanClaim is the claim of a verified bearer token whose value picks
	// one of Plans ("plans(claim)=..."): a claim name or a dotted path,
	// like ByJWT's Field. It is empty when the rule has no plans.
	PlanClaim string
	// Plans are the rule's limits by plan, in source order; nil without
	// "plans(...)". See ForPlan.
	Plans []Plan
}

// WindowString renders the rule's window as the rule language writes it:
// "15m", "1d", or a calendar window's "1mo".
func (r *Rule) WindowString() string {
	if r.Calendar != nil {
		return r.Calendar.Unit.String()
	}
	return FormatWindow(r.Window)
}

// Plan is one limit of a rule's "plans(claim)=name:N/window,..." option:
// a request whose verified claim PlanClaim equals Name is counted with
// Limit per Window instead of the rule's own.
type Plan struct {
	Name   string // [A-Za-z0-9_.-]+, compared case-sensitively
	Limit  int64
	Window time.Duration
	// rule is the rule as counted under this plan (see ForPlan).
	rule *Rule
}

// ForPlan returns the rule to count a request by when its verified plan
// claim has the value plan: the rule as counted under the plan of that
// name, or r itself when no plan has that name (or r has no plans).
//
// The rule of a plan is a copy of r with the plan's Limit and Window,
// shared and read-only like r, and without plans of its own. Its burst and
// bucket follow the plan as limiter.OverrideParams makes them follow an
// override: a token rule's default burst (recorded as its limit) becomes
// the plan's limit, a burst of its own is kept; a sliding rule keeps its
// bucket when the bucket divides the plan's window, and otherwise gets
// DefaultBucket of that window. It has r's name, so it counts in the same
// counters as r: a key's override still beats its plan, and a key whose
// plan changes keeps what it used so far, as under a reload that changes
// the limit. (An override of a key counted under a plan applies to the
// plan's rule, so in the rare rule whose bucket does not divide a plan's
// window, the override's bucket follows the plan's.)
//
// It does not allocate for the rules Parse returns.
func (r *Rule) ForPlan(plan string) *Rule {
	for i := range r.Plans {
		if p := &r.Plans[i]; p.Name == plan {
			if p.rule == nil { // a Rule built by hand, not by Parse
				return r.planRule(p.Limit, p.Window)
			}
			return p.rule
		}
	}
	return r
}

// planRule returns r as counted under the plan of this limit and window
// (see ForPlan).
func (r *Rule) planRule(limit int64, window time.Duration) *Rule {
	v := *r
	v.PlanClaim, v.Plans = "", nil
	v.Limit, v.Window = limit, window
	if r.Algorithm == Token && r.Burst == r.Limit {
		v.Burst = limit
	}
	if r.Algorithm == Sliding && (r.Bucket <= 0 || window%r.Bucket != 0) {
		v.Bucket = DefaultBucket(window)
	}
	return &v
}
