package policy

import (
	"net/textproto"
	"strings"
)

// Charge is where a rule reads what a request really cost from its
// response (charge=header(Name) or charge=json(path+path...)).
type Charge struct {
	// Header is the canonical name of the response header that holds the
	// cost; empty for a JSON charge.
	Header string
	// Paths are the JSON paths whose integers add up to the cost, each a
	// list of object keys from the root of the body (or of an SSE event's
	// data); nil for a header charge.
	Paths [][]string
}

// String renders the charge as the rule language writes it, without
// "charge=".
func (c *Charge) String() string {
	if c.Header != "" {
		return "header(" + c.Header + ")"
	}
	paths := make([]string, len(c.Paths))
	for i, p := range c.Paths {
		paths[i] = strings.Join(p, ".")
	}
	return "json(" + strings.Join(paths, "+") + ")"
}

// charge parses the value of a charge= option.
func (rp *ruleParser) charge(o, val string) *Charge {
	const syntax = "charge: expected charge=header(Name) or charge=json(path) such as json(usage.total_tokens) or json(a.b+c.d), got %q"
	inner, ok := strings.CutSuffix(val, ")")
	if !ok {
		rp.problem(syntax, o)
		return nil
	}
	if name, ok := strings.CutPrefix(inner, "header("); ok {
		if !isToken(name) {
			rp.problem("charge: expected a response header name in header(Name), got %q", o)
			return nil
		}
		return &Charge{Header: textproto.CanonicalMIMEHeaderKey(name)}
	}
	list, ok := strings.CutPrefix(inner, "json(")
	if !ok || list == "" {
		rp.problem(syntax, o)
		return nil
	}
	c := &Charge{}
	for path := range strings.SplitSeq(list, "+") {
		keys := strings.Split(path, ".")
		for _, k := range keys {
			if !validJSONKey(k) {
				rp.problem("charge: expected json(path) with dotted keys of [A-Za-z0-9_-], got %q", o)
				return nil
			}
		}
		c.Paths = append(c.Paths, keys)
	}
	if len(c.Paths) > MaxChargePaths {
		rp.problem("charge: expected at most %d paths in json(...), got %q", MaxChargePaths, o)
		return nil
	}
	return c
}

// MaxChargePaths is the most paths one json(...) charge may add up.
const MaxChargePaths = 8

// validJSONKey reports whether s is a key a charge path may name: one or
// more of [A-Za-z0-9_-].
func validJSONKey(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
