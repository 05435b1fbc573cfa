package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestPlansOutliveAnEmptyTable: the decide function's statements are
// planned once per connection, and a gateway's connections are made at
// start-up, when the counters table is often empty (every fresh
// deployment). Plans made then must still probe the primary key once per
// counter when the table has grown. (A cursor is planned for its first
// rows: the lock-and-load query, written as a join ordered by (rule, key),
// became a walk of the whole index in key order, with the batch's keys
// compared against every counter; a decision cost 0.7 ms of Postgres CPU
// at 10,000 counters, and more with every key.)
func TestPlansOutliveAnEmptyTable(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	decide := fmt.Sprintf(`SELECT now_us FROM %s.decide(NULL, false,
		array_fill('r'::text, ARRAY[$2::int]), $1::text[], array_fill(0::smallint, ARRAY[$2::int]),
		array_fill(100::bigint, ARRAY[$2::int]), array_fill(3600000000::bigint, ARRAY[$2::int]),
		array_fill(0::bigint, ARRAY[$2::int]), array_fill(0::bigint, ARRAY[$2::int]),
		array_fill(0::bigint, ARRAY[4 * $2::int]),
		ARRAY(SELECT generate_series(1, $2::int)), ARRAY(SELECT generate_series(1, $2::int)),
		array_fill(1::bigint, ARRAY[$2::int]), array_fill(false, ARRAY[$2::int]), array_fill(false, ARRAY[$2::int]),
		array_fill(0::bigint, ARRAY[$2::int]), array_fill(0::bigint, ARRAY[$2::int]), array_fill(0::bigint, ARRAY[$2::int]),
		array_fill(false, ARRAY[$2::int]), array_fill(-1::bigint, ARRAY[$2::int]))`,
		pgx.Identifier{db.Schema}.Sanitize())
	// fetched runs decide for keys (sorted, as callers send them) in a
	// transaction that it rolls back, and returns how many index entries
	// of the counters table the transaction fetched.
	fetched := func(keys ...string) int64 {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // read-only by then
		if _, err := tx.Exec(ctx, decide, keys, len(keys)); err != nil {
			t.Fatal(err)
		}
		var n int64
		err = tx.QueryRow(ctx, `SELECT coalesce(sum(idx_tup_fetch), 0) FROM pg_stat_xact_user_tables
			WHERE schemaname = $1 AND relname = 'counters'`, db.Schema).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Plan every statement of the function while the table is empty: a
	// new key, then the same key again (it exists within the transaction
	// only in the first call, which is rolled back).
	fetched("a")
	fetched("a")

	const rows = 5000
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.counters (rule, key, alg, n, expires_at)
		SELECT 'r', 'k' || lpad(g::text, 5, '0'), 0, 1, now() + interval '1 hour' FROM generate_series(1, $1) AS g`,
		pgx.Identifier{db.Schema}.Sanitize()), rows); err != nil {
		t.Fatal(err)
	}
	newKeys := []string{"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9"}
	oldKeys := []string{"k00001", "k00002", "k00003", "k00004", "k00005", "k00006", "k00007", "k00008", "k00009", "k00010"}
	// Each key is fetched by a few probes at most (lock, insert, update).
	const most = 4 * 10
	if n := fetched(newKeys...); n > most {
		t.Errorf("10 new keys at %d counters fetched %d index entries, want at most %d: a plan made on the empty table walks the table", rows, n, most)
	}
	if n := fetched(oldKeys...); n > most {
		t.Errorf("10 existing keys at %d counters fetched %d index entries, want at most %d: a plan made on the empty table walks the table", rows, n, most)
	}
}
