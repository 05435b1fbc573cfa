package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/postgres"
)

// The question's budget follows the database's recent answers: three
// times the slowest of the last 64, within the floor and the ceiling.
func TestQuestionBudget(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		recent []time.Duration
		floor  time.Duration
		want   time.Duration
	}{
		{nil, time.Second, time.Second},
		{[]time.Duration{5 * ms, 20 * ms}, time.Second, time.Second},
		{[]time.Duration{5 * ms, 570 * ms, 20 * ms}, time.Second, 1710 * ms},
		{[]time.Duration{5 * time.Second}, time.Second, 3 * time.Second},
		{[]time.Duration{5 * time.Second}, 4 * time.Second, 4 * time.Second}, // a deadline longer than the ceiling
	} {
		if got := postgres.QuestionBudget(c.recent, c.floor); got != c.want {
			t.Errorf("budget after %v, floor %v = %v, want %v", c.recent, c.floor, got, c.want)
		}
	}
	// Only the last 64 answers count.
	recent := []time.Duration{2 * time.Second}
	for range 64 {
		recent = append(recent, ms)
	}
	if got := postgres.QuestionBudget(recent, time.Second); got != time.Second {
		t.Errorf("budget after a slow answer and 64 quick ones = %v, want the floor", got)
	}
}

// appName is the application name of db's sessions, which the store's
// share: a session of that name running a statement passes for sluice's.
func appName(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	var app string
	if err := db.Pool.QueryRow(context.Background(), "SELECT current_setting('application_name')").Scan(&app); err != nil {
		t.Fatal(err)
	}
	return app
}

// holdRow runs, on a connection of its own named app, one statement that
// locks rule's counters and sleeps for hold while it runs, and returns
// once it sleeps (the lock taken); the channel receives its end.
func holdRow(t *testing.T, db *pgtest.DB, app, rule string, hold time.Duration) <-chan error {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done, finished := make(chan error, 1), make(chan struct{})
	t.Cleanup(func() {
		<-finished // the statement ends by itself, within hold
		conn.Close(context.Background())
	})
	go func() {
		_, err := conn.Exec(ctx, "SELECT pg_sleep($2) FROM (SELECT 1 FROM "+db.Table("counters")+
			" WHERE rule = $1 FOR UPDATE) AS locked", rule, hold.Seconds())
		done <- err
		close(finished)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; {
		var running bool
		// Sleeping: the row, fetched before, is locked.
		if err := db.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND wait_event = 'PgSleep')", app).Scan(&running); err != nil {
			t.Fatal(err)
		}
		if running {
			return done
		}
		if time.Now().After(deadline) {
			t.Fatal("the holding statement did not start within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Load is not an outage: a decide statement that waits longer than the
// deadline for a counter that another sluice statement holds while it
// runs is answered when that statement ends, not failed, and the store
// asks the database about it a few times, not every deadline; one that waits
// for a stranger (a session of another application) fails soon after the
// deadline, with a timeout the breaker counts.
func TestLateStatementBehindSluiceIsLoad(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)
	log, logs := observedLog(t, zapcore.WarnLevel)
	s := open(t, db, nil, nil, unleased, func(o *postgres.Options) { o.DecisionTimeout, o.Logger = 50*time.Millisecond, log })
	r := fixed("held", 10, time.Hour)
	decide(t, s, chk(r, "k")) // the counter exists
	app := appName(t, db)

	held := holdRow(t, db, app, r.Name, 1500*time.Millisecond)
	began := time.Now()
	asked := postgres.ProgressQuestions(s)
	res := make([]limiter.Result, 1)
	allowed, err := s.Decide(ctx, []limiter.Check{chk(r, "k")}, res)
	took := time.Since(began)
	if err != nil || !allowed {
		t.Fatalf("behind a running sluice statement: allowed %v, err %v after %v; want allowed once it ends", allowed, err, took)
	}
	if took < time.Second {
		t.Errorf("answered after %v: the counter was held for 1.5s, so the statement cannot have waited for it", took)
	}
	// Asked at the deadline, then after 50, 100, 200, 400 and 800 ms:
	// about 6 questions. Asked every deadline, it was about 28.
	if n := postgres.ProgressQuestions(s) - asked; n > 10 {
		t.Errorf("%d progress questions about one statement that waited %v: want the waits between them to grow", n, took.Round(time.Millisecond))
	}
	if err := <-held; err != nil {
		t.Fatal(err)
	}

	held = holdRow(t, db, "someone-else", r.Name, 3*time.Second)
	began = time.Now()
	allowed, err = s.Decide(ctx, []limiter.Check{chk(r, "k")}, res)
	took = time.Since(began)
	if allowed || limiter.ErrorKind(err) != limiter.ErrorTimeout {
		t.Fatalf("behind a stranger's statement: allowed %v, err %v; want a timeout", allowed, err)
	}
	if took > 2*time.Second {
		t.Errorf("failed after %v; want soon after the 50ms deadline, long before the stranger's 3s end", took)
	}
	t.Logf("behind a stranger: failed after %v", took.Round(time.Millisecond))
	// The log names the stranger, so that an operator can find it.
	late := logs.FilterMessageSnippet("missed its deadline").All()
	if len(late) != 1 {
		t.Fatalf("%d log lines of a statement that missed its deadline, want 1", len(late))
	}
	why, _ := late[0].ContextMap()["why"].(string)
	t.Logf("why: %s", why)
	for _, want := range []string{"application_name 'someone-else'", "client backend", "active for", "'SELECT pg_sleep($2) FROM"} {
		if !strings.Contains(why, want) {
			t.Errorf("the log says why %q, which does not name the stranger: no %q", why, want)
		}
	}
	<-held
}

// TestStatementBoundSaysWhatItWaitedFor: a statement that the database
// keeps calling progressing, behind a running sluice statement longer
// than the store's StatementTimeout, fails at that bound, and the log says
// what its server process waited for.
func TestStatementBoundSaysWhatItWaitedFor(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)
	log, logs := observedLog(t, zapcore.WarnLevel)
	s := open(t, db, nil, nil, unleased, func(o *postgres.Options) {
		o.DecisionTimeout = 50 * time.Millisecond
		o.StatementTimeout = 600 * time.Millisecond
		o.Logger = log
	})
	r := fixed("bound", 10, time.Hour)
	decide(t, s, chk(r, "k")) // the counter exists
	app := appName(t, db)
	held := holdRow(t, db, app, r.Name, 2*time.Second)
	res := make([]limiter.Result, 1)
	allowed, err := s.Decide(ctx, []limiter.Check{chk(r, "k")}, res)
	if allowed || limiter.ErrorKind(err) != limiter.ErrorTimeout {
		t.Fatalf("behind a sluice statement longer than the bound: allowed %v, err %v; want a timeout", allowed, err)
	}
	var said []string
	for _, e := range logs.FilterMessageSnippet("ran into its bound").All() {
		said = append(said, e.ContextMap()["waiting"].(string))
	}
	if len(said) != 1 || !strings.HasPrefix(said[0], "Lock:") {
		t.Errorf("logged waiting %q, want one entry naming the lock it waited for", said)
	}
	<-held
}

// TestQuestionOverADeadChecker: the connection the store asks its progress
// questions on dies with its server process (the server restarted, as in
// the fault tests' kills, or the backend was terminated), and pgx learns
// it only when it next uses it. A statement late behind a running sluice
// statement is still found progressing, over a new connection, and
// answered; it used to fail at once with a timeout, which the fault tests
// saw as 503s right after a restarted database was called ready.
func TestQuestionOverADeadChecker(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)
	// An application name of its own, so that the checking connection to
	// end is this store's, not that of a test running beside it.
	app := "sluice-" + db.Schema
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := open(t, db, pool, nil, unleased, func(o *postgres.Options) { o.DecisionTimeout = 50 * time.Millisecond })
	runStore(t, s) // Run keeps the checking connection open
	r := fixed("dead-checker", 10, time.Hour)
	decide(t, s, chk(r, "k")) // the counter exists
	res := make([]limiter.Result, 1)
	late := func(what string) {
		t.Helper()
		held := holdRow(t, db, app, r.Name, 400*time.Millisecond)
		if allowed, err := s.Decide(ctx, []limiter.Check{chk(r, "k")}, res); err != nil || !allowed {
			t.Fatalf("%s: behind a running sluice statement: allowed %v, err %v; want allowed once it ends", what, allowed, err)
		}
		if err := <-held; err != nil {
			t.Fatal(err)
		}
	}
	late("first") // asked over the checking connection
	// The checking connection's server process ends; the client does not
	// know until it sends.
	var ended int
	if err := db.Pool.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid() AND query LIKE '%pg_blocking_pids%'", app).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	// One, or two when the first question went over the pool (the
	// checking connection was not open yet); a pool connection ended too
	// is made again by the decision's retry.
	if ended < 1 {
		t.Fatalf("no session of this store asked the progress question")
	}
	late("after the checking connection died")
}
