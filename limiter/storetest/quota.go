package storetest

import (
	"context"

	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// Calendar returns a fixed rule of cost 1 whose window is the calendar
// unit u in zone tz (an IANA name) starting on day anchor of a month.
func Calendar(name string, limit int64, u policy.CalendarUnit, tz string, anchor int) *policy.Rule {
	zone, err := time.LoadLocation(tz)
	if err != nil {
		panic(err)
	}
	nominal := map[policy.CalendarUnit]time.Duration{policy.Day: 24 * time.Hour, policy.Week: 7 * 24 * time.Hour, policy.Month: 31 * 24 * time.Hour}[u]
	return &policy.Rule{Name: name, Limit: limit, Window: nominal, Algorithm: policy.Fixed, Cost: 1,
		Calendar: &policy.Calendar{Unit: u, Zone: zone, Anchor: anchor}}
}

// testCalendar checks calendar windows at their edges: the period that
// holds the store's clock, its true length as Window, its end as Reset.
func testCalendar(t *testing.T, newStore Factory) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	type probe struct {
		at        string
		allowed   bool
		remaining int64
		reset     string
		window    time.Duration
	}
	for _, tc := range []struct {
		name   string
		rule   *policy.Rule
		probes []probe
	}{
		// March in Berlin lasts 31 days less the hour DST takes.
		{"month across DST", Calendar("m", 2, policy.Month, "Europe/Berlin", 1), []probe{
			{"2026-03-31T21:00:00Z", true, 1, "2026-03-31T22:00:00Z", 31*24*time.Hour - time.Hour},
			{"2026-03-31T21:59:59.999999Z", true, 0, "2026-03-31T22:00:00Z", 31*24*time.Hour - time.Hour},
			{"2026-03-31T21:59:59.999999Z", false, 0, "2026-03-31T22:00:00Z", 31*24*time.Hour - time.Hour},
			{"2026-03-31T22:00:00Z", true, 1, "2026-04-30T22:00:00Z", 30 * 24 * time.Hour},
		}},
		{"25-hour day", Calendar("d", 1, policy.Day, "America/New_York", 1), []probe{
			{"2026-11-01T04:00:00Z", true, 0, "2026-11-02T05:00:00Z", 25 * time.Hour},
			{"2026-11-02T04:59:59Z", false, 0, "2026-11-02T05:00:00Z", 25 * time.Hour},
			{"2026-11-02T05:00:00Z", true, 0, "2026-11-03T05:00:00Z", 24 * time.Hour},
		}},
		{"ISO week in Kolkata", Calendar("w", 1, policy.Week, "Asia/Kolkata", 1), []probe{
			{"2026-11-29T18:29:59Z", true, 0, "2026-11-29T18:30:00Z", 7 * 24 * time.Hour},
			{"2026-11-29T18:30:00Z", true, 0, "2026-12-06T18:30:00Z", 7 * 24 * time.Hour},
		}},
		{"anchor=31 in a 30-day month", Calendar("a", 1, policy.Month, "UTC", 31), []probe{
			{"2026-11-29T12:00:00Z", true, 0, "2026-11-30T00:00:00Z", 30 * 24 * time.Hour},
			{"2026-11-30T00:00:00Z", true, 0, "2026-12-31T00:00:00Z", 31 * 24 * time.Hour},
		}},
		{"leap February", Calendar("f", 1, policy.Month, "UTC", 1), []probe{
			{"2028-02-29T23:59:59Z", true, 0, "2028-03-01T00:00:00Z", 29 * 24 * time.Hour},
			{"2028-03-01T00:00:00Z", true, 0, "2028-04-01T00:00:00Z", 31 * 24 * time.Hour},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewClock(at(tc.probes[0].at))
			s := newStore(t, clock)
			for i, p := range tc.probes {
				now := at(p.at)
				clock.Set(now)
				ok, res := Decide(t, s, chk(tc.rule, "k"))
				r := res[0]
				if ok != p.allowed || r.Remaining != p.remaining || !r.Reset.Equal(at(p.reset)) ||
					r.Window != p.window || r.ResetAfter != at(p.reset).Sub(now) {
					t.Errorf("probe %d at %s: allowed %v remaining %d reset %s window %s reset after %s; want %v %d %s %s %s",
						i, p.at, ok, r.Remaining, r.Reset.Format(time.RFC3339Nano), r.Window, r.ResetAfter,
						p.allowed, p.remaining, p.reset, p.window, at(p.reset).Sub(now))
				}
				if !ok && r.RetryAfter != r.ResetAfter {
					t.Errorf("probe %d: retry after %s, want the time to the boundary %s", i, r.RetryAfter, r.ResetAfter)
				}
			}
		})
	}
}

// Settle settles ss on s, failing the test when it cannot.
func Settle(t testing.TB, s limiter.Store, ss ...limiter.Settlement) {
	t.Helper()
	st, ok := s.(limiter.Settler)
	if !ok {
		t.Fatalf("%T does not settle charges", s)
	}
	if err := st.Settle(context.Background(), ss); err != nil {
		t.Fatalf("Settle: %v", err)
	}
}

// charged makes a rule read its cost from the response's
// usage.total_tokens.
func charged(r *policy.Rule) { r.Charge = &policy.Charge{Paths: [][]string{{"usage", "total_tokens"}}} }

// testCharges checks settlements for every algorithm: the difference to
// the reservation within its window, the whole charge once the window
// moved on, a count past the limit, a charge below the reservation, and
// concurrent settlements summing exactly.
func testCharges(t *testing.T, newStore Factory) {
	for _, a := range Algos {
		t.Run(a.Name, func(t *testing.T) {
			r := With(a.Make("c", 10, time.Minute), charged)
			clock := NewClock(Base)
			s := newStore(t, clock)
			admit := func(key string, at time.Duration, wantRemaining int64) time.Time {
				t.Helper()
				clock.Set(Base.Add(at))
				ok, res := Decide(t, s, chk(r, key))
				if !ok || res[0].Remaining != wantRemaining {
					t.Fatalf("%s at +%v: allowed %v remaining %d, want allowed with %d", key, at, ok, res[0].Remaining, wantRemaining)
				}
				return limiter.Admitted(res[0], limiter.SourceStore, time.Time{})
			}
			settle := func(key string, at time.Duration, reserved, charge int64, admitted time.Time) {
				t.Helper()
				clock.Set(Base.Add(at))
				Settle(t, s, limiter.Settlement{Check: chk(r, key), Reserved: reserved, Charge: charge, Admitted: admitted})
			}
			// Within the window: 1 reserved, 7 charged, so 8 count after
			// one more request.
			adm := admit("k", 0, 9)
			if !adm.Equal(Base) {
				t.Errorf("Admitted %s, want the store's clock %s", adm, Base)
			}
			settle("k", 0, 1, 7, adm)
			admit("k", 0, 2)
			// A charge without a reservation (a fail mode admitted it)
			// takes the key past its limit: denied, remaining 0.
			settle("k", time.Second, 0, 10, Base.Add(time.Second))
			clock.Set(Base.Add(time.Second))
			// 7 + 1 + 10 counted (for the token bucket, 108 s of tokens
			// not yet refilled at 1 s, 18 requests of 6 s rounded up).
			const wantCount = 18
			if ok, res := Decide(t, s, chk(r, "k")); ok || res[0].Remaining != 0 || res[0].RetryAfter <= 0 || res[0].Count != wantCount {
				t.Errorf("past the limit: allowed %v remaining %d count %d retry %s, want a denial with count %d",
					ok, res[0].Remaining, res[0].Count, res[0].RetryAfter, wantCount)
			}
			// A response that outlives its window: the whole charge lands
			// in the window current when it settles.
			adm = admit("late", 59*time.Second, 9)
			settle("late", 61*time.Second, 1, 5, adm)
			admit("late", 61*time.Second, 4)
			// A charge below the reservation gives the difference back.
			adm = admit("zero", 0, 9)
			settle("zero", 0, 1, 0, adm)
			admit("zero", 0, 9)
		})
	}
	t.Run("concurrent", func(t *testing.T) {
		r := With(Fixed("c", 100_000, time.Hour), charged)
		clock := NewClock(Base)
		s := newStore(t, clock)
		const n = 200
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, res := Decide(t, s, chk(r, "k"))
				if !ok {
					t.Errorf("request %d denied", i)
					return
				}
				Settle(t, s, limiter.Settlement{Check: chk(r, "k"), Reserved: 1, Charge: int64(i % 7),
					Admitted: limiter.Admitted(res[0], limiter.SourceStore, time.Time{})})
			}()
		}
		wg.Wait()
		want := int64(0)
		for i := range n {
			want += int64(i % 7)
		}
		_, res := Decide(t, s, chk(r, "k"))
		if got := r.Limit - res[0].Remaining - 1; got != want {
			t.Errorf("after %d concurrent settlements the count is %d, want %d", n, got, want)
		}
	})
	t.Run("tiers", func(t *testing.T) {
		tpm := With(Fixed("tpm", 1000, time.Minute), charged)
		rpm := Fixed("rpm", 60, time.Minute)
		s := newStore(t, NewClock(Base))
		_, res := Decide(t, s, chk(tpm, "u"), chk(rpm, "u"))
		Settle(t, s, limiter.Settlement{Check: chk(tpm, "u"), Reserved: 1, Charge: 1000,
			Admitted: limiter.Admitted(res[0], limiter.SourceStore, time.Time{})})
		ok, res := Decide(t, s, chk(tpm, "u"), chk(rpm, "u"))
		if ok || res[0].Allowed || !res[1].Allowed || res[1].Remaining != 59 {
			t.Errorf("after 1000 of 1000 tokens, a request: allowed %v, tpm %v, rpm %v with %d left; want tpm to deny alone and rpm to count nothing",
				ok, res[0].Allowed, res[1].Allowed, res[1].Remaining)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		s := newStore(t, NewClock(Base))
		err := s.(limiter.Settler).Settle(context.Background(), []limiter.Settlement{{Check: chk(Fixed("c", 1, time.Minute), "k"), Charge: -1}})
		if err == nil {
			t.Error("a negative charge was taken")
		}
	})
}
