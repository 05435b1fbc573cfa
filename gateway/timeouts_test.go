package gateway

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
	"time"

	"net/http/httptest"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/proxy"
)

// TestStreamsAndWriteTimeout: a server-sent event stream that lasts longer
// than an explicit SLUICE_WRITE_TIMEOUT is cut at it, and the same stream
// under the default (0) reaches its end, though it also outlasts a short
// SLUICE_READ_TIMEOUT, which bounds only the reading of the request.
func TestStreamsAndWriteTimeout(t *testing.T) {
	const events = 12
	const every = 100 * time.Millisecond // the stream lasts 1.2 s
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range events {
			if _, err := w.Write([]byte("data: " + strings.Repeat("x", i) + "\n\n")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-time.After(every):
			case <-r.Context().Done():
				return
			}
		}
		w.Write([]byte("data: end\n\n"))
	}))
	defer up.Close()

	stream := func(t *testing.T, set map[string]string) (got int, end bool) {
		t.Helper()
		env := base()
		env["SLUICE_UPSTREAM"] = up.URL
		env["SLUICE_RULES"] = "sse: GET /events by ip 100/1m"
		for k, v := range set {
			env[k] = v
		}
		g := start(t, env)
		res, err := http.Get(g.url + "/events")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("status %d", res.StatusCode)
		}
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			switch line := sc.Text(); {
			case line == "data: end":
				end = true
			case strings.HasPrefix(line, "data: "):
				got++
			}
		}
		return got, end
	}

	t.Run("default never cuts", func(t *testing.T) {
		if got, end := stream(t, map[string]string{"SLUICE_READ_TIMEOUT": "300ms"}); got != events || !end {
			t.Fatalf("got %d of %d events, end %v: the stream was cut", got, events, end)
		}
	})
	t.Run("explicit write timeout cuts", func(t *testing.T) {
		if got, end := stream(t, map[string]string{"SLUICE_WRITE_TIMEOUT": "400ms"}); end || got >= events {
			t.Fatalf("got %d of %d events, end %v: the stream outlived SLUICE_WRITE_TIMEOUT=400ms", got, events, end)
		}
	})
}

// TestTimeoutSettings: the SLUICE_*_TIMEOUT settings reach the public
// server and the upstream transport, with their defaults.
func TestTimeoutSettings(t *testing.T) {
	c, err := load(base())
	if err != nil {
		t.Fatal(err)
	}
	if c.timeouts != proxy.DefaultTimeouts() {
		t.Fatalf("default timeouts %+v, want %+v", c.timeouts, proxy.DefaultTimeouts())
	}
	want := proxy.Timeouts{ReadHeader: time.Second, Read: 2 * time.Second, Idle: 3 * time.Second, Write: 4 * time.Second, Upstream: 5 * time.Second}
	env := base()
	env["SLUICE_READ_HEADER_TIMEOUT"], env["SLUICE_READ_TIMEOUT"], env["SLUICE_IDLE_TIMEOUT"] = "1s", "2s", "3s"
	env["SLUICE_WRITE_TIMEOUT"], env["SLUICE_UPSTREAM_TIMEOUT"] = "4s", "5s"
	if c, err = load(env); err != nil {
		t.Fatal(err)
	}
	if c.timeouts != want {
		t.Fatalf("timeouts %+v, want %+v", c.timeouts, want)
	}
	g, err := newGateway(c, Options{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.backend.close()
	s := g.public
	if s.ReadHeaderTimeout != time.Second || s.ReadTimeout != 2*time.Second || s.IdleTimeout != 3*time.Second || s.WriteTimeout != 4*time.Second {
		t.Fatalf("public server timeouts: header %s, read %s, idle %s, write %s", s.ReadHeaderTimeout, s.ReadTimeout, s.IdleTimeout, s.WriteTimeout)
	}
	if g.admin.WriteTimeout != 4*time.Second {
		t.Fatalf("admin write timeout %s", g.admin.WriteTimeout)
	}
}

// TestUpstreamTimeout: an upstream that takes longer than
// SLUICE_UPSTREAM_TIMEOUT to send its response headers gets the client a
// 502; within it, the response passes.
func TestUpstreamTimeout(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
			}
		}
	}))
	defer up.Close()
	env := base()
	env["SLUICE_UPSTREAM"] = up.URL
	env["SLUICE_UPSTREAM_TIMEOUT"] = "200ms"
	g := start(t, env)
	if code, _ := get(t, g.url+"/fast"); code != 200 {
		t.Fatalf("fast upstream: %d", code)
	}
	began := time.Now()
	code, body := get(t, g.url+"/slow")
	if code != 502 || time.Since(began) > 1500*time.Millisecond {
		t.Fatalf("slow upstream: %d after %s, want 502 after about 200ms: %s", code, time.Since(began), body)
	}
}
