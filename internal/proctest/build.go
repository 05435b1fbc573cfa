package proctest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

// BuildCommand returns the go build of pkgs in dir into out (a file, or a
// directory when it ends in a separator), as the container image builds
// sluice: static (CGO_ENABLED=0), with -trimpath, and ldflags when not
// empty. Every build of the tests and the load harness goes through it, so
// that one compiled package serves them all from the build cache (a
// second flavour of the dependencies was minutes of a fresh machine's CI).
func BuildCommand(ctx context.Context, dir, out, ldflags string, pkgs ...string) *exec.Cmd {
	args := []string{"build", "-trimpath"}
	if ldflags != "" {
		args = append(args, "-ldflags", ldflags)
	}
	args = append(append(args, "-o", out), pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd
}

// BinaryEnv names a sluice binary already built (by .ci/test, once for
// every package) that Sluice returns instead of building one.
const BinaryEnv = "SLUICE_TEST_BINARY"

// Build builds the command pkg (an import path of this module, such as
// github.com/sluicehq/sluice) as BuildCommand does, without the race
// detector, once per test process however many tests ask, and returns the
// binary's path. A package whose tests call it removes what it built from
// TestMain, after m.Run, with RemoveBuilt.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	built.Lock()
	b, ok := built.bins[pkg]
	if !ok {
		b = &binary{}
		if built.bins == nil {
			built.bins = map[string]*binary{}
		}
		built.bins[pkg] = b
	}
	built.Unlock()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, path.Base(pkg))
		if out, err := BuildCommand(context.Background(), "", b.path, "", pkg).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// RemoveBuilt removes every binary Build built in this process.
func RemoveBuilt() {
	built.Lock()
	defer built.Unlock()
	for _, b := range built.bins {
		if b.path != "" {
			os.RemoveAll(filepath.Dir(b.path)) //nolint:errcheck // best effort
		}
	}
}

// built holds what Build built, by package.
var built struct {
	sync.Mutex
	bins map[string]*binary
}

// binary is one command built by Build, or why it could not be.
type binary struct {
	once sync.Once
	path string
	err  error
}

// Sluice is Build of the sluice command itself, or the binary BinaryEnv
// names.
func Sluice(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv(BinaryEnv); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("%s: %v", BinaryEnv, err)
		}
		return bin
	}
	return Build(t, "github.com/sluicehq/sluice")
}

// Main runs the tests of m, then removes what Build built, and returns the
// exit code: TestMain of a package whose tests call Build is
// os.Exit(proctest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	RemoveBuilt()
	return code
}
