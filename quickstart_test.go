package main

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// quickstartSkip marks a shell block of the Quickstart that TestQuickstart
// does not run (it installs packages); it must be the line just before the
// block.
const quickstartSkip = "<!-- TestQuickstart does not run this block"

// TestQuickstart runs the README's Quickstart as a newcomer would: its
// shell blocks, as written, one after another in one bash, in a copy of
// the repository, with a private Postgres cluster standing in for the
// one the skipped block installs (reached through the libpq variables
// that createdb and sluice both read). It checks that both gateways
// answered 200s and then 429 with the rate-limit headers, and that the
// demo API and both gateways stopped at the end.
func TestQuickstart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sluice and runs the quickstart")
	}
	for _, tool := range []string{"bash", "curl", "openssl", "createdb", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("the quickstart needs %s", tool)
			}
			t.Skipf("the quickstart needs %s", tool)
		}
	}
	for _, port := range []string{"3000", "8080", "8081", "9090", "9091"} {
		l, err := net.Listen("tcp", "127.0.0.1:"+port)
		if err != nil {
			t.Skipf("the quickstart uses port %s, which is taken here: %v", port, err)
		}
		l.Close()
	}
	blocks := quickstartBlocks(t)

	cluster := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	dir := t.TempDir()
	copyRepository(t, dir)
	script := "set -e\n" + strings.Join(blocks, "\n")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = dir
	// The commands run as written; the environment builds as .ci/test
	// does (-trimpath, no cgo). The copy's directory is new every run, so
	// an untrimmed build compiled every package of the module again for its
	// file paths (alone, 12.5 s of the test against 6.5 s; 68 s in a CI run
	// beside the rest).
	cmd.Env = append(quickstartEnv(), "PGHOST=127.0.0.1", fmt.Sprintf("PGPORT=%d", cluster.Port), "PGUSER=postgres",
		"GOFLAGS=-trimpath", "CGO_ENABLED=0")
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	transcript := string(out)
	if err != nil {
		t.Fatalf("the quickstart failed: %v\n%s", err, transcript)
	}
	for _, want := range []*regexp.Regexp{
		// The in-memory gateway: five allowed with their headers, then 429.
		regexp.MustCompile(`(?s)(HTTP/1.1 200 OK\r?\n[^H]*Ratelimit: "hello";r=\d+;t=\d+.*){5}HTTP/1.1 429 Too Many Requests\r?\n[^H]*Ratelimit: "hello";r=0;t=\d+\r?\n.*Retry-After: \d+\r?\n.*X-Ratelimit-Remaining: 0`),
		regexp.MustCompile(`schema sluice: \d+ migrations applied`),
		// The Postgres gateway: five 200s, then 429 with Retry-After.
		regexp.MustCompile(`(HTTP/1.1 200 OK\r?\n){5}HTTP/1.1 429 Too Many Requests\r?\nRetry-After: \d+`),
		regexp.MustCompile(`\{"rule":"hello","limit":5,"window":"1m","window_seconds":60,"count":5,"remaining":0,`),
	} {
		if !want.MatchString(transcript) {
			t.Errorf("the transcript does not match %s:\n%s", want, transcript)
		}
	}
	if !strings.Contains(transcript, `"store":"memory"`) || !strings.Contains(transcript, `"store":"postgres"`) {
		t.Errorf("want one gateway on each store:\n%s", transcript)
	}
	// kill %1 %2 %3 stopped everything: the ports are free again.
	for _, port := range []string{"3000", "8080", "8081"} {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second); err == nil {
			c.Close()
			t.Errorf("port %s still answers after the quickstart's kill", port)
		}
	}
}

// quickstartBlocks returns the ```sh blocks of README.md's Quickstart
// section, less those marked with quickstartSkip: the blocks
// TestQuickstart runs. It fails t unless there are two, the gateway on
// memory, then on Postgres.
func quickstartBlocks(t *testing.T) []string {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Quickstart\n")
	if !ok {
		t.Fatal("README has no Quickstart section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var blocks []string
	lines := strings.Split(section, "\n")
	for i := 0; i < len(lines); i++ {
		if lines[i] != "```sh" {
			continue
		}
		skip := i > 0 && strings.HasPrefix(lines[i-1], quickstartSkip)
		var b []string
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			b = append(b, lines[i])
		}
		if !skip {
			blocks = append(blocks, strings.Join(b, "\n"))
		}
	}
	if len(blocks) != 2 {
		t.Fatalf("found %d shell blocks to run in the Quickstart, want 2", len(blocks))
	}
	return blocks
}

// copyRepository copies the repository's files (not its history or build
// outputs) into dir, so that the quickstart's go build writes nothing here.
func copyRepository(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == ".git" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil // a worktree's .git file
		}
		if path == "sluice" { // a build output
			return nil
		}
		target := filepath.Join(dir, path)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// quickstartEnv is this process's environment without sluice's settings
// or libpq's, as in a fresh shell.
func quickstartEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SLUICE_") || strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "DATABASE_URL=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}
