// Package proctest is test support for the tests that run programs (the
// sluice binary, PostgreSQL, PgBouncer, the Debian tools a test drives):
// building the binary, finding a tool, free loopback ports and the
// address a child logged for a listener given port 0, a buffer for a
// child's output, running a tool to its end, starting a child that dies
// with the test (a server: until it accepts) and stopping it, waiting for
// a port to accept, reading a Prometheus exposition or a registry's
// series, small HTTP calls (raw bytes on a connection among them, and an
// upstream's WebSocket upgrade), an upstream that counts the requests
// reaching it, counting the statuses of concurrent requests, and running
// a gateway's Run in-process on loopback.
//
// It is for tests (and the load harness in bench/) only, and imports
// nothing of sluice.
package proctest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FreePort returns a loopback port that nothing listens on now and that
// this process has not returned before.
//
// The port is taken from below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), not from it: a program is often given
// its port seconds before it binds it (sluice opens its public port once
// its store is ready), and an ephemeral port may meanwhile become the
// local end of any outgoing connection on the machine (the gateways' own
// connections to Postgres) or the port of a listener bound to port 0,
// which then makes the program's bind fail with "address already in use"
// and sends its traffic to someone else.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := Port()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return p
}

// Port is FreePort for a program that is not a test (the load harness):
// the same ports, and an error instead of a failed test.
func Port() (int, error) {
	ports.Lock()
	defer ports.Unlock()
	if ports.handed == nil {
		ports.handed = map[int]bool{}
		ports.lo, ports.hi = portRange()
		if ports.hi > ports.lo {
			ports.next = ports.lo + rand.IntN(ports.hi-ports.lo) // other test processes start elsewhere
		}
	}
	for range ports.hi - ports.lo {
		p := ports.next
		if ports.next++; ports.next >= ports.hi {
			ports.next = ports.lo
		}
		if ports.handed[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue // taken
		}
		l.Close()
		ports.handed[p] = true
		return p, nil
	}
	// No range below the ephemeral one, or all of it taken: let the
	// kernel choose.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ports is FreePort's state: the range it hands ports out of, where it
// goes on, and what it has handed out.
var ports struct {
	sync.Mutex
	lo, hi, next int
	handed       map[int]bool
}

// portRange returns [lo, hi): the 10,000 ports below the kernel's
// ephemeral range, or an empty range when that cannot be read or has no
// room below it.
func portRange() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	var first, last int
	if n, _ := fmt.Sscan(string(b), &first, &last); n != 2 || first < 11024 {
		return 0, 0
	}
	return first - 10000, first
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
