package gateway

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
)

// TestAccessLog: with SLUICE_ACCESS_LOG=true every request gets one JSON
// line with its method, canonical path, rules, hashed key prefixes,
// outcome, status and durations, and no line carries an IP, email or
// tenant that was sent; the responses are counted by status, also the
// listener's own answer to a request that does not parse.
func TestAccessLog(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	}))
	defer up.Close()
	const (
		email  = "Victim.Person@Example.com"
		tenant = "acme-tenant-7731"
		client = "203.0.113.77"
	)
	env := base()
	env["SLUICE_UPSTREAM"] = up.URL
	env["SLUICE_ACCESS_LOG"] = "true"
	env["SLUICE_TRUSTED_PROXIES"] = "127.0.0.1/32"
	env["SLUICE_RULES"] = "login: POST /api/login by ip 1/1h; reset: POST /api/reset by email 5/1h; q: GET /api/q by tenant 5/1h"
	var out proctest.Buffer
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&out), zapcore.InfoLevel))
	_, g := serveGateway(t, env, Options{Logger: log})
	pgtest.ClearOf(t, time.Hour, 10*time.Second)

	send := func(method, path, body string, header ...string) int {
		t.Helper()
		req, _ := http.NewRequest(method, g.url+path, strings.NewReader(body))
		req.Header.Set("X-Forwarded-For", client)
		for i := 0; i < len(header); i += 2 {
			req.Header.Add(header[i], header[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	want := []struct {
		method, path, outcome string
		rules                 []string
		status                int
		upstream              bool
	}{
		{"POST", "/api/login", "allowed", []string{"login"}, 200, true},
		{"POST", "/api/login", "limited", []string{"login"}, 429, false},
		{"POST", "/api/reset", "allowed", []string{"reset"}, 200, true},
		{"GET", "/api/q", "allowed", []string{"q"}, 200, true},
		{"GET", "/api/q", "rejected", []string{"q"}, 400, false},
		{"GET", "/elsewhere", "no_rule", []string{}, 200, true},
	}
	send("POST", "/api/login", "")
	send("POST", "/api//login", "")
	send("POST", "/api/reset", `{"email":"`+email+`"}`, "Content-Type", "application/json")
	send("GET", "/api/q?x="+tenant[:4], "", "X-Tenant-ID", tenant)
	send("GET", "/api/q", "", "X-Tenant-ID", tenant, "X-Tenant-ID", "other") // ambiguous: 400
	send("GET", "/elsewhere", "")
	// A request net/http refuses before any handler: counted, not logged.
	c, err := net.Dial("tcp", strings.TrimPrefix(g.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET /api/%zz HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || res.StatusCode != 400 || res.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("malformed path on the public listener: %v %v", res, err)
	}
	c.Close()
	if err := g.stop(); err != nil {
		t.Fatal(err)
	}

	var lines []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, line)
		}
		if m["logger"] == "access" {
			lines = append(lines, m)
			for _, secret := range []string{client, "127.0.0.1", strings.ToLower(email), email, tenant, "acme"} {
				if strings.Contains(line, secret) {
					t.Errorf("access log line shows %q: %s", secret, line)
				}
			}
		}
	}
	if len(lines) != len(want) {
		t.Fatalf("%d access log lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, w := range want {
		m := lines[i]
		rules, _ := json.Marshal(m["rules"])
		wantRules, _ := json.Marshal(w.rules)
		if m["msg"] != "request" || m["method"] != w.method || m["path"] != w.path || m["outcome"] != w.outcome ||
			m["status"] != float64(w.status) || string(rules) != string(wantRules) {
			t.Errorf("line %d: %v, want %+v", i, m, w)
		}
		if d, ok := m["duration_ms"].(float64); !ok || d <= 0 {
			t.Errorf("line %d: duration_ms %v", i, m["duration_ms"])
		}
		if _, ok := m["upstream_ms"]; ok != w.upstream {
			t.Errorf("line %d: upstream_ms present %v, want %v", i, ok, w.upstream)
		}
		keys, _ := m["keys"].([]any)
		if w.outcome != "rejected" && len(keys) != len(w.rules) {
			t.Errorf("line %d: keys %v for rules %v", i, keys, w.rules)
		}
		for _, k := range keys {
			if s, _ := k.(string); len(s) != 12 {
				t.Errorf("line %d: key %q is not a 12-character prefix of the hash", i, k)
			}
		}
	}
}

// TestResponsesMetric: sluice_http_responses_total counts the public
// listener's responses by status, including net/http's own refusals.
func TestResponsesMetric(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	env := base()
	env["SLUICE_UPSTREAM"] = up.URL
	env["SLUICE_RULES"] = "login: POST /api/login by ip 1/1h"
	g := start(t, env)
	pgtest.ClearOf(t, time.Hour, 10*time.Second)
	for range 3 {
		res, err := http.Post(g.url+"/api/login", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	get(t, g.url+"/api/%2e%2e/x") // sluice's own 400
	c, err := net.Dial("tcp", strings.TrimPrefix(g.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET / HTTP/1.1\r\n\r\n") // net/http's own 400: no Host
	io.Copy(io.Discard, c)
	c.Close()
	_, metrics := get(t, g.admin+"/metrics")
	for _, want := range []string{
		`sluice_http_responses_total{code="200"} 1`,
		`sluice_http_responses_total{code="429"} 2`,
		`sluice_http_responses_total{code="400"} 2`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestAccessLogLogger: the production logger writes every access log line,
// unsampled and whatever SLUICE_LOG_LEVEL says, while other lines keep
// the level and the sampling.
func TestAccessLogLogger(t *testing.T) {
	env := base()
	env["SLUICE_ACCESS_LOG"], env["SLUICE_LOG_LEVEL"] = "true", "warn"
	cfg, err := load(env)
	if err != nil {
		t.Fatal(err)
	}
	var out proctest.Buffer
	log := buildLogger(cfg, zapcore.AddSync(&out))
	access := log.Named(accessLoggerName)
	for i := range 500 {
		access.Info("request", zap.Int("i", i))
		log.Info("chatter")
		log.Warn("store trouble")
	}
	got := out.String()
	if n := strings.Count(got, `"msg":"request"`); n != 500 {
		t.Errorf("%d access log lines of 500", n)
	}
	if strings.Contains(got, "chatter") {
		t.Error("an INFO line passed SLUICE_LOG_LEVEL=warn")
	}
	if n := strings.Count(got, "store trouble"); n < 100 || n > 110 {
		t.Errorf("%d of 500 repeated WARN lines, want the sampled 100 or so", n)
	}
	env["SLUICE_ACCESS_LOG"] = "false"
	if cfg, err = load(env); err != nil {
		t.Fatal(err)
	}
	var off proctest.Buffer
	buildLogger(cfg, zapcore.AddSync(&off)).Named(accessLoggerName).Info("request")
	if off.String() != "" {
		t.Errorf("with the access log off, its logger wrote: %s", off.String())
	}
}
