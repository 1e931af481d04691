package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Redis6Env is the file .ci/redis6 writes beside the Redis 6.0.16 it
// unpacks (REDIS6_SERVER, LD_LIBRARY_PATH and LUA_CPATH, one NAME=value a
// line), in $REDIS6_DIR or else .cache/redis6 at the root of the module.
const Redis6Env = "env"

// Redis6 reads where .ci/redis6 put Redis 6.0.16: its redis-server, and
// the environment the server runs with (the caller's, with LD_LIBRARY_PATH
// and LUA_CPATH for the libraries and the Lua modules, cjson and bit, that
// it loads by require). The error says how to get it.
func Redis6() (bin string, env []string, err error) {
	dir := os.Getenv("REDIS6_DIR")
	if dir == "" {
		root, err := moduleRoot()
		if err != nil {
			return "", nil, err
		}
		dir = filepath.Join(root, ".cache", "redis6")
	}
	path := filepath.Join(dir, Redis6Env)
	f, err := os.Open(path)
	if err != nil {
		return "", nil, fmt.Errorf("redistest: Redis 6 is not in %s (run .ci/redis6, which make test runs): %w", dir, err)
	}
	defer f.Close()
	env = os.Environ()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), "=")
		switch {
		case !ok:
		case name == "REDIS6_SERVER":
			bin = val
		default:
			env = append(env, name+"="+val)
		}
	}
	if err := sc.Err(); err != nil {
		return "", nil, fmt.Errorf("redistest: %s: %w", path, err)
	}
	if bin == "" {
		return "", nil, fmt.Errorf("redistest: %s names no REDIS6_SERVER (run .ci/redis6 again)", path)
	}
	if _, err := os.Stat(bin); err != nil {
		return "", nil, fmt.Errorf("redistest: Redis 6's redis-server (run .ci/redis6 again): %w", err)
	}
	return bin, env, nil
}

// moduleRoot is the nearest directory at or above the working directory
// that holds go.mod (a test's working directory is its package's).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("redistest: no go.mod above the working directory: set REDIS6_DIR to where .ci/redis6 put Redis 6")
		}
		dir = up
	}
}

// StartRedis6 is Start for Redis 6.0.16 (.ci/redis6's): a server without
// functions, whose scripts share one Lua state. It fails the test when that
// Redis is missing (nothing is skipped).
func StartRedis6(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	bin, env, err := Redis6()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return startTB(t, LaunchOptions{Bin: bin, Env: env, Args: extraArgs})
}
