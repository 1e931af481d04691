package procs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestStatTicks(t *testing.T) {
	stat := "9556 (we (i)rd) R 9512 9512 6189 0 -1 4194304 102 0 0 0 25 7 0 0 20 0 1 0 196731 3133440 387\n"
	if n, err := StatTicks(stat); err != nil || n != 32 {
		t.Fatalf("got %d, %v; want 32", n, err)
	}
	if _, err := StatTicks("1 (x) R 2 3"); err == nil {
		t.Fatal("short stat line: want an error")
	}
	if _, err := StatTicks("1 x R 2 3 4 5 6 7 8 9 10 11 12 13 14"); err == nil {
		t.Fatal("no ')': want an error")
	}
	if d, err := CPU(os.Getpid()); err != nil || d < 0 {
		t.Fatalf("CPU(self) = %v, %v", d, err)
	}
}

func TestCleanerLastFirstOnce(t *testing.T) {
	var c Cleaner
	var got []int
	for i := range 3 {
		c.Add(func() { got = append(got, i) })
	}
	c.Run()
	c.Run()
	if !slices.Equal(got, []int{2, 1, 0}) {
		t.Fatalf("ran %v, want [2 1 0] once", got)
	}
}

func TestStartStop(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "child.log")
	var c Cleaner
	p, err := Start(&c, "child", log, dir, nil, "/bin/sh", "-c", "pwd; echo one; echo two; exec sleep 30")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.LogTail(5), "two") {
		if time.Now().After(deadline) {
			t.Fatalf("no output after 10s: %s", p.LogTail(5))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p.Exited() || p.Pid() <= 0 {
		t.Fatalf("exited %v, pid %d: want running", p.Exited(), p.Pid())
	}
	tail := p.LogTail(2)
	if want := "--- " + log + " (last lines) ---\none\ntwo"; tail != want {
		t.Fatalf("LogTail(2) = %q, want %q", tail, want)
	}
	if !strings.Contains(p.LogTail(3), dir) {
		t.Fatalf("the child did not run in dir %s: %s", dir, p.LogTail(3))
	}
	c.Run() // Stop, by the cleaner
	if !p.Exited() {
		t.Fatal("still running after the cleaner ran")
	}
}
