// Package policy is sluice's rule language: parsing rules, canonicalising
// request paths and matching requests to the rules that apply to them.
//
// A Policy is immutable once parsed and safe for simultaneous use by
// multiple goroutines.
//
// It imports nothing of sluice: the limiter, the proxy, the admin API and
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
	}
	return "unknown"
}

// Identity names the identifier a rule counts by.
type Identity struct {
	Kind IdentityKind
	// Field is the body or query field for ByEmail (default "email") and
	// the canonical header name for ByTenant (default "X-Tenant-Id") and
	// ByHeader, and the pattern as written for ByDescriptor ("k1,k2=v").
	// It is empty for ByIP and ByGlobal.
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

	// Domain is the Envoy rate limit domain of a rule whose path is
	// rls:DOMAIN (see IsRLS); Path is then empty. Empty for HTTP rules.
	Domain string
	// Descriptor is the descriptor(...) pattern of an rls: rule, in order
	// (see MatchesDescriptor); nil for HTTP rules.
	Descriptor []DescriptorEntry
}
