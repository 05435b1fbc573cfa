package gateway

import (
	"fmt"
	"io"
)

// CheckConfig is `sluice check-config`: it reads and validates every
// setting and the rules as the gateway does, and prints the rules as a
// table, or returns every problem found.
func CheckConfig(environ map[string]string, stdout io.Writer) error {
	cfg, err := load(environ)
	if err != nil {
		return err
	}
	store := "memory (per-instance, not durable)"
	if cfg.databaseURL != "" {
		store = "postgres, schema " + cfg.DBSchema
	}
	fmt.Fprintf(stdout, "configuration ok: upstream %s, store %s, %d rules\n\n", cfg.upstream.Redacted(), store, len(cfg.policy.Rules()))
	return cfg.policy.WriteTable(stdout)
}
