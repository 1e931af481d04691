package slidingratelimit

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
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
