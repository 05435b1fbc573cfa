package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
)

// browser is a headless Chromium tab that records every request the
// page makes and every error it reports.
type browser struct {
	ctx context.Context

	mu        sync.Mutex
	requests  []string            // URLs the page requested
	errors    []string            // console errors, exceptions, error log entries
	documents map[string][]string // Content-Security-Policy of each document response, by URL
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	exe := proctest.Tool(t, "chromium", "chromium")
	// The flags that work on a machine without a network: without the
	// background-networking ones, Chromium keeps trying to reach its
	// services and the closed network refuses each attempt.
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox, // root in CI
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	b := &browser{documents: map[string][]string{}}
	// The listener sees every event of the tab, in order, from its start.
	ctx, cancelTab := chromedp.NewContext(alloc, chromedp.WithListener(b.record))
	ctx, cancelTimeout := context.WithTimeout(ctx, 120*time.Second)
	t.Cleanup(func() { cancelTimeout(); cancelTab(); cancelAlloc() })
	b.ctx = ctx
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, log.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("enable the log: %v", err)
	}
	return b
}

// record keeps what the tests check of an event of the tab.
func (b *browser) record(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		b.requests = append(b.requests, ev.Request.URL)
	case *network.EventResponseReceived:
		if ev.Type == network.ResourceTypeDocument {
			csp, _ := ev.Response.Headers["Content-Security-Policy"].(string)
			b.documents[ev.Response.URL] = append(b.documents[ev.Response.URL], csp)
		}
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			var args []string
			for _, a := range ev.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			b.errors = append(b.errors, "console."+string(ev.Type)+": "+strings.Join(args, " "))
		}
	case *runtime.EventExceptionThrown:
		msg := ev.ExceptionDetails.Text
		if ev.ExceptionDetails.Exception != nil {
			msg += " " + ev.ExceptionDetails.Exception.Description
		}
		b.errors = append(b.errors, "exception: "+msg)
	case *log.EventEntryAdded:
		if ev.Entry.Level == log.EntryLevelError {
			b.errors = append(b.errors, "log ("+string(ev.Entry.Source)+"): "+ev.Entry.Text+" "+ev.Entry.URL)
		}
	}
}

func (b *browser) do(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		t.Fatalf("%s: %v (errors so far: %v)", what, err, b.errorsSeen())
	}
}

func eval[T any](t *testing.T, b *browser, js string) T {
	t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

func (b *browser) errorsSeen() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.errors)
}

// text returns the text of the first visible node sel (a CSS selector)
// matches, waiting up to 20 s for there to be one. The node is found and
// read in one evaluation in the page: the console renders its tables
// again every second, and a node found by one DevTools call can be gone
// by the next ("No node with given id found").
func (b *browser) text(t *testing.T, sel string) string {
	t.Helper()
	js := fmt.Sprintf(`(() => { const n = document.querySelector(%q); return n && n.getClientRects().length > 0 ? [n.innerText] : []; })()`, sel)
	for deadline := time.Now().Add(20 * time.Second); ; {
		s, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](js))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		if len(s) == 1 {
			return strings.TrimSpace(s[0])
		}
		if time.Now().After(deadline) {
			t.Fatalf("read %s: no visible node within 20 s", sel)
		}
		time.Sleep(50 * time.Millisecond) // the page renders on its own schedule
	}
}

// waitText waits until the text of sel satisfies ok.
func (b *browser) waitText(t *testing.T, sel string, ok func(string) bool) string {
	t.Helper()
	var s string
	for deadline := time.Now().Add(20 * time.Second); ; {
		s = b.text(t, sel)
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s shows %q, never what the test waits for", sel, s)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// choose picks value in a select, as a click on an option does (the
// change event included).
func choose(sel, value string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		if _, err := chromedp.SetValue(chromedp.CSS(sel), value)(ctx, t); err != nil {
			return err
		}
		_, err := chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).dispatchEvent(new Event("change", {bubbles: true}))`, sel))(ctx, t)
		return err
	})
}

// TestConsoleInChromium drives the console as an operator would, in
// headless Chromium against a running gateway: signs in with the token,
// sees every rule and the rates move after traffic without a reload,
// looks a key up and resets it (the gateway then lets the next request
// through), adds and deletes an override (the gateway applies each), and
// reads a tenant's usage, which follows the override. No request of the
// page leaves the admin listener's origin, the page
// reports no error (a violation of its Content-Security-Policy would be
// one), and its responses carry the policy. A screenshot is written to
// the test's directory and, when SLUICE_SCREENSHOT_DIR is set, there
// (docs/console.png is one).
func TestConsoleInChromium(t *testing.T) {
	b := newBrowser(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	const token = "console-t0ken-for-the-test"
	rules := []string{"login", "query", "send-mail", "api-global"}
	g := start(t, map[string]string{
		"SLUICE_UPSTREAM": up.URL,
		"SLUICE_RULES": "login: POST /api/login by ip 3/1h\n" +
			"query: GET /api/query by tenant 2/1d\n" +
			"send-mail: POST /api/send by email 100/1h sliding\n" +
			"api-global: * /api/* by global 100000/1m sliding fail=closed",
		"SLUICE_ADMIN_TOKEN": token,
	})
	send := func(method, path string, header ...string) int {
		res, _ := proctest.Send(t, method, g.url+path, header...)
		return res.StatusCode
	}

	// Signing in: the page asks for the token, and shows the rules.
	b.do(t, "open the console", chromedp.Navigate(g.admin+"/"), chromedp.WaitVisible(chromedp.ID("token")))
	b.do(t, "sign in",
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.CSS(`#login-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#rules tbody tr[data-rule="login"]`)),
	)
	names := eval[[]string](t, b, `[...document.querySelectorAll("#rules tbody tr")].map(tr => tr.cells[0].textContent)`)
	if !slices.Equal(names, rules) {
		t.Fatalf("the console shows the rules %v, want %v", names, rules)
	}
	if s := b.text(t, `#rules tr[data-rule="query"] td.limit`); !strings.HasPrefix(s, "2/1d") {
		t.Errorf("query's limit shows %q", s)
	}

	// Traffic: the rates move without a reload (the page keeps a mark
	// that a reload would lose).
	eval[chromedp.Void](t, b, `window.sluiceTestMark = 42`)
	// login's count, read back through the page, in one hour window.
	pgtest.ClearOf(t, time.Hour, 30*time.Second)
	for i := range 5 {
		want := map[bool]int{true: 200, false: 429}[i < 3]
		if code := send("POST", "/api/login"); code != want {
			t.Fatalf("login %d: %d, want %d", i+1, code, want)
		}
	}
	for range 3 {
		send("GET", "/api/query", "X-Tenant-ID", "globex")
	}
	b.waitText(t, `#rules tr[data-rule="login"] td.limited`, func(s string) bool { return s != "–" && s != "0" })
	b.waitText(t, `#rules tr[data-rule="login"] td.share`, func(s string) bool { return s == "40%" })
	b.waitText(t, `#top tbody tr[data-rule="login"] td.num`, func(s string) bool { return strings.HasPrefix(s, "2") })
	if eval[int](t, b, `window.sluiceTestMark`) != 42 {
		t.Fatal("the page was reloaded")
	}
	if s := b.text(t, "#store-ready"); !strings.HasPrefix(s, "yes") {
		t.Errorf("store ready shows %q", s)
	}

	// Steady traffic on another route while the operator works, so that
	// the screenshot's sparklines have a few seconds of it.
	steady, stopSteady := context.WithCancel(context.Background())
	steadyDone := make(chan struct{})
	go func() {
		defer close(steadyDone)
		for i := 0; steady.Err() == nil; i++ {
			req, _ := http.NewRequestWithContext(steady, "GET", g.url+"/api/ping", nil)
			if res, err := http.DefaultClient.Do(req); err == nil {
				res.Body.Close()
			}
			time.Sleep(time.Duration(20+i%5*10) * time.Millisecond)
		}
	}()
	defer func() { stopSteady(); <-steadyDone }()

	// Key lookup and reset.
	b.do(t, "look a key up",
		choose("#lookup-rule", "login"),
		chromedp.SendKeys(chromedp.ID("lookup-value"), "127.0.0.1"),
		chromedp.Click(chromedp.CSS(`#lookup button[type="submit"]`)),
	)
	b.waitText(t, "#lookup-count", func(s string) bool { return s == "3 of 3 per 1h" })
	if s := b.text(t, "#lookup-remaining"); s != "0" {
		t.Errorf("remaining shows %q", s)
	}
	if code := send("POST", "/api/login"); code != 429 {
		t.Fatalf("before the reset: %d", code)
	}
	b.do(t, "reset the key", chromedp.Click(chromedp.ID("lookup-clear")))
	b.waitText(t, "#lookup-message", func(s string) bool { return strings.HasPrefix(s, "Reset") })
	b.waitText(t, "#lookup-count", func(s string) bool { return s == "0 of 3 per 1h" })
	if code := send("POST", "/api/login"); code != 200 {
		t.Fatalf("after the reset the gateway answers %d, want 200", code)
	}

	// An override: added, applied by the gateway, deleted.
	b.do(t, "add an override",
		choose("#override-rule", "query"),
		chromedp.SendKeys(chromedp.ID("override-value"), "acme"),
		chromedp.SendKeys(chromedp.ID("override-limit"), "4"),
		chromedp.SendKeys(chromedp.ID("override-window"), "1d"),
		chromedp.Click(chromedp.CSS(`#override-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#overrides tbody tr[data-rule="query"]`)),
	)
	if s := b.text(t, `#overrides tbody tr[data-rule="query"]`); !strings.Contains(s, "4/1d") || strings.Contains(s, "acme") {
		t.Errorf("the override shows %q", s)
	}
	var got []int
	for range 5 {
		got = append(got, send("GET", "/api/query", "X-Tenant-ID", "acme"))
	}
	if !slices.Equal(got, []int{200, 200, 200, 200, 429}) {
		t.Fatalf("with the override (4/1d) the gateway answered %v", got)
	}

	// Usage: a tenant's standing on every tenant rule, under its override.
	b.do(t, "show a tenant's usage",
		choose("#usage-kind", "tenant"),
		chromedp.SendKeys(chromedp.ID("usage-value"), "acme"),
		chromedp.Click(chromedp.CSS(`#usage button[type="submit"]`)),
	)
	b.waitText(t, `#usage-table tr[data-rule="query"] td.count`, func(s string) bool { return s == "4" })
	if s := b.text(t, `#usage-table tr[data-rule="query"] td.limit`); s != "4/1d" {
		t.Errorf("usage limit shows %q", s)
	}
	if s := b.text(t, `#usage-table tr[data-rule="query"] td.remaining`); s != "0" {
		t.Errorf("usage remaining shows %q", s)
	}
	if s := b.text(t, `#usage-table tr[data-rule="query"] td.reset`); !strings.HasPrefix(s, "in ") {
		t.Errorf("usage reset shows %q", s)
	}
	if n := eval[int](t, b, `document.querySelectorAll("#usage-table tbody tr").length`); n != 1 {
		t.Errorf("the usage of a tenant lists %d rules, want 1 (query)", n)
	}

	// A screenshot for a person to look at, with every panel filled.
	b.waitText(t, `#top tbody tr[data-rule="query"] td.num`, func(s string) bool { return s != "" })
	time.Sleep(2 * time.Second) // two more seconds of the steady traffic
	stopSteady()
	<-steadyDone
	b.waitText(t, "#updated", func(string) bool { return true })
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	for _, dir := range []string{t.TempDir(), os.Getenv("SLUICE_SCREENSHOT_DIR")} {
		if dir == "" {
			continue
		}
		path := filepath.Join(dir, "console.png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}

	b.do(t, "delete the override",
		chromedp.Click(chromedp.CSS(`#overrides tbody tr[data-rule="query"] button.danger`)),
		chromedp.WaitNotPresent(chromedp.CSS(`#overrides tbody tr[data-rule="query"]`)),
	)
	if code := send("GET", "/api/query", "X-Tenant-ID", "acme"); code != 429 {
		t.Fatalf("after the override's deletion (4 counted, limit 2 again): %d, want 429", code)
	}
	// The usage view follows without a new lookup: the rule's limit again.
	b.waitText(t, `#usage-table tr[data-rule="query"] td.limit`, func(s string) bool { return s == "2/1d" })
	code, body := proctest.Call(t, "GET", g.admin+"/v1/overrides", token, "")
	if code != 200 || strings.Contains(body, `"rule":"query"`) {
		t.Fatalf("the override is still there: %d %s", code, body)
	}

	// What the page did, all along.
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, u := range b.requests {
		if !strings.HasPrefix(u, g.admin+"/") {
			t.Errorf("the page requested %s, outside the admin origin %s", u, g.admin)
		}
	}
	if len(b.requests) < 10 {
		t.Errorf("only %d requests recorded: %v", len(b.requests), b.requests)
	}
	for _, e := range b.errors {
		t.Errorf("the page reported an error: %s", e)
	}
	csp := b.documents[g.admin+"/"]
	if len(csp) == 0 || !strings.Contains(csp[0], "default-src 'self'") || !strings.Contains(csp[0], "frame-ancestors 'none'") {
		t.Errorf("the console's Content-Security-Policy: %q", csp)
	}
}
