package deploy

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/proctest"
)

// unitPath is where the unit is installed, and binPath where its
// ExecStart expects sluice.
const (
	unitPath = "/etc/systemd/system/sluice.service"
	binPath  = "/usr/local/bin/sluice"
	envPath  = "/etc/sluice/sluice.env"
)

// TestSystemdUnit checks deploy/systemd/sluice.service: its hardening
// settings, `systemd-analyze verify` without a single complaint, and
// `systemd-analyze security` rating it OK or better. Both run on a
// temporary root laid out as an installation: the unit, the sluice binary
// the test built at ExecStart's path, the environment file, and the
// system's own units (for the default dependencies); verify checks that
// ExecStart's binary exists and is executable.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	analyze := tool(t, "systemd-analyze", "systemd")
	unit := parseUnit(t, filepath.Join(root, "deploy", "systemd", "sluice.service"))

	for key, want := range map[string]string{
		"Service.ExecStart":               binPath,
		"Service.EnvironmentFile":         envPath,
		"Service.Restart":                 "on-failure",
		"Service.DynamicUser":             "yes",
		"Service.NoNewPrivileges":         "yes",
		"Service.ProtectSystem":           "strict",
		"Service.ProtectHome":             "yes",
		"Service.PrivateTmp":              "yes",
		"Service.PrivateDevices":          "yes",
		"Service.CapabilityBoundingSet":   "",
		"Service.AmbientCapabilities":     "",
		"Service.RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
		"Service.SystemCallArchitectures": "native",
		"Service.KillSignal":              "SIGTERM",
	} {
		if got, ok := unit[key]; !ok || got[len(got)-1] != want {
			t.Errorf("%s = %q, want %q", key, got, want)
		}
	}
	if f := unit["Service.SystemCallFilter"]; len(f) == 0 || f[0] != "@system-service" {
		t.Errorf("SystemCallFilter %q: want @system-service first", f)
	}
	if stop, err := time.ParseDuration(last(unit["Service.TimeoutStopSec"])); err != nil || stop <= drain {
		t.Errorf("TimeoutStopSec %q: want more than the %s drain", unit["Service.TimeoutStopSec"], drain)
	}

	dir := t.TempDir()
	install := func(src, dst string) { link(t, src, filepath.Join(dir, dst)) }
	install(filepath.Join(root, "deploy", "systemd", "sluice.service"), unitPath)
	install(filepath.Join(root, "deploy", "systemd", "sluice.env.example"), envPath)
	systemUnits := "/usr/lib/systemd/system"
	if _, err := os.Stat(systemUnits); err != nil {
		systemUnits = "/lib/systemd/system"
	}
	if err := os.MkdirAll(filepath.Join(dir, "usr", "lib", "systemd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := proctest.Run("", nil, "cp", "-a", systemUnits, filepath.Join(dir, "usr", "lib", "systemd")+"/"); err != nil {
		t.Fatalf("copy the system's units: %v\n%s", err, out)
	}

	verify := func() (string, error) {
		return proctest.Run("", nil, analyze, "verify", "--root="+dir, unitPath)
	}
	// Without the binary, verify must object: otherwise its silence below
	// would prove nothing.
	if out, err := verify(); err == nil || !strings.Contains(out, binPath) {
		t.Fatalf("systemd-analyze verify passes although %s is missing: %v\n%s", binPath, err, out)
	}
	install(sluiceBinary(t), binPath)
	// verify exits 0 on unknown keys and bad values, which it only prints.
	if out, err := verify(); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}

	// OK is an exposure below 5.0; --threshold fails above 4.9.
	out, err := proctest.Run("", nil, analyze, "security", "--offline=yes", "--threshold=49", "--no-pager", "--root="+dir, unitPath)
	_, level, _ := strings.Cut(out, "Overall exposure level for sluice.service: ")
	m := strings.Fields(level) // the exposure and its rating
	if len(m) < 2 {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	t.Logf("systemd-analyze security: exposure %s %s", m[0], m[1])
	if err != nil || (m[1] != "OK" && m[1] != "SAFE" && m[1] != "PERFECT") {
		t.Errorf("systemd-analyze security rates the unit %s %s (%v); want OK or better:\n%s", m[0], m[1], err, out)
	}

	// The example environment file holds settings sluice accepts.
	env := append([]string{"PATH=" + os.Getenv("PATH")}, parseEnvironmentFile(t, filepath.Join(dir, envPath))...)
	if out, err := proctest.Run("", env, sluiceBinary(t), "check-config"); err != nil {
		t.Errorf("sluice check-config with %s: %v\n%s", envPath, err, out)
	}
}

// parseUnit reads a unit file into "Section.Key" → values in order
// (a key may be given several times).
func parseUnit(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unit := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, _ := strings.Cut(line, "=")
			unit[section+"."+strings.TrimSpace(k)] = append(unit[section+"."+strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	return unit
}

// parseEnvironmentFile reads KEY=VALUE lines as systemd's EnvironmentFile=
// does for the forms the example uses: comments, and values in double
// quotes.
func parseEnvironmentFile(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not KEY=VALUE", path, line)
		}
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		env = append(env, k+"="+v)
	}
	return env
}

func last(values []string) string {
	if len(values) == 0 {
		return ""
	}
	return values[len(values)-1]
}
