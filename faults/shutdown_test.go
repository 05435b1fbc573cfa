//go:build unix

package faults

// A shutdown with a decision in flight.

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestFaultGracefulShutdown: a decision waiting on the database when the
// gateway is told to stop completes, decided by the store, and is counted;
// the pool closes only after it.
func TestFaultGracefulShutdown(t *testing.T) {
	db := parallelDB(t)
	up := newUpstream(t)
	env := schemaEnv(up.URL, db)
	env["SLUICE_DB_TIMEOUT"] = "30s" // the decision waits for the lock, whatever it takes
	g := startFault(t, env)
	// Both decisions on "inflight" in one counter row.
	pgtest.ClearOf(t, time.Hour, 30*time.Second)
	if r := g.mustPost(t, "/closed", "inflight"); r.status != 200 {
		t.Fatalf("warm-up: %d", r.status)
	}

	ctx := context.Background()
	locker, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Release()
	counters := db.Table("counters")
	if _, err := locker.Exec(ctx, "BEGIN; LOCK TABLE "+counters+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	replied := make(chan reply, 1)
	go func() {
		r, err := g.post("/closed", "inflight")
		if err != nil {
			t.Error(err)
		}
		replied <- r
	}()
	waitFor(t, 10*time.Second, "the decision waits on the lock", func() bool {
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sluice' AND wait_event_type = 'Lock'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})

	stopped := make(chan error, 1)
	go func() { stopped <- g.stop() }()
	waitFor(t, 10*time.Second, "the public listener closes", func() bool {
		conn, err := net.Dial("tcp", strings.TrimPrefix(g.url, "http://"))
		if err == nil {
			conn.Close()
		}
		return err != nil
	})
	select {
	case err := <-stopped:
		t.Fatalf("the gateway stopped (%v) with a decision in flight", err)
	default:
	}
	if _, err := locker.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if r := <-replied; r.status != 200 {
		t.Errorf("in-flight decision answered %d, want 200 from the store", r.status)
	}
	if err := <-stopped; err != nil {
		t.Errorf("serve: %v", err)
	}
	var n int64
	if err := db.Pool.QueryRow(ctx, "SELECT n FROM "+counters+" WHERE rule = 'closed'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("counter %d after the shutdown, want 2: the in-flight decision was not committed", n)
	}
}
