package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
)

func TestErrorKind(t *testing.T) {
	// A real failed connection attempt: nothing listens on port 1.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, refused := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5")
	if refused == nil {
		t.Fatal("connected to port 1")
	}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"refused", refused, limiter.ErrorConnection},
		{"only standbys", fmt.Errorf("connect: %w", errors.Join(refused, pgconn.ErrReadOnlyConnection)), limiter.ErrorReadOnly},
		{"deadline while connecting", errors.Join(pgconn.ErrReadOnlyConnection, context.DeadlineExceeded), limiter.ErrorTimeout},
		{"closed", fmt.Errorf("decide: %w", pgconn.ErrConnClosed), limiter.ErrorConnection},
		{"read-only transaction", &pgconn.PgError{Code: "25006"}, limiter.ErrorReadOnly},
		{"too many clients", &pgconn.PgError{Code: "53300"}, limiter.ErrorTooManyConnections},
		{"other", errors.New("boom"), limiter.ErrorOther},
		// SQLSTATEs.
		{"query canceled", fmt.Errorf("decide: %w", &pgconn.PgError{Code: "57014"}), limiter.ErrorTimeout},
		{"lock not available", &pgconn.PgError{Code: "55P03"}, limiter.ErrorTimeout},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, limiter.ErrorConnection},
		{"crash shutdown", &pgconn.PgError{Code: "57P02"}, limiter.ErrorConnection},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, limiter.ErrorConnection},
		{"connection failure", &pgconn.PgError{Code: "08006"}, limiter.ErrorConnection},
		{"connection rejected", &pgconn.PgError{Code: "08001"}, limiter.ErrorConnection},
		{"undefined table", &pgconn.PgError{Code: "42P01"}, limiter.ErrorUndefinedTable},
		{"undefined function", &pgconn.PgError{Code: "42883"}, limiter.ErrorUndefinedTable},
		{"invalid schema", &pgconn.PgError{Code: "3F000"}, limiter.ErrorUndefinedTable},
		{"insufficient privilege", &pgconn.PgError{Code: "42501"}, limiter.ErrorInsufficientPrivilege},
		{"unique violation", &pgconn.PgError{Code: "23505"}, limiter.ErrorOther},
		{"a deadline wins", fmt.Errorf("%w: %w", context.DeadlineExceeded, &pgconn.PgError{Code: "57P01"}), limiter.ErrorTimeout},
	}
	for _, tt := range tests {
		if got := postgres.ErrorKind(tt.err); got != tt.want {
			t.Errorf("%s: ErrorKind(%v) = %q, want %q", tt.name, tt.err, got, tt.want)
		}
	}
}

// TestReadOnlyConnectionIsDropped: a decision whose pooled connection's
// server turned read-only (as a demoted primary's do) is retried once on a
// fresh connection instead of failing, the pool is reset, and the
// decision counts once.
func TestReadOnlyConnectionIsDropped(t *testing.T) {
	s, pool, r := oneConnStore(t, "ro")

	// Make the pool's only connection read-only, as a demotion would.
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	pid := conn.Conn().PgConn().PID()
	conn.Release()

	before := s.BatchStats().Statements
	ok, res := decide(t, s, chk(r, "k"))
	if !ok || res[0].Remaining != 8 {
		t.Fatalf("decision on a read-only connection: allowed=%v remaining=%d, want allowed with 8 left", ok, res[0].Remaining)
	}
	if n := s.BatchStats().Statements - before; n != 2 {
		t.Errorf("%d statements for the decision, want 2: the read-only one and the retry", n)
	}
	conn, err = pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if conn.Conn().PgConn().PID() == pid {
		t.Error("the read-only connection is still in the pool")
	}
}

// TestPreparedStatementHint: the error of a statement that the server does
// not know says what to put in the connection string.
func TestPreparedStatementHint(t *testing.T) {
	s, pool, r := oneConnStore(t, "ps")
	// Forget the statements pgx prepared behind its back, as a
	// transaction-mode pooler moving the client to another server
	// connection would.
	if _, err := pool.Exec(context.Background(), "DEALLOCATE ALL", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	res := make([]limiter.Result, 1)
	_, err := s.Decide(context.Background(), []limiter.Check{chk(r, "k")}, res)
	if err == nil {
		t.Fatal("a decision succeeded after its prepared statement was deallocated")
	}
	if !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
		t.Errorf("error %q gives no hint", err)
	}
}

// TestPoolAcquireBounded: with every pooled connection busy, a decision
// waits for one no longer than its context allows, and says it timed out.
func TestPoolAcquireBounded(t *testing.T) {
	s, pool, r := oneConnStore(t, "busy")

	conn, err := pool.Acquire(context.Background()) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const deadline = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	began := time.Now()
	_, err = s.Decide(ctx, []limiter.Check{chk(r, "k")}, make([]limiter.Result, 1))
	took := time.Since(began)
	if err == nil || limiter.ErrorKind(err) != limiter.ErrorTimeout {
		t.Fatalf("decision with no free connection: %v, want a timeout", err)
	}
	if took > deadline+time.Second {
		t.Errorf("the decision waited %v for a connection, past its %v deadline", took, deadline)
	}
}

// TestTripCountsTheStoresKind: a failure the store's background work
// reports to the breaker is counted with the kind only the store can tell
// from pgx's errors. A demoted primary's pool reconnecting to servers that
// are all read-only was counted as other (TestFaultDemotedPrimary, which
// wants read_only, failed so in CI).
func TestTripCountsTheStoresKind(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, refused := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5")
	onlyStandbys := fmt.Errorf("connect: %w", errors.Join(refused, pgconn.ErrReadOnlyConnection))
	reg := prometheus.NewRegistry()
	b, err := limiter.NewBreaker(limiter.BreakerConfig{Metrics: limiter.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t)
	s := open(t, db, nil, nil, func(o *postgres.Options) { o.Breaker = b })
	postgres.Trip(s, onlyStandbys)
	if b.State() != limiter.BreakerOpen {
		t.Fatalf("breaker %v after a trip, want open", b.State())
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counted := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "sluice_store_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && m.GetCounter().GetValue() > 0 {
					counted[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if want := map[string]float64{limiter.ErrorReadOnly: 1}; !maps.Equal(counted, want) {
		t.Errorf("store errors counted %v, want %v", counted, want)
	}
}
