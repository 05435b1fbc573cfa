package deploy

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
)

// The example addresses of deploy/nginx/sluice.conf and
// deploy/caddy/Caddyfile, which a test replaces with free ports: sluice's
// SLUICE_CHECK_LISTEN, the application, and the port the proxy listens on.
const (
	exampleCheck = "127.0.0.1:9191"
	exampleApp   = "127.0.0.1:3000"
)

// render returns the shipped file at path (under deploy/) with each old
// string replaced by its new one, failing t when an old string is not in
// the file: the test runs the file as shipped, its addresses aside.
func render(t *testing.T, path string, oldNew ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", path))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for i := 0; i < len(oldNew); i += 2 {
		if !strings.Contains(s, oldNew[i]) {
			t.Fatalf("%s no longer holds %q, which the test replaces", path, oldNew[i])
		}
	}
	// One pass: a port put in for one address (127.0.0.1:30003) must not
	// be read again as another's (127.0.0.1:3000).
	return strings.NewReplacer(oldNew...).Replace(s)
}

// app is the application behind the proxy: it counts what reaches it and
// sends rate-limit headers of its own, which the client must never see
// beside sluice's.
type app struct{ *proctest.Upstream }

func newApp(t *testing.T) *app {
	return &app{proctest.NewUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("RateLimit", `"app";r=99;t=1`)
		w.Header().Set("X-RateLimit-Limit", "99")
		io.WriteString(w, "from the app")
	})}
}

func (a *app) addr() string { return strings.TrimPrefix(a.URL, "http://") }

// startNginx runs Debian's nginx with deploy/nginx/sluice.conf in front of
// upstream, asking sluice at check, and returns its base URL.
func startNginx(t *testing.T, check, upstream string) string {
	t.Helper()
	nginx := tool(t, "nginx", "nginx-light")
	dir := t.TempDir()
	os.Chmod(dir, 0o755) // nginx's workers may run as another user
	listen := proctest.FreeAddr(t)
	site := render(t, "nginx/sluice.conf", exampleCheck, check, exampleApp, upstream, "listen 8000;", "listen "+listen+";")
	writeConf(t, filepath.Join(dir, "sluice.conf"), site)
	// What a packaged nginx.conf has around conf.d/*.conf, with every path
	// in the test's directory.
	var main strings.Builder
	fmt.Fprintf(&main, "worker_processes 1;\npid %[1]s/nginx.pid;\nerror_log %[1]s/error.log warn;\n", dir)
	main.WriteString("events { worker_connections 512; }\nhttp {\n    access_log off;\n")
	for _, temp := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		fmt.Fprintf(&main, "    %s_temp_path %s/%s;\n", temp, dir, temp)
	}
	fmt.Fprintf(&main, "    include %s/sluice.conf;\n}\n", dir)
	conf := filepath.Join(dir, "nginx.conf")
	writeConf(t, conf, main.String())
	// nginx stops its workers on SIGTERM.
	runProxy(t, listen, filepath.Join(dir, "error.log"), syscall.SIGTERM, nil,
		nginx, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", conf, "-g", "daemon off;")
	return "http://" + listen
}

// startCaddy runs Debian's caddy with deploy/caddy/Caddyfile in front of
// upstream, asking sluice at check, and returns its base URL.
func startCaddy(t *testing.T, check, upstream string) string {
	t.Helper()
	caddy := tool(t, "caddy", "caddy")
	dir := t.TempDir()
	listen := proctest.FreeAddr(t)
	site := render(t, "caddy/Caddyfile", exampleCheck, check, exampleApp, upstream, "\n:8000 {", "\nhttp://"+listen+" {")
	writeConf(t, filepath.Join(dir, "site"), site)
	// Global options of the test's Caddy: no admin endpoint (tests run
	// side by side), no certificates to manage.
	conf := filepath.Join(dir, "Caddyfile")
	writeConf(t, conf, "{\n\tadmin off\n\tauto_https off\n}\nimport "+filepath.Join(dir, "site")+"\n")
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir}
	runProxy(t, listen, "", syscall.SIGKILL, env, caddy, "run", "--config", conf, "--adapter", "caddyfile")
	return "http://" + listen
}

// writeConf writes a configuration file of the test's.
func writeConf(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// runProxy starts the proxy prog with args and env as proctest.Daemon
// does, and waits for it to accept on listen; if it does not, the test
// fails with its output and errorLog (a file, when the proxy logs to one).
func runProxy(t *testing.T, listen, errorLog string, sig syscall.Signal, env []string, prog string, args ...string) {
	t.Helper()
	if out, ok := proctest.Daemon(t, listen, sig, env, prog, args...); !ok {
		var log []byte
		if errorLog != "" {
			log, _ = os.ReadFile(errorLog)
		}
		t.Fatalf("%s does not listen on %s: %s\n%s", filepath.Base(prog), listen, out, log)
	}
}

// decisionService starts sluice with only its check listener, trusting the
// proxies on loopback, and returns the check listener's address.
func decisionService(t *testing.T, env map[string]string) (string, *process) {
	t.Helper()
	env["SLUICE_CHECK_LISTEN"] = "127.0.0.1:0"
	env["SLUICE_TRUSTED_PROXIES"] = "127.0.0.1"
	p := startSluice(t, env)
	return p.check, p
}

// reply is one response to a client, its body read.
type reply struct {
	code   int
	header http.Header
	body   string
}

// get sends GET url with the header pairs (a name, then its value).
func get(t *testing.T, url string, header ...string) reply {
	t.Helper()
	res, body := proctest.Send(t, http.MethodGet, url, header...)
	return reply{res.StatusCode, res.Header, body}
}

// expectLimited sends six requests through the proxy at base against a
// limit of three: three reach the application with sluice's headers
// (never the application's own), three get 429 with Retry-After, the
// RateLimit headers and a problem+json body. A path no rule matches
// passes without rate-limit headers.
func expectLimited(t *testing.T, base string, a *app) {
	t.Helper()
	for i := range 6 {
		r := get(t, base+"/hello")
		allowed := i < 3
		switch {
		case allowed && (r.code != 200 || r.body != "from the app"):
			t.Errorf("request %d: %d %q, want the app's 200", i+1, r.code, r.body)
		case allowed && !strings.HasPrefix(r.header.Get("Ratelimit"), fmt.Sprintf(`"hello";r=%d;t=`, 2-i)):
			t.Errorf("request %d: RateLimit %q", i+1, r.header.Values("Ratelimit"))
		case !allowed && (r.code != http.StatusTooManyRequests || r.header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(r.body, `"status":429`) || !strings.Contains(r.body, "quota-exceeded")):
			t.Errorf("request %d: %d %s %q, want 429 problem+json", i+1, r.code, r.header.Get("Content-Type"), r.body)
		case !allowed && (r.header.Get("Retry-After") == "" || r.header.Get("Retry-After") == "0"):
			t.Errorf("request %d: Retry-After %q", i+1, r.header.Get("Retry-After"))
		}
		for _, h := range []string{"Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"} {
			if v := r.header.Values(h); len(v) != 1 || v[0] == "" || strings.Contains(v[0], "app") || v[0] == "99" {
				t.Errorf("request %d: %s %q, want one, sluice's", i+1, h, v)
			}
		}
		if got, want := r.header.Get("Ratelimit-Policy"), `"hello";q=3;w=60`; got != want {
			t.Errorf("request %d: RateLimit-Policy %q, want %q", i+1, got, want)
		}
	}
	if n := a.Hits(); n != 3 {
		t.Errorf("%d requests reached the app, want 3", n)
	}
	r := get(t, base+"/elsewhere")
	if r.code != 200 || r.body != "from the app" || r.header.Get("Ratelimit") != "" || r.header.Get("Ratelimit-Policy") != "" {
		t.Errorf("a path no rule matches: %d %v", r.code, r.header)
	}
}

const proxyRules = "hello: GET /hello by ip 3/1m; q: GET /q by tenant 5/1m"

// limitedBehind starts sluice's decision service for proxyRules, and in
// front of a new app the proxy that start runs, asking it; it checks
// expectLimited through the proxy, and returns the proxy's base URL, the
// app and sluice.
func limitedBehind(t *testing.T, start func(t *testing.T, check, upstream string) string) (string, *app, *process) {
	t.Helper()
	a := newApp(t)
	check, sl := decisionService(t, map[string]string{"SLUICE_RULES": proxyRules})
	base := start(t, check, a.addr())
	// The six requests, and the test's after them, in one window of the
	// 1m rule.
	pgtest.ClearOf(t, time.Minute, 5*time.Second)
	expectLimited(t, base, a)
	return base, a, sl
}

// TestNginxAuthRequest runs deploy/nginx/sluice.conf with Debian's nginx:
// six requests against a limit of three give three to the app and three
// 429s with Retry-After and the RateLimit headers; a request sluice
// cannot read is 400, and with sluice gone, 503 with Retry-After.
func TestNginxAuthRequest(t *testing.T) {
	t.Parallel()
	base, a, sl := limitedBehind(t, startNginx)

	r := get(t, base+"/q", "X-Tenant-ID", "acme", "X-Tenant-ID", "other")
	if r.code != 400 || r.header.Get("Retry-After") != "" || !strings.Contains(r.body, `"status":400`) {
		t.Errorf("an ambiguous tenant: %d %v %s", r.code, r.header, r.body)
	}
	// sluice gone: nginx cannot ask, and answers 503 rather than let
	// requests through unlimited.
	sl.stop(t)
	r = get(t, base+"/hello")
	if r.code != 503 || r.header.Get("Retry-After") != "1" || !strings.Contains(r.body, `"status":503`) {
		t.Errorf("sluice gone: %d %v %s", r.code, r.header, r.body)
	}
	if n := a.Hits(); n != 4 { // three /hello and /elsewhere
		t.Errorf("%d requests reached the app, want 4", n)
	}
}

// TestCaddyForwardAuth runs deploy/caddy/Caddyfile with Debian's caddy:
// the same six requests, and sluice's own 400 passed through.
func TestCaddyForwardAuth(t *testing.T) {
	t.Parallel()
	base, _, _ := limitedBehind(t, startCaddy)
	r := get(t, base+"/hello")
	if !strings.Contains(r.body, `"violated-policies":["hello"]`) {
		t.Errorf("Caddy passes sluice's 429 as it is: %s", r.body)
	}
	r = get(t, base+"/q", "X-Tenant-ID", "acme", "X-Tenant-ID", "other")
	if r.code != 400 || !strings.Contains(r.body, "rule 'q'") {
		t.Errorf("an ambiguous tenant: %d %s", r.code, r.body)
	}
}

// TestSharedLimitBehindProxies: three sluice on one Postgres, each asked
// by an nginx of its own: 30 concurrent requests spread over the three on
// a limit of 5 let exactly 5 reach the app.
func TestSharedLimitBehindProxies(t *testing.T) {
	t.Parallel()
	tool(t, "nginx", "nginx-light")
	db := pgtest.New(t)
	a := newApp(t)
	var bases []string
	for range 3 {
		check, _ := decisionService(t, map[string]string{
			"SLUICE_RULES":        "hello: GET /hello by ip 5/1h fail=closed",
			"SLUICE_DATABASE_URL": db.URL, "SLUICE_DB_SCHEMA": db.Schema, "SLUICE_AUTO_MIGRATE": "false",
			"SLUICE_HASH_KEY":   "shared-limit-key-0123456789",
			"SLUICE_DB_TIMEOUT": "2s",
		})
		bases = append(bases, startNginx(t, check, a.addr()))
	}
	pgtest.ClearOf(t, time.Hour, 20*time.Second)
	codes := proctest.CountStatuses(t, 30, func(i int) (int, error) {
		return proctest.StatusOf(client.Get(bases[i%3] + "/hello"))
	})
	if codes[200] != 5 || codes[429] != 25 || a.Hits() != 5 {
		t.Errorf("30 requests through three nginx and three sluice on a limit of 5: %v, %d reached the app; want 5 × 200, 25 × 429, 5", codes, a.Hits())
	}
}
