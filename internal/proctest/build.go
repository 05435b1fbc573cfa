package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

// Build builds the command pkg (an import path of this module, such as
// github.com/sluicehq/sluice) as its users build it, without the race
// detector or any flag, once per test process however many tests ask,
// and returns the binary's path. A package whose tests call it removes
// what it built from TestMain, after m.Run, with RemoveBuilt.
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
		if out, err := exec.Command("go", "build", "-o", b.path, pkg).CombinedOutput(); err != nil {
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

// Sluice is Build of the sluice command itself.
func Sluice(t testing.TB) string {
	t.Helper()
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
