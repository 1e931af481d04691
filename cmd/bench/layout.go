package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// layout is how the processes share the CPUs during one pass over the
// sites.
type layout struct {
	Name string // "shared" or "pinned"
	// CaddyCPU and LoadCPU are the CPUs of Caddy and of the load generator
	// and redis-server in the pinned layout; -1 in the shared one.
	CaddyCPU, LoadCPU int
}

func (l layout) pinned() bool { return l.CaddyCPU >= 0 }

// describe says in words where each process runs.
func (l layout) describe(ncpu int) string {
	if !l.pinned() {
		return fmt.Sprintf("load generator, Caddy and redis-server share all %d CPUs (no pinning, Caddy's default GOMAXPROCS)", ncpu)
	}
	return fmt.Sprintf("Caddy on CPU %d (taskset -c %d, GOMAXPROCS=1); load generator and redis-server on CPU %d (taskset -c %d)",
		l.CaddyCPU, l.CaddyCPU, l.LoadCPU, l.LoadCPU)
}

// wrap returns the command prefix that runs a program on cpu (none when
// cpu < 0).
func wrap(cpu int) []string {
	if cpu < 0 {
		return nil
	}
	return []string{"taskset", "-c", strconv.Itoa(cpu)}
}

var sharedLayout = layout{Name: "shared", CaddyCPU: -1, LoadCPU: -1}

// pinnedLayout returns the pinned layout on the first two CPUs this process
// may run on (CPU 0 and 1 on most machines), or why there is none: only one
// CPU, or no taskset.
func pinnedLayout() (layout, error) {
	cpus, err := allowedCPUs(os.Getpid())
	if err != nil {
		return layout{}, err
	}
	if len(cpus) < 2 {
		return layout{}, fmt.Errorf("only %d CPU available", len(cpus))
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		return layout{}, errors.New("taskset not found on PATH (util-linux)")
	}
	return layout{Name: "pinned", CaddyCPU: cpus[0], LoadCPU: cpus[1]}, nil
}

// selectLayouts parses -layouts: "all", or a comma-separated list of shared
// and pinned. A pinned layout the machine cannot do is dropped with its
// reason in note.
func selectLayouts(flagVal string) (ls []layout, note string, err error) {
	want := map[string]bool{}
	for _, n := range strings.Split(flagVal, ",") {
		switch n = strings.TrimSpace(n); n {
		case "":
		case "all":
			want["shared"], want["pinned"] = true, true
		case "shared", "pinned":
			want[n] = true
		default:
			return nil, "", fmt.Errorf("unknown layout %q in -layouts (known: shared, pinned, all)", n)
		}
	}
	if len(want) == 0 {
		return nil, "", errors.New("-layouts selects no layout")
	}
	if want["shared"] {
		ls = append(ls, sharedLayout)
	}
	if want["pinned"] {
		p, err := pinnedLayout()
		if err != nil {
			note = "pinned layout unavailable: " + err.Error()
			if !want["shared"] {
				note += "; running the shared layout instead"
				ls = append(ls, sharedLayout)
			} else {
				note += "; shared layout only"
			}
		} else {
			ls = append(ls, p)
		}
	}
	return ls, note, nil
}

// allowedCPUs reads the CPU affinity list of a process (Cpus_allowed_list
// in /proc/PID/status, "0-3,8").
func allowedCPUs(pid int) ([]int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		if runtime.GOOS != "linux" {
			return nil, fmt.Errorf("CPU affinity is Linux-only (%s)", runtime.GOOS)
		}
		return nil, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return parseCPUList(strings.TrimSpace(v))
		}
	}
	return nil, errors.New("no Cpus_allowed_list in /proc/PID/status")
}

// parseCPUList parses a Linux CPU list such as "0-3,8,10-11".
func parseCPUList(s string) ([]int, error) {
	var cpus []int
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("bad CPU list %q", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("bad CPU list %q", s)
			}
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == 0 {
		return nil, fmt.Errorf("empty CPU list %q", s)
	}
	slices.Sort(cpus)
	return slices.Compact(cpus), nil
}

// cpuList formats CPUs for taskset -c.
func cpuList(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

// setAffinity sets the CPUs of every thread of process pid (taskset -a -p);
// threads it starts later inherit them.
func setAffinity(pid int, cpus []int) error {
	out, err := exec.Command("taskset", "-a", "-p", "-c", cpuList(cpus), strconv.Itoa(pid)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("taskset -a -p -c %s %d: %v: %s", cpuList(cpus), pid, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// checkAffinity verifies that process pid runs on exactly cpus.
func checkAffinity(name string, pid int, cpus []int) error {
	got, err := allowedCPUs(pid)
	if err != nil {
		return fmt.Errorf("%s (pid %d): %v", name, pid, err)
	}
	if !slices.Equal(got, cpus) {
		return fmt.Errorf("%s (pid %d) runs on CPUs %s, want %s", name, pid, cpuList(got), cpuList(cpus))
	}
	return nil
}

// pinSelf moves this process (the Go load generator) to cpu with
// GOMAXPROCS 1, and returns the function that undoes it.
func pinSelf(cpu int) (restore func(), err error) {
	pid := os.Getpid()
	orig, err := allowedCPUs(pid)
	if err != nil {
		return nil, err
	}
	if err := setAffinity(pid, []int{cpu}); err != nil {
		return nil, err
	}
	procs := runtime.GOMAXPROCS(1)
	return func() {
		runtime.GOMAXPROCS(procs)
		if err := setAffinity(pid, orig); err != nil {
			logf("warning: restoring the CPU affinity: %v", err)
		}
	}, nil
}
