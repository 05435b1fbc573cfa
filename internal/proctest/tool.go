package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Tool returns the path of the program name, which the Debian package pkg
// installs, looked up on PATH and then in the sbin directories (where
// Debian puts nginx, pgbouncer and runuser). When it is missing the test
// is skipped, or failed when the CI environment variable is set: .ci/run
// installs every tool a test uses, so that a missing one cannot pass for a
// green run.
func Tool(t testing.TB, name, pkg string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	msg := fmt.Sprintf("%s not found; install it (Debian: apt-get install %s), or run .ci/run, which does", name, pkg)
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set: a test may not be skipped for a missing tool)", msg)
	}
	t.Skipf("%s; skipping (this fails when CI is set)", msg)
	return ""
}

// Run runs the program name with args to its end, in dir ("" for this
// process's directory) with env (nil for this process's environment), and
// returns what it wrote to its standard output and error, together, and
// its error: it did not start, or did not exit 0. The tests that check a
// file with a tool (promtool, systemd-analyze, shellcheck, psql, sluice
// check-config) run it so and print the output when it objects.
func Run(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	return string(out), err
}
