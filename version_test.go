package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVersionOfAClone: `sluice version` of a `go build` in a git
// clone says the clone's commit, from the build information the Go
// toolchain records (vcs.revision), with nothing given at link time.
//
// The toolchain records it only where the module's directory has a .git
// directory: not in a linked git worktree, whose .git is a file
// (golang/go#58218), and not with -buildvcs=false. So the test builds in
// a fresh clone, and overrides a GOFLAGS=-buildvcs=false that the machine
// may set (go env -w), as a user's plain build has -buildvcs=auto.
func TestVersionOfAClone(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skip("not in a git checkout")
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "clone")
	git := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("clone", "--quiet", "--no-checkout", strings.TrimSpace(string(top)), dir)
	git("-C", dir, "checkout", "--quiet", "--detach", strings.TrimSpace(string(head)))

	// -trimpath and no cgo, as .ci/test and the image build: neither
	// changes what the toolchain stamps, and the clone's directory is new
	// every run, so without -trimpath every package of the module was
	// compiled again for its file paths (64 s of a CI run beside the rest).
	build := exec.Command("go", "build", "-trimpath", "-o", "sluice", ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=auto", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build in the clone: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(dir, "sluice"), "version").CombinedOutput()
	if err != nil {
		t.Fatalf("sluice version: %v\n%s", err, out)
	}
	want := "commit " + strings.TrimSpace(string(head)) + ","
	if !strings.Contains(string(out), want) {
		t.Fatalf("sluice version printed %q, want %q in it", out, want)
	}
}
