package postgres

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// TestInvalidateForgives: an admin reset at 100 (database µs) gives back,
// with the units a lease did not spend, the ones it spent of what was
// granted at or before the reset (spent in the order granted), and never
// one of a grant it cannot date before the reset; any other key event
// gives back only what was not spent.
func TestInvalidateForgives(t *testing.T) {
	const at = 100
	rule := &policy.Rule{Name: "r", Algorithm: policy.Fixed}
	for _, tc := range []struct {
		name                 string
		granted, left, grant int64
		reserved             int64
		firstUS              int64
		grants               []datedGrant // the dated ones, oldest first
		ngrant               int          // all grants; 0: len(grants)
		forgive              bool
		want                 int64 // the return's unused units
	}{
		{"one grant before, part spent", 10, 4, 10, 0, 50, []datedGrant{{50, 10}}, 0, true, 10},
		{"two grants before", 10, 0, 4, 0, 20, []datedGrant{{20, 6}, {60, 10}}, 0, true, 10},
		{"the last grant after, its units unspent", 12, 9, 9, 0, 50, []datedGrant{{50, 3}, {150, 12}}, 0, true, 12},
		{"the last grant after, some of it spent", 12, 5, 9, 0, 50, []datedGrant{{50, 3}, {150, 12}}, 0, true, 8}, // 3 before, all spent: 5 + 3
		{"three grants after", 12, 5, 4, 0, 50, []datedGrant{{50, 3}, {110, 6}, {120, 8}, {150, 12}}, 0, true, 8},
		// Older grants not kept and every kept one after the reset: which
		// units were granted before it is unknown, nothing is forgiven.
		{"every dated grant after", 12, 5, 4, 0, 50, []datedGrant{{110, 5}, {120, 6}, {130, 8}, {150, 12}}, 5, true, 5},
		// Units reserved by requests still being decided are theirs to
		// settle (decideLeased), neither unspent nor forgiven here.
		{"units reserved", 10, 3, 10, 2, 50, []datedGrant{{50, 10}}, 0, true, 8},
		{"a recall or an override", 10, 4, 10, 0, 50, []datedGrant{{50, 10}}, 0, false, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := newLeaseTable(10)
			k := slotKey{"r", "k"}
			l := &lease{rule: rule, granted: tc.granted, left: tc.left, grant: tc.grant, reserved: tc.reserved,
				firstUS: tc.firstUS, ngrant: max(tc.ngrant, len(tc.grants))}
			copy(l.grants[:], tc.grants)
			tbl.shards[shardOf(k)].m[k] = l
			tbl.held.Store(tc.left)
			if !tbl.invalidate("r", "k", time.UnixMicro(at), tc.forgive) {
				t.Fatal("not invalidated")
			}
			rs := tbl.takeReturns()
			if len(rs) != 1 || rs[0].unused != tc.want || rs[0].settled != tc.granted {
				t.Fatalf("returns %+v, want %d unused of %d settled", rs, tc.want, tc.granted)
			}
			if h := tbl.held.Load(); h != 0 || l.granted != 0 {
				t.Errorf("after: %d units held, lease %+v", h, l)
			}
		})
	}
	// A lease granted after the reset is not its business.
	tbl := newLeaseTable(10)
	k := slotKey{"r", "k"}
	tbl.shards[shardOf(k)].m[k] = &lease{rule: rule, granted: 5, left: 5, grant: 5, firstUS: 150, grants: [grantsKept]datedGrant{{150, 5}}, ngrant: 1}
	if tbl.invalidate("r", "k", time.UnixMicro(at), true) || len(tbl.takeReturns()) != 0 {
		t.Error("a lease granted after the reset was given up")
	}
}

// TestForgiveQueued: a reset heard while a lease's return waits to be sent
// (given up by a recall a moment before) gives back with it what the
// lease spent of its units granted before the reset; other keys' returns,
// and returns of units reserved by denied requests, stay as they are.
func TestForgiveQueued(t *testing.T) {
	tbl := newLeaseTable(10)
	spent := leaseReturn{rule: "r", key: "k", unused: 0, settled: 3, grants: [grantsKept]datedGrant{{50, 1}, {150, 3}}, ngrant: 2}
	other := leaseReturn{rule: "r", key: "other", unused: 0, settled: 3, grants: [grantsKept]datedGrant{{50, 3}}, ngrant: 1}
	reserved := leaseReturn{rule: "r", key: "k", unused: 1}
	tbl.returns = []leaseReturn{spent, other, reserved}
	tbl.forgiveQueued("r", "k", 100)
	tbl.forgiveQueued("r", "k", 100) // heard again, by the poll: forgiven once
	got := tbl.takeReturns()
	if got[0].unused != 1 || got[1].unused != 0 || got[2].unused != 1 || got[2].settled != 0 {
		t.Errorf("unused after the reset: %d, %d, %d; want 1 (granted before the reset), 0 (another key), 1 (a reservation)",
			got[0].unused, got[1].unused, got[2].unused)
	}
}
