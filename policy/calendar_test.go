package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// calendarRule parses one rule and returns its calendar.
func calendarRule(t *testing.T, limitAndOptions string) *policy.Rule {
	t.Helper()
	p, err := policy.Parse("q: * /api/* by tenant " + limitAndOptions)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := p.Lookup("q")
	return r
}

func TestCalendarPeriods(t *testing.T) {
	for _, tc := range []struct {
		name, rule string
		at         string // RFC 3339
		start, end string // RFC 3339, with the zone's offsets
	}{
		{"UTC day", "10/1d tz=UTC", "2026-11-27T21:00:00Z", "2026-11-27T00:00:00Z", "2026-11-28T00:00:00Z"},
		{"Berlin day", "10/1d tz=Europe/Berlin", "2026-11-27T23:30:00Z", "2026-11-28T00:00:00+01:00", "2026-11-29T00:00:00+01:00"},
		// Spring forward: 29 March 2026 lasts 23 hours in Berlin.
		{"Berlin 23-hour day", "10/1d tz=Europe/Berlin", "2026-03-29T12:00:00+02:00", "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00"},
		// Fall back: 25 October 2026 lasts 25 hours.
		{"Berlin 25-hour day", "10/1d tz=Europe/Berlin", "2026-10-25T02:30:00+01:00", "2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00"},
		{"New York 23-hour day", "10/1d tz=America/New_York", "2026-03-08T03:30:00-04:00", "2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00"},
		{"New York 25-hour day", "10/1d tz=America/New_York", "2026-11-01T01:30:00-05:00", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00"},
		// A zone whose change skips midnight: the day begins at 01:00.
		{"Beirut skipped midnight", "10/1d tz=Asia/Beirut", "2026-03-29T10:00:00+03:00", "2026-03-29T01:00:00+03:00", "2026-03-30T00:00:00+03:00"},
		{"Beirut the day before", "10/1d tz=Asia/Beirut", "2026-03-28T23:59:59+02:00", "2026-03-28T00:00:00+02:00", "2026-03-29T01:00:00+03:00"},
		// Half-hour offsets.
		{"Kolkata day", "10/1d tz=Asia/Kolkata", "2026-11-27T18:29:59Z", "2026-11-27T00:00:00+05:30", "2026-11-28T00:00:00+05:30"},
		{"Kolkata next day", "10/1d tz=Asia/Kolkata", "2026-11-27T18:30:00Z", "2026-11-28T00:00:00+05:30", "2026-11-29T00:00:00+05:30"},
		{"Adelaide month across DST", "10/1mo tz=Australia/Adelaide", "2026-04-10T00:00:00Z", "2026-04-01T00:00:00+10:30", "2026-05-01T00:00:00+09:30"},
		// ISO weeks from Monday.
		{"week, Friday", "10/1w", "2026-11-27T12:00:00Z", "2026-11-23T00:00:00Z", "2026-11-30T00:00:00Z"},
		{"week, Monday midnight", "10/1w", "2026-11-30T00:00:00Z", "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z"},
		{"week, Sunday night", "10/1w tz=Europe/Berlin", "2026-11-29T22:59:59Z", "2026-11-23T00:00:00+01:00", "2026-11-30T00:00:00+01:00"},
		{"week across the year", "10/1w", "2027-01-01T00:00:00Z", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z"},
		// Months: calendar months, never 30 days.
		{"month", "10/1mo", "2026-11-27T00:00:00Z", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z"},
		{"February of a leap year", "10/1mo", "2028-02-29T23:59:59Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"},
		{"Berlin month, UTC still the month before", "10/1mo tz=Europe/Berlin", "2026-11-30T23:30:00Z", "2026-12-01T00:00:00+01:00", "2027-01-01T00:00:00+01:00"},
		{"anchor=15", "10/1mo anchor=15", "2026-11-14T23:59:59Z", "2026-10-15T00:00:00Z", "2026-11-15T00:00:00Z"},
		{"anchor=15 on the day", "10/1mo anchor=15", "2026-11-15T00:00:00Z", "2026-11-15T00:00:00Z", "2026-12-15T00:00:00Z"},
		// anchor=31: a 30-day month's period starts on the 30th.
		{"anchor=31 in November", "10/1mo anchor=31", "2026-11-30T10:00:00Z", "2026-11-30T00:00:00Z", "2026-12-31T00:00:00Z"},
		{"anchor=31 before the 30th", "10/1mo anchor=31", "2026-11-29T10:00:00Z", "2026-10-31T00:00:00Z", "2026-11-30T00:00:00Z"},
		{"anchor=31 in a leap February", "10/1mo anchor=31", "2028-02-29T00:00:00Z", "2028-02-29T00:00:00Z", "2028-03-31T00:00:00Z"},
		{"anchor=30 in a common February", "10/1mo anchor=30", "2027-03-01T00:00:00Z", "2027-02-28T00:00:00Z", "2027-03-30T00:00:00Z"},
		{"anchor=31 across DST", "10/1mo anchor=31 tz=Europe/Berlin", "2026-03-31T12:00:00+02:00", "2026-03-31T00:00:00+02:00", "2026-04-30T00:00:00+02:00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := calendarRule(t, tc.rule)
			if r.Calendar == nil {
				t.Fatalf("%q: no calendar", tc.rule)
			}
			at, start, end := mustTime(t, tc.at), mustTime(t, tc.start), mustTime(t, tc.end)
			gotStart, gotEnd := r.Calendar.Period(at)
			if !gotStart.Equal(start) || !gotEnd.Equal(end) {
				t.Errorf("%q at %s: period [%s, %s), want [%s, %s)", tc.rule, tc.at, gotStart, gotEnd, start, end)
			}
			// Every instant of the period gives the same period, and the
			// instant before it the previous one.
			for _, in := range []time.Time{start, end.Add(-time.Microsecond)} {
				if s, e := r.Calendar.Period(in); !s.Equal(start) || !e.Equal(end) {
					t.Errorf("at %s: period [%s, %s), want [%s, %s)", in, s, e, start, end)
				}
			}
			if _, e := r.Calendar.Period(start.Add(-time.Microsecond)); !e.Equal(start) {
				t.Errorf("the period before %s ends at %s", start, e)
			}
		})
	}
}

// TestCalendarContinuous walks years of periods in every zone that has a
// peculiarity: each period ends where the next begins, holds the instants
// it claims, and starts at a local midnight (or the change that skipped
// it) of the right weekday or day of the month.
func TestCalendarContinuous(t *testing.T) {
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "America/Santiago", "Asia/Beirut", "America/Havana", "Asia/Kolkata", "Australia/Lord_Howe", "Pacific/Chatham", "Asia/Kathmandu"}
	for _, z := range zones {
		for _, opts := range []string{"1d tz=" + z, "1w tz=" + z, "1mo tz=" + z, "1mo anchor=31 tz=" + z} {
			r := calendarRule(t, "10/"+opts)
			at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
			stop := at.AddDate(3, 0, 0)
			_, end := r.Calendar.Period(at)
			for end.Before(stop) {
				s, e := r.Calendar.Period(end)
				if !s.Equal(end) || !e.After(s) {
					t.Fatalf("%s: after a period ending %s comes [%s, %s)", opts, end, s, e)
				}
				mid := s.Add(e.Sub(s) / 2)
				if ms, me := r.Calendar.Period(mid); !ms.Equal(s) || !me.Equal(e) {
					t.Fatalf("%s: %s is in [%s, %s), not [%s, %s)", opts, mid, ms, me, s, e)
				}
				if h := e.Sub(s); r.Calendar.Unit == policy.Day && (h < 22*time.Hour || h > 26*time.Hour) {
					t.Fatalf("%s: a day of %s: [%s, %s)", opts, h, s, e)
				}
				local := s.In(r.Calendar.Zone)
				if r.Calendar.Unit == policy.Week && local.Weekday() != time.Monday {
					t.Fatalf("%s: a week starting on %s", opts, local)
				}
				if r.Calendar.Unit == policy.Month && strings.Contains(opts, "anchor") && local.Day() < 28 {
					t.Fatalf("%s: a month starting on %s", opts, local)
				}
				end = e
			}
		}
	}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestCalendarRules(t *testing.T) {
	for rule, want := range map[string]string{
		"10/1mo":                    "1mo",
		"10/1w tz=Europe/Berlin":    "1w tz=Europe/Berlin",
		"10/1d tz=Asia/Kolkata":     "1d tz=Asia/Kolkata",
		"10/1mo anchor=15":          "1mo anchor=15",
		"10/1mo fixed anchor=1":     "1mo",
		"10/1mo tz=UTC anchor=31":   "1mo anchor=31",
		"10/1mo charge=header(X-C)": "1mo",
	} {
		r := calendarRule(t, rule)
		if r.Calendar == nil || r.Calendar.String() != want || r.Algorithm != policy.Fixed {
			t.Errorf("%q: calendar %v, want %s", rule, r.Calendar, want)
		}
		if r.WindowString() != strings.Fields(want)[0] {
			t.Errorf("%q: WindowString %q", rule, r.WindowString())
		}
	}
	// 1d without tz= is the epoch-aligned day it always was: UTC days.
	if r := calendarRule(t, "10/1d"); r.Calendar != nil || r.Window != 24*time.Hour {
		t.Errorf("10/1d: calendar %v, window %s", r.Calendar, r.Window)
	}
}

func TestCalendarErrors(t *testing.T) {
	for rule, want := range map[string]string{
		"10/1mo sliding":                      `rule "q": limit: expected a calendar window (1mo) with the fixed algorithm only, got "sliding"`,
		"10/1w token":                         `rule "q": limit: expected a calendar window (1w) with the fixed algorithm only, got "token"`,
		"10/1d tz=UTC reset":                  `with the fixed algorithm only, got "reset"`,
		"10/2mo":                              `rule "q": limit: expected a calendar month as 1mo`,
		"10/3w":                               `rule "q": limit: expected a calendar week as 1w`,
		"10/1h tz=Europe/Berlin":              `rule "q": tz: expected only with a calendar window (1d, 1w or 1mo), got "tz=Europe/Berlin" on 1h`,
		"10/2d tz=Europe/Berlin":              `tz: expected only with a calendar window`,
		"10/24h tz=Europe/Berlin":             `got "tz=Europe/Berlin" on 24h (a calendar day is written 1d)`,
		"10/1440m anchor=3":                   `got "anchor=3" on 1440m`,
		"10/1d anchor=5":                      `rule "q": anchor: expected only with a monthly window (1mo), got "anchor=5" on 1d`,
		"10/1w anchor=5":                      `anchor: expected only with a monthly window (1mo), got "anchor=5" on 1w`,
		"10/1h anchor=5":                      `anchor: expected only with a monthly window (1mo)`,
		"10/1mo anchor=0":                     `anchor: expected anchor=D with a day from 1 to 31, got "anchor=0"`,
		"10/1mo anchor=32":                    `anchor: expected anchor=D with a day from 1 to 31, got "anchor=32"`,
		"10/1mo tz=Mars/Olympus":              `rule "q": tz: expected an IANA time zone such as tz=Europe/Berlin, got "tz=Mars/Olympus" (unknown zone)`,
		"10/1mo tz=Local":                     `tz: expected an IANA time zone`,
		"10/1mo tz=../../etc/passwd":          `tz: expected an IANA time zone`,
		"10/1mo tz=UTC tz=UTC":                `expected each option once, got "tz" twice`,
		"10/1mo plans(t)=pro:100/1d":          `plans: expected the rule's calendar window 1mo in every plan, got "pro:100/1d"`,
		"10/1h plans(t)=pro:100/1mo":          `plans: expected a calendar window (1w, 1mo) only on a rule with that window`,
		"10/1h charge=json(a..b)":             `charge: expected json(path) with dotted keys`,
		"10/1h charge=json()":                 `charge: expected charge=header(Name) or charge=json(path)`,
		"10/1h charge=header(a b)":            `charge: expected charge=header(Name)`,
		"10/1h charge=header()":               `charge: expected a response header name`,
		"10/1h charge=usage":                  `charge: expected charge=header(Name) or charge=json(path)`,
		"10/1h charge=json(a) charge=json(b)": `expected each option once, got "charge" twice`,
	} {
		_, err := policy.Parse("q: * /api/* by tenant " + rule)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %s", rule, err, want)
		}
	}
	_, err := policy.Parse("q: * rls:edge by descriptor(k) 10/1h charge=json(a)")
	if err == nil || !strings.Contains(err.Error(), "charge: expected charge= only on a rule whose path is an HTTP path") {
		t.Errorf("a charge on an rls: rule: %v", err)
	}
	// Every problem at once, in one message.
	_, err = policy.Parse("q: * /api/* by tenant 10/1mo sliding tz=Nowhere/Else anchor=40")
	for _, want := range []string{"tz:", "anchor:", "fixed algorithm only"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("several problems: %v, want %s among them", err, want)
		}
	}
}

func TestCharges(t *testing.T) {
	for rule, want := range map[string]string{
		"charge=header(x-credits-used)":                       "header(X-Credits-Used)",
		"charge=json(usage.total_tokens)":                     "json(usage.total_tokens)",
		"charge=json(usage.input_tokens+usage.output_tokens)": "json(usage.input_tokens+usage.output_tokens)",
	} {
		r := calendarRule(t, "100/1m "+rule)
		if r.Charge == nil || r.Charge.String() != want {
			t.Errorf("%q: charge %v, want %s", rule, r.Charge, want)
		}
	}
}
