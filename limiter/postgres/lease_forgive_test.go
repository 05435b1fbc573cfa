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
		name                  string
		granted, left, grant  int64
		reserved              int64
		firstUS, prevUS, last int64
		forgive               bool
		want                  int64 // the return's unused units
	}{
		{"one grant before, part spent", 10, 4, 10, 0, 50, 0, 50, true, 10},
		{"two grants before", 10, 0, 4, 0, 20, 50, 60, true, 10},
		{"the last grant after, its units unspent", 12, 9, 9, 0, 50, 50, 150, true, 12},
		{"the last grant after, some of it spent", 12, 5, 9, 0, 50, 50, 150, true, 8}, // 3 before, all spent: 5 + 3
		{"two grants after", 12, 5, 4, 0, 50, 120, 150, true, 5},
		// Units reserved by requests still being decided are theirs to
		// settle (decideLeased), neither unspent nor forgiven here.
		{"units reserved", 10, 3, 10, 2, 50, 0, 50, true, 8},
		{"a recall or an override", 10, 4, 10, 0, 50, 0, 50, false, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := newLeaseTable(10)
			k := slotKey{"r", "k"}
			l := &lease{rule: rule, granted: tc.granted, left: tc.left, grant: tc.grant, reserved: tc.reserved,
				firstUS: tc.firstUS, prevUS: tc.prevUS, lastUS: tc.last}
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
	tbl.shards[shardOf(k)].m[k] = &lease{rule: rule, granted: 5, left: 5, grant: 5, firstUS: 150, lastUS: 150}
	if tbl.invalidate("r", "k", time.UnixMicro(at), true) || len(tbl.takeReturns()) != 0 {
		t.Error("a lease granted after the reset was given up")
	}
}
