//go:build unix

package proctest

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// StartChild starts cmd as a child that dies with this process: its
// parent-death signal is sig. Linux sends that signal when the thread that
// started the child ends, so the child is started from a goroutine that
// keeps its thread until the child has exited; exited is closed then.
func StartChild(cmd *exec.Cmd, sig syscall.Signal) (exited chan struct{}, err error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = sig
	cmd.SysProcAttr.Setpgid = true
	started := make(chan error, 1)
	exited = make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		defer close(exited)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait() //nolint:errcheck // the exit is what is waited for
	}()
	return exited, <-started
}

// Daemon starts the server program name with args, with env (nil for this
// process's environment), as a child whose parent-death signal is sig,
// stops it when the test ends (Stop, with 10 s of grace), and waits up to
// 30 s for it to accept on addr. It returns the program's output, its
// standard output and error, and whether it accepts; the caller fails with
// the output, and what else the program logged, when it does not.
func Daemon(t testing.TB, addr string, sig syscall.Signal, env []string, name string, args ...string) (*Buffer, bool) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = env
	out := &Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	exited, err := StartChild(cmd, sig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Stop(cmd, exited, 10*time.Second) })
	return out, Accepts(addr, exited, 30*time.Second, 20*time.Millisecond)
}
