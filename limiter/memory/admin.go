package memory

import (
	"context"
	"time"
)

// Admin exposes a Store's administration methods with the context-taking
// signatures the admin API uses for every store. The memory store's
// methods cannot fail or block, so the contexts are unused.
type Admin struct{ *Store }

// Reset deletes key's counter under rule.
func (a Admin) Reset(_ context.Context, rule, key string) error {
	a.Store.Reset(rule, key)
	return nil
}

// SetOverride gives key its own limit and window under rule.
func (a Admin) SetOverride(_ context.Context, rule, key string, limit int64, window time.Duration) error {
	return a.Store.SetOverride(rule, key, limit, window)
}

// DeleteOverride returns key to rule's own limit.
func (a Admin) DeleteOverride(_ context.Context, rule, key string) error {
	a.Store.DeleteOverride(rule, key)
	return nil
}
