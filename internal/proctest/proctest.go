// Package proctest is test support for the tests that run programs (the
// sluice binary, PostgreSQL, PgBouncer): free loopback ports, a buffer for
// a child's output, starting a child that dies with the test and stopping
// it, waiting for a port to accept, reading a Prometheus exposition, and
// small HTTP calls.
package proctest

import (
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FreePort returns a loopback port that nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// FreeAddr returns 127.0.0.1:port for a FreePort.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", FreePort(t))
}

// Buffer is a bytes.Buffer safe for a process's two output streams and a
// reader.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Stop sends cmd, started by StartChild, SIGTERM and waits up to grace for
// exited to be closed; after that it kills cmd and waits for it. It
// reports whether cmd exited within grace.
func Stop(cmd *exec.Cmd, exited <-chan struct{}, grace time.Duration) bool {
	cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // it may have exited
	select {
	case <-exited:
		return true
	case <-time.After(grace):
		cmd.Process.Kill() //nolint:errcheck
		<-exited
		return false
	}
}

// Accepts waits until addr accepts a TCP connection and reports whether it
// did before limit passed or exited was closed. A port opening is an
// external event: Accepts polls it, every poll.
func Accepts(addr string, exited <-chan struct{}, limit, poll time.Duration) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return true
		}
		select {
		case <-exited:
			return false
		case <-time.After(poll):
		}
	}
	return false
}
