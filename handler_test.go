package slidingratelimit

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
)

// testClock is an injectable clock for `clock app`.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock {
	return &testClock{t: time.Date(2026, 11, 29, 11, 59, 59, 0, time.UTC)}
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// provision provisions and validates h as Caddy would, with an optional
// clock, and returns an observer of its logs.
func provision(t *testing.T, h *Handler, clock *testClock) *observer.ObservedLogs {
	t.Helper()
	if clock != nil {
		if h.rt == nil {
			h.rt = &provisioned{}
		}
		h.rt.now = clock.Now
		if h.Redis != nil {
			h.Clock = "app"
		}
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(func() {
		if err := h.Cleanup(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		cancel()
	})
	if err := h.Provision(ctx); err != nil {
		t.Fatalf("provision: %v", err)
	}
	if err := h.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	h.rt.logger = zap.New(core)
	return logs
}

// uniqueName gives each test its own limiter name, so tests that share the
// process-wide in-process store never share keys.
var nameSeq atomic.Int64

func uniqueName() string { return "t" + strconv.FormatInt(nameSeq.Add(1), 10) }

// serve sends one request with the given headers through h; next answers 200.
func serve(t *testing.T, h *Handler, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	w, err := serveErr(t, h, hdr)
	if err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	return w
}

// serveErr is serve, returning the handler's error.
func serveErr(t *testing.T, h *Handler, hdr map[string]string) (*httptest.ResponseRecorder, error) {
	t.Helper()
	w, r, _ := newRequest(hdr)
	return w, h.ServeHTTP(w, r, nextOK)
}

// newRequest prepares a request with the given headers as Caddy's server
// would (replacer, client IP, vars), and its recorder.
func newRequest(hdr map[string]string) (*httptest.ResponseRecorder, *http.Request, *caddy.Replacer) {
	r := httptest.NewRequest(http.MethodGet, "http://example.com/api", nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	repl := caddy.NewReplacer()
	return w, caddyhttp.PrepareRequest(r, repl, w, nil), repl
}

// nextOK is the next handler of the tests: it answers 200.
var nextOK = caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
	w.WriteHeader(http.StatusOK)
	return nil
})

type denyBody struct {
	Error      string  `json:"error"`
	RetryAfter int64   `json:"retry_after"`
	Region     *string `json:"region"`
}

func TestHandlerCountsDownThenDenies(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: "5", Window: caddy.Duration(time.Minute)}
	provision(t, h, clock)

	for i := 4; i >= 0; i-- {
		w := serve(t, h, map[string]string{"X-API-Key": "k1"})
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: status %d", 5-i, w.Code)
		}
		if got := w.Header().Get("X-RateLimit-Remaining"); got != strconv.Itoa(i) {
			t.Fatalf("X-RateLimit-Remaining=%q, want %d", got, i)
		}
		if got := w.Header().Get("X-RateLimit-Limit"); got != "5" {
			t.Fatalf("X-RateLimit-Limit=%q", got)
		}
	}
	clock.Advance(500 * time.Millisecond)
	w := serve(t, h, map[string]string{"X-API-Key": "k1"})
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("6th request: status %d, want 429", w.Code)
	}
	// 59.5 s until the first entry leaves: rounded up to 60 whole seconds.
	if got := w.Header().Get("Retry-After"); got != "60" {
		t.Errorf("Retry-After=%q, want 60", got)
	}
	if got := w.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type=%q", got)
	}
	var body denyBody
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", w.Body.String(), err)
	}
	if body.Error != "rate_limited" || body.RetryAfter != 60 || body.Region != nil {
		t.Errorf("body = %s", w.Body.String())
	}
	if got := w.Header().Get("RateLimit"); got != `"`+h.Name+`";r=0;t=60` {
		t.Errorf("RateLimit=%q", got)
	}
	if got := w.Header().Get("RateLimit-Policy"); got != `"`+h.Name+`";q=5;w=60` {
		t.Errorf("RateLimit-Policy=%q", got)
	}
	// Another key has its own budget.
	if w := serve(t, h, map[string]string{"X-API-Key": "k2"}); w.Code != http.StatusOK {
		t.Errorf("other key: status %d", w.Code)
	}
	// One window after the first request, one slot frees.
	clock.Advance(59*time.Second + 500*time.Millisecond + time.Microsecond)
	if w := serve(t, h, map[string]string{"X-API-Key": "k1"}); w.Code != http.StatusOK {
		t.Errorf("after the window: status %d", w.Code)
	}
}

func TestHandlerRetryAfterRoundsUpToWholeSeconds(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	h := &Handler{Name: uniqueName(), Limit: "1", Window: caddy.Duration(1500 * time.Millisecond)}
	provision(t, h, clock)
	serve(t, h, nil)
	clock.Advance(1400 * time.Millisecond) // 100ms left: still 1 whole second
	w := serve(t, h, nil)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("status %d, Retry-After %q; want 429 and 1", w.Code, w.Header().Get("Retry-After"))
	}
}

func TestHandlerRegionsAreIndependent(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Region: "{http.request.header.X-Region}",
				Limit: "2", Window: caddy.Duration(time.Minute)}
			if store == "redis" {
				h.Redis = &RedisConfig{Addresses: []string{srv.Addr()}}
			}
			provision(t, h, newTestClock())
			us := map[string]string{"X-API-Key": "k", "X-Region": "us"}
			gb := map[string]string{"X-API-Key": "k", "X-Region": "gb"}
			serve(t, h, us)
			serve(t, h, us)
			w := serve(t, h, us)
			if w.Code != http.StatusTooManyRequests {
				t.Fatalf("us 3rd: status %d", w.Code)
			}
			var body denyBody
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Region == nil || *body.Region != "us" {
				t.Errorf("429 body %q: want region us", w.Body.String())
			}
			if w := serve(t, h, gb); w.Code != http.StatusOK || w.Header().Get("X-RateLimit-Remaining") != "1" {
				t.Errorf("gb: status %d remaining %q, want 200 and 1", w.Code, w.Header().Get("X-RateLimit-Remaining"))
			}
		})
	}
}

// TestConcurrencyIsExact: 4 handlers with their own Redis clients (4 Caddy
// servers) share one Redis; 400 concurrent requests on one key with limit 50
// admit exactly 50. The same for the in-process store with one handler.
func TestConcurrencyIsExact(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	run := func(t *testing.T, hs []*Handler) {
		var admitted, denied atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := 0; i < 400; i++ {
			wg.Add(1)
			go func(h *Handler) {
				defer wg.Done()
				<-start
				w, err := serveErr(t, h, map[string]string{"X-API-Key": "hot"}) // no t.Fatal off the test's goroutine
				if err != nil {
					t.Errorf("ServeHTTP: %v", err)
					return
				}
				switch w.Code {
				case http.StatusOK:
					admitted.Add(1)
				case http.StatusTooManyRequests:
					denied.Add(1)
				default:
					t.Errorf("status %d", w.Code)
				}
			}(hs[i%len(hs)])
		}
		close(start)
		wg.Wait()
		if admitted.Load() != 50 || denied.Load() != 350 {
			t.Fatalf("admitted %d, denied %d; want 50 and 350", admitted.Load(), denied.Load())
		}
	}
	t.Run("redis, 4 instances", func(t *testing.T) {
		name := uniqueName()
		var hs []*Handler
		for i := 0; i < 4; i++ {
			// A distinct pool size gives each handler its own client and
			// pool, as 4 Caddy processes would have.
			h := &Handler{Name: name, Key: "{http.request.header.X-API-Key}", Limit: "50", Window: caddy.Duration(time.Minute),
				Redis: &RedisConfig{Addresses: []string{srv.Addr()}, PoolSize: 20 + i, Timeout: caddy.Duration(2 * time.Second)}}
			provision(t, h, nil)
			hs = append(hs, h)
		}
		if hs[0].rt.storeKey == hs[1].rt.storeKey {
			t.Fatal("handlers share a client; the test needs one per instance")
		}
		run(t, hs)
	})
	t.Run("memory, 1 instance", func(t *testing.T) {
		h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: "50", Window: caddy.Duration(time.Minute)}
		provision(t, h, nil)
		run(t, []*Handler{h})
	})
}

// TestScriptFlush: after SCRIPT FLUSH (what a Redis restarted empty does to
// the script cache) and FUNCTION FLUSH (to the function library) the next
// request is still decided, and correctly, on both ways of calling the
// script: the library is loaded again (or the script, by EVAL).
func TestScriptFlush(t *testing.T) {
	t.Parallel()
	for _, scripts := range []string{"", "eval"} {
		t.Run("scripts="+scripts, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			h := &Handler{Name: uniqueName(), Limit: "3", Window: caddy.Duration(time.Minute),
				Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Scripts: scripts}}
			provision(t, h, newTestClock())
			serve(t, h, nil)
			serve(t, h, nil)
			for _, flush := range []string{"SCRIPT", "FUNCTION"} {
				if got := srv.CLI(t, flush, "FLUSH"); got != "OK" {
					t.Fatalf("%s FLUSH: %q", flush, got)
				}
			}
			w := serve(t, h, nil)
			if w.Code != http.StatusOK || w.Header().Get("X-RateLimit-Remaining") != "0" {
				t.Fatalf("after flush: status %d remaining %q, want 200 and 0", w.Code, w.Header().Get("X-RateLimit-Remaining"))
			}
			if w := serve(t, h, nil); w.Code != http.StatusTooManyRequests {
				t.Fatalf("4th: status %d, want 429", w.Code)
			}
			libs := srv.CLI(t, "FUNCTION", "LIST", "LIBRARYNAME", lua.Library)
			// (This limiter's checks are sliding_log's of one window,
			// without a ban: on EVALSHA they go by the log's fast script.)
			cached := srv.CLI(t, "SCRIPT", "EXISTS", scriptSHA(t, lua.DecideFast[1]))
			if scripts == "eval" && (cached != "1" || libs != "") {
				t.Errorf("scripts eval: script cached %q, libraries %q; want the script cached again after the EVAL fallback, no library", cached, libs)
			}
			if scripts == "" && (cached != "0" || !strings.Contains(libs, lua.Library)) {
				t.Errorf("scripts functions: script cached %q, libraries %q; want the library %s loaded again, no script", cached, libs, lua.Library)
			}
		})
	}
}

// TestRedisDown: with Redis stopped, fail open admits within the timeout
// and fail closed answers 503; each logs one error per burst.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Kill()
	const timeout = 200 * time.Millisecond
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			h := &Handler{Name: uniqueName(), Limit: "3", Window: caddy.Duration(time.Minute), Fail: mode,
				Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(timeout)}}
			logs := provision(t, h, nil)
			for i := 0; i < 20; i++ {
				start := time.Now()
				w := serve(t, h, nil)
				if took := time.Since(start); took > timeout+100*time.Millisecond {
					t.Fatalf("request %d took %s, more than the %s timeout", i, took, timeout)
				}
				want := http.StatusOK
				if mode == "closed" {
					want = http.StatusServiceUnavailable
				}
				if w.Code != want {
					t.Fatalf("request %d: status %d, want %d", i, w.Code, want)
				}
				if mode == "closed" && w.Body.String() != `{"error":"rate_limiter_unavailable"}`+"\n" {
					t.Fatalf("503 body %q", w.Body.String())
				}
			}
			errs := logs.FilterLevelExact(zapcore.ErrorLevel).All()
			if len(errs) != 1 {
				t.Fatalf("%d error lines for one burst of 20 failures, want 1", len(errs))
			}
			if got := circuitGauge(t, h.Name); got != float64(limiter.Open) {
				t.Errorf("circuit_state gauge %v after 20 failures, want %d (open)", got, limiter.Open)
			}
			if errs[0].ContextMap()["fail"] != mode {
				t.Errorf("log line %v does not name the fail mode", errs[0].ContextMap())
			}
		})
	}
}

// TestRedisDownThenTimeout: a Redis that accepts connections but never
// answers (a black hole) costs at most the timeout per request.
func TestRedisBlackHole(t *testing.T) {
	t.Parallel()
	ln, err := newBlackHole(t)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 150 * time.Millisecond
	h := &Handler{Name: uniqueName(), Limit: "3", Window: caddy.Duration(time.Minute),
		Redis: &RedisConfig{Addresses: []string{ln}, Timeout: caddy.Duration(timeout)}}
	provision(t, h, nil)
	for i := 0; i < 3; i++ {
		start := time.Now()
		w := serve(t, h, nil)
		if took := time.Since(start); took > timeout+150*time.Millisecond {
			t.Fatalf("request %d took %s with a %s timeout", i, took, timeout)
		}
		if w.Code != http.StatusOK {
			t.Fatalf("fail open: status %d", w.Code)
		}
	}
}

func TestTemplateExpand(t *testing.T) {
	t.Parallel()
	repl := caddy.NewReplacer()
	repl.Set("a", "x")
	repl.Set("b", 42)
	for _, c := range []struct{ raw, want string }{
		{"{a}", "x"}, {"{b}", "42"}, {"{a}-{b}", "x-42"}, {"lit", "lit"}, {"{missing}", ""}, {"pre{a}", "prex"}, {"", ""},
	} {
		tmpl := compileTemplate(c.raw)
		if got := tmpl.expand(repl); got != c.want || got != repl.ReplaceAll(c.raw, "") {
			t.Errorf("%q: got %q, want %q (and what ReplaceAll gives)", c.raw, got, c.want)
		}
	}
}

// TestHeaderKeyAsCaddyRendersIt: a key that is one request header, read
// from the header directly, is what Caddy's placeholder renders: the
// field's values joined by ",", "" when absent, whatever case the template
// writes the field in.
func TestHeaderKeyAsCaddyRendersIt(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"{http.request.header.X-Key}", "{http.request.header.x-key}", "{http.request.header.X-KEY}",
		"{http.request.header.x_key}", "{http.request.header.}", "{http.request.header.X Key}", "{http.request.host}", "k-{http.request.header.X-Key}"} {
		for _, vals := range [][]string{nil, {""}, {"a"}, {"a", "b"}, {"a", "", "c,d"}} {
			h := &Handler{rt: &provisioned{keyTmpl: compileTemplate(raw)}}
			h.rt.keyHeader = headerField(h.rt.keyTmpl)
			_, r, repl := newRequest(nil)
			for _, field := range []string{"X-Key", "x_key", "X Key"} {
				for _, v := range vals {
					r.Header[textproto.CanonicalMIMEHeaderKey(field)] = append(r.Header[textproto.CanonicalMIMEHeaderKey(field)], v)
				}
			}
			want := repl.ReplaceAll(raw, "")
			if got := h.key(repl, r.Header); got != want {
				t.Errorf("%s with %q: %q, Caddy renders %q", raw, vals, got, want)
			}
			if got := h.key(repl, nil); got != want {
				t.Errorf("%s with %q, through the replacer: %q, Caddy renders %q", raw, vals, got, want)
			}
		}
	}
}

// TestPlaceholders: what access logs and later handlers read, including
// the global ceiling's usage and the empty count when no store decided.
func TestPlaceholders(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Region: "{http.request.header.X-Region}",
		Limit: "3", GlobalLimit: "5", Window: caddy.Duration(time.Minute)}
	provision(t, h, newTestClock())
	w, r, repl := newRequest(map[string]string{"X-API-Key": "k", "X-Region": "us"})
	if err := h.ServeHTTP(w, r, nextOK); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		phAllowed: "true", phCount: "1", phLimit: "3", phRemaining: "2", phRetryAfter: "0", phRegion: "us",
		phSource: "memory", phNearLimit: "false", phDryRun: "false",
		phGlobalCount: "1", phGlobalLimit: "5", phGlobalRemaining: "4",
	}
	for k, v := range want {
		if got, _ := repl.GetString(k); got != v {
			t.Errorf("{%s} = %q, want %q", k, got, v)
		}
	}
	if got := repl.ReplaceAll("{http.sliding_ratelimit.count}/{http.sliding_ratelimit.limit}", ""); got != "1/3" {
		t.Errorf("in a template: %q", got)
	}

	// Store down, fail open: no count, the fail mode as the source.
	srv := redistest.Start(t)
	srv.Kill()
	down := &Handler{Name: uniqueName(), Limit: "3", Window: caddy.Duration(time.Minute),
		Redis: &RedisConfig{Addresses: []string{srv.Addr()}}}
	provision(t, down, nil)
	w, r, repl = newRequest(nil)
	if err := down.ServeHTTP(w, r, nextOK); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{phAllowed: "true", phCount: "", phRemaining: "", phLimit: "3", phSource: sourceFailOpen} {
		if got, _ := repl.GetString(k); got != v {
			t.Errorf("store down: {%s} = %q, want %q", k, got, v)
		}
	}
}

// TestWindowPlaceholders: with several windows, each has placeholders of
// its own, and the tightest is what count, limit and remaining show.
func TestWindowPlaceholders(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Region: "{http.request.header.X-Region}",
		Limits:       []LimitConfig{{Limit: "2", Window: caddy.Duration(time.Second)}, {Limit: "10", Window: caddy.Duration(time.Minute)}},
		GlobalLimits: []LimitConfig{{Limit: "100", Period: "day"}}}
	provision(t, h, newTestClock())
	w, r, repl := newRequest(map[string]string{"X-Region": "eu"})
	if err := h.ServeHTTP(w, r, nextOK); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"http.sliding_ratelimit.name":                 h.Name,
		"http.sliding_ratelimit.outcome":              "allowed",
		"http.sliding_ratelimit.window.1s.remaining":  "1",
		"http.sliding_ratelimit.window.1s.limit":      "2",
		"http.sliding_ratelimit.window.1m.count":      "1",
		"http.sliding_ratelimit.window.1m.remaining":  "9",
		"http.sliding_ratelimit.global.day.remaining": "99",
		"http.sliding_ratelimit.remaining":            "1",
		"http.sliding_ratelimit.limit":                "2",
		"http.sliding_ratelimit.global_remaining":     "99",
		"http.sliding_ratelimit.window.1h.remaining":  "",
	}
	for k, v := range want {
		if got, _ := repl.GetString(k); got != v {
			t.Errorf("{%s} = %q, want %q", k, got, v)
		}
	}
	if got := w.Header().Get("RateLimit-Policy"); !strings.Contains(got, `"`+h.Name+`-1s";q=2;w=1, "`+h.Name+`-1m";q=10;w=60, "`+h.Name+`-global";q=100;w=86400`) {
		t.Errorf("RateLimit-Policy %q", got)
	}
}
