package postgres

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/limiter"
)

// Faults: what the store does with the error of a statement that failed.
//
// Every such error is classified once, here, where pgx's own error types
// are known, and carries its kind (limiter.KindedError) to the limiter's
// metrics, logs and circuit breaker.
//
// Errors that say the server behind the pool can no longer take writes
// (SQLSTATE 25006 read_only_sql_transaction: a primary demoted by a
// failover, or a standby reached through a DNS name that moved) or is going
// away (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03
// cannot_connect_now) reset the pool: its idle connections are closed at
// once and the busy ones when they are released, so that the next
// connections are made anew, through target_session_attrs=read-write, to
// whichever server is now the primary. Without the reset, every pooled
// connection to the old server would fail one decision before being
// dropped.

// faultError is a failed statement's error with its kind.
type faultError struct {
	kind string
	err  error
}

var _ limiter.KindedError = (*faultError)(nil)

func (e *faultError) Error() string {
	if preparedStatementError(e.err) {
		return e.err.Error() + " (behind PgBouncer in transaction pooling mode, add default_query_exec_mode=exec to SLUICE_DATABASE_URL)"
	}
	return e.err.Error()
}

func (e *faultError) Unwrap() error { return e.err }

// StoreErrorKind returns one of the limiter.Error kinds.
func (e *faultError) StoreErrorKind() string { return e.kind }

// fault classifies err, the error of a statement sent through the pool,
// resets the pool when err says its server is read-only or going away,
// and returns err with its kind attached. It returns nil for nil.
func (s *Store) fault(err error) error {
	if err == nil {
		return nil
	}
	if staleServer(err) {
		s.dropPool(err)
	}
	return kinded(err)
}

// kinded returns err with its kind attached.
func kinded(err error) error {
	return &faultError{kind: errorKind(err), err: err}
}

// dropPool closes every idle pooled connection at once and the busy ones
// when they are released, after err said they are stale; it logs when err
// says why (the server read-only or going away), once until the store is
// ready again (every connection of a server that shuts down reports it).
func (s *Store) dropPool(err error) {
	s.pool.Reset()
	if staleServer(err) && s.dropLogged.CompareAndSwap(false, true) {
		s.log.Warn("dropped every pooled connection: the server is read-only or shutting down; new connections go to the current primary",
			zap.String("kind", errorKind(err)), zap.Error(err))
	}
}

// errorKind classifies an error of pgx as one of the limiter.Error kinds.
// A deadline or a cancelled context wins, whatever else the error says;
// then the server's SQLSTATE (see sqlStateKind); then what only pgx's own
// errors tell: a connection attempt that found only read-only servers
// (target_session_attrs=read-write, before a standby is promoted) is
// limiter.ErrorReadOnly, and any other failed connection attempt or closed
// connection is limiter.ErrorConnection; then limiter.ErrorKind's network
// errors.
func errorKind(err error) string {
	k := limiter.ErrorKind(err)
	if k == limiter.ErrorTimeout || k == limiter.ErrorCanceled {
		return k
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if sk := sqlStateKind(pgErr.Code); sk != "" {
			return sk
		}
	}
	var ce *pgconn.ConnectError
	switch {
	case errors.Is(err, pgconn.ErrReadOnlyConnection):
		return limiter.ErrorReadOnly
	case k != limiter.ErrorOther:
		return k
	case errors.As(err, &ce), errors.Is(err, pgconn.ErrConnClosed):
		return limiter.ErrorConnection
	}
	return limiter.ErrorOther
}

// sqlStateKind maps a PostgreSQL SQLSTATE to a kind, or "" when it has
// none.
func sqlStateKind(code string) string {
	switch code {
	case "57014", "55P03": // query_canceled, lock_not_available
		return limiter.ErrorTimeout
	case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
		return limiter.ErrorConnection
	case "25006": // read_only_sql_transaction
		return limiter.ErrorReadOnly
	case "53300": // too_many_connections
		return limiter.ErrorTooManyConnections
	case "42P01", "42883", "3F000": // undefined_table, undefined_function, invalid_schema_name
		return limiter.ErrorUndefinedTable
	case "42501": // insufficient_privilege
		return limiter.ErrorInsufficientPrivilege
	}
	if strings.HasPrefix(code, "08") { // connection_exception
		return limiter.ErrorConnection
	}
	return ""
}

// staleServer reports whether err says that the pool's server no longer
// takes writes or is going away.
func staleServer(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "25006", "57P01", "57P02", "57P03":
		return true
	}
	return false
}

// preparedStatementError reports whether err is the server not knowing a
// prepared statement the client prepared (26000 invalid_sql_statement_name)
// or knowing one it did not (42P05 duplicate_prepared_statement): the mark
// of a transaction-mode pooler that moved the client to another server
// connection.
func preparedStatementError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "42P05")
}
