//go:build unix

package pgtest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Private clusters: fault tests stop, slow down, fill up and fail over a
// PostgreSQL server, so each makes one of its own with initdb, on a free
// loopback port, in a temporary directory removed when the test ends.
// Nothing they do reaches the shared server of New.
//
// Postgres refuses to run as root. When the tests run as root (as in CI
// containers), the servers and PgBouncer run as the unprivileged user
// ClusterUser, created with useradd if missing, through runuser.
//
// A missing program (initdb, pg_ctl, pg_basebackup, pgbouncer, runuser)
// skips the test with a message saying what to install; when the CI
// environment variable is set, it fails the test instead, so that a CI
// machine without them can never pass for a green run. .ci/run installs
// them.

// ClusterUser is the operating-system user that runs private servers when
// the tests run as root.
const ClusterUser = "sluicetest"

// Tool returns the path of the program name: for PostgreSQL's programs,
// the newest /usr/lib/postgresql/*/bin/name, else name on PATH (or in
// /usr/sbin, where Debian puts pgbouncer). When it is missing, the test is
// skipped, or failed when the CI environment variable is set.
func Tool(t testing.TB, name string) string {
	t.Helper()
	p, err := toolPath(name)
	if err != nil {
		missing(t, err.Error())
	}
	return p
}

func toolPath(name string) (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return pgVersion(b) - pgVersion(a) })
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	install := "PostgreSQL's server programs (Debian: apt-get install postgresql)"
	if name == "pgbouncer" {
		install = "PgBouncer (Debian: apt-get install pgbouncer)"
	} else if name == "runuser" {
		install = "util-linux's runuser"
	}
	return "", fmt.Errorf("%s not found; install %s, or run .ci/run, which installs it", name, install)
}

// pgVersion is the major version in a /usr/lib/postgresql/N/bin path.
func pgVersion(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// missing skips t, or fails it under CI.
func missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("pgtest: %s (CI is set: a fault test may not be skipped)", msg)
		return
	}
	t.Skipf("pgtest: %s; skipping (this fails when CI is set)", msg)
}

// ClusterOptions configure NewCluster.
type ClusterOptions struct {
	// Settings are written to postgresql.conf, e.g. "max_connections":
	// "8". They override the defaults of NewCluster.
	Settings map[string]string
}

// Cluster is a private PostgreSQL server for one test.
type Cluster struct {
	// Port is the server's port on 127.0.0.1.
	Port int
	// Dir is the cluster's directory: data directory, server log and
	// sockets; removed when the test ends.
	Dir string

	data   string
	as     []string // runuser prefix, or nil
	pgCtl  string
	logged string // server log
}

// NewCluster creates a cluster with initdb (trust authentication for user
// postgres on loopback, replication allowed), starts it on a free port and
// registers its stop and removal with t.Cleanup.
func NewCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	initdb := Tool(t, "initdb")
	c := newCluster(t)
	out, err := c.run(initdb, "-D", c.data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--no-instructions")
	if err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	settings := map[string]string{
		"fsync":             "off",
		"full_page_writes":  "off",
		"shared_buffers":    "16MB",
		"max_connections":   "100",
		"log_min_messages":  "warning",
		"wal_level":         "replica",
		"max_wal_senders":   "4",
		"wal_keep_size":     "64MB",
		"hot_standby":       "on",
		"logging_collector": "off",
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	c.configure(t, settings)
	c.Start(t)
	return c
}

// newCluster makes the directory of a cluster owned by the user that will
// run it, and registers the cluster's stop and removal.
func newCluster(t testing.TB) *Cluster {
	t.Helper()
	c := &Cluster{pgCtl: Tool(t, "pg_ctl"), Port: freePort(t)}
	if os.Geteuid() == 0 {
		c.as = []string{Tool(t, "runuser"), "-u", ClusterUser, "--"}
	}
	dir, err := os.MkdirTemp("", "sluice-pg-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	c.Dir, c.data, c.logged = dir, filepath.Join(dir, "data"), filepath.Join(dir, "server.log")
	t.Cleanup(func() {
		// Immediate: the test is over, nothing needs to be kept.
		c.run(c.pgCtl, "-D", c.data, "-m", "immediate", "-w", "stop") //nolint:errcheck // may be stopped already
		os.RemoveAll(dir)
	})
	if c.as != nil {
		uid, gid := clusterUser(t)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	return c
}

// clusterUser returns the ids of ClusterUser, creating the user if missing.
func clusterUser(t testing.TB) (uid, gid int) {
	t.Helper()
	u, err := user.Lookup(ClusterUser)
	if err != nil {
		useradd := Tool(t, "useradd")
		out, addErr := exec.Command(useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ClusterUser).CombinedOutput()
		// Another test process may have created it meanwhile.
		if u, err = user.Lookup(ClusterUser); err != nil {
			t.Fatalf("pgtest: create user %s: %v\n%s", ClusterUser, addErr, out)
		}
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid
}

// configure appends settings to postgresql.conf, where later lines win.
func (c *Cluster) configure(t testing.TB, settings map[string]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("\n# pgtest\n")
	keys := make([]string, 0, len(settings)+3)
	for k := range settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(settings[k], "'", "''"))
	}
	fmt.Fprintf(&b, "listen_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\n", c.Port, c.Dir)
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer f.Close()
	if _, err := f.WriteString(b.String()); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

// run runs a program as the cluster's user and returns its output.
func (c *Cluster) run(prog string, args ...string) ([]byte, error) {
	return c.Command(prog, args...).CombinedOutput()
}

// Command returns a command that runs prog with args as the cluster's
// operating-system user, in Dir.
func (c *Cluster) Command(prog string, args ...string) *exec.Cmd {
	argv := append(append(slices.Clone(c.as), prog), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = c.Dir
	return cmd
}

// URL is the connection string of the server's postgres database as the
// postgres superuser.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
}

// Start starts the server and waits until it accepts connections (a
// standby: until it is ready for read-only ones).
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	if out, err := c.run(c.pgCtl, "-D", c.data, "-l", c.logged, "-w", "-t", "60", "start"); err != nil {
		t.Fatalf("pgtest: start cluster on port %d: %v\n%s\n%s", c.Port, err, out, c.Log())
	}
}

// Stop stops the server in fast mode: sessions are terminated (their
// clients see SQLSTATE 57P01), the server is down when Stop returns.
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	if out, err := c.run(c.pgCtl, "-D", c.data, "-m", "fast", "-w", "-t", "60", "stop"); err != nil {
		t.Fatalf("pgtest: stop cluster on port %d: %v\n%s", c.Port, err, out)
	}
}

// Promote turns a standby into a primary and waits until it takes writes.
func (c *Cluster) Promote(t testing.TB) {
	t.Helper()
	if out, err := c.run(c.pgCtl, "-D", c.data, "-w", "-t", "60", "promote"); err != nil {
		t.Fatalf("pgtest: promote cluster on port %d: %v\n%s\n%s", c.Port, err, out, c.Log())
	}
}

// Log returns the server's log, for failure messages.
func (c *Cluster) Log() string {
	b, _ := os.ReadFile(c.logged)
	return string(b)
}

// NewStandby makes a streaming standby of c with pg_basebackup -R on a
// free port of its own, starts it and registers its removal.
func (c *Cluster) NewStandby(t testing.TB) *Cluster {
	t.Helper()
	basebackup := Tool(t, "pg_basebackup")
	s := newCluster(t)
	out, err := s.run(basebackup, "-h", "127.0.0.1", "-p", strconv.Itoa(c.Port), "-U", "postgres",
		"-D", s.data, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	if err != nil {
		t.Fatalf("pgtest: pg_basebackup: %v\n%s", err, out)
	}
	s.configure(t, nil) // its own port and sockets
	s.Start(t)
	return s
}

// Exec runs sql on the server's postgres database as the superuser, in a
// connection of its own.
func (c *Cluster) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := c.Connect(ctx)
	if err != nil {
		t.Fatalf("pgtest: connect to port %d: %v", c.Port, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// Connect opens one connection to the server as the superuser.
func (c *Cluster) Connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.Connect(ctx, c.URL())
}

// WaitForStandby waits until the standby s has replayed everything c had
// written when it was called.
func (c *Cluster) WaitForStandby(t testing.TB, s *Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	primary, err := c.Connect(ctx)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer primary.Close(context.Background())
	var lsn string
	if err := primary.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	standby, err := s.Connect(ctx)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer standby.Close(context.Background())
	for {
		var caught bool
		err := standby.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", lsn).Scan(&caught)
		if err != nil {
			t.Fatalf("pgtest: standby on port %d did not replay up to %s: %v", s.Port, lsn, err)
		}
		if caught {
			return
		}
		time.Sleep(5 * time.Millisecond) // replication is an external event: poll it
	}
}

// PgBouncer is a PgBouncer process in front of a Cluster.
type PgBouncer struct {
	// Port is PgBouncer's port on 127.0.0.1.
	Port int
	log  string
}

// NewPgBouncer starts PgBouncer in front of c's postgres database, with
// authentication off (auth_type any: every client is the postgres user on
// the server), the given settings added to its [pgbouncer] section (e.g.
// "pool_mode": "transaction"), and stops it when the test ends.
func (c *Cluster) NewPgBouncer(t testing.TB, settings map[string]string) *PgBouncer {
	t.Helper()
	prog := Tool(t, "pgbouncer")
	b := &PgBouncer{Port: freePort(t), log: filepath.Join(c.Dir, "pgbouncer.log")}
	conf := map[string]string{
		"listen_addr":               "127.0.0.1",
		"listen_port":               strconv.Itoa(b.Port),
		"unix_socket_dir":           "",
		"auth_type":                 "any",
		"max_client_conn":           "1000",
		"default_pool_size":         "10",
		"logfile":                   b.log,
		"ignore_startup_parameters": "extra_float_digits",
	}
	for k, v := range settings {
		conf[k] = v
	}
	var ini bytes.Buffer
	fmt.Fprintf(&ini, "[databases]\npostgres = host=127.0.0.1 port=%d dbname=postgres user=postgres\n\n[pgbouncer]\n", c.Port)
	keys := make([]string, 0, len(conf))
	for k := range conf {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&ini, "%s = %s\n", k, conf[k])
	}
	path := filepath.Join(c.Dir, fmt.Sprintf("pgbouncer-%d.ini", b.Port))
	if err := os.WriteFile(path, ini.Bytes(), 0o644); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cmd := c.Command(prog, path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Its own process group, so that stopping it reaches PgBouncer through
	// runuser.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("pgtest: start pgbouncer: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) //nolint:errcheck // may have exited
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
			<-exited
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", b.Port), time.Second)
		if err == nil {
			conn.Close()
			return b
		}
		select {
		case err := <-exited:
			logged, _ := os.ReadFile(b.log)
			t.Fatalf("pgtest: pgbouncer exited: %v\n%s\n%s", err, out.String(), logged)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: pgbouncer does not listen on port %d: %v", b.Port, err)
		}
		time.Sleep(10 * time.Millisecond) // startup is an external event: poll it
	}
}

// URL is the connection string of the postgres database through
// PgBouncer. query is appended as the URL's query string after
// sslmode=disable, e.g. "default_query_exec_mode=exec".
func (b *PgBouncer) URL(query string) string {
	u := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", b.Port)
	if query != "" {
		u += "&" + query
	}
	return u
}

// Log returns PgBouncer's log, for failure messages.
func (b *PgBouncer) Log() string {
	s, _ := os.ReadFile(b.log)
	return string(s)
}

// freePort returns a loopback port that nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
