//go:build unix

package pgtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// recorder is a testing.TB that records Fatalf and Skipf instead of
// stopping the test.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                        {}
func (r *recorder) Fatalf(format string, a ...any) { r.fatal = fmt.Sprintf(format, a...) }
func (r *recorder) Skipf(format string, a ...any)  { r.skip = fmt.Sprintf(format, a...) }

// TestToolMissing: a missing program skips a fault test locally and fails
// it under CI, never passing silently.
func TestToolMissing(t *testing.T) {
	const name = "sluice-no-such-program"
	t.Setenv("CI", "")
	r := &recorder{TB: t}
	if p := Tool(r, name); p != "" || r.fatal != "" || !strings.Contains(r.skip, name+" not found") {
		t.Errorf("without CI: path %q, fatal %q, skip %q; want a skip naming the program", p, r.fatal, r.skip)
	}
	t.Setenv("CI", "true")
	r = &recorder{TB: t}
	if p := Tool(r, name); p != "" || r.skip != "" || !strings.Contains(r.fatal, "CI is set") {
		t.Errorf("with CI: path %q, fatal %q, skip %q; want a failure", p, r.fatal, r.skip)
	}
}

func TestToolFound(t *testing.T) {
	if p := Tool(t, "sh"); !strings.HasSuffix(p, "/sh") {
		t.Errorf("Tool(sh) = %q", p)
	}
}

// TestKilledBinaryLeavesNoServer: a test binary killed with SIGKILL in the
// middle of a test (no cleanup runs) takes its private server with it, and
// the next NewCluster removes the directory it left.
func TestKilledBinaryLeavesNoServer(t *testing.T) {
	if os.Getenv("PGTEST_KILLED_CHILD") == "1" {
		c := NewCluster(t, ClusterOptions{})
		fmt.Printf("cluster %d %s\n", c.Port, c.Dir)
		time.Sleep(time.Minute) // killed long before
		return
	}
	Tool(t, "initdb")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledBinaryLeavesNoServer$", "-test.v")
	cmd.Env = append(os.Environ(), "PGTEST_KILLED_CHILD=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		port int
		dir  string
	)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if n, _ := fmt.Sscanf(sc.Text(), "cluster %d %s", &port, &dir); n == 2 {
			break
		}
	}
	if port == 0 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("the child made no cluster")
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if c, err := net.Dial("tcp", addr); err != nil {
		t.Fatalf("the child's server does not listen: %v", err)
	} else {
		c.Close()
	}
	cmd.Process.Kill()
	cmd.Wait() //nolint:errcheck // killed
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("the server of a killed test binary still listens on %s 10s later", addr)
		}
		time.Sleep(20 * time.Millisecond) // the server's exit is an external event: poll it
	}
	removeOrphans()
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the killed binary's directory %s is still there: %v", dir, err)
	}
}

// TestKillWhileConnecting: the server is killed while clients open
// connections as fast as they can, so the postmaster is forking backends at
// the moment of the kill, and started again at once. Each start succeeds:
// no backend forked around the kill outlives it holding the shared memory.
// Pause and Resume under the same flood leave no backend running.
func TestKillWhileConnecting(t *testing.T) {
	c := NewCluster(t, ClusterOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(ctx, time.Second)
				if conn, err := c.Connect(cctx); err == nil {
					conn.Close(cctx)
				}
				ccancel()
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	for round := range 10 {
		time.Sleep(50 * time.Millisecond)
		c.Pause(t)
		running := func() (running []string) {
			for _, pid := range c.processes() {
				if state, _, ok := procStat(pid); ok && state != "T" && state != "Z" {
					running = append(running, fmt.Sprintf("%d (%s)", pid, state))
				}
			}
			return running
		}
		// A stop signal takes effect when its process is next scheduled.
		for deadline := time.Now().Add(5 * time.Second); len(running()) > 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				c.Resume(t)
				t.Fatalf("round %d: processes of the paused server still run: %v", round, running())
			}
		}
		c.Resume(t)
		time.Sleep(50 * time.Millisecond)
		c.Kill(t)
		c.Start(t)
	}
}

// TestRequireSynchronousStandbyWaitsForCommits: a new connection shows
// synchronous_standby_names as soon as the postmaster has reloaded, but a
// commit waits for a standby only once the checkpointer has read the
// setting too. With the checkpointer stopped (SIGSTOP), the setting shows
// and commits do not wait: RequireSynchronousStandby must not return
// then, and once the checkpointer runs again it returns, and commits
// wait. (It used to wait only for the setting to show; a store made in
// between committed a decision at once, in a CI run.)
func TestRequireSynchronousStandbyWaitsForCommits(t *testing.T) {
	c := NewCluster(t, ClusterOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var checkpointer int
	if err := c.Conn(t, ctx).QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'").Scan(&checkpointer); err != nil {
		t.Fatal(err)
	}
	c.signalPids(t, []int{checkpointer}, syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			c.signalPids(t, []int{checkpointer}, syscall.SIGCONT)
		}
	}()
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		c.RequireSynchronousStandby(t)
	}()
	// The setting shows on new connections while the checkpointer is
	// stopped, and commits do not wait.
	for {
		var v string
		if err := c.Conn(t, ctx).QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v == "*" {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if c.commitWaits(t, ctx) {
		t.Fatal("a commit waited with the checkpointer stopped: the test cannot show the wait")
	}
	select {
	case <-returned:
		t.Fatal("RequireSynchronousStandby returned while commits did not wait")
	case <-time.After(500 * time.Millisecond):
	}
	c.signalPids(t, []int{checkpointer}, syscall.SIGCONT)
	stopped = false
	select {
	case <-returned:
	case <-time.After(20 * time.Second):
		t.Fatal("RequireSynchronousStandby did not return once the checkpointer ran")
	}
	if !c.commitWaits(t, ctx) {
		t.Error("after RequireSynchronousStandby, a commit did not wait")
	}
}
