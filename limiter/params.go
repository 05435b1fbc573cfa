package limiter

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// Params are the counting parameters a store applies to one check, after a
// per-key override (docs/algorithms.md, "Notation"). Every store derives
// them with RuleParams or OverrideParams so that the stores agree.
type Params struct {
	Limit  int64
	Window time.Duration
	// Bucket is a sliding rule's bucket width; it divides Window.
	Bucket time.Duration
	// Burst is a token rule's capacity.
	Burst int64
	// Cost is what one request consumes, at least 1.
	Cost int64
}

// RuleParams returns the parameters of r when the key has no override. A
// sliding rule without a Bucket gets policy.DefaultBucket(Window), a token
// rule without a Burst gets its Limit, and a Cost below 1 counts as 1.
func RuleParams(r *policy.Rule) Params {
	p := Params{Limit: r.Limit, Window: r.Window, Bucket: r.Bucket, Burst: r.Burst, Cost: max(1, r.Cost)}
	if p.Burst <= 0 {
		p.Burst = p.Limit
	}
	if r.Algorithm == policy.Sliding && (p.Bucket <= 0 || (p.Window > 0 && p.Window%p.Bucket != 0)) {
		p.Bucket = policy.DefaultBucket(p.Window)
	}
	return p
}

// OverrideParams returns the parameters of r for a key whose override sets
// limit and window. The override replaces Limit and Window; a token rule's
// burst follows the override's limit unless the rule set a burst of its
// own (a Burst other than zero and other than the rule's Limit, since the
// parser records the default burst as the limit); a sliding rule keeps its
// bucket when the bucket divides the new window and otherwise gets
// policy.DefaultBucket(window).
func OverrideParams(r *policy.Rule, limit int64, window time.Duration) Params {
	p := Params{Limit: limit, Window: window, Bucket: r.Bucket, Burst: limit, Cost: max(1, r.Cost)}
	if r.Burst > 0 && r.Burst != r.Limit {
		p.Burst = r.Burst
	}
	if r.Algorithm == policy.Sliding && (p.Bucket <= 0 || window%p.Bucket != 0) {
		p.Bucket = policy.DefaultBucket(window)
	}
	return p
}

// Validate reports whether p can be counted: a positive limit and burst,
// a window and bucket of at least a microsecond (the stores count in
// microseconds), and a bucket that divides the window.
func (p Params) Validate(a policy.Algorithm) error {
	switch {
	case p.Limit < 1:
		return fmt.Errorf("limit %d: must be at least 1", p.Limit)
	case p.Window < time.Microsecond:
		return fmt.Errorf("window %v: must be at least 1µs", p.Window)
	case a == policy.Token && p.Burst < 1:
		return fmt.Errorf("burst %d: must be at least 1", p.Burst)
	case a == policy.Sliding && (p.Bucket < time.Microsecond || p.Window%p.Bucket != 0):
		return fmt.Errorf("bucket %v: must be at least 1µs and divide the window %v", p.Bucket, p.Window)
	}
	return nil
}
