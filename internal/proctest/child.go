//go:build unix

package proctest

import (
	"os/exec"
	"runtime"
	"syscall"
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
