//go:build !linux

package main

import "os/exec"

// setDeathSignal does nothing where the kernel offers no parent-death
// signal; the harness's own cleanup and the helpers' -lifetime still bound
// every child.
func setDeathSignal(*exec.Cmd) {}
