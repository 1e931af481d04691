package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	caddyReady   = 30 * time.Second
	buildTimeout = 15 * time.Minute
)

// cleaner runs cleanup functions once, last added first. It is global so a
// panicking goroutine can run it before the process dies.
type cleaner struct {
	mu  sync.Mutex
	fns []func()
}

var cleanup cleaner

func (c *cleaner) add(f func()) {
	c.mu.Lock()
	c.fns = append(c.fns, f)
	c.mu.Unlock()
}

func (c *cleaner) run() {
	c.mu.Lock()
	fns := c.fns
	c.fns = nil
	c.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// repanic, deferred first thing in a goroutine, kills the child processes
// before a panic takes the process down (deferred functions of main do not
// run when another goroutine panics).
func repanic() {
	if r := recover(); r != nil {
		cleanup.run()
		panic(r)
	}
}

// childAttr puts a child in its own process group (so it and its children
// can be killed together, and a terminal's Ctrl-C reaches only us) and asks
// Linux to kill it if we die without cleaning up. Pdeathsig follows the
// thread that started the child: main locks its goroutine to the main
// thread, and children are started from main.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// proc is a started child process.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when it has exited
	once sync.Once
}

func startProc(name, logPath, dir string, env []string, bin string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	cleanup.add(p.stop)
	return p, nil
}

// stop asks the process group to end (SIGTERM), then kills it after 3s.
func (p *proc) stop() {
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

// killGroup kills a command's process group (for exec.Cmd.Cancel).
func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// logTail returns the last n lines of the process's log.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "--- " + path + " (last lines) ---\n" + strings.Join(lines, "\n")
}

// moduleRoot returns the directory of this repository's go.mod, checking it
// is the sliding_ratelimit module.
func moduleRoot(goBin string) (string, error) {
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside a Go module: run from the sliding_ratelimit repository (go run ./cmd/bench)")
	}
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	if !strings.Contains(string(b), "module github.com/sliding-ratelimit/sliding_ratelimit\n") {
		return "", fmt.Errorf("%s is not the sliding_ratelimit module: run from the repository", gomod)
	}
	return filepath.Dir(gomod), nil
}

// buildCaddy builds ./cmd/caddy into dir and returns the binary's path.
func buildCaddy(ctx context.Context, goBin, root, dir string) (string, error) {
	bin := filepath.Join(dir, "caddy")
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", bin, "./cmd/caddy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -o %s ./cmd/caddy: %v\n%s", bin, err, out)
	}
	return bin, nil
}

// peerModule is the module path of the peer, mholt/caddy-ratelimit.
const peerModule = "github.com/mholt/caddy-ratelimit"

// buildWithPeer builds one Caddy with this plugin and the peer (its source
// in peerDir) into dir: a scratch module in dir/peerbuild, never in the
// repository, requires both with replace lines to root and peerDir, starts
// from root's go.sum, resolves the rest with go mod tidy (the peer may need
// modules from the proxy) and builds.
func buildWithPeer(ctx context.Context, goBin, root, peerDir, dir string) (string, error) {
	peerDir, err := filepath.Abs(peerDir)
	if err != nil {
		return "", err
	}
	if b, err := os.ReadFile(filepath.Join(peerDir, "go.mod")); err != nil || !strings.Contains(string(b), "module "+peerModule+"\n") {
		return "", fmt.Errorf("-peer %s: not a clone of %s (its go.mod: %v)", peerDir, peerModule, err)
	}
	mod := filepath.Join(dir, "peerbuild")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		return "", err
	}
	files := map[string]string{
		"go.mod": "module benchcaddy\n\ngo 1.26\n\nrequire (\n\tgithub.com/sliding-ratelimit/sliding_ratelimit v0.0.0\n\t" +
			peerModule + " v0.0.0\n)\n\nreplace github.com/sliding-ratelimit/sliding_ratelimit => " + root +
			"\n\nreplace " + peerModule + " => " + peerDir + "\n",
		"main.go": "// Caddy with both rate limiters, for go run ./cmd/bench -peer.\npackage main\n\nimport (\n" +
			"\tcaddycmd \"github.com/caddyserver/caddy/v2/cmd\"\n\n\t_ \"github.com/caddyserver/caddy/v2/modules/standard\"\n" +
			"\t_ \"" + peerModule + "\"\n\t_ \"github.com/sliding-ratelimit/sliding_ratelimit\"\n)\n\nfunc main() { caddycmd.Main() }\n",
	}
	if sum, err := os.ReadFile(filepath.Join(root, "go.sum")); err == nil {
		files["go.sum"] = string(sum)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(mod, name), []byte(body), 0o644); err != nil {
			return "", err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	bin := filepath.Join(dir, "caddy")
	for _, args := range [][]string{{"mod", "tidy"}, {"build", "-o", bin, "."}} {
		cmd := exec.CommandContext(ctx, goBin, args...)
		cmd.Dir = mod
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go %s in %s: %v\n%s", strings.Join(args, " "), mod, err, out)
		}
	}
	return bin, nil
}

var errRedisMissing = errors.New("redis-server not found on PATH: install it (e.g. apt-get install redis-server), " +
	"or run only sites without Redis (-sites none,memory_log); the benchmark starts its own server on a free port " +
	"and never uses 127.0.0.1:6379")

// validateCaddyfile runs `caddy validate` (adapt, then load and provision
// every module without serving) on a Caddyfile; the error carries Caddy's
// own message.
func validateCaddyfile(ctx context.Context, caddyBin, path string, env []string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, caddyBin, "validate", "--config", path, "--adapter", "caddyfile")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	return errors.New(caddyError(string(out), err))
}

// caddyError picks Caddy's error out of its output: an "Error: ..." line, or
// the message of its last JSON log line at level error.
func caddyError(out string, err error) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if strings.HasPrefix(l, "Error:") {
			return l
		}
		var entry struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Error string `json:"error"`
		}
		if json.Unmarshal([]byte(l), &entry) == nil && (entry.Level == "error" || entry.Level == "fatal") {
			if entry.Error != "" {
				return entry.Msg + ": " + entry.Error
			}
			return entry.Msg
		}
	}
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return fmt.Sprintf("%v: %s", err, strings.Join(lines, "\n"))
}

// caddyLogErrors returns the messages of the error-level lines in Caddy's
// log (its logging is rate limited, so this undercounts events).
func caddyLogErrors(path string) (n int, msgs []string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, nil
	}
	for _, l := range strings.Split(string(b), "\n") {
		var entry struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Error string `json:"error"`
		}
		if json.Unmarshal([]byte(l), &entry) != nil || (entry.Level != "error" && entry.Level != "fatal") {
			continue
		}
		msg := entry.Msg
		if entry.Error != "" {
			msg += ": " + entry.Error
		}
		msgs = append(msgs, msg)
	}
	return len(msgs), msgs
}

// nthCaddyError returns the message of the error line after the first n.
func nthCaddyError(path string, n int) string {
	if _, msgs := caddyLogErrors(path); len(msgs) > n {
		return msgs[n]
	}
	return ""
}

// waitSites polls every URL until it answers 200 or 429, Caddy exits, or
// the timeout passes.
func waitSites(ctx context.Context, caddy *proc, urls map[string]string) error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	deadline := time.Now().Add(caddyReady)
	for name, url := range urls {
		for {
			if caddy.exited() {
				return fmt.Errorf("caddy exited during startup\n%s", logTail(caddy.log, 30))
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			req.Header.Set("X-Key", "bench-ready-probe")
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusTooManyRequests {
					break
				}
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("site %s (%s) not ready after %v: %v\n%s", name, url, caddyReady, err, logTail(caddy.log, 30))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}
