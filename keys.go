package main

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/proxy"
)

// memoryKeys adapts the memory store's administration methods, which cannot
// fail or block, to the admin API's context-taking proxy.KeyStore.
type memoryKeys struct{ *memory.Store }

var _ proxy.KeyStore = memoryKeys{}

func (m memoryKeys) Reset(_ context.Context, rule, key string) error {
	m.Store.Reset(rule, key)
	return nil
}

func (m memoryKeys) SetOverride(_ context.Context, rule, key string, limit int64, window time.Duration) error {
	return m.Store.SetOverride(rule, key, limit, window)
}

func (m memoryKeys) DeleteOverride(_ context.Context, rule, key string) error {
	m.Store.DeleteOverride(rule, key)
	return nil
}
