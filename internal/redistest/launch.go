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
	"time"

	"github.com/redis/go-redis/v9"
)

// LaunchOptions say how Launch starts one redis-server. The zero value is a
// plain server: redis-server from PATH on a free 127.0.0.1 port in a fresh
// temporary directory.
type LaunchOptions struct {
	// Bin is the redis-server binary (a path or a name looked up on PATH);
	// "" means "redis-server".
	Bin string
	// Dir is the parent of the server's working directory: each attempt
	// makes a fresh directory inside it (so a retry never sees a stale
	// nodes.conf) that holds redis.log. "" makes it in os.TempDir(), and
	// Stop removes it; a directory made inside a given Dir is left to the
	// caller.
	Dir string
	// Args are appended to the defaults: --save "" --appendonly no
	// --bind 127.0.0.1 --port P --dir D. They must not set --port.
	Args []string
	// Wrapper, if set, is a command the server runs under, e.g.
	// {"taskset", "-c", "1"}. It must exec redis-server (so the pid is the
	// server's), as taskset, nice and env do.
	Wrapper []string
	// Env is the server's environment; nil means the caller's.
	Env []string
	// ReadyTimeout bounds the wait for the first PONG (and Restart's wait
	// for the port); 0 means 5s.
	ReadyTimeout time.Duration
	// Attempts is how many fresh ports are tried when a port turns out to
	// be taken (another process won the race for it); 0 means 5.
	Attempts int

	// PickPort picks the port; nil means FreePort.
	PickPort func() (int, error)
	// ArgsFor, if set, builds the whole argument list for the picked port
	// and directory (it may write files, such as a sentinel config, into
	// dir) instead of the defaults and Args.
	ArgsFor func(port int, dir string) ([]string, error)
	// TLS, if set, makes the readiness PING and Client speak TLS with this
	// client config; CLIArgs are the matching redis-cli flags for CLI.
	TLS     *tls.Config
	CLIArgs []string
}

// Proc is one redis-server process started by Launch. Its methods are safe
// to call from several goroutines.
type Proc struct {
	Port int    // TCP port on 127.0.0.1
	Dir  string // working directory; holds redis.log

	addr      string
	bin       string
	args      []string // full argument list (without Wrapper), reused by Restart
	wrapper   []string
	env       []string
	logPath   string
	ownDir    bool // Dir was made in os.TempDir(): Stop removes it
	ready     time.Duration
	tlsConfig *tls.Config
	cliArgs   []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

const (
	defaultReadyTimeout = 5 * time.Second
	defaultAttempts     = 5
)

// Launch starts redis-server as opts say and waits until it answers PING
// (raw RESP, over TLS when opts.TLS is set). A port that turns out to be
// taken is retried with a fresh one, up to opts.Attempts times. The server
// runs in its own process group and, on Linux, is killed by the kernel if
// the thread that started it exits (so a program should start it from a
// goroutine locked to its thread, or from main). Stop it with Stop (or
// Kill). The error carries the tail of redis.log.
func Launch(opts LaunchOptions) (*Proc, error) {
	if opts.ArgsFor == nil && slices.Contains(opts.Args, "--port") {
		return nil, fmt.Errorf("redistest: Args must not set --port (got %q)", opts.Args)
	}
	bin, err := lookRedis(opts.Bin, "redis-server")
	if err != nil {
		return nil, err
	}
	var wrapper []string
	if len(opts.Wrapper) > 0 {
		w0, err := exec.LookPath(opts.Wrapper[0])
		if err != nil {
			return nil, fmt.Errorf("redistest: wrapper %q: %w", opts.Wrapper[0], err)
		}
		wrapper = append([]string{w0}, opts.Wrapper[1:]...)
	}
	pick := opts.PickPort
	if pick == nil {
		pick = FreePort
	}
	attempts := cmpOr(opts.Attempts, defaultAttempts)
	argsFor := opts.ArgsFor
	if argsFor == nil {
		argsFor = func(port int, dir string) ([]string, error) {
			return append(defaultArgs(port, dir), opts.Args...), nil
		}
	}
	for attempt := 1; ; attempt++ {
		port, err := pick()
		if err != nil {
			return nil, err
		}
		p := &Proc{
			Port:      port,
			addr:      net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			bin:       bin,
			wrapper:   wrapper,
			env:       opts.Env,
			ready:     cmpOr(opts.ReadyTimeout, defaultReadyTimeout),
			tlsConfig: opts.TLS,
			cliArgs:   opts.CLIArgs,
		}
		if opts.Dir == "" {
			p.Dir, err = os.MkdirTemp("", "redistest-"+strconv.Itoa(port)+"-")
			p.ownDir = true
		} else {
			p.Dir, err = os.MkdirTemp(opts.Dir, "redis-"+strconv.Itoa(port)+"-")
		}
		if err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
		p.logPath = filepath.Join(p.Dir, "redis.log")
		if p.args, err = argsFor(port, p.Dir); err != nil {
			p.Stop()
			return nil, fmt.Errorf("redistest: preparing redis-server on %s: %w", p.addr, err)
		}
		err = p.launch()
		if err == nil {
			return p, nil
		}
		p.Kill()
		inUse := p.addrInUse()
		tail := p.LogTail()
		if p.ownDir {
			_ = os.RemoveAll(p.Dir)
		}
		if attempt < attempts && inUse {
			continue
		}
		return nil, fmt.Errorf("redistest: starting redis-server on %s: %w\n%s", p.addr, err, tail)
	}
}

func defaultArgs(port int, dir string) []string {
	return []string{
		"--save", "", "--appendonly", "no",
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
	}
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Addr returns "127.0.0.1:PORT".
func (p *Proc) Addr() string { return p.addr }

// Pid is the server's process id (0 when it is not running).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Exited reports whether the server is not running (killed, or it died).
func (p *Proc) Exited() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Stop kills the server like Kill and removes its directory if Launch made
// it in os.TempDir(). It is safe to call more than once; Restart after Stop
// starts the server again in a fresh, empty directory of the same name.
func (p *Proc) Stop() {
	p.Kill()
	if p.ownDir {
		_ = os.RemoveAll(p.Dir)
	}
}

// Kill stops the process with SIGKILL (its whole process group) and waits
// for it to exit. It is a no-op if the server is not running. Port and Dir
// are kept, so Restart can bring it back.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Pause stops the process with SIGSTOP: its port stays bound and the kernel
// still accepts connections, but nothing is answered, like a hung Redis.
// Resume continues it; Kill works on a paused server too. No-op if the
// server is not running.
func (p *Proc) Pause() { p.signal(syscall.SIGSTOP) }

// Resume continues a server stopped by Pause.
func (p *Proc) Resume() { p.signal(syscall.SIGCONT) }

func (p *Proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// Restart starts the server again on the same port and directory with the
// same arguments (killing it first if it is still running) and waits for
// PING. While the port cannot be bound yet it retries, up to the ready
// timeout.
func (p *Proc) Restart() error {
	p.Kill()
	deadline := time.Now().Add(p.ready)
	for {
		err := p.launch()
		if err == nil {
			return nil
		}
		p.Kill()
		if p.addrInUse() && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		return fmt.Errorf("redistest: restarting redis-server on %s: %w\n%s", p.addr, err, p.LogTail())
	}
}

// NewClient returns a go-redis client for this server (TLS when the server
// was launched with LaunchOptions.TLS); the caller closes it.
func (p *Proc) NewClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: p.addr, DialTimeout: time.Second, TLSConfig: p.tlsConfig})
}

// RunCLI runs "redis-cli -h 127.0.0.1 -p PORT [CLIArgs] args..." (for at
// most 30s) and returns its trimmed combined output.
func (p *Proc) RunCLI(args ...string) (string, error) {
	bin, err := lookRedis("", "redis-cli")
	if err != nil {
		return "", err
	}
	return p.cli(bin, args...)
}

func (p *Proc) cli(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	full := append(append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(p.Port)}, p.cliArgs...), args...)
	out, err := exec.CommandContext(ctx, bin, full...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// LogTail returns the last 20 lines of redis.log, headed by its path, for
// error messages.
func (p *Proc) LogTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return "--- " + p.logPath + " (tail) ---\n" + strings.Join(lines, "\n")
}

// launch starts the process, appending its output to redis.log, and waits
// until it answers PING. On error the process may still be running.
func (p *Proc) launch() error {
	if err := os.MkdirAll(p.Dir, 0o755); err != nil { // gone after Stop
		return err
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child keeps its own copy of the descriptor
	argv := append(append(slices.Clone(p.wrapper), p.bin), p.args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = p.Dir
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	return waitReady(p.addr, p.tlsConfig, done, p.ready)
}

func (p *Proc) addrInUse() bool {
	b, _ := os.ReadFile(p.logPath)
	return strings.Contains(string(b), "Address already in use")
}

// waitReady sends raw RESP PINGs until the server answers +PONG (or -NOAUTH,
// which also proves it is serving), the process exits, or timeout passes.
func waitReady(addr string, tlsConfig *tls.Config, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
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
	return fmt.Errorf("no PONG within %v: %v", timeout, last)
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

// lookRedis resolves bin (default def) on PATH, with an install hint.
func lookRedis(bin, def string) (string, error) {
	if bin == "" {
		bin = def
	}
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("%s not found on PATH: install it (apt-get install redis-server): %w", bin, err)
	}
	return p, nil
}

// SharedPort is the port of a Redis someone else may run on the machine:
// FreePort and FreePorts never return it.
const SharedPort = 6379

// FreePort returns a currently free 127.0.0.1 TCP port, never SharedPort.
// It is free when picked; another process could take it before use
// (Launch retries with a fresh port when that happens).
func FreePort() (int, error) {
	ps, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ps[0], nil
}

// FreePorts returns n distinct currently free 127.0.0.1 TCP ports, never
// SharedPort. Each is held open until all are picked, so none repeats.
func FreePorts(n int) ([]int, error) {
	seen := map[int]bool{SharedPort: true}
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for tries := 0; len(ports) < n && tries < 50*max(n, 1); tries++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("redistest: free port: %w", err)
		}
		ls = append(ls, l)
		if p := l.Addr().(*net.TCPAddr).Port; !seen[p] {
			seen[p] = true
			ports = append(ports, p)
		}
	}
	if len(ports) < n {
		return nil, errors.New("redistest: could not find free 127.0.0.1 ports")
	}
	return ports, nil
}

// freeClusterPort returns a free port whose cluster bus port (port+10000) is
// also free and below 65536.
func freeClusterPort() (int, error) {
	for range 200 {
		p, err := listenFree(0)
		if err != nil || p == SharedPort || p+10000 >= 65536 {
			continue
		}
		if _, err := listenFree(p + 10000); err == nil {
			return p, nil
		}
	}
	return 0, errors.New("redistest: could not find a free 127.0.0.1 port pair (port, port+10000)")
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
