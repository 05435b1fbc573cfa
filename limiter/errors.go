package limiter

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"syscall"
)

// Errors and their kinds. Being over a limit is never an error (it is a
// Result); an error means the store could not decide, and its kind says
// why, in fixed words that metrics, logs and alerts select on.

// ErrBreakerOpen is the Outcome.Err of a decision for which the Breaker
// refused to call the store.
var ErrBreakerOpen = errors.New("limiter: store circuit breaker is open")

// Kinds of store errors, the values of the kind label of
// sluice_store_errors_total and of the kind field of log lines. They are
// fixed words, so that alerts can select on them.
const (
	// ErrorTimeout: the store did not answer within the decision's
	// deadline (the context's deadline, a network timeout, or the server
	// cancelling the statement).
	ErrorTimeout = "timeout"
	// ErrorCanceled: the caller gave up (the client went away). It says
	// nothing about the store's health.
	ErrorCanceled = "canceled"
	// ErrorConnection: the store could not be reached or dropped the
	// connection: refused, reset, closed, or the server shutting down or
	// starting up.
	ErrorConnection = "connection"
	// ErrorReadOnly: the server takes no writes: a standby, or a primary
	// demoted by a failover.
	ErrorReadOnly = "read_only"
	// ErrorTooManyConnections: the server refused a new connection
	// because all its connection slots are taken.
	ErrorTooManyConnections = "too_many_connections"
	// ErrorUndefinedTable: sluice's schema objects are missing: dropped,
	// or never migrated.
	ErrorUndefinedTable = "undefined_table"
	// ErrorInsufficientPrivilege: the database role may not use sluice's
	// objects.
	ErrorInsufficientPrivilege = "insufficient_privilege"
	// ErrorOverload: the store was not asked: the decision found the
	// gateway's own queue of decisions at its bound (too many waiting for
	// the store at once). It says nothing about the store's health: the
	// circuit breaker does not count it.
	ErrorOverload = "overload"
	// ErrorOther: anything else.
	ErrorOther = "other"
)

// errorKinds lists the kinds, for validating what a KindedError reports.
var errorKinds = [...]string{
	ErrorTimeout, ErrorCanceled, ErrorConnection, ErrorReadOnly, ErrorTooManyConnections,
	ErrorUndefinedTable, ErrorInsufficientPrivilege, ErrorOverload, ErrorOther,
}

// KindedError is implemented by store errors that know their kind better
// than ErrorKind can tell from the outside, such as a driver's own
// sentinel errors. StoreErrorKind returns one of the Error constants.
type KindedError interface {
	error
	StoreErrorKind() string
}

// ErrorKind classifies a store error for metrics, logs and the circuit
// breaker, looking through wrapped errors, in this order: a deadline
// (context.DeadlineExceeded) is ErrorTimeout and a cancelled context
// ErrorCanceled, whatever else the error says; then the kind reported by a
// KindedError (a store classifies its driver's errors itself, where the
// driver's types are known, and attaches the kind); then network errors: a
// timeout is ErrorTimeout, any other net.Error, a refused or reset
// connection, or a connection that ended mid-message (io.EOF,
// io.ErrUnexpectedEOF) is ErrorConnection. Everything else is ErrorOther.
func ErrorKind(err error) string {
	switch {
	case err == nil:
		return ErrorOther
	case errors.Is(err, context.DeadlineExceeded):
		return ErrorTimeout
	case errors.Is(err, context.Canceled):
		return ErrorCanceled
	}
	var ke KindedError
	if errors.As(err, &ke) {
		if k := ke.StoreErrorKind(); slices.Contains(errorKinds[:], k) {
			return k
		}
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return ErrorTimeout
	case ne != nil,
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return ErrorConnection
	}
	return ErrorOther
}
