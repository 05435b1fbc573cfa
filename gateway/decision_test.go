//go:build unix

package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
)

// decisionService runs a gateway that answers other proxies only: no
// SLUICE_UPSTREAM, forward-auth on check and Envoy's rate limit service on
// rls, both on loopback ports the kernel chose. It returns once both
// accept.
func decisionService(t *testing.T, env map[string]string) (g *Gateway, check, rls string) {
	t.Helper()
	env["SLUICE_UPSTREAM"] = ""
	env["SLUICE_CHECK_LISTEN"], env["SLUICE_RLS_LISTEN"] = "127.0.0.1:0", "127.0.0.1:0"
	g, r, _ := serveGatewayAsync(t, env, Options{Logger: zap.NewNop()})
	return g, r.addr(t, "SLUICE_CHECK_LISTEN"), r.addr(t, "SLUICE_RLS_LISTEN")
}

// rlsClient is a client of the rate limit service at addr, built from
// go-control-plane's types as Envoy calls it, over plain HTTP/2 or with
// the TLS configuration tc.
func rlsClient(t *testing.T, addr string, tc *tls.Config) rlsv3.RateLimitServiceClient {
	t.Helper()
	creds := insecure.NewCredentials()
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func descriptorCall(domain string, kv ...string) *rlsv3.RateLimitRequest {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
}

// askCheck sends one forward-auth question about method and uri.
func askCheck(c *http.Client, url, method, uri string) (int, error) {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-Forwarded-Method", method)
	req.Header.Set("X-Forwarded-Uri", uri)
	return proctest.StatusOf(c.Do(req))
}

// TestDecisionServiceOnly: without SLUICE_UPSTREAM, sluice serves the
// check and gRPC listeners and no public one; both share the rules (a
// reload reaches both), the store and the metrics, labelled by listener.
func TestDecisionServiceOnly(t *testing.T) {
	dir := t.TempDir()
	rules := dir + "/rules"
	os.WriteFile(rules, []byte("login: POST /api/login by ip 2/1m\nrls-login: * rls:edge by descriptor(generic_key=login,remote_address) 2/1m"), 0o644)
	env := base()
	env["SLUICE_RULES"], env["SLUICE_RULES_FILE"] = "", rules
	g, check, rlsAddr := decisionService(t, env)
	if g.public != nil {
		t.Fatal("a public listener without SLUICE_UPSTREAM")
	}
	pgtest.ClearOf(t, time.Minute, 5*time.Second)
	var codes []int
	for range 3 {
		code, err := askCheck(http.DefaultClient, "http://"+check, "POST", "/api/login")
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 200 429]" {
		t.Errorf("forward-auth: %v, want [200 200 429]", codes)
	}
	c := rlsClient(t, rlsAddr, nil)
	var overall []string
	for range 3 {
		res, err := c.ShouldRateLimit(context.Background(), descriptorCall("edge", "generic_key", "login", "remote_address", "10.0.0.1"))
		if err != nil {
			t.Fatal(err)
		}
		overall = append(overall, res.GetOverallCode().String())
	}
	if fmt.Sprint(overall) != "[OK OK OVER_LIMIT]" {
		t.Errorf("rls: %v", overall)
	}
	// One reload reaches both listeners.
	os.WriteFile(rules, []byte("login: POST /api/login by ip 5/1m\nrls-login: * rls:edge by descriptor(generic_key=login,remote_address) 5/1m"), 0o644)
	if err := g.reloadRules(); err != nil {
		t.Fatal(err)
	}
	if code, _ := askCheck(http.DefaultClient, "http://"+check, "POST", "/api/login"); code != 200 {
		t.Errorf("forward-auth after raising the limit: %d", code)
	}
	if res, _ := c.ShouldRateLimit(context.Background(), descriptorCall("edge", "generic_key", "login", "remote_address", "10.0.0.1")); res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("rls after raising the limit: %v", res)
	}
	for series, n := range map[string]float64{
		`sluice_requests_total{listener="check",outcome="allowed"}`:  3,
		`sluice_requests_total{listener="check",outcome="limited"}`:  1,
		`sluice_requests_total{listener="rls",outcome="allowed"}`:    3,
		`sluice_requests_total{listener="rls",outcome="limited"}`:    1,
		`sluice_requests_total{listener="public",outcome="allowed"}`: 0,
	} {
		if v := gathered(t, g, series); v != n {
			t.Errorf("%s = %v, want %v", series, v, n)
		}
	}
}

// TestDescriptorKeysInTheAdminAPI: the admin API reads, overrides and
// resets the counter of a descriptor's open values, as the gRPC listener
// counts it, and refuses a wrong number of values.
func TestDescriptorKeysInTheAdminAPI(t *testing.T) {
	env := base()
	env["SLUICE_RULES"] = "rls-login: * rls:edge by descriptor(generic_key=login,remote_address) 2/1h"
	env["SLUICE_ADMIN_TOKEN"] = "admin-token"
	env["SLUICE_UPSTREAM"], env["SLUICE_CHECK_LISTEN"], env["SLUICE_RLS_LISTEN"] = "", "127.0.0.1:0", "127.0.0.1:0"
	_, r, _ := serveGatewayAsync(t, env, Options{Logger: zap.NewNop()})
	rlsAddr := r.addr(t, "SLUICE_RLS_LISTEN")
	c := rlsClient(t, rlsAddr, nil)
	pgtest.ClearOf(t, time.Hour, 10*time.Second)
	login := descriptorCall("edge", "generic_key", "login", "remote_address", "10.0.0.9")
	if _, err := c.ShouldRateLimit(context.Background(), login); err != nil {
		t.Fatal(err)
	}
	key := r.admin + "/v1/keys?rule=rls-login&descriptor=10.0.0.9"
	if code, body := proctest.Call(t, "GET", key, "admin-token", ""); code != 200 || !strings.Contains(body, `"count":1`) {
		t.Errorf("GET the descriptor's key: %d %s", code, body)
	}
	if code, body := proctest.Call(t, "GET", key+"&descriptor=x", "admin-token", ""); code != 400 || !strings.Contains(body, "give descriptor= once for each") {
		t.Errorf("two values for one open key: %d %s", code, body)
	}
	override := r.admin + "/v1/overrides?rule=rls-login&descriptor=10.0.0.9"
	if code, body := proctest.Call(t, "PUT", override, "admin-token", `{"limit":50,"window":"1h"}`); code != 200 {
		t.Fatalf("PUT override: %d %s", code, body)
	}
	res, err := c.ShouldRateLimit(context.Background(), login)
	if err != nil {
		t.Fatal(err)
	}
	if lim := res.GetStatuses()[0].GetCurrentLimit(); lim.GetRequestsPerUnit() != 50 || res.GetStatuses()[0].GetLimitRemaining() != 48 {
		t.Errorf("after the override: %v", res.GetStatuses()[0])
	}
}

// gathered is the value of one series of g's metrics, written as in the
// exposition.
func gathered(t *testing.T, g *Gateway, series string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(g.Metrics(), promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	m, err := proctest.ParseMetrics(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	return m[series]
}

// TestDecisionServiceDeadDatabase: with the database unreachable, each
// listener answers each rule's fail mode within SLUICE_DB_TIMEOUT and a
// margin: forward-auth 503 for fail=closed, gRPC UNKNOWN; open lets
// through; local decides per instance.
func TestDecisionServiceDeadDatabase(t *testing.T) {
	env := map[string]string{
		"SLUICE_DATABASE_URL":  "postgres://postgres@" + proctest.FreeAddr(t) + "/postgres?sslmode=disable&connect_timeout=1",
		"SLUICE_HASH_KEY":      "dead-database-key-0123456789",
		"SLUICE_DB_TIMEOUT":    "50ms",
		"SLUICE_START_TIMEOUT": "100ms",
		"SLUICE_RULES": `closed: GET /closed by ip 5/1m fail=closed
open: GET /open by ip 1/1m fail=open
local: GET /local by ip 1/1m fail=local
rclosed: * rls:e by descriptor(k=closed) 5/1m fail=closed
ropen: * rls:e by descriptor(k=open) 1/1m fail=open
rlocal: * rls:e by descriptor(k=local) 1/1m fail=local`,
	}
	_, check, rlsAddr := decisionService(t, env)
	c := rlsClient(t, rlsAddr, nil)
	const deadline = 50*time.Millisecond + 450*time.Millisecond // SLUICE_DB_TIMEOUT and a margin for a loaded machine
	timed := func(what string, f func() string) string {
		t.Helper()
		began := time.Now()
		got := f()
		if took := time.Since(began); took > deadline {
			t.Errorf("%s took %v, more than %v", what, took, deadline)
		}
		return got
	}
	ask := func(path string) string {
		code, err := askCheck(http.DefaultClient, "http://"+check, "GET", path)
		if err != nil {
			return err.Error()
		}
		return fmt.Sprint(code)
	}
	call := func(k string) string {
		res, err := c.ShouldRateLimit(context.Background(), descriptorCall("e", "k", k))
		if err != nil {
			return status.Code(err).String()
		}
		return res.GetOverallCode().String()
	}
	c.ShouldRateLimit(context.Background(), descriptorCall("e", "k", "none")) // the connection, outside the timing
	// Both requests of each fail=local rule in one window of its 1m.
	pgtest.ClearOf(t, time.Minute, 5*time.Second)
	for _, tc := range []struct{ what, got, want string }{
		{"check closed", timed("check closed", func() string { return ask("/closed") }), "503"},
		{"check open", timed("check open", func() string { return ask("/open") }), "200"},
		{"check open again", timed("check open", func() string { return ask("/open") }), "200"},
		{"check local", timed("check local", func() string { return ask("/local") }), "200"},
		{"check local again", timed("check local", func() string { return ask("/local") }), "429"},
		{"rls closed", timed("rls closed", func() string { return call("closed") }), codes.Unknown.String()},
		{"rls open", timed("rls open", func() string { return call("open") }), "OK"},
		{"rls open again", timed("rls open", func() string { return call("open") }), "OK"},
		{"rls local", timed("rls local", func() string { return call("local") }), "OK"},
		{"rls local again", timed("rls local", func() string { return call("local") }), "OVER_LIMIT"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %s, want %s", tc.what, tc.got, tc.want)
		}
	}
}

// TestRLSExactAcrossInstances: 50 concurrent calls through two instances
// on one Postgres, on a limit of 10, let exactly 10 through.
func TestRLSExactAcrossInstances(t *testing.T) {
	db := pgtest.New(t)
	var clients []rlsv3.RateLimitServiceClient
	for range 2 {
		env := map[string]string{
			"SLUICE_DATABASE_URL": db.URL, "SLUICE_DB_SCHEMA": db.Schema, "SLUICE_AUTO_MIGRATE": "false",
			"SLUICE_HASH_KEY":   "rls-exact-key-0123456789",
			"SLUICE_DB_TIMEOUT": "2s", "SLUICE_FAIL_MODE": "closed",
			"SLUICE_RULES": "rls-login: * rls:edge by descriptor(generic_key=login,remote_address) 10/1h",
		}
		_, _, addr := decisionService(t, env)
		clients = append(clients, rlsClient(t, addr, nil))
	}
	pgtest.ClearOf(t, time.Hour, 20*time.Second)
	codes := proctest.CountStatuses(t, 50, func(i int) (int, error) {
		res, err := clients[i%2].ShouldRateLimit(context.Background(), descriptorCall("edge", "generic_key", "login", "remote_address", "198.51.100.7"))
		return int(res.GetOverallCode()), err
	})
	ok, over := codes[int(rlsv3.RateLimitResponse_OK)], codes[int(rlsv3.RateLimitResponse_OVER_LIMIT)]
	if ok != 10 || over != 40 {
		t.Errorf("50 calls on a limit of 10: %d OK, %d OVER_LIMIT (all codes: %v); want 10, 40", ok, over, codes)
	}
}

// TestTLS: with SLUICE_TLS_* set, the public, check and gRPC listeners
// speak TLS, offer HTTP/2, and refuse a caller without a certificate the
// client CA signed; on SIGHUP a renewed certificate is served to new
// connections while an open one goes on, and a broken file keeps the
// running certificate.
func TestTLS(t *testing.T) {
	p := newPKI(t)
	certFile, keyFile, first := p.issue(t, "server", false, time.Now().Add(2*time.Hour))
	clientFile, clientKey, _ := p.issue(t, "envoy", true, time.Now().Add(2*time.Hour))
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	env := base()
	env["SLUICE_UPSTREAM"] = up.URL
	env["SLUICE_RULES"] = "login: POST /api/login by ip 100/1m; rls: * rls:edge by descriptor(remote_address) 100/1m"
	env["SLUICE_TLS_CERT_FILE"], env["SLUICE_TLS_KEY_FILE"], env["SLUICE_TLS_CLIENT_CA_FILE"] = certFile, keyFile, p.caFile
	env["SLUICE_CHECK_LISTEN"], env["SLUICE_RLS_LISTEN"] = "127.0.0.1:0", "127.0.0.1:0"
	_, r := serveGateway(t, env, Options{Logger: zap.NewNop()})
	public := strings.Replace(r.url, "http://", "https://", 1)
	check, rlsAddr := r.addr(t, "SLUICE_CHECK_LISTEN"), r.addr(t, "SLUICE_RLS_LISTEN")

	withCert := &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{clientCert(t, clientFile, clientKey)}}
	newClient := func(tc *tls.Config) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}}
	}
	good := newClient(withCert)
	res, err := good.Post(public+"/api/login", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || res.Proto != "HTTP/2.0" || res.Header.Get("Ratelimit-Policy") == "" {
		t.Errorf("public over TLS: %d %s %v", res.StatusCode, res.Proto, res.Header)
	}
	if code, err := askCheck(good, "https://"+check, "POST", "/api/login"); err != nil || code != 200 {
		t.Errorf("check over TLS: %d %v", code, err)
	}
	if _, err := rlsClient(t, rlsAddr, withCert).ShouldRateLimit(context.Background(), descriptorCall("edge", "remote_address", "10.0.0.1")); err != nil {
		t.Errorf("rls over mutual TLS: %v", err)
	}

	// Callers without a certificate the CA signed are refused, on every
	// listener.
	stranger := newPKI(t)
	strangerFile, strangerKey, _ := stranger.issue(t, "stranger", true, time.Now().Add(time.Hour))
	for name, tc := range map[string]*tls.Config{
		"no certificate":           {RootCAs: p.pool},
		"another CA's certificate": {RootCAs: p.pool, Certificates: []tls.Certificate{clientCert(t, strangerFile, strangerKey)}},
	} {
		if _, err := askCheck(newClient(tc), "https://"+check, "POST", "/api/login"); err == nil {
			t.Errorf("check, %s: answered", name)
		}
		if res, err := newClient(tc).Post(public+"/api/login", "", nil); err == nil {
			res.Body.Close()
			t.Errorf("public, %s: answered", name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := rlsClient(t, rlsAddr, tc).ShouldRateLimit(ctx, descriptorCall("edge", "remote_address", "10.0.0.1"))
		cancel()
		if err == nil {
			t.Errorf("rls, %s: answered", name)
		}
	}
	// Plain HTTP gets net/http's "Client sent an HTTP request to an HTTPS
	// server", never a decision.
	if code, err := askCheck(http.DefaultClient, "http://"+check, "POST", "/api/login"); err == nil && code != http.StatusBadRequest {
		t.Errorf("check answered plain HTTP with %d", code)
	}

	// Renewal: new files, SIGHUP; new connections see the new
	// certificate, the open one goes on.
	served := func(c *http.Client) *x509.Certificate {
		t.Helper()
		res, err := c.Post(public+"/api/login", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.TLS.PeerCertificates[0]
	}
	if got := served(good); got.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Fatalf("serial %v before the renewal, want %v", got.SerialNumber, first.SerialNumber)
	}
	renewedCert, renewedKey, renewed := p.issue(t, "server-renewed", false, time.Now().Add(48*time.Hour))
	copyFile(t, renewedCert, certFile)
	copyFile(t, renewedKey, keyFile)
	hup(t)
	deadline := time.Now().Add(10 * time.Second)
	for served(newClient(withCert)).SerialNumber.Cmp(renewed.SerialNumber) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("new connections do not get the renewed certificate 10 s after SIGHUP")
		}
		time.Sleep(20 * time.Millisecond) // the signal is handled by another goroutine
	}
	if got := served(good); got.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Errorf("the connection open before SIGHUP: serial %v, want the first certificate's (not dropped)", got.SerialNumber)
	}
	// A broken file on the next SIGHUP keeps the renewed certificate.
	os.WriteFile(certFile, []byte("garbage"), 0o600)
	hup(t)
	time.Sleep(200 * time.Millisecond) // nothing observable is to change: give the handler time to have refused
	if got := served(newClient(withCert)); got.SerialNumber.Cmp(renewed.SerialNumber) != 0 {
		t.Errorf("after a broken file: serial %v, want the renewed %v", got.SerialNumber, renewed.SerialNumber)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
