//go:build unix

package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/proctest"
)

// Private clusters: fault tests stop, slow down, fill up and fail over a
// PostgreSQL server, so each makes one of its own with initdb, on a free
// loopback port, in a temporary directory removed when the test ends.
// Nothing they do reaches the shared server of New.
//
// Postgres refuses to run as root. When the tests run as root (as in CI
// containers), the servers, their tools and PgBouncer run as the
// unprivileged user ClusterUser, created with useradd if missing.
//
// Servers and PgBouncer are children of the test process, started with a
// parent-death signal: a test binary that is killed (a timeout, ^C, kill
// -9) takes its servers with it instead of leaving them running, and the
// directories such a binary leaves behind are removed by the next
// NewCluster.
//
// A missing program (initdb, postgres, pg_ctl, pg_basebackup, pgbouncer)
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
	p, err := ToolPath(name)
	if err != nil {
		missing(t, err.Error())
	}
	return p
}

// ToolPath is Tool without a test: the path of the program name, or an
// error saying what to install. The benchmark's private clusters use it.
func ToolPath(name string) (string, error) {
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

	data     string
	cred     *syscall.Credential // the user that runs the server; nil: this process's
	postgres string
	pgCtl    string
	logged   string // server log

	mu     sync.Mutex
	server *exec.Cmd     // the running postmaster, or nil
	exited chan struct{} // closed when it has exited
}

// NewCluster creates a cluster with initdb (trust authentication for user
// postgres on loopback, replication allowed), starts it on a free port and
// registers its stop and removal with t.Cleanup.
func NewCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	initdb := Tool(t, "initdb")
	c := newCluster(t, 0)
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

// ownerFile names the file in a cluster's directory that holds the process
// id of the test binary that made it.
const ownerFile = "owner.pid"

// newCluster makes the directory of a cluster on port (0: a free one)
// owned by the user that will run it, and registers the cluster's stop and
// removal.
func newCluster(t testing.TB, port int) *Cluster {
	t.Helper()
	removeOrphans()
	if port == 0 {
		port = proctest.FreePort(t)
	}
	c := &Cluster{postgres: Tool(t, "postgres"), pgCtl: Tool(t, "pg_ctl"), Port: port}
	if os.Geteuid() == 0 {
		uid, gid := clusterUser(t)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir, err := os.MkdirTemp("", "sluice-pg-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	c.Dir, c.data, c.logged = dir, filepath.Join(dir, "data"), filepath.Join(dir, "server.log")
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		// Immediate: the test is over, nothing needs to be kept.
		c.signal(syscall.SIGQUIT)
		c.waitExit(30 * time.Second)
		os.RemoveAll(dir)
	})
	if c.cred != nil {
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	return c
}

// removeOrphans removes the directories of clusters whose test binary is
// gone (killed before its cleanup ran). Their servers died with it.
func removeOrphans() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "sluice-pg-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue // being made, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil || errors.Is(syscall.Kill(pid, 0), syscall.EPERM) {
			continue
		}
		os.RemoveAll(d)
	}
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
	cmd := exec.Command(prog, args...)
	cmd.Dir = c.Dir
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd
}

// URL is the connection string of the server's postgres database as the
// postgres superuser.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
}

// NewEmptyCluster makes a cluster without its data directory, for a test
// whose own program makes one (a deployment script that runs
// pg_basebackup, say) and starts the server with StartCommand. Like
// NewCluster's, it has a free port, runs as ClusterUser when the tests run
// as root, and is stopped and removed when the test ends.
func NewEmptyCluster(t testing.TB) *Cluster {
	t.Helper()
	return newCluster(t, 0)
}

// DataDir is the cluster's data directory, which a cluster of
// NewEmptyCluster does not have until something makes it.
func (c *Cluster) DataDir() string {
	return c.data
}

// Start starts the server and waits until it accepts connections (a
// standby: until it is ready for read-only ones).
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	c.start(t, c.Command(c.postgres, "-D", c.data))
}

// StartCommand starts the server with prog and args instead of postgres
// itself, as the cluster's user, in Dir, with exactly the environment env,
// and waits as Start does. prog must end by exec'ing postgres on DataDir
// and Port, so that Stop, Kill, Promote and the end of the test reach the
// server. Its output goes to the server's log.
func (c *Cluster) StartCommand(t testing.TB, env []string, prog string, args ...string) {
	t.Helper()
	cmd := c.Command(prog, args...)
	cmd.Env = env
	c.start(t, cmd)
}

func (c *Cluster) start(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	logf, err := os.OpenFile(c.logged, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	exited, err := proctest.StartChild(cmd, syscall.SIGQUIT) // SIGQUIT: immediate shutdown
	if err != nil {
		t.Fatalf("pgtest: start cluster on port %d: %v", c.Port, err)
	}
	c.mu.Lock()
	c.server, c.exited = cmd, exited
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		conn, err := c.Connect(ctx)
		if err == nil {
			conn.Close(ctx)
			return
		}
		select {
		case <-exited:
			t.Fatalf("pgtest: the server on port %d exited: %v\n%s", c.Port, err, c.Log())
		case <-ctx.Done():
			t.Fatalf("pgtest: the server on port %d does not accept connections: %v\n%s", c.Port, err, c.Log())
		case <-time.After(20 * time.Millisecond): // start-up is an external event: poll it
		}
	}
}

// Stop stops the server in fast mode: sessions are terminated (their
// clients see SQLSTATE 57P01), the server is down when Stop returns.
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	c.signal(syscall.SIGINT) // fast shutdown
	if !c.waitExit(60 * time.Second) {
		t.Fatalf("pgtest: the server on port %d did not stop within 60s\n%s", c.Port, c.Log())
	}
}

// Kill kills the server and every process of it with SIGKILL, as a crash
// of its machine would; Start then runs crash recovery.
func (c *Cluster) Kill(t testing.TB) {
	t.Helper()
	pids := c.freeze(t)
	c.signalPids(t, pids, syscall.SIGKILL)
	if !c.waitExit(60 * time.Second) {
		t.Fatalf("pgtest: the server on port %d did not die", c.Port)
	}
	// Wait for every process that was killed, so that nothing holds the
	// port or the shared memory when Start runs. Once the postmaster is
	// gone its children belong to another parent, so they are waited for
	// by the pids listed while it was frozen.
	for deadline := time.Now().Add(30 * time.Second); anyAlive(pids); {
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: processes of the killed server on port %d remain", c.Port)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Pause stops every process of the server with SIGSTOP: connections stay
// open and nothing answers, as on a stalled machine. Resume continues
// them.
func (c *Cluster) Pause(t testing.TB) {
	t.Helper()
	c.signalPids(t, c.freeze(t), syscall.SIGSTOP)
}

// Resume continues a paused server: its children first, then the
// postmaster, which alone starts new ones.
func (c *Cluster) Resume(t testing.TB) {
	t.Helper()
	pids := c.processes()
	if len(pids) > 0 {
		pids = append(pids[1:], pids[0])
	}
	c.signalPids(t, pids, syscall.SIGCONT)
}

// freeze stops the postmaster with SIGSTOP and returns its pid and those of
// its children. Stopped, it forks no backend between the listing and the
// signal that follows it: a backend forked a moment after a listing would
// otherwise outlive a kill and hold the shared memory, and Start would
// then fail ("pre-existing shared memory block is still in use").
func (c *Cluster) freeze(t testing.TB) []int {
	t.Helper()
	c.mu.Lock()
	server := c.server
	c.mu.Unlock()
	if server == nil || server.Process == nil {
		return nil
	}
	c.signal(syscall.SIGSTOP)
	// The signal takes effect when the postmaster is next scheduled; until
	// then it may still fork.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		state, _, ok := procStat(server.Process.Pid)
		if !ok || state == "T" || state == "Z" {
			return c.processes()
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: the postmaster on port %d did not stop (state %s)", c.Port, state)
		}
	}
}

// signal sends sig to the postmaster, if it runs.
func (c *Cluster) signal(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.server != nil && c.server.Process != nil {
		c.server.Process.Signal(sig) //nolint:errcheck // it may have exited
	}
}

// signalPids sends sig to each of pids that still exists.
func (c *Cluster) signalPids(t testing.TB, pids []int, sig syscall.Signal) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("pgtest: signal %v to %d: %v", sig, pid, err)
		}
	}
}

// anyAlive reports whether any of pids is a process that has not exited
// (a zombie has: it holds no memory and no port).
func anyAlive(pids []int) bool {
	for _, pid := range pids {
		if state, _, ok := procStat(pid); ok && state != "Z" {
			return true
		}
	}
	return false
}

// procStat returns the state and the parent's pid of process pid, from
// /proc; ok is false when there is no such process.
func procStat(pid int) (state string, ppid int, ok bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", 0, false
	}
	// The fields after the command, which is in parentheses and may hold
	// spaces: state, then the parent's pid.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 2 {
		return "", 0, false
	}
	ppid, _ = strconv.Atoi(fields[1])
	return fields[0], ppid, true
}

// processes returns the postmaster's pid (if it runs) followed by those of
// its children.
func (c *Cluster) processes() []int {
	c.mu.Lock()
	server, exited := c.server, c.exited
	c.mu.Unlock()
	if server == nil || server.Process == nil {
		return nil
	}
	pm := server.Process.Pid
	var pids []int
	select {
	case <-exited:
	default:
		pids = append(pids, pm)
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(pid); ok && ppid == pm {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitExit waits up to d for the postmaster to exit and reports whether it
// has (or was not running).
func (c *Cluster) waitExit(d time.Duration) bool {
	c.mu.Lock()
	exited := c.exited
	c.mu.Unlock()
	if exited == nil {
		return true
	}
	select {
	case <-exited:
		return true
	case <-time.After(d):
		return false
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
	return c.NewStandbyAt(t, 0)
}

// NewStandbyAt is NewStandby on port (0: a free one), such as the port of
// a primary that died, so that a connection string listing the servers'
// ports keeps naming every server through failovers.
func (c *Cluster) NewStandbyAt(t testing.TB, port int) *Cluster {
	t.Helper()
	basebackup := Tool(t, "pg_basebackup")
	s := newCluster(t, port)
	out, err := s.run(basebackup, "-h", "127.0.0.1", "-p", strconv.Itoa(c.Port), "-U", "postgres",
		"-D", s.data, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	if err != nil {
		t.Fatalf("pgtest: pg_basebackup: %v\n%s", err, out)
	}
	s.configure(t, nil) // its own port and sockets
	s.Start(t)
	return s
}

// RequireSynchronousStandby makes every commit on c wait until a standby
// has flushed it (synchronous_standby_names '*', synchronous_commit on),
// as a server with synchronous replication does; with no standby
// attached, commits wait. The setting is in postgresql.auto.conf, which a
// standby made from c afterwards copies: promoted, it waits for a standby
// of its own. Call it while no standby is attached: it returns once a
// commit waits.
func (c *Cluster) RequireSynchronousStandby(t testing.TB) {
	t.Helper()
	c.Exec(t, "ALTER SYSTEM SET synchronous_standby_names = '*'")
	c.Exec(t, "SELECT pg_reload_conf()")
	// The reload reaches the server's processes by a signal, later, and a
	// commit waits for a standby only once the checkpointer has read it:
	// it keeps the flag in shared memory that every commit looks at.
	// Until then a new connection already shows the setting and its
	// commits do not wait (a store made at that moment committed a
	// decision at once, in a CI run). So: until a commit waits.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !c.commitWaits(t, ctx) {
		time.Sleep(5 * time.Millisecond) // the reload is the server's: poll it
	}
}

// commitWaits reports whether a commit on c waits for a standby: it
// commits a transaction that writes (an xid and a WAL record: a
// transactional logical message, which needs no table) on one connection
// and, if
// another sees it wait (wait event SyncRep), cancels the wait, which
// Postgres ends by committing locally with a warning.
func (c *Cluster) commitWaits(t testing.TB, ctx context.Context) bool {
	t.Helper()
	// Closed here, not at the end of the test: the caller polls.
	var conns [2]*pgx.Conn
	for i := range conns {
		conn, err := c.Connect(ctx)
		if err != nil {
			t.Fatalf("pgtest: connect to port %d: %v", c.Port, err)
		}
		defer conn.Close(context.Background())
		conns[i] = conn
	}
	writer, admin := conns[0], conns[1]
	pid := writer.PgConn().PID()
	done := make(chan error, 1)
	go func() {
		_, err := writer.Exec(ctx, "SELECT pg_logical_emit_message(true, 'pgtest', '')")
		done <- err
	}()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("pgtest: %v", err)
			}
			return false // committed without waiting
		case <-time.After(5 * time.Millisecond): // the commit is the server's: poll it
		}
		var waiting bool
		if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep')", pid).Scan(&waiting); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		if waiting {
			if _, err := admin.Exec(ctx, "SELECT pg_cancel_backend($1)", pid); err != nil {
				t.Fatalf("pgtest: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("pgtest: %v", err)
			}
			return true
		}
	}
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

// Conn opens one connection to the server as the superuser, failing t when
// it cannot, and closes it when the test ends.
func (c *Cluster) Conn(t testing.TB, ctx context.Context) *pgx.Conn {
	t.Helper()
	conn, err := c.Connect(ctx)
	if err != nil {
		t.Fatalf("pgtest: connect to port %d: %v", c.Port, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
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
	b := &PgBouncer{Port: proctest.FreePort(t), log: filepath.Join(c.Dir, "pgbouncer.log")}
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
	exited, err := proctest.StartChild(cmd, syscall.SIGTERM)
	if err != nil {
		t.Fatalf("pgtest: start pgbouncer: %v", err)
	}
	t.Cleanup(func() { proctest.Stop(cmd, exited, 10*time.Second) })
	if !proctest.Accepts(fmt.Sprintf("127.0.0.1:%d", b.Port), exited, 10*time.Second, 10*time.Millisecond) {
		select {
		case <-exited:
			logged, _ := os.ReadFile(b.log)
			t.Fatalf("pgtest: pgbouncer exited: %v\n%s\n%s", cmd.ProcessState, out.String(), logged)
		default:
			t.Fatalf("pgtest: pgbouncer does not listen on port %d", b.Port)
		}
	}
	return b
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
