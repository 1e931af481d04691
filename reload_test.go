package slidingratelimit

// Config reloads under load.

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// reloadTestConfig is a Caddyfile with two limiters: one on Redis whose limit
// changes from load to load, one in-process that never changes, and
// optionally without the Redis one.
func reloadTestConfig(redisAddr, memName string, redisLimit int, withRedis bool) string {
	redisRoute := ""
	if withRedis {
		redisRoute = `
	route /redis {
		sliding_ratelimit {
			name    reload-redis
			key     {http.request.header.X-API-Key}
			limit   ` + strconv.Itoa(redisLimit) + `
			window  1m
			redis   redis://` + redisAddr + ` {
				timeout 2s
			}
		}
		respond "ok"
	}`
	}
	return `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
}
http://localhost:9080 {` + redisRoute + `
	route /memory {
		sliding_ratelimit {
			name    ` + memName + `
			key     {http.request.header.X-API-Key}
			limit   10
			window  1m
		}
		respond "ok"
	}
}
`
}

// TestReloadUnderLoad posts 5 changed configs to Caddy's admin /load while
// 8 goroutines send requests. No request fails (only 200 or 429; a request
// Caddy's listener swap drops in the transport is retried once and must
// then succeed); the new limit applies; the unchanged in-process
// limiter keeps its counts; the Redis client and its pool are the same
// object throughout and Redis sees no new connections pile up; loading a
// config without the Redis limiter closes the client.
// Not parallel: Caddy's admin endpoint and ports are process-wide.
func TestReloadUnderLoad(t *testing.T) {
	defer func() {
		if t.Skipped() {
			t.Errorf("caddytest skipped the test; it must run")
		}
	}()
	const workers = 8
	srv := redistest.Start(t)
	memName := "reload-mem-" + uniqueName()
	limit := 100
	tester := newTester(t)
	tester.InitServer(reloadTestConfig(srv.Addr(), memName, limit, true), "caddyfile")
	if t.Failed() {
		t.FailNow()
	}

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers + 2}}
	defer client.CloseIdleConnections()
	get := func(path, key string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodGet, "http://localhost:9080"+path, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("X-API-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, nil
	}
	mustGet := func(path, key string) *http.Response {
		t.Helper()
		resp, err := get(path, key)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return resp
	}
	remaining := func(resp *http.Response) string { return resp.Header.Get("X-RateLimit-Remaining") }

	// Counts made before any reload: 3 of 10 in process, 3 in Redis.
	for i := range 3 {
		if r := mustGet("/memory", "steady"); r.StatusCode != http.StatusOK || remaining(r) != strconv.Itoa(9-i) {
			t.Fatalf("/memory before the reloads: status %d remaining %s", r.StatusCode, remaining(r))
		}
		if r := mustGet("/redis", "steady"); r.StatusCode != http.StatusOK || remaining(r) != strconv.Itoa(limit-1-i) {
			t.Fatalf("/redis before the reloads: status %d remaining %s", r.StatusCode, remaining(r))
		}
	}

	// The Redis store's pool entry: its client is compared across reloads.
	redisEntryOf := func() (any, redisEntry, int) {
		t.Helper()
		var key any
		var entry redisEntry
		found := 0
		stores.Range(func(k, v any) bool {
			if e, ok := v.(redisEntry); ok && strings.Contains(fmt.Sprint(k), srv.Addr()) {
				key, entry = k, e
				found++
			}
			return true
		})
		return key, entry, found
	}
	connected := func() int {
		t.Helper()
		for _, line := range strings.Split(srv.CLI(t, "INFO", "clients"), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("connected_clients %q", v)
				}
				return n - 1 // not redis-cli itself
			}
		}
		t.Fatal("INFO clients has no connected_clients")
		return 0
	}

	// Load: 8 goroutines, fresh keys (always 200), half on each limiter.
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		failures []string
		retried  []string // first attempts lost in the transport, then retried
	)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				path := "/memory"
				if n%2 == 0 {
					path = "/redis"
				}
				key := fmt.Sprintf("load-%s-%d-%d", memName, g, n)
				resp, err := get(path, key)
				if err != nil {
					// A reload makes Caddy (not the limiter) drop a few
					// connections: its old server closes idle keep-alive
					// connections, and on Unix each config binds a new
					// SO_REUSEPORT socket and closes the old one with
					// whatever sat in its accept backlog. A GET lost that
					// way is retried once, as HTTP clients do for
					// idempotent requests; a limiter that panics or hangs
					// fails the retry too.
					mu.Lock()
					retried = append(retried, fmt.Sprintf("GET %s: %v", path, err))
					mu.Unlock()
					resp, err = get(path, key)
				}
				mu.Lock()
				if err != nil {
					failures = append(failures, fmt.Sprintf("GET %s (retried): %v", path, err))
				} else {
					statuses[resp.StatusCode]++
					if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
						failures = append(failures, fmt.Sprintf("GET %s: status %d", path, resp.StatusCode))
					}
				}
				mu.Unlock()
			}
		}()
	}
	stopLoad := func() {
		stop.Store(true)
		wg.Wait()
	}
	defer stopLoad()

	time.Sleep(300 * time.Millisecond) // the pool warms up to the load
	poolKey, before, found := redisEntryOf()
	if found != 1 {
		t.Fatalf("%d Redis stores for %s in the pool, want 1", found, srv.Addr())
	}
	connBefore := connected()

	admin := &http.Client{Timeout: 10 * time.Second}
	for i := 1; i <= 5; i++ {
		limit = 100 + i
		resp, err := admin.Post("http://localhost:2999/load", "text/caddyfile",
			strings.NewReader(reloadTestConfig(srv.Addr(), memName, limit, true)))
		if err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("reload %d: status %d: %s", i, resp.StatusCode, body)
		}
		time.Sleep(150 * time.Millisecond) // traffic on the new config
		k, e, n := redisEntryOf()
		if n != 1 || k != poolKey || e.client != before.client || e.Breaker != before.Breaker {
			t.Fatalf("reload %d: the Redis store was replaced (%d entries; same client: %v, same breaker: %v)",
				i, n, e.client == before.client, e.Breaker == before.Breaker)
		}
		if refs, ok := stores.References(poolKey); !ok || refs != 1 {
			t.Errorf("reload %d: the Redis store has %d references (present %v), want 1: a handler leaked it", i, refs, ok)
		}
		if c := connected(); c > workers+2 {
			t.Errorf("reload %d: %d clients connected to Redis (%d before the reloads, %d workers): connections pile up", i, c, connBefore, workers)
		}
	}
	stopLoad()

	mu.Lock()
	t.Logf("statuses under load: %v; Redis clients before the reloads %d, after %d", statuses, connBefore, connected())
	if len(retried) > 0 {
		t.Logf("%d requests lost by Caddy's listener swap and retried, e.g. %s", len(retried), retried[0])
	}
	for i, f := range failures {
		if i == 10 {
			t.Errorf("... and %d more", len(failures)-10)
			break
		}
		t.Errorf("failed during the reloads: %s", f)
	}
	if statuses[http.StatusOK] == 0 {
		t.Error("no request succeeded under load")
	}
	mu.Unlock()

	// The new limit applies; the counts made before the reloads are kept.
	if r := mustGet("/redis", "fresh-"+memName); r.Header.Get("X-RateLimit-Limit") != strconv.Itoa(limit) {
		t.Errorf("after the reloads: X-RateLimit-Limit %s, want %d", r.Header.Get("X-RateLimit-Limit"), limit)
	}
	if r := mustGet("/memory", "steady"); r.StatusCode != http.StatusOK || remaining(r) != "6" {
		t.Errorf("in-process limiter after 5 reloads: status %d remaining %s, want 200 and 6 (3 before + 1): its state was reset",
			r.StatusCode, remaining(r))
	}
	if r := mustGet("/redis", "steady"); r.StatusCode != http.StatusOK || remaining(r) != strconv.Itoa(limit-4) {
		t.Errorf("redis limiter after 5 reloads: status %d remaining %s, want 200 and %d", r.StatusCode, remaining(r), limit-4)
	}

	// The last user goes: the client is closed, its connections too.
	resp, err := admin.Post("http://localhost:2999/load", "text/caddyfile",
		strings.NewReader(reloadTestConfig(srv.Addr(), memName, limit, false)))
	if err != nil {
		t.Fatalf("final load: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("final load: status %d", resp.StatusCode)
	}
	if _, _, n := redisEntryOf(); n != 0 {
		t.Errorf("the Redis store outlived its last limiter")
	}
	deadline := time.Now().Add(3 * time.Second)
	for connected() > 0 {
		if time.Now().After(deadline) {
			t.Errorf("%d connections to Redis remain after its last limiter went", connected())
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := mustGet("/memory", "steady"); remaining(r) != "5" {
		t.Errorf("in-process limiter after the final load: remaining %s, want 5", remaining(r))
	}
}

// TestReloadWarnsWhenBudgetsRestart: a reload that changes a limiter's
// algorithm changes its keys, so every budget starts again: Caddy says so
// in its log, naming what changed. A reload that changes only a limit or a
// window says nothing (budgets carry over).
func TestReloadWarnsWhenBudgetsRestart(t *testing.T) {
	t.Parallel()
	name := uniqueName()
	old := &Handler{Name: name, Limit: "5", Window: caddy.Duration(time.Minute)}
	provision(t, old, newTestClock())
	for _, c := range []struct {
		next *Handler
		want string
	}{
		{&Handler{Name: name, Limit: "7", Window: caddy.Duration(time.Hour)}, ""},
		{&Handler{Name: name, Algorithm: "sliding_counter", Limit: "5", Window: caddy.Duration(time.Minute)}, "algorithm sliding_log -> sliding_counter"},
	} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
		core, logs := observer.New(zapcore.WarnLevel)
		c.next.rt = &provisioned{logger: zap.New(core)}
		if err := c.next.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		warns := logs.FilterMessageSnippet("budget starts again").All()
		switch {
		case c.want == "" && len(warns) != 0:
			t.Errorf("a reload of limits and windows warned: %v", warns[0].ContextMap())
		case c.want != "" && (len(warns) != 1 || !strings.Contains(fmt.Sprint(warns[0].ContextMap()["changed"]), c.want)):
			t.Errorf("reload to %s: warnings %v, want one naming %q", c.next.Algorithm, warns, c.want)
		}
		c.next.Cleanup()
		cancel()
	}
}

// TestReloadKeepsInProcessOverrides: an operator gives K a limit of 2 for 10
// minutes through the admin API on a limiter of the in-process store, then
// a config reload provisions the limiter again (Caddy keeps the in-process
// store and its budgets). The new handler applies the override: K is
// admitted twice, with X-RateLimit-Limit 2, as it would be on Redis.
func TestReloadKeepsInProcessOverrides(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	name := uniqueName()
	mk := func() *Handler {
		return &Handler{Name: name, Key: "{http.request.header.X-API-Key}", Limit: "100", Window: caddy.Duration(time.Hour)}
	}
	old := mk()
	provision(t, old, clock)
	if code, body := adminOverride(t, http.MethodPut, name, "key=K&limit=2&ttl=10m"); code != http.StatusOK {
		t.Fatalf("PUT override: %d %s", code, body)
	}
	reloaded := mk()
	provision(t, reloaded, clock)
	k := map[string]string{"X-API-Key": "K"}
	if n := admitted(t, reloaded, k, 5); n != 2 {
		t.Errorf("after the reload K was admitted %d times of 5, want 2 (its override of 2 lasts 10 minutes)", n)
	}
	if got := serve(t, reloaded, k).Header().Get("X-RateLimit-Limit"); got != "2" {
		t.Errorf("after the reload: X-RateLimit-Limit %q, want 2 (the override)", got)
	}
}
