package policy

import (
	"strings"
)

// Rules for Envoy's rate limit service (package check/rls): a rule whose
// path is "rls:DOMAIN" and whose identity is "descriptor(k1,k2=v,...)"
// matches the descriptors of a ShouldRateLimit call in that domain, and
// never an HTTP request; every other rule matches HTTP requests, and never
// a descriptor.
//
//	rls-login: * rls:edge by descriptor(generic_key=login,remote_address) 5/1m
//
// The rule matches a descriptor whose entries have exactly those keys in
// that order, and the values given (generic_key=login) where the rule
// gives one; the values of the other keys (remote_address) form the key
// the rule counts by.

// rlsPrefix starts the path of a rule for Envoy's rate limit service.
const rlsPrefix = "rls:"

// DescriptorEntry is one entry of an Envoy rate limit descriptor: a key
// and its value. In a rule's Descriptor, an empty Value means any value,
// which is then part of the counted key.
type DescriptorEntry struct {
	Key, Value string
}

// IsRLS reports whether r is a rule for Envoy's rate limit service (its
// path is rls:DOMAIN): it matches descriptors, never HTTP requests.
func (r *Rule) IsRLS() bool { return r.Domain != "" }

// MatchDescriptor appends to dst every rule of domain whose descriptor
// pattern matches entries (see Rule.MatchesDescriptor), in source order,
// and returns the extended slice.
func (p *Policy) MatchDescriptor(domain string, entries []DescriptorEntry, dst []*Rule) []*Rule {
	return p.appendMatching(dst, func(r *Rule) bool { return r.MatchesDescriptor(domain, entries) })
}

// MatchesDescriptor reports whether r, an rls:DOMAIN rule, applies to a
// descriptor of entries sent for domain: the same domain, exactly the
// rule's keys in the rule's order, and the rule's values where it gives
// them. An HTTP rule never does.
func (r *Rule) MatchesDescriptor(domain string, entries []DescriptorEntry) bool {
	if r.Domain == "" || r.Domain != domain || len(entries) != len(r.Descriptor) {
		return false
	}
	for i, e := range r.Descriptor {
		if entries[i].Key != e.Key || e.Value != "" && entries[i].Value != e.Value {
			return false
		}
	}
	return true
}

// DescriptorValues appends to dst the values of entries, a descriptor r
// matches, that the rule gives no value for: the values that form the
// key it counts by, in the rule's order.
func (r *Rule) DescriptorValues(entries []DescriptorEntry, dst []string) []string {
	for i, e := range r.Descriptor {
		if e.Value == "" {
			dst = append(dst, entries[i].Value)
		}
	}
	return dst
}

// rls parses the methods, the rls:DOMAIN path and the descriptor(...)
// identity of a rule for Envoy's rate limit service. A descriptor has no
// method, so the methods must be "*".
func (rp *ruleParser) rls(r *Rule, methods, path, identity string) {
	if methods != "*" {
		rp.problem("methods: expected * on an rls: rule (descriptors have no method), got %q", methods)
	}
	domain := path[len(rlsPrefix):]
	if !validField(domain) {
		rp.problem("path: expected rls:DOMAIN with a domain of [A-Za-z0-9_.-]+, got %q", path)
	} else {
		r.Domain = domain
	}
	const expected = "identity: expected descriptor(key,key=value,...) on an rls: rule, with keys of [A-Za-z0-9_.-]+ and values without white space, commas or parentheses, got %q"
	args, ok := strings.CutPrefix(identity, "descriptor(")
	if !ok || !strings.HasSuffix(args, ")") {
		rp.problem(expected, identity)
		return
	}
	args = args[:len(args)-1]
	var entries []DescriptorEntry
	for entry := range strings.SplitSeq(args, ",") {
		key, value, fixed := strings.Cut(entry, "=")
		if !validField(key) || fixed && (value == "" || strings.ContainsAny(value, "()")) {
			rp.problem(expected, identity)
			return
		}
		entries = append(entries, DescriptorEntry{Key: key, Value: value})
	}
	r.Identity = Identity{Kind: ByDescriptor, Field: args}
	r.Descriptor = entries
}

// descriptorOnHTTP is the problem of a descriptor(...) identity on a rule
// whose path is an HTTP path.
const descriptorOnHTTP = "identity: expected descriptor(...) only on a rule whose path is rls:DOMAIN, got %q"
