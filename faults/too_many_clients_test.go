//go:build unix

package faults

// No connection slot left on the server (SQLSTATE 53300).

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestFaultTooManyClients: the server has no connection slot left for the
// gateway, whose own connections were terminated. Requests wait no longer
// than the decision timeout, then the fail modes apply; decisions resume
// when slots free up.
func TestFaultTooManyClients(t *testing.T) {
	// Not parallel: it bounds the gateway's answer time, which
	// the other fault tests' load would be part of. It runs before them.
	const timeout = 250 * time.Millisecond
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{Settings: map[string]string{
		"max_connections": "12", "superuser_reserved_connections": "0",
	}})
	up := newUpstream(t)
	env := faultEnv(up.URL, c.URL()+"&pool_max_conns=4")
	env["SLUICE_DB_TIMEOUT"] = timeout.String()
	g := startFault(t, env)
	gws := []*faultGateway{g}
	expectExact(t, gws, "before")

	ctx := context.Background()
	var fillers []*pgx.Conn
	defer func() {
		for _, f := range fillers {
			f.Close(ctx)
		}
	}()
	fill := func() {
		t.Helper()
		for {
			conn, err := c.Connect(ctx)
			if err != nil {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "53300" {
					t.Fatalf("filling the server: %v, want SQLSTATE 53300", err)
				}
				return
			}
			fillers = append(fillers, conn)
		}
	}
	fill()
	if len(fillers) == 0 {
		t.Fatal("no slot to fill")
	}
	// Terminate the gateway's sessions and take their slots too. The
	// gateway reconnects as soon as a slot is free (its background poll
	// runs twice a second), and on a busy machine it can take a slot
	// before fill does, or before the last of its terminated sessions has
	// ended: then terminate it again.
	sessions := func() int {
		var n int
		if err := fillers[0].QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sluice'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for attempt := 1; ; attempt++ {
		waitFor(t, 10*time.Second, "the gateway's sessions end", func() bool {
			if _, err := fillers[0].Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'sluice'"); err != nil {
				t.Fatal(err)
			}
			return sessions() == 0
		})
		fill()
		if sessions() == 0 {
			break
		}
		if attempt == 20 {
			t.Fatal("the gateway took a slot back 20 times before the test could")
		}
	}
	t.Logf("%d connections hold every slot", len(fillers))

	g.served.take()
	var took []time.Duration
	for i := range 30 {
		for _, path := range []string{"/open", "/closed", "/local"} {
			r := g.mustPost(t, path, fmt.Sprintf("full-%d", i))
			want := map[string]int{"/open": 200, "/closed": 503, "/local": 200}[path]
			if r.status != want {
				t.Fatalf("%s with the server full: status %d, want %d", path, r.status, want)
			}
			took = append(took, r.took)
		}
	}
	served := g.served.take()
	worst := percentile(served, 100)
	t.Logf("server full: inside the gateway p50 %v, p99 %v, max %v; round trips p50 %v, p99 %v, max %v",
		percentile(served, 50), percentile(served, 99), worst, percentile(took, 50), percentile(took, 99), percentile(took, 100))
	if worst > timeout+100*time.Millisecond {
		t.Errorf("the gateway took up to %v with the server full, want under %v + 100ms", worst, timeout)
	}
	// The kind is counted by whatever meets the full server first: these
	// decisions, or, when the background poll found the terminated
	// sessions and opened the breaker before they came, its next probe.
	waitFor(t, 10*time.Second, "a too_many_connections error counted", func() bool {
		return g.metric(t, `sluice_store_errors_total{kind="too_many_connections"}`) > 0
	})
	if e := logged(g.logs, zapcore.WarnLevel, "circuit breaker opened", ""); len(e) != 1 {
		t.Errorf("%d breaker-opened lines, want 1", len(e))
	}

	for _, f := range fillers {
		f.Close(ctx)
	}
	fillers = nil
	recovered := g.waitDecides(t, 10*time.Second, "decisions resume once slots free up")
	t.Logf("store decisions again %v after the slots freed up", recovered)
	expectExact(t, gws, "after")
}
