package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/admin"
	"github.com/sluicehq/sluice/jwt"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/identity"
	"github.com/sluicehq/sluice/telemetry"
)

// Settings: every variable sluice reads is parsed here, with caarlos0/env,
// and validated in one pass that reports every problem. The gateway reads
// settings (load); the commands that need only a few read those alone
// (loadMigrate, loadHealthcheck), under the same names and with the same
// defaults.

// settings are every variable sluice reads, with its default. Values are
// validated in one pass by load.
type settings struct {
	Upstream          string        `env:"SLUICE_UPSTREAM" help:"the default upstream base URL, e.g. http://127.0.0.1:3000; required unless SLUICE_CHECK_LISTEN or SLUICE_RLS_LISTEN is set (then, without it, no public listener)"`
	Routes            string        `env:"SLUICE_ROUTES" help:"extra upstreams by path prefix: /billing/=http://billing:8080,/search/=http://search:9200"`
	Listen            string        `env:"SLUICE_LISTEN" envDefault:":8080" help:"the public listener, host:port"`
	AdminListen       string        `env:"SLUICE_ADMIN_LISTEN" envDefault:"127.0.0.1:9090" help:"health, metrics and the admin API, host:port; off loopback it needs SLUICE_ADMIN_TOKEN"`
	CheckListen       string        `env:"SLUICE_CHECK_LISTEN" help:"forward-auth for nginx (auth_request), Traefik and Caddy, host:port; empty: off"`
	RLSListen         string        `env:"SLUICE_RLS_LISTEN" help:"Envoy's rate limit service over gRPC, host:port; empty: off"`
	TLSCertFile       string        `env:"SLUICE_TLS_CERT_FILE" help:"PEM certificate chain: TLS (HTTP/2 offered) on the public, check and gRPC listeners; re-read on SIGHUP"`
	TLSKeyFile        string        `env:"SLUICE_TLS_KEY_FILE" help:"PEM private key of SLUICE_TLS_CERT_FILE"`
	TLSClientCAFile   string        `env:"SLUICE_TLS_CLIENT_CA_FILE" help:"PEM CA certificates: callers must present a certificate one of them signed (mutual TLS); re-read on SIGHUP"`
	DatabaseURL       string        `env:"SLUICE_DATABASE_URL" help:"Postgres connection string; empty means the in-memory store (per-instance, not durable)"`
	DatabaseURLAlt    string        `env:"DATABASE_URL" help:"used when SLUICE_DATABASE_URL is empty"`
	DBSchema          string        `env:"SLUICE_DB_SCHEMA" envDefault:"sluice" help:"the schema holding sluice's tables and functions (never public)"`
	AutoMigrate       bool          `env:"SLUICE_AUTO_MIGRATE" envDefault:"true" help:"apply the migrations at start-up"`
	Rules             string        `env:"SLUICE_RULES" help:"the rules, one per line or separated by ;"`
	RulesFile         string        `env:"SLUICE_RULES_FILE" help:"a file of rules instead of SLUICE_RULES; SIGHUP reloads it"`
	HashKey           string        `env:"SLUICE_HASH_KEY" help:"secret for the HMAC of identifiers, at least 16 bytes, the same on every instance; required with a database"`
	TrustedProxies    string        `env:"SLUICE_TRUSTED_PROXIES" help:"CIDRs whose X-Forwarded-For is believed"`
	FailMode          string        `env:"SLUICE_FAIL_MODE" envDefault:"local" help:"when the store cannot decide: open, closed or local"`
	DBTimeout         time.Duration `env:"SLUICE_DB_TIMEOUT" envDefault:"50ms" help:"deadline of one decision against the store"`
	DBBatch           bool          `env:"SLUICE_DB_BATCH" envDefault:"true" help:"share statements between concurrent decisions"`
	DBBatchWait       time.Duration `env:"SLUICE_DB_BATCH_WAIT" envDefault:"2ms" help:"under load, how long a decision may wait to share a statement; 0 turns it off"`
	DBSyncCommit      string        `env:"SLUICE_DB_SYNCHRONOUS_COMMIT" help:"empty: the limiter's transactions commit with the server's own synchronous_commit (durable); off opts out: a Postgres crash can then lose its last <= 600 ms of counts and leases"`
	DBLeases          bool          `env:"SLUICE_DB_LEASES" envDefault:"true" help:"spend slices of roomy limits in memory, granted durably by the database; false decides every request in the database"`
	LocalCacheSize    int           `env:"SLUICE_LOCAL_CACHE_SIZE" envDefault:"100000" help:"entries of the over-limit cache; 0 turns the fast path off"`
	MaxBodyBytes      int64         `env:"SLUICE_MAX_BODY_BYTES" envDefault:"65536" help:"largest request body buffered (and read for identifiers)"`
	MemoryMaxKeys     int           `env:"SLUICE_MEMORY_MAX_KEYS" envDefault:"1000000" help:"bound on the counters of the in-memory store and of fail=local"`
	StartTimeout      time.Duration `env:"SLUICE_START_TIMEOUT" envDefault:"10s" help:"longest wait at start-up for the store before the public listener opens anyway"`
	ReadHeaderTimeout time.Duration `env:"SLUICE_READ_HEADER_TIMEOUT" envDefault:"5s" help:"longest a client may take to send a request's headers"`
	ReadTimeout       time.Duration `env:"SLUICE_READ_TIMEOUT" envDefault:"60s" help:"longest a client may take to send a whole request"`
	IdleTimeout       time.Duration `env:"SLUICE_IDLE_TIMEOUT" envDefault:"120s" help:"how long an idle keep-alive connection is kept"`
	WriteTimeout      time.Duration `env:"SLUICE_WRITE_TIMEOUT" envDefault:"0" help:"longest a response may take; 0 never cuts one (streams, WebSockets)"`
	UpstreamTimeout   time.Duration `env:"SLUICE_UPSTREAM_TIMEOUT" envDefault:"60s" help:"longest wait for an upstream's response headers"`
	UsagePath         string        `env:"SLUICE_USAGE_PATH" help:"a path on the public listener, such as /_sluice/usage, where a GET shows the caller its standing on every rule (never forwarded); empty: off"`
	AccessLog         bool          `env:"SLUICE_ACCESS_LOG" envDefault:"false" help:"one JSON line per request (method, path, rules, hashed key prefixes, outcome, status, durations)"`
	Headers           string        `env:"SLUICE_HEADERS" envDefault:"ietf,x" help:"rate-limit header families: ietf, x, ietf,x or none"`
	AdminToken        string        `env:"SLUICE_ADMIN_TOKEN" help:"bearer token of the admin API (/v1/*)"`
	LogLevel          string        `env:"SLUICE_LOG_LEVEL" envDefault:"info" help:"debug, info, warn or error"`
	LogFormat         string        `env:"SLUICE_LOG_FORMAT" envDefault:"json" help:"json or console"`

	// Verified identity (jwt rules, plans): where the keys that verify
	// bearer tokens come from, how far clocks may disagree, and what else a
	// token must hold.
	JWTJWKSURL    string        `env:"SLUICE_JWT_JWKS_URL" help:"a JWK set that verifies bearer tokens (jwt rules, plans), fetched at start-up and refreshed every 10 min or as its Cache-Control says"`
	JWTJWKSFile   string        `env:"SLUICE_JWT_JWKS_FILE" help:"a JWK set in a file, instead of SLUICE_JWT_JWKS_URL; SIGHUP re-reads it"`
	JWTSecret     string        `env:"SLUICE_JWT_SECRET" help:"the HMAC key of HS256, HS384 and HS512 tokens, its bytes as given, at least 32 bytes; beside a JWKS or alone; never shown"`
	JWTLeeway     time.Duration `env:"SLUICE_JWT_LEEWAY" envDefault:"30s" help:"how far a token's exp, nbf and iat may be off; 0 for none"`
	JWTIssuer     string        `env:"SLUICE_JWT_ISSUER" help:"the only iss a token may have; empty accepts any"`
	JWTAudience   string        `env:"SLUICE_JWT_AUDIENCE" help:"comma list: a token's aud must hold one of them; empty accepts any"`
	JWTAlgorithms string        `env:"SLUICE_JWT_ALGORITHMS" help:"comma list of the alg values accepted; empty means every one the keys can verify (never none)"`
	JWTInvalid    string        `env:"SLUICE_JWT_INVALID" envDefault:"ip" help:"a present but invalid token: ip (counted by the client IP, like a request without one) or reject (401)"`

	// Tracing: the standard OpenTelemetry variables sluice reads itself
	// (see telemetry.Config); the exporter reads the others.
	OTELEndpoint       string `env:"OTEL_EXPORTER_OTLP_ENDPOINT" help:"OTLP collector for traces, e.g. http://collector:4318; empty: no tracing and no cost"`
	OTELTracesEndpoint string `env:"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" help:"the URL traces are sent to, as given, instead of OTEL_EXPORTER_OTLP_ENDPOINT/v1/traces"`
	OTELProtocol       string `env:"OTEL_EXPORTER_OTLP_PROTOCOL" help:"http/protobuf (the default) or grpc"`
	OTELTracesProtocol string `env:"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" help:"the same, for traces only"`
	OTELSampler        string `env:"OTEL_TRACES_SAMPLER" help:"parentbased_always_on (the default), always_on, always_off, traceidratio, parentbased_always_off or parentbased_traceidratio"`
	OTELSamplerArg     string `env:"OTEL_TRACES_SAMPLER_ARG" help:"the ratio of the traceidratio samplers, 0 to 1"`
	OTELServiceName    string `env:"OTEL_SERVICE_NAME" help:"service.name of the spans; empty means sluice"`
	OTELDisabled       bool   `env:"OTEL_SDK_DISABLED" envDefault:"false" help:"true turns tracing off whatever else is set"`
	OTELExporter       string `env:"OTEL_TRACES_EXPORTER" help:"otlp (the default) or none"`
}

// config is the validated form of settings that the gateway is assembled
// from.
type config struct {
	settings
	upstream       *url.URL
	routes         []proxy.Route
	databaseURL    string
	policy         *policy.Policy
	trusted        identity.TrustedProxies
	failMode       policy.FailMode
	headers        proxy.HeaderFamilies
	timeouts       proxy.Timeouts
	logLevel       zapcore.Level
	hashKeyDerived bool          // no SLUICE_HASH_KEY: a random per-process key is used
	certs          *certificates // SLUICE_TLS_*; nil without TLS
	tracing        telemetry.Config
	// jwt verifies bearer tokens; nil without a key source (no
	// SLUICE_JWT_JWKS_URL, SLUICE_JWT_JWKS_FILE or SLUICE_JWT_SECRET). It
	// has no logger and no metrics: load built it to validate the
	// settings, and check-config shows it; the gateway builds its own of
	// jwtConfig, whose Logger and Metrics it sets.
	jwt       *jwt.Verifier
	jwtConfig jwt.Config
}

// public reports whether the public listener (the proxy) runs: only with
// an upstream to forward to.
func (c *config) public() bool { return c.upstream != nil }

// minHashKeyBytes is the shortest SLUICE_HASH_KEY accepted. HMAC keys
// shorter than 16 bytes make offline guessing of hashed IPs too cheap.
const minHashKeyBytes = 16

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// load reads the environment and validates it in one pass. The error, if
// any, lists every problem found, one per line.
func load(environ map[string]string) (*config, error) {
	var s settings
	var problems []string
	unparsed := map[string]bool{} // variables whose syntax was wrong: no range checks for them
	if err := env.ParseWithOptions(&s, env.Options{Environment: environ}); err != nil {
		var msgs []string
		msgs, unparsed = envProblems(err, environ)
		problems = append(problems, msgs...)
	}
	c := &config{settings: s}

	switch {
	case s.Upstream == "" && s.CheckListen == "" && s.RLSListen == "":
		problems = append(problems, "SLUICE_UPSTREAM: required, e.g. http://127.0.0.1:3000, unless sluice only answers other proxies (SLUICE_CHECK_LISTEN, SLUICE_RLS_LISTEN)")
	case s.Upstream == "":
		// A decision service only: no public listener.
		if s.Routes != "" {
			problems = append(problems, "SLUICE_ROUTES: needs SLUICE_UPSTREAM: without it there is no public listener to route")
		}
	default:
		if u, err := proxy.ParseUpstream(s.Upstream); err != nil {
			problems = append(problems, "SLUICE_UPSTREAM: "+err.Error())
		} else {
			c.upstream = u
		}
	}
	c.routes = parse(&problems, "SLUICE_ROUTES", proxy.ParseRoutes, s.Routes)
	switch err := proxy.ValidateUsagePath(s.UsagePath); {
	case err != nil:
		problems = append(problems, "SLUICE_USAGE_PATH: "+err.Error())
	case s.UsagePath != "" && s.Upstream == "":
		problems = append(problems, "SLUICE_USAGE_PATH: needs SLUICE_UPSTREAM: without it there is no public listener to answer on")
	}

	listeners := []struct{ name, addr string }{{"SLUICE_ADMIN_LISTEN", s.AdminListen}}
	if s.Upstream != "" {
		listeners = append(listeners, struct{ name, addr string }{"SLUICE_LISTEN", s.Listen})
	}
	if s.CheckListen != "" {
		listeners = append(listeners, struct{ name, addr string }{"SLUICE_CHECK_LISTEN", s.CheckListen})
	}
	if s.RLSListen != "" {
		listeners = append(listeners, struct{ name, addr string }{"SLUICE_RLS_LISTEN", s.RLSListen})
	}
	for i, l := range listeners {
		if !validListen(l.addr) {
			problems = append(problems, fmt.Sprintf("%s: expected host:port such as :8080 (a port from 0 to 65535), got %q", l.name, l.addr))
		}
		for _, prev := range listeners[:i] {
			// Port 0 asks the kernel for a port: two of them get two.
			if l.addr == prev.addr && !anyPort(l.addr) {
				problems = append(problems, sameListener(prev.name, l.name))
			}
		}
	}
	if host, _, err := net.SplitHostPort(s.AdminListen); err == nil && s.AdminToken == "" && !isLoopback(host) {
		problems = append(problems, fmt.Sprintf("SLUICE_ADMIN_TOKEN: required when SLUICE_ADMIN_LISTEN is not a loopback address (got %q): the admin API would be open to the network", s.AdminListen))
	}

	c.databaseURL = databaseURL(s.DatabaseURL, s.DatabaseURLAlt)
	if c.databaseURL != "" {
		if _, err := pgxpool.ParseConfig(c.databaseURL); err != nil {
			problems = append(problems, errBadDatabaseURL.Error())
		}
		if s.HashKey == "" {
			problems = append(problems, "SLUICE_HASH_KEY: required when a database is configured, and the same on every instance")
		}
	}
	if s.HashKey != "" && len(s.HashKey) < minHashKeyBytes {
		problems = append(problems, fmt.Sprintf("SLUICE_HASH_KEY: must be at least %d bytes, got %d", minHashKeyBytes, len(s.HashKey)))
	}
	c.hashKeyDerived = s.HashKey == ""
	if msg := schemaProblem(s.DBSchema); msg != "" {
		problems = append(problems, msg)
	}

	if p, msgs := loadRules(s); len(msgs) > 0 {
		problems = append(problems, msgs...)
	} else {
		c.policy = p
	}

	c.trusted = parse(&problems, "SLUICE_TRUSTED_PROXIES", identity.ParseTrustedProxies, s.TrustedProxies)
	c.certs = loadTLS(&problems, s)
	loadJWT(c, &problems, unparsed)

	switch s.FailMode {
	case "open":
		c.failMode = policy.FailOpen
	case "closed":
		c.failMode = policy.FailClosed
	case "local":
		c.failMode = policy.FailLocal
	default:
		problems = append(problems, fmt.Sprintf("SLUICE_FAIL_MODE: expected open, closed or local, got %q", s.FailMode))
	}
	if s.DBTimeout <= 0 && !unparsed["SLUICE_DB_TIMEOUT"] {
		problems = append(problems, fmt.Sprintf("SLUICE_DB_TIMEOUT: must be positive, got %s", s.DBTimeout))
	}
	if s.DBBatchWait < 0 && !unparsed["SLUICE_DB_BATCH_WAIT"] {
		problems = append(problems, fmt.Sprintf("SLUICE_DB_BATCH_WAIT: must be 0 (off) or more, got %s", s.DBBatchWait))
	}
	switch s.DBSyncCommit {
	case "", "on", "off": // on: the server's own, as empty (the setting's meaning before it was empty by default)
	default:
		problems = append(problems, fmt.Sprintf("SLUICE_DB_SYNCHRONOUS_COMMIT: expected empty (the server's synchronous_commit) or off, got %q", s.DBSyncCommit))
	}
	if s.LocalCacheSize < 0 && !unparsed["SLUICE_LOCAL_CACHE_SIZE"] {
		problems = append(problems, fmt.Sprintf("SLUICE_LOCAL_CACHE_SIZE: must be 0 (off) or more, got %d", s.LocalCacheSize))
	}
	if s.MaxBodyBytes <= 0 && !unparsed["SLUICE_MAX_BODY_BYTES"] {
		problems = append(problems, fmt.Sprintf("SLUICE_MAX_BODY_BYTES: must be positive, got %d", s.MaxBodyBytes))
	}
	if s.MemoryMaxKeys < 1 && !unparsed["SLUICE_MEMORY_MAX_KEYS"] {
		problems = append(problems, fmt.Sprintf("SLUICE_MEMORY_MAX_KEYS: must be at least 1, got %d", s.MemoryMaxKeys))
	}
	if s.StartTimeout < 0 && !unparsed["SLUICE_START_TIMEOUT"] {
		problems = append(problems, fmt.Sprintf("SLUICE_START_TIMEOUT: must be 0 (do not wait) or more, got %s", s.StartTimeout))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"SLUICE_READ_HEADER_TIMEOUT", s.ReadHeaderTimeout},
		{"SLUICE_READ_TIMEOUT", s.ReadTimeout},
		{"SLUICE_IDLE_TIMEOUT", s.IdleTimeout},
		{"SLUICE_UPSTREAM_TIMEOUT", s.UpstreamTimeout},
	} {
		if d.v <= 0 && !unparsed[d.name] {
			problems = append(problems, fmt.Sprintf("%s: must be positive, got %s", d.name, d.v))
		}
	}
	if s.WriteTimeout < 0 && !unparsed["SLUICE_WRITE_TIMEOUT"] {
		problems = append(problems, fmt.Sprintf("SLUICE_WRITE_TIMEOUT: must be 0 (never cut a response) or more, got %s", s.WriteTimeout))
	}
	c.timeouts = proxy.Timeouts{ReadHeader: s.ReadHeaderTimeout, Read: s.ReadTimeout, Idle: s.IdleTimeout, Write: s.WriteTimeout, Upstream: s.UpstreamTimeout}
	c.headers = parse(&problems, "SLUICE_HEADERS", proxy.ParseHeaderFamilies, s.Headers)
	if lvl, err := zapcore.ParseLevel(s.LogLevel); err != nil {
		problems = append(problems, fmt.Sprintf("SLUICE_LOG_LEVEL: expected debug, info, warn or error, got %q", s.LogLevel))
	} else {
		c.logLevel = lvl
	}
	if s.LogFormat != "json" && s.LogFormat != "console" {
		problems = append(problems, fmt.Sprintf("SLUICE_LOG_FORMAT: expected json or console, got %q", s.LogFormat))
	}
	c.tracing = telemetry.Config{
		Endpoint: s.OTELEndpoint, TracesEndpoint: s.OTELTracesEndpoint,
		Protocol: s.OTELProtocol, TracesProtocol: s.OTELTracesProtocol,
		Sampler: s.OTELSampler, SamplerArg: s.OTELSamplerArg,
		ServiceName: s.OTELServiceName, Disabled: s.OTELDisabled, Exporter: s.OTELExporter,
	}
	problems = append(problems, c.tracing.Problems()...)

	if len(problems) > 0 {
		return nil, &configError{problems: problems}
	}
	return c, nil
}

// validListen reports whether addr is host:port with a decimal port from
// 0 to 65535. net.Listen would also take a service name (":http"), and
// refuses a port out of range only when the listener opens, after the
// store has started: such an address is a configuration problem, listed
// with the others.
func validListen(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	_, err = strconv.ParseUint(port, 10, 16) // digits only, at most 65535
	return err == nil
}

// anyPort reports whether addr asks for any free port (port 0), which the
// kernel picks when the listener opens and logs (see Gateway.listening).
func anyPort(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && port == "0"
}

// sameListener is the problem of two listeners given one address.
func sameListener(first, second string) string {
	if first == "SLUICE_ADMIN_LISTEN" {
		if second == "SLUICE_LISTEN" {
			return "SLUICE_ADMIN_LISTEN: must differ from SLUICE_LISTEN: the admin API is never on the public listener"
		}
		return second + ": must differ from SLUICE_ADMIN_LISTEN: the admin API is never on a listener other proxies call"
	}
	return second + ": must differ from " + first + ": each listener has an address of its own"
}

// jwtSettings name the settings of jwt.Config's fields, for its problems.
var jwtSettings = map[string]string{
	"JWKSURL":    "SLUICE_JWT_JWKS_URL",
	"JWKSFile":   "SLUICE_JWT_JWKS_FILE",
	"Secret":     "SLUICE_JWT_SECRET",
	"Issuer":     "SLUICE_JWT_ISSUER",
	"Audiences":  "SLUICE_JWT_AUDIENCE",
	"Algorithms": "SLUICE_JWT_ALGORITHMS",
	"Leeway":     "SLUICE_JWT_LEEWAY",
}

// hasKeySource reports whether any setting gives keys that verify tokens.
func (s *settings) hasKeySource() bool {
	return s.JWTJWKSURL != "" || s.JWTJWKSFile != "" || s.JWTSecret != ""
}

// loadJWT validates the SLUICE_JWT_* settings, and with a key source
// builds the verifier (reading SLUICE_JWT_JWKS_FILE) into c.jwt. Without
// a key source the other SLUICE_JWT_* settings have nothing to check, and
// rules that need a token are refused (see loadRules). The problems
// jwt.New finds are reported under the settings' names; the secret is in
// none of them.
func loadJWT(c *config, problems *[]string, unparsed map[string]bool) {
	s := &c.settings
	if s.JWTInvalid != "ip" && s.JWTInvalid != "reject" {
		*problems = append(*problems, fmt.Sprintf("SLUICE_JWT_INVALID: expected ip or reject, got %q", s.JWTInvalid))
	}
	leeway := s.JWTLeeway
	switch {
	case unparsed["SLUICE_JWT_LEEWAY"]:
	case leeway < 0:
		*problems = append(*problems, fmt.Sprintf("SLUICE_JWT_LEEWAY: must be 0 (none) or more, got %s", leeway))
		leeway = 0 // jwt's default: the other settings are still checked
	case leeway == 0:
		leeway = jwt.Off
	}
	if !s.hasKeySource() {
		return
	}
	c.jwtConfig = jwt.Config{
		JWKSURL:    s.JWTJWKSURL,
		JWKSFile:   s.JWTJWKSFile,
		Secret:     []byte(s.JWTSecret),
		Issuer:     s.JWTIssuer,
		Audiences:  commaList(s.JWTAudience),
		Algorithms: commaList(s.JWTAlgorithms),
		Leeway:     leeway,
	}
	v, err := jwt.New(c.jwtConfig)
	if err == nil {
		c.jwt = v
		return
	}
	errs := []error{err}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		errs = joined.Unwrap()
	}
	for _, e := range errs {
		var ce *jwt.ConfigError
		switch {
		case !errors.As(e, &ce):
			*problems = append(*problems, e.Error())
		case jwtSettings[ce.Field] != "":
			*problems = append(*problems, jwtSettings[ce.Field]+": "+ce.Problem)
		case s.JWTJWKSURL != "" && s.JWTJWKSFile != "":
			*problems = append(*problems, "SLUICE_JWT_JWKS_URL and SLUICE_JWT_JWKS_FILE: set one, not both")
		default:
			*problems = append(*problems, "SLUICE_JWT_*: "+ce.Problem)
		}
	}
}

// commaList splits a comma list, trimming white space around each item;
// nil when s holds nothing but white space.
func commaList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	items := strings.Split(s, ",")
	for i := range items {
		items[i] = strings.TrimSpace(items[i])
	}
	return items
}

// migrateSettings are the only settings `sluice migrate` reads, with the
// same names and defaults as in settings (a test keeps them equal): a
// migration job or a deploy step has the database and the schema, not the
// gateway's upstream, rules or hash key.
type migrateSettings struct {
	DatabaseURL    string `env:"SLUICE_DATABASE_URL"`
	DatabaseURLAlt string `env:"DATABASE_URL"`
	DBSchema       string `env:"SLUICE_DB_SCHEMA" envDefault:"sluice"`
}

// loadMigrate reads and validates the settings of `sluice migrate`,
// reporting every problem at once as load does.
func loadMigrate(environ map[string]string) (*config, error) {
	var s migrateSettings
	if err := env.ParseWithOptions(&s, env.Options{Environment: environ}); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	c := &config{settings: settings{DatabaseURL: s.DatabaseURL, DatabaseURLAlt: s.DatabaseURLAlt, DBSchema: s.DBSchema}}
	c.databaseURL = databaseURL(s.DatabaseURL, s.DatabaseURLAlt)
	if c.databaseURL == "" {
		return nil, errors.New("migrate: no database configured: set SLUICE_DATABASE_URL")
	}
	var problems []string
	if _, err := pgxpool.ParseConfig(c.databaseURL); err != nil {
		problems = append(problems, errBadDatabaseURL.Error())
	}
	if msg := schemaProblem(s.DBSchema); msg != "" {
		problems = append(problems, msg)
	}
	if len(problems) > 0 {
		return nil, &configError{problems: problems}
	}
	return c, nil
}

// healthcheckSettings are the only settings `sluice healthcheck` reads, with
// the same names and defaults as in settings (a test keeps them equal), so
// that the probe works whatever else the environment holds or lacks.
type healthcheckSettings struct {
	AdminListen string `env:"SLUICE_ADMIN_LISTEN" envDefault:"127.0.0.1:9090"`
}

// loadHealthcheck reads the settings of `sluice healthcheck` and returns
// the URL it probes: /healthz at SLUICE_ADMIN_LISTEN, where an unspecified
// host (":9090", "0.0.0.0:9090", "[::]:9090") means loopback.
func loadHealthcheck(environ map[string]string) (string, error) {
	var s healthcheckSettings
	if err := env.ParseWithOptions(&s, env.Options{Environment: environ}); err != nil {
		return "", fmt.Errorf("healthcheck: %w", err)
	}
	host, port, err := net.SplitHostPort(s.AdminListen)
	if err != nil {
		return "", fmt.Errorf("healthcheck: SLUICE_ADMIN_LISTEN: expected host:port such as 127.0.0.1:9090, got %q", s.AdminListen)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		// A wildcard listener also listens on loopback (Go's "tcp"
		// listeners on [::] are dual-stack).
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/healthz", nil
}

// databaseURL is the database's connection string: SLUICE_DATABASE_URL,
// else DATABASE_URL; empty when neither is set.
func databaseURL(url, alt string) string {
	if url == "" {
		return alt
	}
	return url
}

// errBadDatabaseURL is the problem of a connection string that pgx cannot
// parse. pgx's message may echo the connection string; this names the
// problem without repeating a password.
var errBadDatabaseURL = errors.New("SLUICE_DATABASE_URL: not a valid Postgres connection string")

// schemaProblem is the problem with SLUICE_DB_SCHEMA, or "" when it is a
// schema sluice may use.
func schemaProblem(schema string) string {
	if !schemaName.MatchString(schema) || schema == "public" {
		return fmt.Sprintf("SLUICE_DB_SCHEMA: expected a lower-case identifier other than public ([a-z_][a-z0-9_]*, at most 63 characters), got %q", schema)
	}
	return ""
}

// parse returns what f makes of the value of the variable name, or, when f
// fails, the zero value with the problem "name: error" added to problems.
func parse[T any](problems *[]string, name string, f func(string) (T, error), value string) T {
	v, err := f(value)
	if err != nil {
		*problems = append(*problems, name+": "+err.Error())
		var zero T
		return zero
	}
	return v
}

// isLoopback reports whether a listen host only accepts connections from
// this machine: localhost or a loopback address, as the admin listener
// reads a Host (admin.IsLoopbackHost: localhost in ASCII case only, so
// "localhoſt" is not). An empty host (":9090") listens on every
// interface.
func isLoopback(host string) bool {
	return admin.IsLoopbackHost(host)
}

// configError lists every problem found in the settings.
type configError struct{ problems []string }

func (e *configError) Error() string {
	return fmt.Sprintf("invalid configuration (%s):\n  %s", countProblems(len(e.problems)), strings.Join(e.problems, "\n  "))
}

// countProblems is "1 problem" or "N problems".
func countProblems(n int) string {
	if n == 1 {
		return "1 problem"
	}
	return fmt.Sprintf("%d problems", n)
}

// loadRules reads and parses the rules of SLUICE_RULES or SLUICE_RULES_FILE:
// the policy, or every problem, each naming where the rules came from. A
// rule that counts by a token's claim (by jwt) or picks its limit by one
// (plans) is refused without keys to verify tokens: it would count every
// request by its client IP, and no plan would ever apply.
func loadRules(s settings) (*policy.Policy, []string) {
	src, origin, err := rulesSource(s)
	if err != nil {
		return nil, []string{err.Error()}
	}
	p, err := policy.Parse(src)
	if err != nil {
		var problems []string
		for _, line := range strings.Split(err.Error(), "\n") {
			problems = append(problems, origin+": "+line)
		}
		return nil, problems
	}
	if s.hasKeySource() {
		return p, nil
	}
	var problems []string
	for _, r := range p.Rules() {
		what := ""
		switch {
		case r.Identity.Kind == policy.ByJWT:
			what = "by " + r.Identity.String()
		case len(r.Plans) > 0:
			what = "plans(" + r.PlanClaim + ")"
		default:
			continue
		}
		problems = append(problems, fmt.Sprintf("%s: line %d: rule %q: %s needs keys to verify tokens: set SLUICE_JWT_JWKS_URL, SLUICE_JWT_JWKS_FILE or SLUICE_JWT_SECRET", origin, r.Line, r.Name, what))
	}
	if len(problems) > 0 {
		return nil, problems
	}
	return p, nil
}

// rulesSource returns the rule text and where it came from, for messages.
func rulesSource(s settings) (src, origin string, err error) {
	switch {
	case s.Rules != "" && s.RulesFile != "":
		return "", "", errors.New("SLUICE_RULES and SLUICE_RULES_FILE: set one, not both")
	case s.RulesFile != "":
		b, err := os.ReadFile(s.RulesFile)
		if err != nil {
			return "", "", fmt.Errorf("SLUICE_RULES_FILE: %w", err)
		}
		return string(b), "SLUICE_RULES_FILE " + s.RulesFile, nil
	default:
		return s.Rules, "SLUICE_RULES", nil
	}
}

// envProblems turns caarlos0/env's errors, which name Go struct fields and
// Go types, into messages that name the variable and what it expects.
func envProblems(err error, environ map[string]string) (msgs []string, keys map[string]bool) {
	keys = map[string]bool{}
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return []string{err.Error()}, keys
	}
	for _, e := range agg.Errors {
		var pe env.ParseError
		if !errors.As(e, &pe) {
			msgs = append(msgs, e.Error())
			continue
		}
		f, _ := reflect.TypeFor[settings]().FieldByName(pe.Name)
		key := f.Tag.Get("env")
		expected := "a valid value"
		switch {
		case pe.Type == reflect.TypeFor[time.Duration]():
			expected = "a duration such as 50ms or 2s"
		case pe.Type.Kind() == reflect.Bool:
			expected = "true or false"
		case pe.Type.Kind() == reflect.Int || pe.Type.Kind() == reflect.Int64:
			expected = "a whole number"
		}
		msgs = append(msgs, fmt.Sprintf("%s: expected %s, got %q", key, expected, environ[key]))
		keys[key] = true
	}
	return msgs, keys
}
