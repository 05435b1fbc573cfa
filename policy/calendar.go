package policy

import (
	"fmt"
	"time"
	_ "time/tzdata" // zone rules built in, so that every instance agrees
)

// CalendarUnit is the length of a calendar window.
type CalendarUnit uint8

const (
	// Day is a local day, midnight to midnight: 23, 24 or 25 hours.
	Day CalendarUnit = iota + 1
	// Week is an ISO week, from Monday's midnight.
	Week
	// Month is a calendar month, from the midnight of its anchor day.
	Month
)

func (u CalendarUnit) String() string {
	switch u {
	case Day:
		return "1d"
	case Week:
		return "1w"
	case Month:
		return "1mo"
	}
	return "unknown"
}

// Calendar is the window of a fixed rule counted by the calendar ("1d
// tz=Europe/Berlin", "1w", "1mo anchor=15"): its periods begin at local
// midnights of Zone, so they are not all the same length.
type Calendar struct {
	Unit CalendarUnit
	// Zone is the time zone of tz=, or UTC.
	Zone *time.Location
	// Anchor is a Month's first day, 1 to 31 (in a month shorter than
	// that, its last day); 1 for Day and Week.
	Anchor int
}

// Period returns the period that holds t: start <= t < end.
func (c *Calendar) Period(t time.Time) (start, end time.Time) {
	t = t.In(c.Zone)
	y, m, d := t.Date()
	switch c.Unit {
	case Week:
		d -= (int(t.Weekday()) + 6) % 7 // back to Monday
		return c.midnight(y, m, d), c.midnight(y, m, d+7)
	case Month:
		first := c.midnight(y, m, anchorDay(y, m, c.Anchor))
		if t.Before(first) {
			return c.midnight(y, m-1, anchorDay(y, m-1, c.Anchor)), first
		}
		return first, c.midnight(y, m+1, anchorDay(y, m+1, c.Anchor))
	default:
		return c.midnight(y, m, d), c.midnight(y, m, d+1)
	}
}

// midnight is the first instant of the local date y-m-d (normalised as
// time.Date does, so d may be 0 or 32). time.Date leaves open which
// instant it gives for a local time that a DST change skips or repeats, so
// midnight reads the date with the offsets on both sides of the changes
// around it and keeps the earliest instant that falls on the date: where
// midnight happens twice (America/Havana), the first one; where a change
// skips it (America/Santiago, Asia/Beirut), the day begins at the change.
func (c *Calendar) midnight(y int, m time.Month, d int) time.Time {
	want := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	t := time.Date(y, m, d, 0, 0, 0, 0, c.Zone)
	start, end := t.ZoneBounds()
	var best time.Time
	for _, probe := range [...]time.Time{t, start.Add(-time.Nanosecond), end} {
		_, offset := probe.Zone()
		u := want.Add(-time.Duration(offset) * time.Second).In(c.Zone)
		if uy, um, ud := u.Date(); uy == want.Year() && um == want.Month() && ud == want.Day() && (best.IsZero() || u.Before(best)) {
			best = u
		}
	}
	if best.IsZero() {
		return t // no zone Go can load behaves so; keep time.Date's reading
	}
	return best
}

// anchorDay is the day a month period of anchor starts on in y-m: anchor,
// or the month's last day when the month is shorter.
func anchorDay(y int, m time.Month, anchor int) int {
	last := time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
	return min(max(anchor, 1), last)
}

// String renders the calendar as the rule language writes it: the window,
// then tz= and anchor= when they are not the defaults.
func (c *Calendar) String() string {
	s := c.Unit.String()
	if c.Zone != time.UTC {
		s += " tz=" + c.Zone.String()
	}
	if c.Unit == Month && c.Anchor > 1 {
		s += fmt.Sprintf(" anchor=%d", c.Anchor)
	}
	return s
}

// nominal is the Window a calendar rule records: the unit's usual length,
// for what only needs a size (a month counts as 31 days, so that nothing
// sized by it is ever too short).
func (u CalendarUnit) nominal() time.Duration {
	switch u {
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 31 * 24 * time.Hour
	}
	return 24 * time.Hour
}
