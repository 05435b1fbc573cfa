package limiter

import (
	"errors"
	"fmt"
	"strings"
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
	// Calendar, for a fixed rule with a calendar window, gives the
	// periods that replace windows aligned to the epoch; Window is then
	// the unit's nominal length. Nil otherwise.
	Calendar *policy.Calendar
}

// Period returns the fixed window that holds now (µs since the epoch):
// the calendar period of a calendar rule, else the window of Window
// aligned to the epoch.
func (p *Params) Period(now int64) (start, end int64) {
	return Period(p.Calendar, p.Window.Microseconds(), now)
}

// Period returns the fixed window that holds now (µs since the epoch):
// the period of cal, or when cal is nil the window of window µs aligned
// to the epoch. Every store counts fixed windows with it.
func Period(cal *policy.Calendar, window, now int64) (start, end int64) {
	if cal != nil {
		s, e := cal.Period(time.UnixMicro(now))
		return s.UnixMicro(), e.UnixMicro()
	}
	start = now / window * window
	if now%window < 0 {
		start -= window
	}
	return start, start + window
}

// RuleParams returns the parameters of r when the key has no override. A
// sliding rule without a Bucket gets policy.DefaultBucket(Window), a token
// rule without a Burst gets its Limit, and a Cost below 1 counts as 1.
func RuleParams(r *policy.Rule) Params {
	p := Params{Limit: r.Limit, Window: r.Window, Bucket: r.Bucket, Burst: r.Burst, Cost: max(1, r.Cost), Calendar: r.Calendar}
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
	if r.Calendar != nil && window == r.Window {
		p.Calendar = r.Calendar // the override changes the limit of each period
	}
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

// ErrInvalidOverride is wrapped by the error of an override that cannot
// apply to its rule (see ValidateOverride).
var ErrInvalidOverride = errors.New("invalid override")

// ValidateOverride reports whether a key of rule r may be given limit and
// window instead of the rule's own: the limit from 1 to policy.MaxCount
// and at least the rule's cost (else no request could ever pass), the
// window from 1s to policy.MaxWindow, and the parameters countable
// (Params.Validate). The error wraps ErrInvalidOverride and says what is
// wrong in words an operator can act on. Every store and the admin API
// check an override with it, so they agree.
func ValidateOverride(r *policy.Rule, limit int64, window time.Duration) error {
	var problems []string
	switch {
	case limit < 1 || limit > policy.MaxCount:
		problems = append(problems, fmt.Sprintf("limit: expected 1 to %d, got %d", int64(policy.MaxCount), limit))
	case limit < max(1, r.Cost):
		problems = append(problems, fmt.Sprintf("limit: must be at least the rule's cost %d, got %d", r.Cost, limit))
	}
	if window < time.Second || window > policy.MaxWindow {
		problems = append(problems, fmt.Sprintf("window: expected from 1s to %s, got %s", policy.FormatWindow(policy.MaxWindow), window))
	}
	if len(problems) == 0 {
		if err := OverrideParams(r, limit, window).Validate(r.Algorithm); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w for rule %q: %s", ErrInvalidOverride, r.Name, strings.Join(problems, "; "))
	}
	return nil
}
