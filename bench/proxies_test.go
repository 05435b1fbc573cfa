package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestParseProxiesFlags(t *testing.T) {
	o, err := parseProxiesFlags([]string{"-callers", "8", "-duration", "2s"})
	if err != nil {
		t.Fatal(err)
	}
	if o.callers != 8 || o.duration != 2*time.Second || o.rounds != 3 || o.keys != 10000 || o.load.connections != 64 {
		t.Errorf("options = %+v", o)
	}
	for _, bad := range [][]string{{"-callers", "0"}, {"-duration", "500ms"}, {"-threads", "0"}, {"-keys", "0"}, {"extra"}} {
		if _, err := parseProxiesFlags(bad); err == nil {
			t.Errorf("parseProxiesFlags(%q): no error", bad)
		}
	}
}

// A short run of bench proxies on the real Postgres: every nginx target
// and every gRPC row measured, nothing refused, and the shipped nginx
// configuration the one asked. It needs wrk and nginx (skipped without
// them, unless CI is set).
func TestProxiesShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	requireTools(t, "wrk", "nginx")
	o, err := parseProxiesFlags([]string{"-duration", "1s", "-rounds", "1", "-warmup", "0s", "-callers", "8", "-keys", "100", "-connections", "8"})
	if err != nil {
		t.Fatal(err)
	}
	// The bound covers the builds too (see TestBurstShort).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out, progress strings.Builder
	if err := proxies(ctx, o, &out, &progress); err != nil {
		t.Fatalf("proxies: %v\n%s", err, progress.String())
	}
	table := out.String()
	for _, want := range []string{"| nginx alone | ", "| nginx limit_req | ", "| nginx + sluice (memory) | ", "| nginx + sluice (postgres) | ",
		"| sluice (memory) | 8 | ", "| sluice (memory) | 1 | ", "| sluice (postgres) | 8 | ", "| sluice (postgres) | 1 | "} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	for line := range strings.Lines(table) {
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) > 3 && (strings.HasPrefix(cells[1], " nginx") || strings.HasPrefix(cells[1], " sluice")) {
			if last := strings.TrimSpace(cells[len(cells)-2]); last != "0" {
				t.Errorf("refused or failed requests: %s\n%s", line, progress.String())
			}
		}
	}
}

// requireTools skips t when one of the programs is neither on PATH nor in
// /usr/sbin, or fails it when CI is set (CI installs them).
func requireTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if _, serr := os.Stat("/usr/sbin/" + tool); serr == nil {
				continue
			}
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not found (CI is set)", tool)
			}
			t.Skipf("%s not found; install it (Debian: apt-get install wrk nginx-light)", tool)
		}
	}
}
