package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/jwt"
	"github.com/sluicehq/sluice/jwt/jwttest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/limiter/postgres"
	"github.com/sluicehq/sluice/policy"
)

// base is a valid environment each case changes.
func base() map[string]string {
	return map[string]string{
		"SLUICE_UPSTREAM": "http://127.0.0.1:3000",
		"SLUICE_RULES":    "login: POST /api/login by ip 5/15m",
	}
}

func TestLoadDefaults(t *testing.T) {
	c, err := load(base())
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != ":8080" || c.AdminListen != "127.0.0.1:9090" || c.DBSchema != "sluice" ||
		c.failMode != policy.FailLocal || c.DBTimeout != 50*time.Millisecond || c.LocalCacheSize != 100000 ||
		c.MaxBodyBytes != 65536 || !c.headers.IETF || !c.headers.X || !c.AutoMigrate || c.databaseURL != "" ||
		!c.hashKeyDerived || len(c.policy.Rules()) != 1 {
		t.Fatalf("unexpected defaults: %+v", c)
	}
}

func TestLoadDatabaseDefaults(t *testing.T) {
	c, err := load(base())
	if err != nil {
		t.Fatal(err)
	}
	// Durable by default: the server's own synchronous_commit.
	if !c.DBBatch || c.DBSyncCommit != "" || !c.DBLeases {
		t.Fatalf("SLUICE_DB_BATCH=%v SLUICE_DB_SYNCHRONOUS_COMMIT=%q SLUICE_DB_LEASES=%v, want true, empty and true", c.DBBatch, c.DBSyncCommit, c.DBLeases)
	}
	if w := batchWait(c); w != 2*time.Millisecond {
		t.Fatalf("batch wait %s, want the default 2ms", w)
	}
}

// TestDefaultsAgree: a setting's default (its envDefault tag, which --help
// prints) and the default of the option it sets (a package constant, which
// the packages' callers and tests get from a zero value) are one value.
func TestDefaultsAgree(t *testing.T) {
	c, err := load(base())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		setting   string
		got, want any
	}{
		{"SLUICE_DB_SCHEMA", c.DBSchema, postgres.DefaultSchema},
		{"SLUICE_DB_TIMEOUT", c.DBTimeout, limiter.DefaultTimeout},
		{"SLUICE_DB_TIMEOUT", c.DBTimeout, postgres.DefaultDecisionTimeout},
		{"SLUICE_DB_BATCH", batching(c), postgres.Batching(0)},
		{"SLUICE_DB_BATCH_WAIT", c.DBBatchWait, postgres.DefaultBatchWait},
		{"SLUICE_LOCAL_CACHE_SIZE", c.LocalCacheSize, limiter.DefaultCacheSize},
		{"SLUICE_MEMORY_MAX_KEYS", c.MemoryMaxKeys, memory.DefaultMaxKeys},
		{"SLUICE_FAIL_MODE", c.failMode, policy.FailLocal}, // what limiter.Config reads its zero DefaultFail as
		{"SLUICE_JWT_LEEWAY", c.JWTLeeway, jwt.DefaultLeeway},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: the setting's default is %v, the package's %v", tc.setting, tc.got, tc.want)
		}
	}
}

func TestBatchWait(t *testing.T) {
	for _, tc := range []struct {
		wait, timeout string
		want          time.Duration
	}{
		{"2ms", "50ms", 2 * time.Millisecond},
		{"4ms", "8ms", 2 * time.Millisecond}, // a quarter of the timeout at most
		{"0", "50ms", limiter.Off},           // off
		{"10ms", "1s", 10 * time.Millisecond},
		{"2ms", "3ns", limiter.Off}, // a quarter of the timeout is nothing: off, not the store's default
	} {
		env := base()
		env["SLUICE_DB_BATCH_WAIT"], env["SLUICE_DB_TIMEOUT"] = tc.wait, tc.timeout
		c, err := load(env)
		if err != nil {
			t.Fatal(err)
		}
		if got := batchWait(c); got != tc.want {
			t.Errorf("SLUICE_DB_BATCH_WAIT=%s SLUICE_DB_TIMEOUT=%s: store wait %s, want %s", tc.wait, tc.timeout, got, tc.want)
		}
	}
}

func TestLoadDatabaseURLFallback(t *testing.T) {
	env := base()
	env["DATABASE_URL"] = "postgres://u@db/x"
	env["SLUICE_HASH_KEY"] = "0123456789abcdef0123456789abcdef"
	c, err := load(env)
	if err != nil {
		t.Fatal(err)
	}
	if c.databaseURL != "postgres://u@db/x" {
		t.Fatalf("DATABASE_URL not used: %q", c.databaseURL)
	}
	env["SLUICE_DATABASE_URL"] = "postgres://u@primary/x"
	if c, err = load(env); err != nil || c.databaseURL != "postgres://u@primary/x" {
		t.Fatalf("SLUICE_DATABASE_URL must win: %v %v", c, err)
	}
}

// TestLoadAnyPort: every listener may ask for port 0 (the tests' way to
// get a port nobody else holds); two of them are not the same listener.
func TestLoadAnyPort(t *testing.T) {
	env := base()
	for _, k := range []string{"SLUICE_LISTEN", "SLUICE_ADMIN_LISTEN", "SLUICE_CHECK_LISTEN", "SLUICE_RLS_LISTEN"} {
		env[k] = "127.0.0.1:0"
	}
	env["SLUICE_TRUSTED_PROXIES"] = "127.0.0.1/32"
	if _, err := load(env); err != nil {
		t.Fatal(err)
	}
}

func TestLoadRulesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules")
	if err := os.WriteFile(path, []byte("# comment\nlogin: POST /api/login by ip 5/15m\nreset: POST /api/reset by email 3/1h sliding\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := base()
	delete(env, "SLUICE_RULES")
	env["SLUICE_RULES_FILE"] = path
	c, err := load(env)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(c.policy.Rules()); n != 2 {
		t.Fatalf("got %d rules, want 2", n)
	}
}

// testJWTSecret is a valid SLUICE_JWT_SECRET (40 bytes: HS256 only).
const testJWTSecret = "a-supabase-style-jwt-secret-of-40-bytes!"

// TestLoadErrors keeps one fixture per configuration error with its exact
// message.
func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  map[string]string
		want string
	}{
		{"upstream missing", map[string]string{"SLUICE_UPSTREAM": ""}, "SLUICE_UPSTREAM: required, e.g. http://127.0.0.1:3000, unless sluice only answers other proxies (SLUICE_CHECK_LISTEN, SLUICE_RLS_LISTEN)"},
		{"routes without upstream", map[string]string{"SLUICE_UPSTREAM": "", "SLUICE_CHECK_LISTEN": ":9191", "SLUICE_ROUTES": "/b/=http://b"}, "SLUICE_ROUTES: needs SLUICE_UPSTREAM: without it there is no public listener to route"},
		{"check listen", map[string]string{"SLUICE_CHECK_LISTEN": "9191"}, `SLUICE_CHECK_LISTEN: expected host:port such as :8080 (a port from 0 to 65535), got "9191"`},
		{"rls listen", map[string]string{"SLUICE_RLS_LISTEN": "localhost"}, `SLUICE_RLS_LISTEN: expected host:port such as :8080 (a port from 0 to 65535), got "localhost"`},
		{"check on the public listener", map[string]string{"SLUICE_CHECK_LISTEN": ":8080"}, "SLUICE_CHECK_LISTEN: must differ from SLUICE_LISTEN: each listener has an address of its own"},
		{"rls on the check listener", map[string]string{"SLUICE_CHECK_LISTEN": ":9191", "SLUICE_RLS_LISTEN": ":9191"}, "SLUICE_RLS_LISTEN: must differ from SLUICE_CHECK_LISTEN: each listener has an address of its own"},
		{"rls on the admin listener", map[string]string{"SLUICE_RLS_LISTEN": "127.0.0.1:9090"}, "SLUICE_RLS_LISTEN: must differ from SLUICE_ADMIN_LISTEN: the admin API is never on a listener other proxies call"},
		{"tls cert without key", map[string]string{"SLUICE_TLS_CERT_FILE": "/x/cert.pem"}, "SLUICE_TLS_KEY_FILE: required with SLUICE_TLS_CERT_FILE"},
		{"tls key without cert", map[string]string{"SLUICE_TLS_KEY_FILE": "/x/key.pem"}, "SLUICE_TLS_CERT_FILE: required with SLUICE_TLS_KEY_FILE"},
		{"tls client CA alone", map[string]string{"SLUICE_TLS_CLIENT_CA_FILE": "/x/ca.pem"}, "SLUICE_TLS_CLIENT_CA_FILE: needs SLUICE_TLS_CERT_FILE and SLUICE_TLS_KEY_FILE: callers are asked for a certificate in a TLS handshake"},
		{"tls files missing", map[string]string{"SLUICE_TLS_CERT_FILE": "/nonexistent/cert.pem", "SLUICE_TLS_KEY_FILE": "/nonexistent/key.pem"}, "SLUICE_TLS_CERT_FILE and SLUICE_TLS_KEY_FILE: open /nonexistent/cert.pem: no such file or directory"},
		{"upstream scheme", map[string]string{"SLUICE_UPSTREAM": "ftp://x"}, `SLUICE_UPSTREAM: expected an http:// or https:// URL, got "ftp://x"`},
		{"upstream host", map[string]string{"SLUICE_UPSTREAM": "http://"}, `SLUICE_UPSTREAM: expected a host in "http://"`},
		{"upstream query", map[string]string{"SLUICE_UPSTREAM": "http://a/?x=1"}, `SLUICE_UPSTREAM: expected no query, fragment or user info in "http://a/?xxxxx"`},
		{"upstream password", map[string]string{"SLUICE_UPSTREAM": "http://admin:secret@a/"}, `SLUICE_UPSTREAM: expected no query, fragment or user info in "http://xxxxx@a/"`},
		{"upstream password, no URL", map[string]string{"SLUICE_UPSTREAM": "http://u:secret%zz@a/"}, `SLUICE_UPSTREAM: not a URL: "http://xxxxx@a/"`},
		{"route password", map[string]string{"SLUICE_ROUTES": "/b/=http://u:secret@b:80"}, `SLUICE_ROUTES: route "/b/": expected no query, fragment or user info in "http://xxxxx@b:80"`},
		{"route syntax with a password", map[string]string{"SLUICE_ROUTES": "billing=http://u:secret@b"}, `SLUICE_ROUTES: expected /prefix/=http://host:port, got "billing=http://xxxxx@b"`},
		{"route syntax", map[string]string{"SLUICE_ROUTES": "billing=http://b"}, `SLUICE_ROUTES: expected /prefix/=http://host:port, got "billing=http://b"`},
		{"route url", map[string]string{"SLUICE_ROUTES": "/b/=b:80"}, `SLUICE_ROUTES: route "/b/": expected an http:// or https:// URL, got "b:80"`},
		{"route twice", map[string]string{"SLUICE_ROUTES": "/b/=http://b,/B=http://c"}, `SLUICE_ROUTES: prefix "/b" given twice`},
		{"listen", map[string]string{"SLUICE_LISTEN": "8080"}, `SLUICE_LISTEN: expected host:port such as :8080 (a port from 0 to 65535), got "8080"`},
		{"admin listen", map[string]string{"SLUICE_ADMIN_LISTEN": "localhost"}, `SLUICE_ADMIN_LISTEN: expected host:port such as :8080 (a port from 0 to 65535), got "localhost"`},
		{"admin port out of range", map[string]string{"SLUICE_ADMIN_LISTEN": "127.0.0.1:99999"}, `SLUICE_ADMIN_LISTEN: expected host:port such as :8080 (a port from 0 to 65535), got "127.0.0.1:99999"`},
		{"negative port", map[string]string{"SLUICE_LISTEN": "127.0.0.1:-1"}, `SLUICE_LISTEN: expected host:port such as :8080 (a port from 0 to 65535), got "127.0.0.1:-1"`},
		{"port name", map[string]string{"SLUICE_CHECK_LISTEN": "127.0.0.1:abc"}, `SLUICE_CHECK_LISTEN: expected host:port such as :8080 (a port from 0 to 65535), got "127.0.0.1:abc"`},
		{"service name", map[string]string{"SLUICE_RLS_LISTEN": ":http"}, `SLUICE_RLS_LISTEN: expected host:port such as :8080 (a port from 0 to 65535), got ":http"`},
		{"empty port", map[string]string{"SLUICE_LISTEN": "127.0.0.1:"}, `SLUICE_LISTEN: expected host:port such as :8080 (a port from 0 to 65535), got "127.0.0.1:"`},
		{"same listeners", map[string]string{"SLUICE_ADMIN_LISTEN": ":8080", "SLUICE_ADMIN_TOKEN": "t"}, "SLUICE_ADMIN_LISTEN: must differ from SLUICE_LISTEN: the admin API is never on the public listener"},
		{"admin on every interface without a token", map[string]string{"SLUICE_ADMIN_LISTEN": "0.0.0.0:9090"}, `SLUICE_ADMIN_TOKEN: required when SLUICE_ADMIN_LISTEN is not a loopback address (got "0.0.0.0:9090"): the admin API would be open to the network`},
		{"admin on an empty host without a token", map[string]string{"SLUICE_ADMIN_LISTEN": ":9090"}, `SLUICE_ADMIN_TOKEN: required when SLUICE_ADMIN_LISTEN is not a loopback address (got ":9090"): the admin API would be open to the network`},
		{"database url", map[string]string{"SLUICE_DATABASE_URL": "postgres://u:secret@h:notaport/x", "SLUICE_HASH_KEY": "0123456789abcdef"}, "SLUICE_DATABASE_URL: not a valid Postgres connection string"},
		{"hash key required", map[string]string{"SLUICE_DATABASE_URL": "postgres://u@h/x"}, "SLUICE_HASH_KEY: required when a database is configured, and the same on every instance"},
		{"hash key short", map[string]string{"SLUICE_HASH_KEY": "short"}, "SLUICE_HASH_KEY: must be at least 16 bytes, got 5"},
		{"schema", map[string]string{"SLUICE_DB_SCHEMA": "Sluice"}, `SLUICE_DB_SCHEMA: expected a lower-case identifier other than public ([a-z_][a-z0-9_]*, at most 63 characters), got "Sluice"`},
		{"schema public", map[string]string{"SLUICE_DB_SCHEMA": "public"}, `SLUICE_DB_SCHEMA: expected a lower-case identifier other than public ([a-z_][a-z0-9_]*, at most 63 characters), got "public"`},
		{"rules and file", map[string]string{"SLUICE_RULES_FILE": "/x"}, "SLUICE_RULES and SLUICE_RULES_FILE: set one, not both"},
		{"rules file missing", map[string]string{"SLUICE_RULES": "", "SLUICE_RULES_FILE": "/nonexistent/rules"}, "SLUICE_RULES_FILE: open /nonexistent/rules: no such file or directory"},
		{"trusted proxies", map[string]string{"SLUICE_TRUSTED_PROXIES": "10.0.0.0/8,nonsense"}, "SLUICE_TRUSTED_PROXIES: "},
		{"fail mode", map[string]string{"SLUICE_FAIL_MODE": "maybe"}, `SLUICE_FAIL_MODE: expected open, closed or local, got "maybe"`},
		{"timeout syntax", map[string]string{"SLUICE_DB_TIMEOUT": "fast"}, `SLUICE_DB_TIMEOUT: expected a duration such as 50ms or 2s, got "fast"`},
		{"timeout zero", map[string]string{"SLUICE_DB_TIMEOUT": "0s"}, "SLUICE_DB_TIMEOUT: must be positive, got 0s"},
		{"batch syntax", map[string]string{"SLUICE_DB_BATCH": "maybe"}, `SLUICE_DB_BATCH: expected true or false, got "maybe"`},
		{"batch wait syntax", map[string]string{"SLUICE_DB_BATCH_WAIT": "soon"}, `SLUICE_DB_BATCH_WAIT: expected a duration such as 50ms or 2s, got "soon"`},
		{"batch wait negative", map[string]string{"SLUICE_DB_BATCH_WAIT": "-1ms"}, "SLUICE_DB_BATCH_WAIT: must be 0 (off) or more, got -1ms"},
		{"synchronous commit", map[string]string{"SLUICE_DB_SYNCHRONOUS_COMMIT": "local"}, `SLUICE_DB_SYNCHRONOUS_COMMIT: expected empty (the server's synchronous_commit) or off, got "local"`},
		{"cache size syntax", map[string]string{"SLUICE_LOCAL_CACHE_SIZE": "lots"}, `SLUICE_LOCAL_CACHE_SIZE: expected a whole number, got "lots"`},
		{"cache size negative", map[string]string{"SLUICE_LOCAL_CACHE_SIZE": "-1"}, "SLUICE_LOCAL_CACHE_SIZE: must be 0 (off) or more, got -1"},
		{"body bytes", map[string]string{"SLUICE_MAX_BODY_BYTES": "0"}, "SLUICE_MAX_BODY_BYTES: must be positive, got 0"},
		{"auto migrate", map[string]string{"SLUICE_AUTO_MIGRATE": "perhaps"}, `SLUICE_AUTO_MIGRATE: expected true or false, got "perhaps"`},
		{"read header timeout zero", map[string]string{"SLUICE_READ_HEADER_TIMEOUT": "0"}, "SLUICE_READ_HEADER_TIMEOUT: must be positive, got 0s"},
		{"read timeout syntax", map[string]string{"SLUICE_READ_TIMEOUT": "a minute"}, `SLUICE_READ_TIMEOUT: expected a duration such as 50ms or 2s, got "a minute"`},
		{"idle timeout negative", map[string]string{"SLUICE_IDLE_TIMEOUT": "-1s"}, "SLUICE_IDLE_TIMEOUT: must be positive, got -1s"},
		{"write timeout negative", map[string]string{"SLUICE_WRITE_TIMEOUT": "-1s"}, "SLUICE_WRITE_TIMEOUT: must be 0 (never cut a response) or more, got -1s"},
		{"upstream timeout zero", map[string]string{"SLUICE_UPSTREAM_TIMEOUT": "0s"}, "SLUICE_UPSTREAM_TIMEOUT: must be positive, got 0s"},
		{"headers", map[string]string{"SLUICE_HEADERS": "ietf,y"}, `SLUICE_HEADERS: expected ietf, x, ietf,x or none, got "ietf,y"`},
		{"headers none mixed", map[string]string{"SLUICE_HEADERS": "none,x"}, `SLUICE_HEADERS: none cannot be combined with other families, got "none,x"`},
		{"log level", map[string]string{"SLUICE_LOG_LEVEL": "loud"}, `SLUICE_LOG_LEVEL: expected debug, info, warn or error, got "loud"`},
		{"log format", map[string]string{"SLUICE_LOG_FORMAT": "xml"}, `SLUICE_LOG_FORMAT: expected json or console, got "xml"`},
		{"otlp endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT: expected a URL such as http://collector:4318"},
		{"otlp endpoint with a password", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://u:hunter2@collector"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: expected a URL such as http://collector:4318"},
		{"otlp protocol", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "udp"}, `OTEL_EXPORTER_OTLP_PROTOCOL: expected http/protobuf or grpc, got "udp"`},
		{"otlp json", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: http/json is not supported by the OpenTelemetry Go exporter: use http/protobuf or grpc"},
		{"sampler", map[string]string{"OTEL_TRACES_SAMPLER": "jaeger_remote"}, `OTEL_TRACES_SAMPLER: expected always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio, got "jaeger_remote"`},
		{"sampler ratio", map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, `OTEL_TRACES_SAMPLER_ARG: expected a ratio from 0 to 1, got "2"`},
		{"traces exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, `OTEL_TRACES_EXPORTER: expected otlp or none, got "zipkin"`},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "yes"}, `OTEL_SDK_DISABLED: expected true or false, got "yes"`},
		{"rules", map[string]string{"SLUICE_RULES": "login POST /api/login by ip 5/15m"}, `SLUICE_RULES: line 1: name: expected "name:" at the start of the rule, got "login"`},
		{"rules, the second of a line", map[string]string{"SLUICE_RULES": "login: POST /api/login by ip 5/15m; reset: POST /api/reset by ip 5/15x"}, `SLUICE_RULES: line 1, column 37: rule "reset": limit: expected N/window such as 5/15m, got "5/15x"`},
		{"rules, unknown method", map[string]string{"SLUICE_RULES": "login: GETT /api/login by ip 5/15m"}, `SLUICE_RULES: line 1: rule "login": methods: expected a method of the IANA HTTP Method Registry (such as GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS) or PURGE, got "GETT"`},
		{"jwt rule without keys", map[string]string{"SLUICE_RULES": "login: POST /api/login by ip 5/15m\napi: GET /api/* by jwt 5/1m"}, `SLUICE_RULES: line 2: rule "api": by jwt needs keys to verify tokens: set SLUICE_JWT_JWKS_URL, SLUICE_JWT_JWKS_FILE or SLUICE_JWT_SECRET`},
		{"jwt(claim) rule without keys", map[string]string{"SLUICE_RULES": "api: GET /api/* by jwt(app_metadata.tenant_id) 5/1m"}, `SLUICE_RULES: line 1: rule "api": by jwt(app_metadata.tenant_id) needs keys to verify tokens: set SLUICE_JWT_JWKS_URL, SLUICE_JWT_JWKS_FILE or SLUICE_JWT_SECRET`},
		{"plans without keys", map[string]string{"SLUICE_RULES": "api: GET /api/* by ip 5/1m plans(tier)=pro:50/1m"}, `SLUICE_RULES: line 1: rule "api": plans(tier) needs keys to verify tokens: set SLUICE_JWT_JWKS_URL, SLUICE_JWT_JWKS_FILE or SLUICE_JWT_SECRET`},
		{"jwks url and file", map[string]string{"SLUICE_JWT_JWKS_URL": "https://auth.example/jwks.json", "SLUICE_JWT_JWKS_FILE": "/etc/sluice/jwks.json"}, "SLUICE_JWT_JWKS_URL and SLUICE_JWT_JWKS_FILE: set one, not both"},
		{"jwks url scheme", map[string]string{"SLUICE_JWT_JWKS_URL": "ftp://auth.example/jwks.json"}, "SLUICE_JWT_JWKS_URL: expected an http or https URL"},
		{"jwks url with a password", map[string]string{"SLUICE_JWT_JWKS_URL": "ftp://u:secret@auth.example/jwks.json"}, "SLUICE_JWT_JWKS_URL: expected an http or https URL"},
		{"jwks url relative", map[string]string{"SLUICE_JWT_JWKS_URL": "/jwks.json"}, "SLUICE_JWT_JWKS_URL: expected an http or https URL"},
		{"jwks file missing", map[string]string{"SLUICE_JWT_JWKS_FILE": "/nonexistent/jwks.json"}, "SLUICE_JWT_JWKS_FILE: open /nonexistent/jwks.json: no such file or directory"},
		{"jwt secret short", map[string]string{"SLUICE_JWT_SECRET": "too-short"}, "SLUICE_JWT_SECRET: expected at least 32 bytes (the length of HS256's hash), got 9"},
		{"jwt issuer", map[string]string{"SLUICE_JWT_SECRET": testJWTSecret, "SLUICE_JWT_ISSUER": "https://auth.example/\x01"}, "SLUICE_JWT_ISSUER: expected no control characters"},
		{"jwt audience", map[string]string{"SLUICE_JWT_SECRET": testJWTSecret, "SLUICE_JWT_AUDIENCE": "api,,web"}, "SLUICE_JWT_AUDIENCE: expected a non-empty value without control characters"},
		{"jwt algorithm none", map[string]string{"SLUICE_JWT_SECRET": testJWTSecret, "SLUICE_JWT_ALGORITHMS": "HS256, none"}, `SLUICE_JWT_ALGORITHMS: "none" is never allowed`},
		{"jwt algorithm unknown", map[string]string{"SLUICE_JWT_SECRET": testJWTSecret, "SLUICE_JWT_ALGORITHMS": "hs256"}, `SLUICE_JWT_ALGORITHMS: unknown algorithm "hs256" (expected RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, EdDSA, HS256, HS384 or HS512)`},
		{"jwt algorithm without its key", map[string]string{"SLUICE_JWT_SECRET": testJWTSecret, "SLUICE_JWT_ALGORITHMS": "RS256"}, "SLUICE_JWT_ALGORITHMS: RS256 needs a JWKS URL or file"},
		{"jwt algorithm, secret too short for it", map[string]string{"SLUICE_JWT_SECRET": testJWTSecret, "SLUICE_JWT_ALGORITHMS": "HS512"}, "SLUICE_JWT_ALGORITHMS: HS512 needs a secret of at least 64 bytes, got 40"},
		{"jwt algorithm without a secret", map[string]string{"SLUICE_JWT_JWKS_URL": "https://auth.example/jwks.json", "SLUICE_JWT_ALGORITHMS": "RS256,HS256"}, "SLUICE_JWT_ALGORITHMS: HS256 needs a secret"},
		{"jwt leeway syntax", map[string]string{"SLUICE_JWT_LEEWAY": "soon"}, `SLUICE_JWT_LEEWAY: expected a duration such as 50ms or 2s, got "soon"`},
		{"jwt leeway negative", map[string]string{"SLUICE_JWT_SECRET": testJWTSecret, "SLUICE_JWT_LEEWAY": "-1s"}, "SLUICE_JWT_LEEWAY: must be 0 (none) or more, got -1s"},
		{"jwt invalid", map[string]string{"SLUICE_JWT_INVALID": "drop"}, `SLUICE_JWT_INVALID: expected ip or reject, got "drop"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := base()
			for k, v := range tc.set {
				env[k] = v
			}
			_, err := load(env)
			var ce *configError
			if !errors.As(err, &ce) {
				t.Fatalf("want a configError, got %v", err)
			}
			if len(ce.problems) != 1 {
				t.Fatalf("want exactly one problem, got %q", ce.problems)
			}
			got := ce.problems[0]
			// Messages from other packages are checked by prefix; their
			// exact text is tested where they are made.
			prefixOnly := strings.HasSuffix(tc.want, ": ")
			if (!prefixOnly && got != tc.want) || !strings.HasPrefix(got, tc.want) {
				t.Fatalf("problem\n got: %s\nwant: %s", got, tc.want)
			}
			if strings.Contains(err.Error(), ":secret") || strings.Contains(err.Error(), testJWTSecret) {
				t.Fatalf("message leaks a password: %s", err)
			}
			if head, _, _ := strings.Cut(err.Error(), "\n"); head != "invalid configuration (1 problem):" {
				t.Fatalf("first line %q, want the count in the singular", head)
			}
		})
	}
}

// TestLoadListsEveryProblem checks that one message lists every problem,
// not only the first.
func TestLoadListsEveryProblem(t *testing.T) {
	_, err := load(map[string]string{
		"SLUICE_FAIL_MODE":  "maybe",
		"SLUICE_DB_TIMEOUT": "fast",
		"SLUICE_HEADERS":    "y",
		"SLUICE_RULES":      "login POST /api/login by ip 5/15m",
	})
	if err == nil {
		t.Fatal("want an error")
	}
	msg := err.Error()
	for _, want := range []string{"(5 problems)", "SLUICE_UPSTREAM", "SLUICE_FAIL_MODE", "SLUICE_DB_TIMEOUT", "SLUICE_HEADERS", "SLUICE_RULES: line 1"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
}

// TestLoadJWT: the SLUICE_JWT_* settings as the verifier gets them, and
// what check-config shows of them.
func TestLoadJWT(t *testing.T) {
	c, err := load(base())
	if err != nil {
		t.Fatal(err)
	}
	if c.jwt != nil || c.JWTInvalid != "ip" || c.JWTLeeway != 30*time.Second {
		t.Fatalf("defaults: verifier %v, invalid %q, leeway %s", c.jwt, c.JWTInvalid, c.JWTLeeway)
	}

	env := base()
	env["SLUICE_RULES"] = "api: GET /api/* by jwt 5/1m plans(app_metadata.plan)=pro:50/1m"
	env["SLUICE_JWT_JWKS_URL"] = "https://u:pw@auth.example/.well-known/jwks.json?x=1"
	env["SLUICE_JWT_SECRET"] = testJWTSecret
	env["SLUICE_JWT_ISSUER"] = "https://auth.example/"
	env["SLUICE_JWT_AUDIENCE"] = " api , web"
	env["SLUICE_JWT_LEEWAY"] = "0"
	env["SLUICE_JWT_INVALID"] = "reject"
	c, err = load(env)
	if err != nil {
		t.Fatal(err)
	}
	jc := c.jwtConfig
	if c.jwt == nil || jc.Leeway != jwt.Off || strings.Join(jc.Audiences, "|") != "api|web" || jc.Algorithms != nil || string(jc.Secret) != testJWTSecret {
		t.Fatalf("verifier config %+v", jc)
	}
	var out bytes.Buffer
	if err := CheckConfig(env, &out); err != nil {
		t.Fatal(err)
	}
	want := "bearer tokens: keys from JWKS URL https://auth.example/.well-known/jwks.json and HMAC secret; " +
		"algorithms RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, EdDSA, HS256; " +
		"issuer https://auth.example/; audience api, web; leeway 0s; invalid tokens rejected (401)\n"
	if !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "plans(app_metadata.plan)=pro:50/1m") {
		t.Errorf("check-config:\n%s\nwant the line\n%s", out.String(), want)
	}

	// A file, and the algorithms given.
	m := mintGateway(t)
	env = base()
	env["SLUICE_JWT_JWKS_FILE"] = writeJWKS(t, m.JWKS("rsa"))
	env["SLUICE_JWT_ALGORITHMS"] = "RS256,ES256"
	out.Reset()
	if err := CheckConfig(env, &out); err != nil {
		t.Fatal(err)
	}
	want = "bearer tokens: keys from JWKS file " + env["SLUICE_JWT_JWKS_FILE"] + "; algorithms RS256, ES256; issuer any; audience any; leeway 30s; invalid tokens counted by client IP\n"
	if !strings.Contains(out.String(), want) {
		t.Errorf("check-config:\n%s\nwant the line\n%s", out.String(), want)
	}
	// A file that holds no key it could use is refused with its reason.
	env["SLUICE_JWT_JWKS_FILE"] = writeJWKS(t, []byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`))
	if _, err := load(env); err == nil || !strings.Contains(err.Error(), "\n  SLUICE_JWT_JWKS_FILE: no usable signature key") {
		t.Errorf("a set of nothing but an HMAC key: %v", err)
	}
}

// TestLoadAdminListen: the admin API may listen on loopback without a
// token; anywhere else it needs one.
func TestLoadAdminListen(t *testing.T) {
	expect := func(listen, token string, ok bool) {
		t.Helper()
		env := base()
		env["SLUICE_ADMIN_LISTEN"], env["SLUICE_ADMIN_TOKEN"] = listen, token
		if _, err := load(env); (err == nil) != ok {
			t.Errorf("SLUICE_ADMIN_LISTEN=%s SLUICE_ADMIN_TOKEN=%q: %v, want ok %v", listen, token, err, ok)
		}
	}
	for _, loopback := range []string{"127.0.0.1:9090", "127.0.0.2:9090", "[::1]:9090", "[::ffff:127.0.0.1]:9090", "localhost:9090", "LOCALHOST:9090"} {
		expect(loopback, "", true)
	}
	for _, network := range []string{"0.0.0.0:9090", ":9090", "[::]:9090", "10.0.0.5:9090", "admin.internal:9090", "localhoſt:9090", "localhost.evil.example:9090"} {
		expect(network, "", false)
		expect(network, "tok", true)
	}
	// check-config reports it like every other problem.
	env := base()
	env["SLUICE_ADMIN_LISTEN"] = "0.0.0.0:9090"
	if err := CheckConfig(env, io.Discard); err == nil || !strings.Contains(err.Error(), "SLUICE_ADMIN_TOKEN: required") {
		t.Fatalf("check-config: %v", err)
	}
}

// TestSecretsNeverShown: the hash key, the admin token, the JWT secret,
// passwords in any URL and bearer tokens appear in no configuration
// error, no check-config output and no log line, whatever else is wrong.
func TestSecretsNeverShown(t *testing.T) {
	const (
		hashKey   = "hashkey-S3CRET-0123456789"
		token     = "token-S3CRET"
		password  = "pw-S3CRET"
		jwtSecret = "jwt-S3CRET-0123456789abcdef0123456789" // 37 bytes: HS256
	)
	bearer := jwttest.HS256(t, jwtSecret, map[string]any{"sub": "user-S3CRET", "exp": time.Now().Add(time.Hour).Unix()})
	secrets := []string{hashKey, token, password, jwtSecret, bearer, "S3CRET"}
	leaks := func(where, s string) {
		t.Helper()
		for _, secret := range secrets {
			if strings.Contains(s, secret) {
				t.Errorf("%s shows a secret: %s", where, s)
			}
		}
	}
	broken := []map[string]string{
		{"SLUICE_UPSTREAM": "http://u:" + password + "@a/"},
		{"SLUICE_UPSTREAM": "http://u:" + password + "%zz@a/"},
		{"SLUICE_UPSTREAM": "u:" + password + "@a:80"},
		{"SLUICE_UPSTREAM": "http://a/?token=" + password},
		{"SLUICE_ROUTES": "/b/=http://u:" + password + "@b"},
		{"SLUICE_ROUTES": "/b/http://u:" + password + "@b"},
		{"SLUICE_DATABASE_URL": "postgres://u:" + password + "@h:notaport/x"},
		{"SLUICE_DATABASE_URL": "host=h password=" + password + " port=x"},
		{"SLUICE_HASH_KEY": "S3CRET"}, // too short
		{"SLUICE_ADMIN_LISTEN": "0.0.0.0:9090", "SLUICE_RULES": "bad"},
		{"SLUICE_JWT_SECRET": "S3CRET-too-short"},
		{"SLUICE_JWT_ALGORITHMS": "HS384"}, // the secret is too short for it
		{"SLUICE_JWT_JWKS_URL": "ftp://u:" + password + "@auth.example/jwks?key=" + password},
		{"SLUICE_JWT_JWKS_URL": "https://u:" + password + "%zz@auth.example/"},
		{"SLUICE_JWT_JWKS_URL": "https://auth.example/?key=" + password, "SLUICE_JWT_JWKS_FILE": "/x"},
		{"SLUICE_JWT_SECRET": "", "SLUICE_RULES": "api: GET /api/* by jwt 5/1m"},
	}
	for _, set := range broken {
		env := base()
		env["SLUICE_HASH_KEY"], env["SLUICE_ADMIN_TOKEN"], env["SLUICE_JWT_SECRET"] = hashKey, token, jwtSecret
		for k, v := range set {
			env[k] = v
		}
		if k, ok := set["SLUICE_ADMIN_LISTEN"]; ok && k != "" {
			delete(env, "SLUICE_ADMIN_TOKEN")
		}
		err := CheckConfig(env, io.Discard)
		if err == nil {
			t.Errorf("%v: want a configuration error", set)
			continue
		}
		leaks("configuration error", err.Error())
	}

	// A valid configuration: check-config, and a gateway's logs from start
	// to stop, with requests in between. Its JWKS URL cannot be reached,
	// so the verifier logs a failed fetch of it.
	env := base()
	env["SLUICE_HASH_KEY"], env["SLUICE_ADMIN_TOKEN"], env["SLUICE_JWT_SECRET"] = hashKey, token, jwtSecret
	env["SLUICE_JWT_JWKS_URL"] = "http://u:" + password + "@127.0.0.1:1/jwks.json?key=" + password
	env["SLUICE_RULES"] = "login: POST /api/login by ip 5/15m; api: GET /api/* by jwt 5/1m"
	env["SLUICE_ACCESS_LOG"] = "true"
	var out bytes.Buffer
	if err := CheckConfig(env, &out); err != nil {
		t.Fatal(err)
	}
	leaks("check-config", out.String())
	if !strings.Contains(out.String(), "bearer tokens: keys from JWKS URL http://127.0.0.1:1/jwks.json and HMAC secret;") {
		t.Errorf("check-config does not show the key sources:\n%s", out.String())
	}

	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	env["SLUICE_UPSTREAM"] = up.URL
	core, logs := observer.New(zapcore.DebugLevel)
	_, g := serveGateway(t, env, Options{Logger: zap.New(core)})
	for _, tok := range []string{token, "wrong"} {
		req, _ := http.NewRequest("DELETE", g.admin+"/v1/keys?rule=login&ip=127.0.0.1", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}
	get(t, g.url+"/api/login")
	if code, _ := proctest.Call(t, "GET", g.url+"/api/x", bearer, ""); code != 200 {
		t.Fatalf("a request with a bearer token: %d", code)
	}
	if err := g.stop(); err != nil {
		t.Fatal(err)
	}
	if logs.Len() == 0 {
		t.Fatal("no log lines to check")
	}
	if logs.FilterMessageSnippet("JWKS refresh failed").Len() == 0 || logs.FilterField(zap.String("jwt", "valid")).Len() != 1 {
		t.Fatal("no failed JWKS fetch, or no access log line of a valid token, to check")
	}
	for _, e := range logs.All() {
		line, _ := json.Marshal(map[string]any{"msg": e.Message, "fields": e.ContextMap()})
		leaks("log line", string(line))
	}

	// A database that cannot be reached: the error and the logs name it
	// without its password.
	env["SLUICE_DATABASE_URL"] = "postgres://sluice:" + password + "@127.0.0.1:1/x?connect_timeout=1"
	core, logs = observer.New(zapcore.DebugLevel)
	env["SLUICE_START_TIMEOUT"] = "0s"
	_, r, _ := serveGatewayAsync(t, env, Options{Logger: zap.New(core)})
	deadline := time.Now().Add(10 * time.Second)
	for logs.FilterMessageSnippet("store not ready").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the gateway did not log its failed connection")
		}
		time.Sleep(10 * time.Millisecond) // the probe is the gateway's own: wait for its log
	}
	if err := r.stop(); err != nil {
		leaks("serve error", err.Error())
	}
	for _, e := range logs.All() {
		line, _ := json.Marshal(map[string]any{"msg": e.Message, "fields": e.ContextMap()})
		leaks("log line", string(line))
	}
}
