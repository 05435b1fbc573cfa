package gateway

import (
	"fmt"
	"io"
	"strings"
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
		if cfg.UsagePath != "" {
			serving += ", usage at " + cfg.UsagePath
		}
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
	fmt.Fprintf(stdout, "configuration ok: %s, store %s, %d rules\n", serving, store, len(cfg.policy.Rules()))
	if cfg.jwt != nil {
		fmt.Fprintf(stdout, "bearer tokens: %s\n", describeJWT(cfg))
	}
	fmt.Fprintln(stdout)
	return cfg.policy.WriteTable(stdout)
}

// describeJWT is the token checks as check-config shows them: where the
// keys come from (the JWKS URL without user information or query, never
// the secret), the algorithms, the issuer, the audiences, the leeway and
// what an invalid token gets.
func describeJWT(cfg *config) string {
	v := cfg.jwt
	issuer, audience := "any", "any"
	if v.Issuer() != "" {
		issuer = v.Issuer()
	}
	if len(cfg.jwtConfig.Audiences) > 0 {
		audience = strings.Join(cfg.jwtConfig.Audiences, ", ")
	}
	invalid := "counted by client IP"
	if cfg.JWTInvalid == "reject" {
		invalid = "rejected (401)"
	}
	return fmt.Sprintf("keys from %s; algorithms %s; issuer %s; audience %s; leeway %s; invalid tokens %s",
		strings.Join(v.Sources(), " and "), strings.Join(v.Algorithms(), ", "), issuer, audience, cfg.JWTLeeway, invalid)
}
