package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// sharedRedisPort is a Redis someone else may run: never used.
const sharedRedisPort = 6379

// redisProc is the soak's own redis-server. (internal/redistest needs a
// testing.TB, so this is its small standalone sibling.)
type redisProc struct {
	addr    string
	dir     string
	version string
	cmd     *exec.Cmd
	done    chan struct{}
}

// startRedis starts bin on a free 127.0.0.1 port (never 6379) in a
// temporary directory, without persistence, and waits until it answers.
func startRedis(bin string) (*redisProc, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%s not found: install redis-server (apt-get install redis-server): %w", bin, err)
	}
	var last error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		dir, err := os.MkdirTemp("", "soak-redis-")
		if err != nil {
			return nil, err
		}
		p := &redisProc{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, done: make(chan struct{})}
		if last = p.launch(path, port); last == nil {
			return p, nil
		}
		p.stop()
	}
	return nil, fmt.Errorf("starting redis-server: %w", last)
}

func (p *redisProc) launch(bin string, port int) error {
	logf, err := os.Create(filepath.Join(p.dir, "redis.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	p.cmd = exec.Command(bin, "--save", "", "--appendonly", "no", "--bind", "127.0.0.1",
		"--port", strconv.Itoa(port), "--dir", p.dir)
	p.cmd.Dir = p.dir
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		p.cmd = nil
		return err
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()

	c := redis.NewClient(&redis.Options{Addr: p.addr, DialTimeout: 500 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		select {
		case <-p.done:
			return errors.New("redis-server exited during startup: " + p.logTail())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		info, err := c.Info(ctx, "server").Result()
		cancel()
		if err == nil {
			for line := range strings.SplitSeq(info, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
					p.version = v
				}
			}
			return nil
		}
	}
	return errors.New("redis-server did not answer within 5s: " + p.logTail())
}

// stop kills the server (its process group) and removes its directory.
func (p *redisProc) stop() {
	if p.cmd != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		p.cmd = nil
	}
	_ = os.RemoveAll(p.dir)
}

func (p *redisProc) logTail() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "redis.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return strings.Join(lines, "\n")
}

// freePort returns a currently free 127.0.0.1 port other than 6379.
func freePort() (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if port != sharedRedisPort {
			return port, nil
		}
	}
	return 0, errors.New("no free 127.0.0.1 port")
}
