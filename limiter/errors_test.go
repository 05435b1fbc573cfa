package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/sluicehq/sluice/limiter"
)

type netTimeout struct{}

func (netTimeout) Error() string   { return "i/o timeout" }
func (netTimeout) Timeout() bool   { return true }
func (netTimeout) Temporary() bool { return true }

var _ net.Error = netTimeout{}

type kinded struct{ kind string }

func (k kinded) Error() string          { return "kinded " + k.kind }
func (k kinded) StoreErrorKind() string { return k.kind }

var _ limiter.KindedError = kinded{}

func TestErrorKind(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{context.DeadlineExceeded, "timeout"},
		{fmt.Errorf("decide: %w", context.DeadlineExceeded), "timeout"},
		{&net.OpError{Op: "read", Err: netTimeout{}}, "timeout"},
		{context.Canceled, "canceled"},
		{fmt.Errorf("query: %w", context.Canceled), "canceled"},
		{errors.New("connection refused"), "other"},
		{limiter.ErrBreakerOpen, "other"},
		{nil, "other"},
		// A deadline wins over whatever else the error says.
		{fmt.Errorf("%w: %w", context.DeadlineExceeded, kinded{"connection"}), "timeout"},
		// A database's own codes are its store's to classify: the limiter
		// knows no driver.
		{errors.New("ERROR: relation does not exist (SQLSTATE 42P01)"), "other"},
		// Network errors.
		{fmt.Errorf("connect: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), "connection"},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), "connection"},
		{fmt.Errorf("receive message: %w", io.ErrUnexpectedEOF), "connection"},
		{net.ErrClosed, "connection"},
		// A KindedError knows best, unless it names no kind.
		{fmt.Errorf("decide: %w", kinded{"read_only"}), "read_only"},
		{kinded{"sideways"}, "other"},
	}
	for _, tt := range tests {
		if got := limiter.ErrorKind(tt.err); got != tt.want {
			t.Errorf("ErrorKind(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}
