package slidingratelimit

// What a client sees: headers, bodies, dry runs, handle_errors.

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

func TestDryRun(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Limit: "5", DryRun: true, Window: caddy.Duration(time.Minute)}
	logs := provision(t, h, newTestClock())
	for i := 0; i < 20; i++ {
		w := serve(t, h, nil)
		if w.Code != http.StatusOK {
			t.Fatalf("dry run request %d: status %d", i+1, w.Code)
		}
		if w.Header().Get("Retry-After") != "" || w.Header().Get("RateLimit") != "" {
			t.Fatalf("dry run sent rate limit headers: %v", w.Header())
		}
	}
	if got := testutil.ToFloat64(metrics.Requests.WithLabelValues(h.Name, resultDryRunDenied)); got != 15 {
		t.Errorf("dry-run denials %v, want 15", got)
	}
	if got := testutil.ToFloat64(metrics.Requests.WithLabelValues(h.Name, resultAllowed)); got != 5 {
		t.Errorf("allowed %v, want 5", got)
	}
	if n := h.usage(t, "", ""); n != 5 {
		t.Errorf("store count %d, want 5: would-be denials must not be recorded", n)
	}
	if len(logs.FilterMessage("dry run: request would have been rate limited").All()) != 1 {
		t.Error("want one (rate-limited) dry-run log line")
	}
}

// TestDryRunNeverBlocksWhenRedisIsDown: a dry run with fail closed lets
// the request through while Redis is down.
func TestDryRunNeverBlocksWhenRedisIsDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Kill()
	h := &Handler{Name: uniqueName(), Limit: "3", Window: caddy.Duration(time.Minute), DryRun: true, Fail: "closed",
		Redis: &RedisConfig{Addresses: []string{srv.Addr()}}}
	provision(t, h, nil)
	w, r, repl := newRequest(nil)
	if err := h.ServeHTTP(w, r, nextOK); err != nil || w.Code != http.StatusOK {
		t.Fatalf("dry run, Redis down, fail closed: %d %v", w.Code, err)
	}
	if got, _ := repl.GetString(phDryRun); got != "true" {
		t.Errorf("{%s} = %q, want true", phDryRun, got)
	}
}

// TestOnLimitError: with on_limit error, handle_errors renders the denial:
// its own body, status 429, and Retry-After still set.
func TestOnLimitError(t *testing.T) {
	tester := newTester(t)
	tester.InitServer(opsGlobal+`
http://localhost:9080 {
	sliding_ratelimit {
		name     `+uniqueName()+`
		limit    1
		window   1m
		on_limit error
	}
	respond "ok"
	handle_errors 429 {
		respond "slow down, retry in {http.sliding_ratelimit.retry_after}s" 429
	}
}
`, "caddyfile")
	get(t, tester, "http://localhost:9080/", nil)
	resp := get(t, tester, "http://localhost:9080/", nil)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	if string(body) != "slow down, retry in 60s" {
		t.Errorf("body %q, want the handle_errors page", body)
	}
	if resp.Header.Get("Retry-After") != "60" {
		t.Errorf("Retry-After %q, want 60", resp.Header.Get("Retry-After"))
	}
}

// TestEachResponseOwnsItsHeaderValues: a later handler that rewrites a
// header value in place (Caddy's `header` does) changes its own response,
// never the next one's.
func TestEachResponseOwnsItsHeaderValues(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Limit: "1", Window: caddy.Duration(time.Minute)}
	provision(t, h, newTestClock())
	serve(t, h, nil)
	first := serve(t, h, nil)
	for k, vs := range first.Header() {
		for i := range vs {
			vs[i] = "rewritten " + k
		}
	}
	second := serve(t, h, nil)
	if second.Code != http.StatusTooManyRequests {
		t.Fatalf("second denial: %d", second.Code)
	}
	for k, vs := range second.Header() {
		for _, v := range vs {
			if strings.HasPrefix(v, "rewritten") {
				t.Errorf("%s of a later 429 is %q: it shares its value with an earlier response", k, v)
			}
		}
	}
}

// TestCachedDenialSaysWhatItKnows: a denial served from the deny cache
// does not repeat the global ceiling's usage as it was when it was cached.
func TestCachedDenialSaysWhatItKnows(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Region: "{http.request.header.X-Region}",
		Limit: "2", GlobalLimit: "10", Window: caddy.Duration(time.Minute),
		Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(2 * time.Second)}}
	provision(t, h, newTestClock())
	us := map[string]string{"X-API-Key": "K", "X-Region": "us"}
	for i := 0; i < 2; i++ {
		serve(t, h, us)
	}
	if w := serve(t, h, us); w.Code != http.StatusTooManyRequests {
		t.Fatalf("us over its limit: %d", w.Code)
	}
	for _, reg := range []string{"gb", "de", "fr"} {
		for i := 0; i < 2; i++ {
			serve(t, h, map[string]string{"X-API-Key": "K", "X-Region": reg})
		}
	}
	// The global ceiling now has 2 left; us is still denied, from the cache.
	w := serve(t, h, us)
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("us: %d", w.Code)
	}
	rl := w.Header().Get("RateLimit")
	if strings.Contains(rl, `-global";r=8`) {
		t.Errorf("RateLimit %q repeats the global ceiling as it was when the denial was cached (r=8; it is 2 now)", rl)
	}
	if i := strings.Index(rl, `-global";r=`); i >= 0 && !strings.Contains(rl, `-global";r=2;`) {
		t.Errorf("RateLimit %q: the global ceiling has 2 left", rl)
	}
}

// TestTokenBucketCapacity: the bucket's capacity is its burst everywhere:
// the 413 check, the load check and the headers.
func TestTokenBucketCapacity(t *testing.T) {
	t.Parallel()
	// Limit 10, burst 20: a cost of 15 fits a full bucket.
	wide := &Handler{Name: uniqueName(), Algorithm: "token_bucket", Limit: "10", Burst: 20, Cost: "15", Window: caddy.Duration(10 * time.Second)}
	provision(t, wide, newTestClock())
	w := serve(t, wide, nil)
	if w.Code != http.StatusOK {
		t.Fatalf("cost 15 in a bucket of 20: %d %s", w.Code, w.Body)
	}
	if got := w.Header().Get("X-RateLimit-Limit"); got != "20" {
		t.Errorf("X-RateLimit-Limit %q, want 20 (the capacity)", got)
	}
	if got := w.Header().Get("RateLimit-Policy"); got != `"`+wide.Name+`";q=20;w=20` {
		t.Errorf("RateLimit-Policy %q, want q=20 (the capacity) and w=20 (the time to fill it)", got)
	}
	if got, want := w.Header().Get("RateLimit"), `"`+wide.Name+`";r=5;t=15`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	if got := w.Header().Get("X-RateLimit-Remaining"); got != "5" {
		t.Errorf("X-RateLimit-Remaining %q, want 5", got)
	}

	// Limit 10, burst 2: a cost of 3 can never fit: 413, not a 429 with a
	// retry time that never comes.
	narrow := &Handler{Name: uniqueName(), Algorithm: "token_bucket", Limit: "10", Burst: 2, Cost: "{http.request.header.X-Cost}", Window: caddy.Duration(10 * time.Second)}
	provision(t, narrow, newTestClock())
	if w := serve(t, narrow, map[string]string{"X-Cost": "3"}); w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("cost 3 in a bucket of 2: %d, want 413", w.Code)
	}
	bad := &Handler{Algorithm: "token_bucket", Limit: "10", Burst: 2, Cost: "3", Window: caddy.Duration(10 * time.Second)}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "burst 2") {
		t.Errorf("static cost 3 over burst 2: Validate() = %v, want it refused naming the burst", err)
	}

	// The burst is the bucket's: a global ceiling's token bucket holds its
	// limit. Burst 50, global limit 20: a cost of 30 never fits the
	// ceiling, so 413 (not a 429 whose retry time never comes), and the
	// ceiling's headers say 20.
	global := &Handler{Name: uniqueName(), Algorithm: "token_bucket", Key: "{http.request.header.X-API-Key}", Region: "{http.request.header.X-Region}",
		Limit: "40", Burst: 50, GlobalLimit: "20", Cost: "{http.request.header.X-Cost}", Window: caddy.Duration(10 * time.Second)}
	provision(t, global, newTestClock())
	hdr := map[string]string{"X-API-Key": "K", "X-Region": "eu", "X-Cost": "30"}
	if w := serve(t, global, hdr); w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("cost 30 over a global ceiling of 20: %d, want 413", w.Code)
	}
	hdr["X-Cost"] = "1"
	w = serve(t, global, hdr)
	if got := w.Header().Get("RateLimit-Policy"); !strings.Contains(got, `-global";q=20;`) {
		t.Errorf("RateLimit-Policy %q: the global ceiling holds 20", got)
	}
	badGlobal := &Handler{Algorithm: "token_bucket", Region: "{http.request.header.X-Region}", Limit: "40", Burst: 50, GlobalLimit: "20", Cost: "30", Window: caddy.Duration(10 * time.Second)}
	if err := badGlobal.Validate(); err == nil || !strings.Contains(err.Error(), "global_limit 20") {
		t.Errorf("static cost 30 over global_limit 20: Validate() = %v, want it refused naming global_limit", err)
	}
}

// TestGRPCRefusals: a gRPC request is refused the gRPC way: HTTP 200,
// trailers only, grpc-status 8 (RESOURCE_EXHAUSTED) with a retry hint for a
// rate limit, 14 (UNAVAILABLE) when the store is down and fail is closed.
func TestGRPCRefusals(t *testing.T) {
	t.Parallel()
	grpcReq := map[string]string{"Content-Type": "application/grpc+proto"}
	h := &Handler{Name: uniqueName(), Limit: "1", Window: caddy.Duration(time.Minute)}
	provision(t, h, newTestClock())
	serve(t, h, grpcReq)
	w := serve(t, h, grpcReq)
	if w.Code != http.StatusOK || w.Header().Get("Grpc-Status") != "8" || w.Body.Len() != 0 {
		t.Errorf("rate limited gRPC call: %d grpc-status %q body %q", w.Code, w.Header().Get("Grpc-Status"), w.Body)
	}
	if got := w.Header().Get("Grpc-Retry-Pushback-Ms"); got != "60000" {
		t.Errorf("grpc-retry-pushback-ms %q, want 60000", got)
	}
	if w.Header().Get("Retry-After") == "" || w.Header().Get("RateLimit") == "" {
		t.Errorf("the rate limit headers are missing: %v", w.Header())
	}

	srv := redistest.Start(t)
	srv.Kill()
	down := &Handler{Name: uniqueName(), Limit: "1", Window: caddy.Duration(time.Minute), Fail: "closed",
		Redis: &RedisConfig{Addresses: []string{srv.Addr()}}}
	provision(t, down, nil)
	w = serve(t, down, grpcReq)
	if w.Code != http.StatusOK || w.Header().Get("Grpc-Status") != "14" {
		t.Errorf("fail closed gRPC call: %d grpc-status %q", w.Code, w.Header().Get("Grpc-Status"))
	}
}

// TestJitterSpreadsRetries: with jitter, denials told to come back at the
// same second are told different seconds: Retry-After is the exact retry
// time plus a random delay of at most the jitter (a duration, or a share of
// the retry time), and the denying window's t in RateLimit, the body's
// retry_after and {http.sliding_ratelimit.retry_after} say the same number
// on every response. A window that did not deny keeps its own t.
func TestJitterSpreadsRetries(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		jitter string
		lo, hi int64 // bounds of Retry-After: the 10 s retry, plus at most 5 s
	}{
		{"5s", 10, 15},
		{"50%", 10, 15},
	} {
		t.Run(c.jitter, func(t *testing.T) {
			t.Parallel()
			clock := newTestClock() // fixed: the exact retry time is 10 s for every denial
			h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Jitter: c.jitter,
				Limits: []LimitConfig{{Limit: "1", Window: caddy.Duration(10 * time.Second)}, {Limit: "100", Window: caddy.Duration(time.Hour)}}}
			provision(t, h, clock)
			hdr := map[string]string{"X-API-Key": "K"}
			if w := serve(t, h, hdr); w.Code != http.StatusOK {
				t.Fatalf("first request: %d", w.Code)
			}
			seen := map[int64]int{}
			for i := 0; i < 200; i++ {
				w, r, repl := newRequest(hdr)
				if err := h.ServeHTTP(w, r, nextOK); err != nil || w.Code != http.StatusTooManyRequests {
					t.Fatalf("denial %d: %d %v", i, w.Code, err)
				}
				ra, err := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
				if err != nil || ra < c.lo || ra > c.hi {
					t.Fatalf("Retry-After %q, want %d to %d", w.Header().Get("Retry-After"), c.lo, c.hi)
				}
				seen[ra]++
				rl := w.Header().Get("RateLimit")
				want := `"` + h.Name + `-10s";r=0;t=` + strconv.FormatInt(ra, 10) + `, "` + h.Name + `-1h";r=99;t=3600`
				if rl != want {
					t.Fatalf("RateLimit %q, want %q: the denying window's t is Retry-After, the other window's its own", rl, want)
				}
				if !strings.Contains(w.Body.String(), `"retry_after":`+strconv.FormatInt(ra, 10)+`}`) {
					t.Fatalf("body %s, want retry_after %d", w.Body, ra)
				}
				if ph, _ := repl.GetString(phRetryAfter); ph != strconv.FormatInt(ra, 10) {
					t.Fatalf("{%s} = %q, want %d", phRetryAfter, ph, ra)
				}
			}
			// Uniform over 5 s: 200 denials all told one second would be a
			// chance below 1e-100.
			if len(seen) < 2 {
				t.Errorf("every denial got Retry-After %v: no jitter", seen)
			}
		})
	}
}

// TestSharedErrorPageNamesTheLimiter: two limiters hand their denials to
// one handle_errors page, which tells the client which limiter denied
// ({http.sliding_ratelimit.name}).
func TestSharedErrorPageNamesTheLimiter(t *testing.T) {
	api, login := uniqueName(), uniqueName()
	tester := newTester(t)
	tester.InitServer(opsGlobal+`
http://localhost:9080 {
	route /api {
		sliding_ratelimit {
			name     `+api+`
			limit    2
			window   1m
			on_limit error
		}
		respond "api"
	}
	route /login {
		sliding_ratelimit {
			name     `+login+`
			limit    1
			window   1m
			on_limit error
		}
		respond "login"
	}
	handle_errors 429 {
		respond "denied by {http.sliding_ratelimit.name}, retry in {http.sliding_ratelimit.retry_after}s" 429
	}
}
`, "caddyfile")
	for _, c := range []struct {
		path, limiter string
		admitted      int
	}{{"/api", api, 2}, {"/login", login, 1}} {
		for i := 0; i < c.admitted; i++ {
			if resp := get(t, tester, "http://localhost:9080"+c.path, nil); resp.StatusCode != http.StatusOK {
				t.Fatalf("%s request %d: %d", c.path, i+1, resp.StatusCode)
			}
		}
		resp := get(t, tester, "http://localhost:9080"+c.path, nil)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusTooManyRequests || !strings.HasPrefix(string(body), "denied by "+c.limiter+", retry in ") {
			t.Errorf("%s over its limit: %d %q, want 429 naming %s", c.path, resp.StatusCode, body, c.limiter)
		}
	}
}

// TestTwoLimitersOneRouteShowTheLast: in a real Caddy (the request's vars
// hold the placeholder state), two limiters on one route share the state:
// the placeholders show the decision of the last one to run, and the
// X-RateLimit headers the tightest of the two.
func TestTwoLimitersOneRouteShowTheLast(t *testing.T) {
	first, second := uniqueName(), uniqueName()
	tester := newTester(t)
	tester.InitServer(opsGlobal+`
http://localhost:9080 {
	route /two {
		sliding_ratelimit {
			name     `+first+`
			key      {http.request.header.X-Key}
			limit    3
			window   1m
		}
		sliding_ratelimit {
			name     `+second+`
			key      {http.request.header.X-Key}
			limit    5
			window   1m
		}
		respond "{http.sliding_ratelimit.name} {http.sliding_ratelimit.remaining}/{http.sliding_ratelimit.limit}"
	}
}
`, "caddyfile")
	for i := 1; i <= 3; i++ {
		req, _ := http.NewRequest(http.MethodGet, "http://localhost:9080/two", nil)
		req.Header.Set("X-Key", first)
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("%s %d/5", second, 5-i); resp.StatusCode != http.StatusOK || string(body) != want {
			t.Errorf("request %d: %d %q, want %q", i, resp.StatusCode, body, want)
		}
		if got, want := resp.Header.Get("X-Ratelimit-Remaining"), strconv.Itoa(3-i); got != want {
			t.Errorf("request %d: X-RateLimit-Remaining %q, want %q (the tighter limiter's)", i, got, want)
		}
	}
}

// TestFailOpenSendsNoRateLimitHeaders: as the README promises, a request
// passed by fail open (Redis killed: the store fails, then the circuit is
// open) gets no rate limit header, no Retry-After, whatever headers mode,
// with every feature that adds a header (several windows, a calendar
// period, max_concurrent); the placeholders say fail_open, and the usage
// ones are empty (unknown).
func TestFailOpenSendsNoRateLimitHeaders(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	addr := srv.Addr()
	srv.Kill()
	for _, mode := range []string{"both", "ietf", "legacy"} {
		h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Headers: mode,
			Limits:        []LimitConfig{{Limit: "5", Window: caddy.Duration(time.Minute)}, {Limit: "100", Period: "day"}},
			MaxConcurrent: "3", Fail: "open",
			Redis: &RedisConfig{Addresses: []string{addr}, Timeout: caddy.Duration(50 * time.Millisecond)}}
		provision(t, h, nil)
		for i := 0; i < 8; i++ { // past the breaker's threshold: its circuit opens
			w, r, repl := newRequest(map[string]string{"X-API-Key": "k"})
			if err := h.ServeHTTP(w, r, nextOK); err != nil {
				t.Fatal(err)
			}
			if w.Code != http.StatusOK {
				t.Fatalf("headers %s, request %d with Redis killed: %d, want 200 (fail open)", mode, i+1, w.Code)
			}
			for name := range w.Header() {
				if l := strings.ToLower(name); strings.HasPrefix(l, "ratelimit") || strings.HasPrefix(l, "x-ratelimit") || l == "retry-after" {
					t.Errorf("headers %s, request %d passed by fail open sends %s: %q", mode, i+1, name, w.Header().Get(name))
				}
			}
			for ph, want := range map[string]string{"source": "fail_open", "allowed": "true", "outcome": "unavailable",
				"remaining": "", "count": ""} {
				if got, _ := repl.GetString("http.sliding_ratelimit." + ph); got != want {
					t.Errorf("headers %s, request %d: {http.sliding_ratelimit.%s} = %q, want %q", mode, i+1, ph, got, want)
				}
			}
		}
		if st := redisBreaker(t, h).State().String(); st != "open" {
			t.Errorf("headers %s: circuit %s after 8 failed requests, want open", mode, st)
		}
	}
}
