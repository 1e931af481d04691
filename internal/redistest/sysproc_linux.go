package redistest

import "syscall"

// sysProcAttr puts redis-server in its own process group (so Kill reaches
// any forked children too) and has the kernel SIGKILL it if the test binary
// dies without running its cleanups (e.g. on a go test -timeout panic).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
