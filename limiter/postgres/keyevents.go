package postgres

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/migrations"
)

// keyEventOverlap is how far back each poll of key events reaches before
// the previous poll's clock: events of transactions that committed late
// (their rows carry the time they were written, not committed) are still
// seen. Re-reading an event only forgets a key twice.
const keyEventOverlap = 5 * time.Second

// WatchKeyEvents calls forget for every key whose counter was reset or
// whose override changed, on any instance, within about every of it
// happening, until ctx ends. The gateway passes its Limiter's Forget, so
// that an admin reset clears the over-limit fast path of every instance.
// Errors are logged and retried at the next tick; it returns nil when ctx
// ends.
func (s *Store) WatchKeyEvents(ctx context.Context, every time.Duration, forget func(rule, key string)) error {
	poll := loadQuery(s.schema, "key_events")
	prune := loadQuery(s.schema, "key_events_prune")
	since := time.Now().Add(-keyEventOverlap).UnixMicro() // first poll: a gateway-clock guess, corrected by the reply
	for tick := 0; sleep(ctx, every); tick++ {
		next, err := s.pollKeyEvents(ctx, poll, since, forget)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("key events poll failed", zap.Error(err))
			}
			continue
		}
		since = next - keyEventOverlap.Microseconds()
		if tick%600 == 0 { // about every ten minutes at the default tick
			if _, err := s.pool.Exec(ctx, prune); err != nil && ctx.Err() == nil {
				s.log.Warn("key events prune failed", zap.Error(err))
			}
		}
	}
	return nil
}

// pollKeyEvents forgets the keys of the events since since (µs) and
// returns the database's clock.
func (s *Store) pollKeyEvents(ctx context.Context, query string, since int64, forget func(rule, key string)) (int64, error) {
	rows, err := s.pool.Query(ctx, query, since)
	if err != nil {
		return 0, err
	}
	var now int64
	var rule, key *string
	_, err = pgx.ForEachRow(rows, []any{&rule, &key, &now}, func() error {
		if rule != nil && key != nil {
			forget(*rule, *key)
		}
		return nil
	})
	return now, err
}

// loadQuery returns the embedded statement name, written for schema.
func loadQuery(schema, name string) string {
	b, err := queryFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic(err) // embedded: cannot happen
	}
	return strings.ReplaceAll(string(b), migrations.Placeholder, pgx.Identifier{schema}.Sanitize())
}
