package limiter

import (
	"cmp"
	"slices"
	"time"
)

// Override is one key's own limit and window under a rule, as the admin
// API lists them.
type Override struct {
	Rule   string
	Key    string // HMAC of the identity; never a raw identifier
	Limit  int64
	Window time.Duration
}

// SortOverrides orders overrides by rule, then key, so that every store
// lists them the same way.
func SortOverrides(o []Override) {
	slices.SortFunc(o, func(a, b Override) int {
		return cmp.Or(cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Key, b.Key))
	})
}
