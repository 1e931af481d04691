// Package redistest starts real redis-server processes for tests.
//
// Every server listens on 127.0.0.1 on a freshly picked free port and keeps
// its files in a per-test temporary directory, so tests may run in parallel
// and never touch a shared Redis (in particular never 127.0.0.1:6379).
// Missing binaries or start failures make the test fail; nothing is skipped.
//
// Beside single servers (Start) it starts Redis Clusters (StartCluster),
// Sentinel setups (StartSentinel) and TLS-only servers with certificates
// made on the fly (NewCerts, StartTLS); Pause and Resume make a server hang
// and come back.
//
// The package needs redis-server (and, for CLI, StartCluster and
// StartSentinel, redis-cli) on PATH, and it uses Unix process groups and
// signals, so it builds on Unix only.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	readyTimeout   = 5 * time.Second  // how long Start/Restart wait for PING
	clusterTimeout = 20 * time.Second // how long StartCluster waits for cluster_state:ok
	startAttempts  = 5                // fresh ports Start tries when a port is taken
	sharedPort     = 6379             // the shared Redis: never use it
)

// Server is one redis-server process started for a test.
type Server struct {
	Port int    // TCP port on 127.0.0.1
	Dir  string // working directory (a t.TempDir()); holds redis.log

	t       testing.TB
	addr    string
	args    []string // full redis-server argument list, reused by Restart
	logPath string

	// tlsConfig, when set, makes readiness checks and Client speak TLS;
	// cliArgs are the matching redis-cli flags (see StartTLS).
	tlsConfig *tls.Config
	cliArgs   []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Addr returns "127.0.0.1:PORT".
func (s *Server) Addr() string { return s.addr }

// Start starts redis-server on a free 127.0.0.1 port in t.TempDir() with
// --save "" --appendonly no --bind 127.0.0.1 --port P --dir D, followed by
// extraArgs, and waits up to 5s until it answers PING. It calls t.Fatalf if
// redis-server is missing or does not come up, and registers a t.Cleanup
// that kills the process. extraArgs must not contain --port.
func Start(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	return start(t, freePort, extraArgs)
}

// start is Start with a pluggable port picker; a port that turns out to be
// taken (another process won the race for it) is retried with a fresh one.
func start(t testing.TB, pick func(testing.TB) int, extraArgs []string) *Server {
	t.Helper()
	if slices.Contains(extraArgs, "--port") {
		t.Fatalf("redistest: extraArgs must not set --port (got %q)", extraArgs)
	}
	return startProc(t, pick, nil, func(port int, dir string) ([]string, error) {
		return append([]string{
			"--save", "", "--appendonly", "no",
			"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
		}, extraArgs...), nil
	})
}

// startProc starts one redis-server on a port chosen by pick, in a fresh
// t.TempDir(), with the arguments argsFor builds for that port and dir (it
// may write files, such as a sentinel config, into dir). setup, if not nil,
// adjusts the Server (TLS) before the process is launched. A port that
// turns out to be taken is retried with a fresh one.
func startProc(t testing.TB, pick func(testing.TB) int, setup func(*Server), argsFor func(port int, dir string) ([]string, error)) *Server {
	t.Helper()
	bin := lookPath(t, "redis-server")
	for attempt := 1; ; attempt++ {
		port := pick(t)
		dir := t.TempDir() // fresh dir per attempt: no stale nodes.conf
		s := &Server{
			Port:    port,
			Dir:     dir,
			t:       t,
			addr:    net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			logPath: filepath.Join(dir, "redis.log"),
		}
		if setup != nil {
			setup(s)
		}
		args, err := argsFor(port, dir)
		if err != nil {
			t.Fatalf("redistest: preparing redis-server on %s: %v", s.addr, err)
		}
		s.args = args
		err = s.launch(bin)
		if err == nil {
			t.Cleanup(s.Kill)
			return s
		}
		s.Kill()
		if attempt < startAttempts && s.addrInUse() {
			continue
		}
		t.Fatalf("redistest: starting redis-server on %s: %v\n%s", s.addr, err, s.logTail())
	}
}

// Kill stops the process with SIGKILL (its whole process group) and waits for
// it to exit. It is a no-op if the server is not running. Port and Dir are
// kept, so Restart can bring it back.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Pause stops the process with SIGSTOP: its port stays bound and the
// kernel still accepts connections, but nothing is answered, like a hung
// Redis. Resume continues it; Kill (and the test's cleanup) work on a paused
// server too. No-op if the server is not running.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a server stopped by Pause.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, sig)
	}
}

// Restart starts the server again on the same port and dir with the same
// arguments (killing it first if it is still running) and waits for PING.
// If the port cannot be bound yet it retries for a few seconds. Like Start it
// calls t.Fatalf on failure, so call it from the test goroutine.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	bin := lookPath(s.t, "redis-server")
	deadline := time.Now().Add(readyTimeout)
	for {
		err := s.launch(bin)
		if err == nil {
			return
		}
		s.Kill()
		if s.addrInUse() && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		s.t.Fatalf("redistest: restarting redis-server on %s: %v\n%s", s.addr, err, s.logTail())
	}
}

// Client returns a go-redis client for this server; it is closed at cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.addr, DialTimeout: time.Second, TLSConfig: s.tlsConfig})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// CLI runs "redis-cli -h 127.0.0.1 -p PORT args..." and returns its trimmed
// output. It calls t.Fatalf if redis-cli is missing or exits non-zero.
func (s *Server) CLI(t testing.TB, args ...string) string {
	t.Helper()
	out, err := s.cli(lookPath(t, "redis-cli"), args...)
	if err != nil {
		t.Fatalf("redistest: redis-cli -p %d %s: %v\n%s", s.Port, strings.Join(args, " "), err, out)
	}
	return out
}

func (s *Server) cli(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	full := append(append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(s.Port)}, s.cliArgs...), args...)
	out, err := exec.CommandContext(ctx, bin, full...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// Cluster is a Redis Cluster of N masters (no replicas) started for a test.
type Cluster struct {
	Servers []*Server
}

// Addrs returns the "127.0.0.1:PORT" address of every node.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		addrs[i] = s.Addr()
	}
	return addrs
}

// StartCluster starts n (>= 3) cluster-enabled servers, joins them with
// "redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes" and
// waits up to 20s until every node reports cluster_state:ok with all 16384
// slots assigned and all n nodes known. It calls t.Fatalf otherwise.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 3 {
		t.Fatalf("redistest: StartCluster needs n >= 3 masters, got %d", n)
	}
	cliBin := lookPath(t, "redis-cli")
	c := &Cluster{}
	for range n {
		c.Servers = append(c.Servers, start(t, freeClusterPort, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
		}))
	}

	args := append(append([]string{"--cluster", "create"}, c.Addrs()...),
		"--cluster-replicas", "0", "--cluster-yes")
	if out, err := c.Servers[0].cli(cliBin, args...); err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}

	want := []string{
		"cluster_state:ok",
		"cluster_slots_assigned:16384",
		"cluster_known_nodes:" + strconv.Itoa(n),
	}
	deadline := time.Now().Add(clusterTimeout)
	for _, s := range c.Servers {
		for {
			info, err := s.cli(cliBin, "CLUSTER", "INFO")
			if err == nil && containsAll(info, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster not ready after %v: node %s CLUSTER INFO (err %v):\n%s",
					clusterTimeout, s.addr, err, info)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return c
}

// launch starts the process, appending its output to redis.log, and waits
// until it answers PING. On error the process may still be running.
func (s *Server) launch(bin string) error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child keeps its own copy of the descriptor
	cmd := exec.Command(bin, s.args...)
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return waitReady(s.addr, s.tlsConfig, done)
}

// waitReady sends raw RESP PINGs until the server answers +PONG (or -NOAUTH,
// which also proves it is serving), the process exits, or readyTimeout passes.
func waitReady(addr string, tlsConfig *tls.Config, exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	last := errors.New("no answer yet")
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("redis-server exited during startup")
		default:
		}
		if last = ping(addr, tlsConfig); last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no PONG within %v: %v", readyTimeout, last)
}

func ping(addr string, tlsConfig *tls.Config) error {
	var conn net.Conn
	var err error
	d := &net.Dialer{Timeout: 500 * time.Millisecond}
	if tlsConfig != nil {
		conn, err = tls.DialWithDialer(d, "tcp", addr, tlsConfig)
	} else {
		conn, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.HasPrefix(line, "+PONG") || strings.HasPrefix(line, "-NOAUTH") {
		return nil
	}
	return fmt.Errorf("PING reply %q", strings.TrimSpace(line))
}

// freePort returns a currently free 127.0.0.1 port (never 6379).
func freePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		if p, err := listenFree(0); err == nil && p != sharedPort {
			return p
		}
	}
	t.Fatalf("redistest: could not find a free 127.0.0.1 port")
	return 0
}

// freeClusterPort returns a free port whose cluster bus port (port+10000) is
// also free and below 65536.
func freeClusterPort(t testing.TB) int {
	t.Helper()
	for range 200 {
		p, err := listenFree(0)
		if err != nil || p == sharedPort || p+10000 >= 65536 {
			continue
		}
		if _, err := listenFree(p + 10000); err == nil {
			return p
		}
	}
	t.Fatalf("redistest: could not find a free 127.0.0.1 port pair (port, port+10000)")
	return 0
}

// listenFree binds 127.0.0.1:port (0 = any), closes it and returns the port.
func listenFree(port int) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lookPath(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found on PATH: install it (apt-get install redis-server) — tests need a real Redis", name)
	}
	return p
}

func (s *Server) addrInUse() bool {
	b, _ := os.ReadFile(s.logPath)
	return strings.Contains(string(b), "Address already in use")
}

// logTail returns the last lines of redis.log for failure messages.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return "--- " + s.logPath + " (tail) ---\n" + strings.Join(lines, "\n")
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
