// Package procs holds what the benchmark commands (cmd/bench, cmd/rlsbench)
// do with the processes they start: children in their own process group,
// stopped and cleaned up last first, and the CPU time a process has used,
// read from /proc. Linux only, as those commands are.
package procs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Cleaner runs cleanup functions once, last added first. A command keeps one
// in a global, so that a panicking goroutine can run it before the process
// dies (see Repanic).
type Cleaner struct {
	mu  sync.Mutex
	fns []func()
}

// Add adds f, to run before those added earlier.
func (c *Cleaner) Add(f func()) {
	c.mu.Lock()
	c.fns = append(c.fns, f)
	c.mu.Unlock()
}

// Run runs the functions added so far, last added first, and forgets them.
func (c *Cleaner) Run() {
	c.mu.Lock()
	fns := c.fns
	c.fns = nil
	c.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// Repanic, deferred first thing in a goroutine, runs c before a panic takes
// the process down (deferred functions of main do not run when another
// goroutine panics), then panics again.
func (c *Cleaner) Repanic() {
	if r := recover(); r != nil {
		c.Run()
		panic(r)
	}
}

// Attr puts a child in its own process group (so it and its children can be
// killed together, and a terminal's Ctrl-C reaches only us) and asks Linux to
// kill it if we die without cleaning up. Pdeathsig follows the thread that
// started the child: a command locks main's goroutine to the main thread and
// starts its children from main.
func Attr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// KillGroup kills a command's process group (for exec.Cmd.Cancel).
func KillGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}

// Proc is a started child process.
type Proc struct {
	Name string
	Log  string // the file its stdout and stderr go to
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	once sync.Once
}

// Start starts bin with args in dir ("": ours) and env, its output appended
// to logPath, in its own process group (Attr), and adds its Stop to c.
func Start(c *Cleaner, name, logPath, dir string, env []string, bin string, args ...string) (*Proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = Attr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	c.Add(p.Stop)
	return p, nil
}

// Stop asks the process group to end (SIGTERM), kills it after 3s, and
// waits at most 3s more.
func (p *Proc) Stop() {
	p.once.Do(func() {
		pgid := -p.cmd.Process.Pid
		_ = syscall.Kill(pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(3 * time.Second):
		}
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(3 * time.Second):
		}
	})
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// LogTail returns the last n lines of the process's log, under a line that
// names the file.
func (p *Proc) LogTail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "--- " + p.Log + " (last lines) ---\n" + strings.Join(lines, "\n")
}

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ).
var clockTick = sync.OnceValue(func() time.Duration {
	if out, err := exec.Command("getconf", "CLK_TCK").Output(); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && n > 0 {
			return time.Second / time.Duration(n)
		}
	}
	return 10 * time.Millisecond // USER_HZ is 100 on every Linux port
})

// CPU returns the CPU time (user + system, all threads) process pid has
// used so far, from /proc/PID/stat.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	ticks, err := StatTicks(string(b))
	if err != nil {
		return 0, err
	}
	return time.Duration(ticks) * clockTick(), nil
}

// StatTicks returns utime + stime (fields 14 and 15) of a /proc/PID/stat
// line. The command name (field 2) may hold spaces and parentheses, so
// fields are counted after its last ')'.
func StatTicks(stat string) (int64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc/PID/stat: no ')'")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("malformed /proc/PID/stat: %d fields after the name", len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("malformed /proc/PID/stat: utime %q stime %q", f[11], f[12])
	}
	return utime + stime, nil
}

// LoadAvg is the machine's 1-minute load average (/proc/loadavg; 0 when
// unknown).
func LoadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
