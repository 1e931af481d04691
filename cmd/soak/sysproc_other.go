//go:build unix && !linux

package main

import "syscall"

// sysProcAttr puts redis-server in its own process group.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
