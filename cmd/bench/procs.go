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
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/procs"
)

const (
	caddyReady   = 30 * time.Second
	buildTimeout = 15 * time.Minute
)

// cleanup stops the children and removes the scratch directories, last
// first; global so that a panicking goroutine can run it (cleanup.Repanic).
var cleanup procs.Cleaner

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
func waitSites(ctx context.Context, caddy *procs.Proc, urls map[string]string) error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	deadline := time.Now().Add(caddyReady)
	for name, url := range urls {
		for {
			if caddy.Exited() {
				return fmt.Errorf("caddy exited during startup\n%s", caddy.LogTail(30))
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
				return fmt.Errorf("site %s (%s) not ready after %v: %v\n%s", name, url, caddyReady, err, caddy.LogTail(30))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}
