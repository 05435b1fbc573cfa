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
	serving := "no public listener (decision service only)"
	if cfg.public() {
		serving = "upstream " + cfg.upstream.Redacted()
	}
	for _, l := range []struct{ what, addr string }{{"forward-auth on", cfg.CheckListen}, {"Envoy rate limit service on", cfg.RLSListen}} {
		if l.addr != "" {
			serving += ", " + l.what + " " + l.addr
		}
	}
	if cfg.certs != nil {
		serving += ", TLS"
		if cfg.TLSClientCAFile != "" {
			serving += " with client certificates"
		}
	}
	fmt.Fprintf(stdout, "configuration ok: %s, store %s, %d rules\n\n", serving, store, len(cfg.policy.Rules()))
	return cfg.policy.WriteTable(stdout)
}
