package proctest

import (
	"context"
	"net"
	"sync"
	"testing"
)

// RunFunc is a server's Run as sluice's gateway has it (gateway.Gateway.Run):
// it serves admin at once, opens its public listener with openPublic when
// it is ready to decide, and returns once ctx is cancelled and it has
// stopped.
type RunFunc func(ctx context.Context, admin net.Listener, openPublic func() (net.Listener, error)) error

// Serve runs run in this process on loopback, as main runs a gateway, until
// the test ends or stop is called. admin is the admin listener's URL,
// listening when Serve returns; the public listener's URL arrives on
// public once run opens it. Both listeners take ports the kernel chooses.
// stop cancels run's context and returns what run returned, the same on
// every call.
func Serve(t testing.TB, run RunFunc) (admin string, public <-chan string, stop func() error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opened := make(chan string, 1)
	openPublic := func() (net.Listener, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			opened <- "http://" + l.Addr().String()
		}
		return l, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, l, openPublic) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() { stop() })
	return "http://" + l.Addr().String(), opened, stop
}
