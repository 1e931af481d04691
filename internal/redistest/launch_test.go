package redistest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func itoa(n int) string { return strconv.Itoa(n) }

func TestFreePorts(t *testing.T) {
	ps, err := FreePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if p == SharedPort || p <= 0 || seen[p] {
			t.Fatalf("bad or repeated port %d in %v", p, ps)
		}
		seen[p] = true
	}
	if p, err := FreePort(); err != nil || p == SharedPort || p <= 0 {
		t.Fatalf("FreePort = %d, %v", p, err)
	}
}

// TestLaunchStop: Launch without a testing.TB, in its own temporary
// directory, which Stop removes.
func TestLaunchStop(t *testing.T) {
	t.Parallel()
	p, err := Launch(LaunchOptions{Args: []string{"--maxmemory", "10mb"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if p.Port == SharedPort || p.Addr() != "127.0.0.1:"+itoa(p.Port) || p.Pid() <= 0 || p.Exited() {
		t.Fatalf("port %d addr %s pid %d exited %v", p.Port, p.Addr(), p.Pid(), p.Exited())
	}
	c := p.NewClient()
	defer c.Close()
	if got, err := c.ConfigGet(context.Background(), "maxmemory").Result(); err != nil || got["maxmemory"] != "10485760" {
		t.Fatalf("CONFIG GET maxmemory = %v, %v", got, err)
	}
	if out, err := p.RunCLI("PING"); err != nil || out != "PONG" {
		t.Fatalf("RunCLI PING = %q, %v", out, err)
	}
	if !strings.Contains(p.LogTail(), "Ready to accept connections") {
		t.Errorf("LogTail:\n%s", p.LogTail())
	}
	p.Stop()
	if !p.Exited() || p.Pid() != 0 {
		t.Error("still running after Stop")
	}
	if _, err := os.Stat(p.Dir); !os.IsNotExist(err) {
		t.Errorf("Stop left %s: %v", p.Dir, err)
	}
	p.Stop() // idempotent
	if err := p.Restart(); err != nil {
		t.Fatalf("Restart after Stop: %v", err)
	}
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
}

// TestLaunchDirWrapper: a given parent Dir is kept (the server's directory
// is made inside it), and the server runs under a wrapper that execs it.
func TestLaunchDirWrapper(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	wrapper := []string{"env", "REDISTEST_WRAPPED=1"}
	if _, err := exec.LookPath("taskset"); err == nil {
		wrapper = []string{"taskset", "-c", "0"}
	}
	p, err := Launch(LaunchOptions{Dir: parent, Wrapper: wrapper})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(p.Dir) != parent {
		t.Errorf("Dir %s not inside %s", p.Dir, parent)
	}
	// The wrapper exec'ed redis-server: the pid is the server's.
	comm, _ := os.ReadFile("/proc/" + itoa(p.Pid()) + "/comm")
	if len(comm) > 0 && !strings.HasPrefix(string(comm), "redis-server") {
		t.Errorf("pid %d is %q, want redis-server", p.Pid(), comm)
	}
	p.Stop()
	if _, err := os.Stat(filepath.Join(p.Dir, "redis.log")); err != nil {
		t.Errorf("Stop removed the server's files in a given Dir: %v", err)
	}
}

func TestLaunchErrors(t *testing.T) {
	if _, err := Launch(LaunchOptions{Args: []string{"--port", "1"}}); err == nil {
		t.Error("--port in Args: want an error")
	}
	if _, err := Launch(LaunchOptions{Bin: "no-such-redis-server-binary"}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("missing binary: %v", err)
	}
	// A server that cannot start reports its log.
	_, err := Launch(LaunchOptions{Args: []string{"--no-such-option", "x"}})
	if err == nil || !strings.Contains(err.Error(), "redis.log") {
		t.Errorf("bad option: %v", err)
	}
}
