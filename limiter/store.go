// Package limiter decides whether requests are within their rules' limits.
//
// A Store keeps the counters and makes one atomic decision for every rule
// that matches a request. Limiter wraps a Store with the over-limit fast
// path, the decision deadline and the fail modes.
//
// It imports only policy of sluice: never a particular store (memory and
// postgres implement Store and import limiter, not the other way round),
// nor anything of HTTP.
package limiter

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// Check is one rule's part of a decision: the rule and the hashed identity
// it counts. Rule and Key together name one counter.
type Check struct {
	Rule *policy.Rule
	Key  string // HMAC of the identity; never a raw identifier
}

// Result is one Check's outcome.
type Result struct {
	// Allowed is this rule's own verdict for the request (for a shadow
	// rule: what it would have decided).
	Allowed bool
	// Limit is the limit applied: the rule's, or the key's override.
	Limit int64
	// Window is the window applied: the rule's, or the key's override.
	Window time.Duration
	// Remaining is the room left after this decision, never negative.
	Remaining int64
	// Count is what the counter holds after this decision, in units of
	// the limit: Limit - Remaining, except after a charge (charge=) took
	// the counter past its limit, when it is more than Limit. For a token
	// bucket, the tokens that have not refilled yet.
	Count int64
	// Reset is when the counter next has its whole limit available again,
	// on the store's clock.
	Reset time.Time
	// ResetAfter is Reset minus the store's clock at the decision.
	ResetAfter time.Duration
	// RetryAfter is zero when Allowed; otherwise how long after the
	// decision a request of the rule's cost would first be allowed,
	// assuming no other traffic.
	RetryAfter time.Duration
	// Shared reports that the check was counted in a counter shared with
	// other keys (a full memory store's overflow counter), so the verdict
	// is not about this key alone: the over-limit cache does not remember
	// it.
	Shared bool
	// Provisional reports, for a check that denied, that units of its
	// counter are out on leases (see package postgres) and may be given
	// back, or spent by this gateway, before RetryAfter: the over-limit
	// cache does not remember such a denial.
	Provisional bool
}

// Store keeps counters and decides.
//
// Decide decides one request against every rule that matches it, as one
// atomic step: the request is allowed when every non-shadow check allows
// it, and then it consumes its rule's cost from every check (a shadow check
// that itself would deny consumes nothing); a denied request consumes only
// from checks whose rule has CountAll. Decide writes one Result per check
// into results, which has len(checks). Being over a limit is a result,
// never an error: errors mean the store could not decide.
//
// Implementations are safe for simultaneous use by multiple goroutines.
type Store interface {
	Decide(ctx context.Context, checks []Check, results []Result) (allowed bool, err error)
}

// SelfTimed is implemented by a store that queues decisions and holds
// what it sends to the decision deadline itself (Config.Timeout), counted
// from the moment a statement is sent: the Postgres store, whose batcher
// queues decisions behind the statements in flight. The Limiter then puts
// no deadline of its own on the call, so that a decision waiting its turn
// behind statements that are being answered never fails for the wait (load
// is not an outage), while a statement the store does not answer in time
// still fails every decision that waits on it within the deadline.
type SelfTimed interface {
	Store
	// TimesItself reports whether the store applies the deadline itself.
	TimesItself() bool
}

// Allowed reports the combined verdict of results: true when every
// non-shadow check allowed.
func Allowed(checks []Check, results []Result) bool {
	for i, c := range checks {
		if !c.Rule.Shadow && !results[i].Allowed {
			return false
		}
	}
	return true
}
