// Package redistest starts real redis-server processes for tests and for
// the repository's programs (cmd/bench, cmd/soak), and reads their INFO.
//
// Every server listens on 127.0.0.1 on a freshly picked free port and keeps
// its files in a temporary directory, so tests may run in parallel and never
// touch a shared Redis (in particular never 127.0.0.1:6379).
//
// The core needs no testing.TB: Launch starts a server as LaunchOptions say
// (binary, directory, extra arguments, a wrapper such as taskset) and
// returns a Proc (Addr, Pid, Stop, Kill, Restart, Pause, Resume, LogTail,
// NewClient, RunCLI); FreePort and FreePorts pick free loopback ports; and
// ParseInfo, ParseCommandStats and ParseCPU (with Info, ReadCommandStats and
// ReadCPU to run them on a client) read INFO output.
//
// The test helpers are built on it: in tests, missing binaries or start
// failures make the test fail; nothing is skipped.
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
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	clusterTimeout = 20 * time.Second // how long StartCluster waits for cluster_state:ok
)

// Server is one redis-server process started for a test: a Proc (see
// Launch) whose failures end the test and which is killed at cleanup.
type Server struct {
	Port int    // TCP port on 127.0.0.1
	Dir  string // working directory (inside a t.TempDir()); holds redis.log

	t testing.TB
	p *Proc
}

// Proc returns the process underneath, for the helpers that do not need a
// testing.TB (Pid, LogTail, ...).
func (s *Server) Proc() *Proc { return s.p }

// Addr returns "127.0.0.1:PORT".
func (s *Server) Addr() string { return s.p.Addr() }

// Start starts redis-server on a free 127.0.0.1 port in t.TempDir() with
// --save "" --appendonly no --bind 127.0.0.1 --port P --dir D, followed by
// extraArgs, and waits up to 5s until it answers PING. It calls t.Fatalf if
// redis-server is missing or does not come up, and registers a t.Cleanup
// that kills the process. extraArgs must not contain --port.
func Start(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	if slices.Contains(extraArgs, "--port") {
		t.Fatalf("redistest: extraArgs must not set --port (got %q)", extraArgs)
	}
	return startTB(t, LaunchOptions{Args: extraArgs})
}

// startTB launches a server as opts say, in the test's temporary directory,
// failing the test if it does not come up, and kills it at cleanup.
func startTB(t testing.TB, opts LaunchOptions) *Server {
	t.Helper()
	lookPath(t, cmpOr(opts.Bin, "redis-server"))
	opts.Dir = t.TempDir()
	p, err := Launch(opts)
	if err != nil {
		t.Fatalf("%v", err)
	}
	s := &Server{Port: p.Port, Dir: p.Dir, t: t, p: p}
	t.Cleanup(s.Kill)
	return s
}

// Kill stops the process with SIGKILL (its whole process group) and waits for
// it to exit. It is a no-op if the server is not running. Port and Dir are
// kept, so Restart can bring it back.
func (s *Server) Kill() { s.p.Kill() }

// Pause stops the process with SIGSTOP: its port stays bound and the
// kernel still accepts connections, but nothing is answered, like a hung
// Redis. Resume continues it; Kill (and the test's cleanup) work on a paused
// server too. No-op if the server is not running.
func (s *Server) Pause() { s.p.Pause() }

// Resume continues a server stopped by Pause.
func (s *Server) Resume() { s.p.Resume() }

// Restart starts the server again on the same port and dir with the same
// arguments (killing it first if it is still running) and waits for PING.
// If the port cannot be bound yet it retries for a few seconds. Like Start it
// calls t.Fatalf on failure, so call it from the test goroutine.
func (s *Server) Restart() {
	s.t.Helper()
	lookPath(s.t, "redis-server")
	if err := s.p.Restart(); err != nil {
		s.t.Fatalf("%v", err)
	}
}

// Client returns a go-redis client for this server; it is closed at cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := s.p.NewClient()
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// CLI runs "redis-cli -h 127.0.0.1 -p PORT args..." and returns its trimmed
// output. It calls t.Fatalf if redis-cli is missing or exits non-zero.
func (s *Server) CLI(t testing.TB, args ...string) string {
	t.Helper()
	out, err := s.p.cli(lookPath(t, "redis-cli"), args...)
	if err != nil {
		t.Fatalf("redistest: redis-cli -p %d %s: %v\n%s", s.Port, strings.Join(args, " "), err, out)
	}
	return out
}

// cli runs redis-cli against the server without failing the test.
func (s *Server) cli(bin string, args ...string) (string, error) { return s.p.cli(bin, args...) }

// logTail returns the last lines of redis.log for failure messages.
func (s *Server) logTail() string { return s.p.LogTail() }

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
		c.Servers = append(c.Servers, startTB(t, LaunchOptions{PickPort: freeClusterPort, Args: []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
		}}))
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
					clusterTimeout, s.Addr(), err, info)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return c
}

func lookPath(t testing.TB, name string) string {
	t.Helper()
	p, err := lookRedis(name, name)
	if err != nil {
		t.Fatalf("%s not found on PATH: install it (apt-get install redis-server) — tests need a real Redis", name)
	}
	return p
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// CommandStats reads the server's INFO commandstats (through redis-cli).
func (s *Server) CommandStats(t testing.TB) CommandStats {
	t.Helper()
	return ParseCommandStats(s.CLI(t, "INFO", "commandstats"))
}

// InfoInt reads an integer field of an INFO section.
func (s *Server) InfoInt(t testing.TB, section, field string) int64 {
	t.Helper()
	info := s.CLI(t, "INFO", section)
	n, err := InfoInt(ParseInfo(info), field)
	if err != nil {
		t.Fatalf("redistest: INFO %s: %v\n%s", section, err, info)
	}
	return n
}
