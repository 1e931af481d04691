package slidingratelimit

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// newTester is caddytest.NewTester that, at the end of t, loads a config
// with nothing but the admin endpoint. The test Caddy is one per process
// and keeps the last config loaded: left there, a config's Redis store
// (its client and its reset subscription) outlives the test and keeps
// dialing the test's redis-server after it is killed, which later tests
// see as goroutines they did not start (TestFaultGoroutineLeak) and as
// log noise. The cleanup runs before the redis-server's when the server
// was started first, as every test here does.
func newTester(t *testing.T) *caddytest.Tester {
	t.Helper()
	tester := caddytest.NewTester(t)
	t.Cleanup(func() { unloadCaddy(t) })
	return tester
}

// unloadCaddy loads the admin-only config into the test Caddy; the stores
// of the config it replaces are released by their Cleanup.
func unloadCaddy(t *testing.T) {
	t.Helper()
	const empty = `{"admin":{"listen":"localhost:2999"}}`
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:2999/load", strings.NewReader(empty))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "localhost:2999"
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		// No Caddy to unload: the test failed before one started.
		t.Logf("unloading the test Caddy's config: %v", err)
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("unloading the test Caddy's config: status %d", resp.StatusCode)
	}
}

// logEntries is the number of entries of the sliding_log key at srv
// admitted after since (µs; 0: every one), in the key's state format:
// format 3 scores an entry -t and says its format with "#3" at +inf; the
// formats before score it t and keep their bookkeeping below zero.
func logEntries(t *testing.T, srv *redistest.Server, key string, since int64) int {
	t.Helper()
	args := []string{"ZCOUNT", key, "(" + strconv.FormatInt(since, 10), "+inf"}
	if srv.CLI(t, "ZSCORE", key, "#3") != "" {
		args = []string{"ZCOUNT", key, "-inf", "(" + strconv.FormatInt(-since, 10)}
	}
	n, err := strconv.Atoi(srv.CLI(t, args...))
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return n
}
