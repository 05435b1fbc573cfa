package policy

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

const (
	// MaxCount is the largest limit, burst and cost a rule may have. It is
	// far above any real limit and small enough that the stores' sums
	// (count plus cost, burst times emission interval) never overflow an
	// int64.
	MaxCount = 1_000_000_000_000

	// MaxWindow is the longest window a rule may have (3650 days). It keeps
	// every reset time the stores compute well inside time.Time's and
	// int64 nanoseconds' range.
	MaxWindow = 3650 * 24 * time.Hour
)

// errSyntax and errRange classify why a count or a window did not parse,
// so that callers can phrase their own messages.
var (
	errSyntax = errors.New("syntax")
	errRange  = errors.New("out of range")
)

// ParseWindow parses a window in the rule language: a positive whole number
// followed by s, m, h or d, such as 15m. The result lies between 1s and
// MaxWindow. It is meant for windows given outside rules, such as the
// admin API's overrides.
func ParseWindow(s string) (time.Duration, error) {
	d, err := parseWindow(s)
	switch err {
	case nil:
		return d, nil
	case errRange:
		return 0, fmt.Errorf("window: expected from 1s to %s, got %q", FormatWindow(MaxWindow), s)
	default:
		return 0, fmt.Errorf("window: expected Ns, Nm, Nh or Nd such as 15m, got %q", s)
	}
}

// parseWindow parses "N" + unit. It returns errSyntax when s is not of
// that form and errRange when N is 0 or the window exceeds MaxWindow.
func parseWindow(s string) (time.Duration, error) {
	if len(s) < 2 {
		return 0, errSyntax
	}
	var unit time.Duration
	switch s[len(s)-1] {
	case 's':
		unit = time.Second
	case 'm':
		unit = time.Minute
	case 'h':
		unit = time.Hour
	case 'd':
		unit = 24 * time.Hour
	default:
		return 0, errSyntax
	}
	n, err := parseDigits(s[:len(s)-1], int64(MaxWindow/unit))
	if err != nil {
		return 0, err
	}
	return time.Duration(n) * unit, nil
}

// parseCount parses a count: decimal digits with a value from 1 to
// MaxCount.
func parseCount(s string) (int64, error) {
	return parseDigits(s, MaxCount)
}

// parseDigits parses a non-empty string of ASCII digits with a value from
// 1 to limit. Signs, spaces and underscores are syntax errors; 0 and values
// above limit (however many digits) are range errors.
func parseDigits(s string, limit int64) (int64, error) {
	if s == "" {
		return 0, errSyntax
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errSyntax
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 || n > limit { // err can only be a range error here
		return 0, errRange
	}
	return n, nil
}

// FormatWindow renders d in the rule language with the largest unit that
// divides it exactly, so 900s is "15m" and 86400s is "1d". A duration that
// is not a positive whole number of seconds is rendered by
// time.Duration.String.
func FormatWindow(d time.Duration) string {
	if d <= 0 || d%time.Second != 0 {
		return d.String()
	}
	switch {
	case d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	}
	return strconv.FormatInt(int64(d/time.Second), 10) + "s"
}

// DefaultBucket is the bucket width of a sliding rule that does not set
// one: the largest whole-second divisor of window that is not above
// max(1s, window/60). So 1m gives 1s, 15m gives 15s, 1h gives 60s, 1d gives
// 1440s and 125s (which 2s does not divide) gives 1s. The result always
// divides window, so the window holds a whole number of buckets, at most
// about 60 of them when window has convenient divisors.
//
// window is expected to be a positive whole number of seconds, as every
// window of the rule language is. For any other window DefaultBucket
// returns window itself: one bucket, which still divides it.
func DefaultBucket(window time.Duration) time.Duration {
	if window < time.Second || window%time.Second != 0 {
		return window
	}
	s := int64(window / time.Second)
	limit := max(1, s/60)
	// Divisors come in pairs (i, s/i) with i <= sqrt(s), so scanning up to
	// the square root finds the best one in O(sqrt(s)) steps, which stays
	// cheap for the longest windows.
	best := int64(1)
	for i := int64(1); i*i <= s; i++ {
		if s%i != 0 {
			continue
		}
		if i <= limit && i > best {
			best = i
		}
		if j := s / i; j <= limit && j > best {
			best = j
		}
	}
	return time.Duration(best) * time.Second
}
