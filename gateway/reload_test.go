//go:build unix

package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
)

// TestReloadOnSIGHUP: SIGHUP (sent to this process, as an operator sends
// it to sluice's) puts a good rules file in force at once, refuses a bad
// one and keeps the running rules, and no request fails meanwhile. A
// request in flight during a reload finishes under the rules it started
// with, and a denial the fast path remembered under an old limit does not
// outlive the change.
func TestReloadOnSIGHUP(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-release
		}
	}))
	defer up.Close()
	var releaseOnce sync.Once
	releaseSlow := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseSlow() // also when the test fails before its time
	rules := filepath.Join(t.TempDir(), "rules")
	write := func(src string) {
		t.Helper()
		replaceFile(t, rules, []byte(src)) // a reload never sees half a file
	}
	write("a: GET /a by ip 2/1h\nslow: GET /slow by ip 1000/1h\nbusy: GET /busy by ip 1000000/1h\n")
	env := base()
	delete(env, "SLUICE_RULES")
	env["SLUICE_UPSTREAM"] = up.URL
	env["SLUICE_RULES_FILE"] = rules
	core, logs := observer.New(zapcore.InfoLevel)
	g, r := serveGateway(t, env, Options{Logger: zap.New(core)})
	// Rule a's count goes on across the reloads.
	pgtest.ClearOf(t, time.Hour, 20*time.Second)

	// Traffic all along: not one request may fail.
	stop := make(chan struct{})
	var sent, failed atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, err := proctest.StatusOf(http.Get(r.url + "/busy"))
				sent.Add(1)
				if err != nil {
					failed.Add(1)
					t.Errorf("request during reloads: %v", err)
					return
				}
				if code != 200 {
					failed.Add(1)
					t.Errorf("request during reloads: %d", code)
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()

	codes := func(n int) (got []int) {
		for range n {
			c, _ := get(t, r.url+"/a")
			got = append(got, c)
		}
		return got
	}
	if got := fmt.Sprint(codes(3)); got != "[200 200 429]" {
		t.Fatalf("before the reload: %s, want [200 200 429]", got)
	}
	// A request in flight across the reload.
	slow := make(chan *http.Response, 1)
	go func() {
		res, err := http.Get(r.url + "/slow")
		if err != nil {
			t.Error(err)
			close(slow)
			return
		}
		slow <- res
	}()
	<-entered

	hup := func(result string, want float64) {
		t.Helper()
		hup(t)
		deadline := time.Now().Add(10 * time.Second)
		for testutil.ToFloat64(g.reloads.WithLabelValues(result)) < want {
			if time.Now().After(deadline) {
				t.Fatalf("no %s reload counted 10 s after SIGHUP", result)
			}
			time.Sleep(5 * time.Millisecond) // the signal arrives asynchronously
		}
	}
	write("a: GET /a by ip 4/1h\nslow: GET /slow by ip 999/1h\nbusy: GET /busy by ip 1000000/1h\n")
	hup("ok", 1)
	if got := fmt.Sprint(codes(3)); got != "[200 200 429]" {
		t.Fatalf("after raising the limit to 4: %s, want [200 200 429] (2 of 4 were used)", got)
	}
	releaseSlow()
	res := <-slow
	if res == nil {
		t.FailNow()
	}
	res.Body.Close()
	if p := res.Header.Get("RateLimit-Policy"); res.StatusCode != 200 || p != `"slow";q=1000;w=3600` {
		t.Fatalf("in-flight request: %d, RateLimit-Policy %q, want 200 under the rule it started with", res.StatusCode, p)
	}
	if _, body := get(t, r.admin+"/v1/rules"); !strings.Contains(body, `"name":"a"`) || !strings.Contains(body, `"limit":4,`) {
		t.Fatalf("/v1/rules after the reload: %s", body)
	}

	write("a: GETT /a by ip 100/1h\n")
	hup("error", 1)
	if got := fmt.Sprint(codes(1)); got != "[429]" {
		t.Fatalf("after a refused reload: %s, want [429] under the running rules", got)
	}
	var shown struct{ Rules []struct{ Name string } }
	if _, body := get(t, r.admin+"/v1/rules"); json.Unmarshal([]byte(body), &shown) != nil || len(shown.Rules) != 3 {
		t.Fatalf("/v1/rules after a refused reload: %s", body)
	}
	if logs.FilterMessage("rules not reloaded: the running rules stay").FilterFieldKey("problems").Len() != 1 {
		t.Fatalf("the refused reload was not logged with its problems: %v", logs.All())
	}
	if _, body := get(t, r.admin+"/metrics"); !strings.Contains(body, `sluice_rules_reloads_total{result="error"} 1`) {
		t.Fatal("/metrics lacks the refused reload")
	}
	time.Sleep(100 * time.Millisecond) // a little more traffic under the running rules
	if sent.Load() < 10 || failed.Load() > 0 {
		t.Fatalf("%d requests sent during the reloads, %d failed", sent.Load(), failed.Load())
	}
}
