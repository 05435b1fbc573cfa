package main

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill cmd if the harness dies without
// cleaning up (SIGKILL, a crash), so no target outlives a run.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
