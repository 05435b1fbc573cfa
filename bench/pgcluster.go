//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
)

// A private cluster: a PostgreSQL server of the run's own, made with
// initdb in a temporary directory on a free loopback port, for a fleet
// that needs more connections than the shared server allows. It is the
// little of internal/pgtest's NewCluster a program needs (pgtest's API
// takes a testing.TB), with the server's durability left alone: fsync,
// full_page_writes and synchronous_commit keep initdb's defaults, so its
// commits cost what the shared server's do. As pgtest's, when the harness
// runs as root the server runs as the unprivileged pgtest.ClusterUser, and
// it dies with the harness (a parent-death signal).

// clusterPrefix names the temporary directories of private clusters; the
// owner file in one holds the pid of the harness that made it.
const (
	clusterPrefix = "sluice-bench-pg-"
	clusterOwner  = "owner.pid"
)

// privateCluster is a running private PostgreSQL server.
type privateCluster struct {
	port           int
	dir            string
	maxConnections int
	cmd            *exec.Cmd
	exited         chan struct{}
}

// startPrivateCluster makes a cluster allowing maxConnections connections
// and starts it; close stops and removes it.
func startPrivateCluster(ctx context.Context, maxConnections int, progress io.Writer) (c *privateCluster, err error) {
	initdb, err := pgtest.ToolPath("initdb")
	if err != nil {
		return nil, err
	}
	postgres, err := pgtest.ToolPath("postgres")
	if err != nil {
		return nil, err
	}
	removeOrphanClusters()
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		if cred, err = clusterCredential(); err != nil {
			return nil, err
		}
	}
	port, err := proctest.Port()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", clusterPrefix)
	if err != nil {
		return nil, err
	}
	c = &privateCluster{port: port, dir: dir, maxConnections: maxConnections}
	defer func() {
		if err != nil {
			c.close() //nolint:errcheck // the error that stopped the start is the one to report
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, clusterOwner), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	command := func(prog string, args ...string) *exec.Cmd {
		cmd := exec.Command(prog, args...)
		cmd.Dir = dir
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		return cmd
	}
	fmt.Fprintf(progress, "fleet: a private cluster (initdb) on 127.0.0.1:%d, max_connections %d, in %s\n", port, maxConnections, dir)
	data := filepath.Join(dir, "data")
	// --no-sync: initdb's own files, which the run throws away, are not
	// flushed; the server's durability is untouched.
	if out, err := command(initdb, "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--no-instructions").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	conf := fmt.Sprintf("\n# bench fleet: a private cluster\nmax_connections = %d\nlisten_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\nlogging_collector = off\nlog_min_messages = warning\n",
		maxConnections, port, dir)
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString(conf)
	if err = errors.Join(err, f.Close()); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the server holds its own descriptor
	cmd := command(postgres, "-D", data)
	cmd.Stdout, cmd.Stderr = logf, logf
	if c.exited, err = proctest.StartChild(cmd, syscall.SIGQUIT); err != nil { // SIGQUIT: immediate shutdown
		return nil, fmt.Errorf("start the private cluster: %w", err)
	}
	c.cmd = cmd
	return c, c.waitAccepting(ctx)
}

// waitAccepting waits until the server accepts connections.
func (c *privateCluster) waitAccepting(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, c.url())
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-c.exited:
			return fmt.Errorf("the private cluster exited: %w\n%s", err, c.log())
		case <-ctx.Done():
			return fmt.Errorf("the private cluster does not accept connections: %w\n%s", err, c.log())
		case <-time.After(50 * time.Millisecond): // start-up is the server's: poll it
		}
	}
}

// url is the connection string of the cluster's postgres database.
func (c *privateCluster) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// log returns the server's log, for error messages.
func (c *privateCluster) log() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
	return string(b)
}

// close stops the server (fast shutdown, then immediate) and removes the
// cluster's directory.
func (c *privateCluster) close() error {
	var err error
	if c.cmd != nil {
		c.cmd.Process.Signal(syscall.SIGINT) //nolint:errcheck // it may have exited
		select {
		case <-c.exited:
		case <-time.After(30 * time.Second):
			c.cmd.Process.Signal(syscall.SIGQUIT) //nolint:errcheck // same
			select {
			case <-c.exited:
			case <-time.After(30 * time.Second):
				err = fmt.Errorf("the private cluster on port %d did not stop; remove %s once it has", c.port, c.dir)
			}
		}
	}
	if err == nil {
		err = os.RemoveAll(c.dir)
	}
	return err
}

// removeOrphanClusters removes the directories of private clusters whose
// harness is gone (killed before it cleaned up); their servers died with
// it.
func removeOrphanClusters() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), clusterPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, clusterOwner))
		if err != nil {
			continue // being made, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // its harness runs
		}
		os.RemoveAll(d)
	}
}

// clusterCredential returns the credential of pgtest.ClusterUser, creating the
// user (a system user without a home or shell) when it is missing.
func clusterCredential() (*syscall.Credential, error) {
	u, err := user.Lookup(pgtest.ClusterUser)
	if err != nil {
		out, addErr := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", pgtest.ClusterUser).CombinedOutput()
		// Another process (a test) may have created it meanwhile.
		if u, err = user.Lookup(pgtest.ClusterUser); err != nil {
			return nil, fmt.Errorf("postgres does not run as root, and user %s could not be created: %v\n%s", pgtest.ClusterUser, addErr, out)
		}
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
