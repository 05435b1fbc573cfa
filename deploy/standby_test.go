//go:build unix

package deploy

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
)

// TestSynchronousStandby runs deploy/postgres's scripts as compose.yaml and
// the official postgres image run them, with compose's environment, on
// private clusters of this machine's PostgreSQL programs, then checks what
// the compose file promises:
//
//   - the standby streams, and the primary waits for it (sync_state sync);
//   - both services' healthchecks pass;
//   - with the standby stopped, a commit on the primary waits (its backend
//     waits on SyncRep), and returns once the script has started the
//     standby again, without a cancelled wait;
//   - after the primary is killed with SIGKILL mid-traffic, sluice's
//     SLUICE_DATABASE_URL finds no server to write to while the standby is
//     one; after pg_ctl promote, every commit the primary acknowledged is
//     on the promoted server, which commits without waiting for a standby
//     of its own, and the URL leads there.
//
// Where a container and this machine differ, the test stands in for the
// container: the servers listen on loopback ports of their own (the
// standby's port and socket directory are given as postgres arguments, and
// PRIMARY_HOST and PRIMARY_PORT name the primary's), and the init script
// finds the temporary server's unix socket through PGHOST and PGPORT, as
// it finds the image's default socket there. Nothing else is changed.
func TestSynchronousStandby(t *testing.T) {
	t.Parallel()
	c := composeConfig(t)
	pgSvc, sbSvc, sluiceSvc := c.Services["postgres"], c.Services["postgres-standby"], c.Services["sluice"]
	path := postgresPath(t)

	primary := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	initPrimary(t, primary, pgSvc, path)
	runHealthcheck(t, "postgres", pgSvc, primary, path)

	// The standby's data directory as the image's fresh volume has it:
	// empty, mode 1777, the postgres user's.
	standby := pgtest.NewEmptyCluster(t)
	if out, err := standby.Command("mkdir", "-m", "1777", standby.DataDir()).CombinedOutput(); err != nil {
		t.Fatalf("mkdir: %v\n%s", err, out)
	}
	if len(sbSvc.Entrypoint) == 0 {
		t.Fatal("postgres-standby has no entrypoint")
	}
	script := sbSvc.bindSource(t, sbSvc.Entrypoint[0])
	if script == "" {
		t.Fatalf("postgres-standby's entrypoint %q is not a file of this machine", sbSvc.Entrypoint)
	}
	if want := filepath.Join("deploy", "postgres", "standby.sh"); !strings.HasSuffix(script, want) {
		t.Fatalf("postgres-standby's entrypoint is %s, want the repository's %s", script, want)
	}
	senv := maps.Clone(sbSvc.Environment)
	senv["PRIMARY_HOST"], senv["PRIMARY_PORT"] = "127.0.0.1", strconv.Itoa(primary.Port)
	env := append(environ(senv), "PATH="+path, "PGDATA="+standby.DataDir(), "HOME="+standby.Dir)
	args := append(slices.Clone(sbSvc.Entrypoint[1:]), sbSvc.Command...)
	args = append(args, "-c", "listen_addresses=127.0.0.1", "-c", "port="+strconv.Itoa(standby.Port),
		"-c", "unix_socket_directories="+standby.Dir)
	startStandby := func() { standby.StartCommand(t, env, script, args...) }
	startStandby()
	runHealthcheck(t, "postgres-standby", sbSvc, standby, path)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	super, err := primary.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer super.Close(context.Background())
	name := sbSvc.Environment["STANDBY_NAME"]
	poll(t, fmt.Sprintf("the primary's pg_stat_replication to show %q streaming with sync_state sync", name), func() (bool, string) {
		var state, sync string
		err := super.QueryRow(ctx, "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1", name).Scan(&state, &sync)
		return err == nil && state == "streaming" && sync == "sync", fmt.Sprintf("%s %s %v", state, sync, err)
	}, primary, standby)

	// sluice's connection settings: the compose file's URL, its servers
	// mapped to the clusters' ports.
	servers := map[string]int{"postgres": primary.Port, "postgres-standby": standby.Port}
	sluiceURL := sluiceSvc.Environment["SLUICE_DATABASE_URL"]
	through := func(ctx context.Context, notices *noticeLog) (*pgx.Conn, error) {
		cfg := connConfig(t, sluiceURL, notices)
		cfg.Port = uint16(servers[cfg.Host])
		for _, f := range cfg.Fallbacks {
			f.Port = uint16(servers[f.Host])
			f.Host = "127.0.0.1"
		}
		cfg.Host = "127.0.0.1"
		return pgx.ConnectConfig(ctx, cfg)
	}
	// at connects to one server, as sluice's URL's user to its database.
	at := func(port int, notices *noticeLog) *pgx.Conn {
		t.Helper()
		cfg := connConfig(t, sluiceURL, notices)
		cfg.Host, cfg.Port, cfg.Fallbacks, cfg.ValidateConnect = "127.0.0.1", uint16(port), nil, nil
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatalf("connect to port %d: %v", port, err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	setup := at(primary.Port, nil)
	if _, err := setup.Exec(ctx, "CREATE TABLE counts (id bigint PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}

	// The standby down: a commit waits for it, and returns once it is back.
	standby.Stop(t)
	var waitNotices noticeLog
	waiter := at(primary.Port, &waitNotices)
	if _, err := waiter.Exec(ctx, "SET statement_timeout = '60s'"); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, "INSERT INTO counts VALUES (0)")
		committed <- err
	}()
	poll(t, "the commit to wait for the standby (wait_event SyncRep)", func() (bool, string) {
		select {
		case err := <-committed:
			t.Fatalf("the commit returned (error %v) while the standby was stopped: the primary does not wait for it", err)
		default:
		}
		var waiting int
		err := super.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&waiting)
		return err == nil && waiting == 1, fmt.Sprintf("%d waiting, %v", waiting, err)
	}, primary, standby)
	startStandby() // again: the data directory is there, no new copy
	select {
	case err := <-committed:
		if err != nil {
			t.Fatalf("the commit that waited for the standby: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the commit still waits after the standby started again\nstandby's log:\n%s", standby.Log())
	}
	if n := waitNotices.matching("synchronous replication"); len(n) > 0 {
		t.Fatalf("the commit's wait for the standby ended otherwise than by the standby: %q", n)
	}

	// The primary killed mid-traffic, the standby promoted: every commit
	// the primary acknowledged is there.
	writer := at(primary.Port, nil)
	// The writer sends, when a commit fails, the last one acknowledged.
	type stop struct {
		acked int64
		err   error
	}
	enough, stopped := make(chan struct{}), make(chan stop, 1)
	go func() {
		for id := int64(1); ; id++ {
			if _, err := writer.Exec(ctx, "INSERT INTO counts VALUES ($1)", id); err != nil {
				stopped <- stop{id - 1, err}
				return
			}
			if id == 200 {
				close(enough)
			}
		}
	}()
	select {
	case <-enough:
	case s := <-stopped:
		t.Fatalf("writing to the primary: %v", s.err)
	case <-ctx.Done():
		t.Fatal("the primary did not take 200 commits")
	}
	primary.Kill(t)
	var last int64
	select {
	case s := <-stopped:
		last = s.acked
	case <-time.After(30 * time.Second):
		t.Fatal("commits still succeed on a killed primary")
	}

	short, cancelShort := context.WithTimeout(ctx, 10*time.Second)
	if conn, err := through(short, nil); err == nil {
		conn.Close(context.Background())
		t.Fatal("sluice's database URL connects while only a standby is up: target_session_attrs=read-write is not in force")
	}
	cancelShort()

	standby.Promote(t)
	promoted := at(standby.Port, nil)
	var present, beyond int64
	if err := promoted.QueryRow(ctx, "SELECT count(*) FILTER (WHERE id <= $1), count(*) FILTER (WHERE id > $1) FROM counts WHERE id > 0", last).Scan(&present, &beyond); err != nil {
		t.Fatal(err)
	}
	if present != last {
		t.Fatalf("the promoted standby has %d of the %d commits the primary acknowledged before it was killed", present, last)
	}
	t.Logf("the promoted standby has all %d acknowledged commits (and %d in flight when the primary was killed)", last, beyond)

	// The promoted server commits alone: it waits for no standby of its own.
	var names string
	if err := promoted.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names); err != nil || names != "" {
		t.Fatalf("the promoted standby's synchronous_standby_names %q (%v): it has no standby, so each commit would wait for good", names, err)
	}
	var afterNotices noticeLog
	conn, err := through(ctx, &afterNotices)
	if err != nil {
		t.Fatalf("sluice's database URL after the promotion: %v", err)
	}
	defer conn.Close(context.Background())
	var port int
	var recovering bool
	if err := conn.QueryRow(ctx, "SELECT inet_server_port(), pg_is_in_recovery()").Scan(&port, &recovering); err != nil {
		t.Fatal(err)
	}
	if port != standby.Port || recovering {
		t.Fatalf("sluice's database URL leads to port %d (in recovery: %v), want the promoted standby's %d", port, recovering, standby.Port)
	}
	if _, err := conn.Exec(ctx, "SET statement_timeout = '10s'"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO counts VALUES (-1)"); err != nil {
		t.Fatalf("a commit on the promoted standby: %v", err)
	}
	if n := afterNotices.matching("synchronous replication"); len(n) > 0 {
		t.Fatalf("a commit on the promoted standby waited for a standby: %q", n)
	}
}

// initPrimary makes of primary what the official image's entrypoint makes
// of an empty data directory, with the service's environment: initdb's
// result (here pgtest's cluster) given the superuser POSTGRES_USER with
// POSTGRES_PASSWORD, the database POSTGRES_DB and the image's pg_hba.conf;
// then the service's init scripts, run as the entrypoint runs them; then
// the restart that ends the entrypoint's initialisation.
func initPrimary(t *testing.T, primary *pgtest.Cluster, svc composeService, path string) {
	t.Helper()
	env := svc.Environment
	user, password, db := env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := primary.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, q := range []struct {
		format string
		args   []string
	}{
		{"CREATE ROLE %I WITH SUPERUSER LOGIN PASSWORD %L", []string{user, password}},
		{"CREATE DATABASE %I OWNER %I", []string{db, user}},
	} {
		var stmt string
		if err := conn.QueryRow(ctx, "SELECT format($1, VARIADIC $2::text[])", q.format, q.args).Scan(&stmt); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", q.format, err)
		}
	}

	// The image's pg_hba.conf: initdb's trust on the socket and on
	// loopback, then the entrypoint's line for passwords from anywhere else.
	// In compose, the standby and sluice are other containers, which
	// loopback's lines do not admit; here they are on loopback, so those
	// lines are left out, and only what primary-init.sh adds lets the
	// standby replicate.
	hba := strings.Join([]string{
		"# pgtest's own connections, which the image has not: the superuser postgres.",
		"host all postgres 127.0.0.1/32 trust",
		"# The image has no role postgres (its superuser is POSTGRES_USER).",
		"local all postgres reject",
		"# initdb's default in the image.",
		"local all all trust",
		"local replication all trust",
		"# The entrypoint's (POSTGRES_HOST_AUTH_METHOD unset).",
		"host all all all scram-sha-256",
		"",
	}, "\n")
	if err := os.WriteFile(filepath.Join(primary.DataDir(), "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}

	// The entrypoint runs an executable *.sh init script as the postgres
	// user, with the service's environment, PGDATA (the image's), and
	// PGPASSWORD, which it exports, while the server listens on the unix
	// socket.
	for _, script := range primaryInitScripts(t, svc) {
		cmd := primary.Command(script)
		cmd.Env = append(environ(env), "PATH="+path, "PGDATA="+primary.DataDir(), "HOME="+primary.Dir,
			"PGPASSWORD="+password, "PGHOST="+primary.Dir, "PGPORT="+strconv.Itoa(primary.Port))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("init script %s: %v\n%s", script, err, out)
		}
	}
	primary.Stop(t)
	primary.Start(t)
}

// runHealthcheck runs a service's healthcheck against the cluster that
// stands for it, whose socket the program finds through PGHOST and PGPORT
// as it finds the image's default socket in a container.
func runHealthcheck(t *testing.T, name string, svc composeService, c *pgtest.Cluster, path string) {
	t.Helper()
	if svc.Healthcheck == nil || len(svc.Healthcheck.Test) < 2 || svc.Healthcheck.Test[0] != "CMD" {
		t.Fatalf("%s's healthcheck %v: want a CMD", name, svc.Healthcheck)
	}
	argv := svc.Healthcheck.Test[1:]
	prog := lookIn(path, argv[0])
	if prog == "" {
		t.Fatalf("%s's healthcheck runs %s, which is not in %s", name, argv[0], path)
	}
	env := []string{"PATH=" + path, "PGHOST=" + c.Dir, "PGPORT=" + strconv.Itoa(c.Port)}
	if out, err := proctest.Run("", env, prog, argv[1:]...); err != nil {
		t.Fatalf("%s's healthcheck %q: %v\n%s", name, svc.Healthcheck.Test, err, out)
	}
}

// postgresPath is a PATH on which the scripts find PostgreSQL's programs,
// as they do in the image, and the system's.
func postgresPath(t *testing.T) string {
	t.Helper()
	var dirs []string
	for _, prog := range []string{"postgres", "pg_basebackup", "pg_isready", "psql"} {
		if d := filepath.Dir(pgtest.Tool(t, prog)); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return strings.Join(append(dirs, "/usr/local/bin", "/usr/bin", "/bin"), ":")
}

// lookIn returns the path of the program name in the directories of path,
// or "".
func lookIn(path, name string) string {
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// environ returns env as sorted NAME=value lines.
func environ(env map[string]string) []string {
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		lines = append(lines, k+"="+env[k])
	}
	return lines
}

// connConfig parses url, recording the server's notices in notices (when
// not nil).
func connConfig(t *testing.T, url string, notices *noticeLog) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	cfg.ConnectTimeout = 5 * time.Second
	if notices != nil {
		cfg.OnNotice = notices.add
	}
	return cfg
}

// noticeLog records a connection's notices (warnings included).
type noticeLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *noticeLog) add(_ *pgconn.PgConn, n *pgconn.Notice) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, n.Severity+": "+n.Message)
}

// matching returns the notices that contain s.
func (l *noticeLog) matching(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			out = append(out, m)
		}
	}
	return out
}

// poll waits up to 60 s for done, an external event, and fails with its
// last state and the servers' logs if it does not come.
func poll(t *testing.T, what string, done func() (bool, string), servers ...*pgtest.Cluster) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok, state := done()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, s := range servers {
				fmt.Fprintf(&logs, "\nlog of the server on port %d:\n%s", s.Port, s.Log())
			}
			t.Fatalf("waited 60s for %s; last: %s%s", what, state, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDeployScripts runs shellcheck on deploy/postgres's scripts, which the
// image runs with a POSIX sh (busybox's on Alpine, dash on Debian).
func TestDeployScripts(t *testing.T) {
	t.Parallel()
	shellcheck := tool(t, "shellcheck", "shellcheck")
	scripts, err := filepath.Glob(filepath.Join(root, "deploy", "postgres", "*.sh"))
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts in deploy/postgres (%v)", err)
	}
	out, err := proctest.Run("", nil, shellcheck, append([]string{"--shell=sh", "--severity=style"}, scripts...)...)
	if err != nil {
		t.Fatalf("shellcheck: %v\n%s", err, out)
	}
}
