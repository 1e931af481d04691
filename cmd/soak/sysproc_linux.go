package main

import "syscall"

// sysProcAttr puts redis-server in its own process group, killed with the
// soak if the soak dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
