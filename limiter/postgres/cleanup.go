package postgres

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/limiter"
)

// Cleanup deletes expired counters in batches of CleanupBatch rows, at most
// CleanupMaxBatches of them, pausing CleanupPause between batches, and
// returns how many rows it deleted.
//
// Each batch is one statement, and so one short transaction, that first
// takes a transaction-level advisory lock with pg_try_advisory_xact_lock:
// at any moment at most one instance is deleting, and an instance that
// finds the lock taken ends its run at once (another one is cleaning).
// Rows locked by decisions are skipped, never waited for. As an
// alternative, a pg_cron job can run the same DELETE (sql/cleanup.sql)
// with CleanupInterval set to limiter.Off.
func (s *Store) Cleanup(ctx context.Context) (deleted int64, err error) {
	for i := 0; i < s.opts.CleanupMaxBatches; i++ {
		if i > 0 && !sleep(ctx, s.opts.CleanupPause) {
			return deleted, ctx.Err()
		}
		n, elected, err := s.cleanupBatch(ctx)
		deleted += n
		if err != nil {
			return deleted, fmt.Errorf("postgres cleanup: %w", err)
		}
		if !elected || n < int64(s.opts.CleanupBatch) {
			break
		}
	}
	return deleted, nil
}

// cleanupBatch deletes one batch if this instance wins the cleanup lock,
// in one statement (sql/cleanup_batch.sql): its implicit transaction
// commits without waiting for this process, which holds no row between
// two round trips.
func (s *Store) cleanupBatch(ctx context.Context) (deleted int64, elected bool, err error) {
	err = s.pool.QueryRow(ctx, s.q.cleanup, s.nowParam(), s.opts.CleanupBatch, s.cleanupKey).Scan(&elected, &deleted)
	return deleted, elected, err
}

// runCleanup runs Cleanup every CleanupInterval while the store is ready,
// until ctx is done.
func (s *Store) runCleanup(ctx context.Context) {
	if s.opts.CleanupInterval == limiter.Off {
		return
	}
	failing := newStateLog(s.log, "cleanup of expired counters")
	for sleep(ctx, s.opts.CleanupInterval) {
		if !s.ready() {
			continue
		}
		start := time.Now()
		n, err := s.Cleanup(ctx)
		if ctx.Err() != nil {
			return
		}
		failing.report(err)
		if err == nil && n > 0 {
			s.log.Debug("cleanup expired counters", zap.Int64("deleted", n), zap.Duration("took", time.Since(start)))
		}
	}
}
