package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
)

// syncStore is a store of opts on c whose commits wait for a synchronous
// standby, on a pool configured as the gateway configures it
// (ConfigurePool, which notes the server's warnings). The pool is made
// once the setting holds: ConfigurePool gives it MinConns, whose
// connections are made in the background as soon as the pool exists, and
// a connection made before the reload sees the setting only once
// signalled. A fresh-clone run under load committed a decision on such a
// connection without waiting (allowed, no error).
func syncStore(t *testing.T, c *pgtest.Cluster, opts postgres.Options) *postgres.Store {
	t.Helper()
	c.RequireSynchronousStandby(t)
	s, err := postgres.New(gatewayPool(t, c.URL(), 4, opts), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// migratedCluster is a private cluster whose postgres database holds the
// schema sluice, migrated while commits do not wait for anyone.
func migratedCluster(t *testing.T) *pgtest.Cluster {
	t.Helper()
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	pool := pgtest.NewPool(t, c.URL(), 2)
	if _, err := postgres.Migrate(context.Background(), pool, postgres.DefaultSchema); err != nil {
		t.Fatal(err)
	}
	return c
}

// expectUncertain checks that a decision failed as a timeout whose commit
// is not known to be durable (with a message that says so when Postgres
// answered at all: unknown says whether it must), with nothing leased.
func expectUncertain(t *testing.T, s *postgres.Store, ok bool, err error, unknown bool) {
	t.Helper()
	if err == nil || ok {
		t.Fatalf("a decision whose commit waited for a standby that never answered: allowed=%v, err=%v; want an error", ok, err)
	}
	if kind := limiter.ErrorKind(err); kind != limiter.ErrorTimeout || (unknown && !strings.Contains(err.Error(), "outcome is unknown")) {
		t.Errorf("error %q of kind %s, want a timeout whose outcome is unknown", err, kind)
	}
	if held := s.LeaseStats().UnitsHeld; held != 0 {
		t.Errorf("%d leased units held after an uncertain commit, want 0: a grant nobody knows is durable is never spent", held)
	}
}

// TestUncertainCommitDeadline: with synchronous replication and no
// standby, a commit waits; when the statement's deadline cancels the wait,
// Postgres commits locally and answers success with a warning. The
// decision must fail (its rule's fail mode applies), never allow, and no
// leased unit from it may be spent: a failover would lose that commit.
func TestUncertainCommitDeadline(t *testing.T) {
	c := migratedCluster(t)
	opts := postgres.Options{Schema: postgres.DefaultSchema, StatementTimeout: 300 * time.Millisecond, DecisionTimeout: time.Second}
	s := syncStore(t, c, opts)
	r := fixed("u", 1000, time.Hour)
	res := make([]limiter.Result, 1)
	ok, err := s.Decide(context.Background(), []limiter.Check{chk(r, "k")}, res)
	expectUncertain(t, s, ok, err, false)
	// And the store is not ready while commits cannot be made durable.
	if err := s.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), "synchronous standbys") {
		t.Errorf("Probe with commits waiting for a standby: %v, want a failure naming the standbys", err)
	}
}

// TestUncertainCommitCancelled: the same when someone else cancels the
// wait (pg_cancel_backend, as an operator or a pooler may): Postgres
// answers success and only warns.
func TestUncertainCommitCancelled(t *testing.T) {
	c := migratedCluster(t)
	opts := postgres.Options{Schema: postgres.DefaultSchema, StatementTimeout: 30 * time.Second, DecisionTimeout: 30 * time.Second}
	s := syncStore(t, c, opts)
	r := fixed("u", 1000, time.Hour)
	type answer struct {
		ok  bool
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res := make([]limiter.Result, 1)
		ok, err := s.Decide(context.Background(), []limiter.Check{chk(r, "k")}, res)
		done <- answer{ok, err}
	}()
	// Cancel the backend once it waits for the standby.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin := c.Conn(t, ctx)
	for {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity
			WHERE wait_event = 'SyncRep' AND query LIKE '%decide(%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		select {
		case a := <-done:
			t.Fatalf("the decision ended before it waited for the standby: %+v", a)
		case <-time.After(10 * time.Millisecond): // the wait is the server's: poll it
		}
	}
	a := <-done
	expectUncertain(t, s, a.ok, a.err, true)
	// The cancelled commit is there, locally: the count was made, and the
	// request not allowed on it.
	var n int64
	if err := admin.QueryRow(ctx, "SELECT n FROM sluice.counters WHERE rule = 'u'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n < 1 {
		t.Errorf("counter n = %d, want the locally committed count (at least the request's own unit)", n)
	}
}
