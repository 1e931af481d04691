package slidingratelimit

// Tests of the seams: features tried together, as an operator and a
// hostile client would, where a wrong answer hides.

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// adminDelete resets key in region through the admin API, as an operator
// would.
func adminDelete(t *testing.T, name, key, region string) {
	t.Helper()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodDelete, "/sliding_ratelimit/"+name+"?key="+key+"&region="+region, nil)
	if err := (&AdminAPI{}).serve(w, r); err != nil || w.Code != http.StatusOK {
		t.Fatalf("DELETE: %v (status %d, %s)", err, w.Code, w.Body)
	}
}

// adminGet asks the admin API what key's next request would get.
func adminGet(t *testing.T, name, query string) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/sliding_ratelimit/"+name+"?"+query, nil)
	if err := (&AdminAPI{}).serve(w, r); err != nil {
		var ae caddy.APIError
		if errorsAs(err, &ae) {
			return ae.HTTPStatus, ae.Err.Error()
		}
		t.Fatal(err)
	}
	return w.Code, w.Body.String()
}

// TestResetClearsDenialsOfEveryRegion: the global ceiling denies K in gb,
// and the denial is cached. An operator resets K in us, which clears K's
// global ceiling: gb must get through at once, not after the cached
// retry time.
func TestResetClearsDenialsOfEveryRegion(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Region: "{http.request.header.X-Region}",
		Limit: "5", GlobalLimit: "7", Window: caddy.Duration(time.Minute),
		Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(2 * time.Second)}}
	provision(t, h, newTestClock())
	us := map[string]string{"X-API-Key": "K", "X-Region": "us"}
	gb := map[string]string{"X-API-Key": "K", "X-Region": "gb"}
	for i := 0; i < 5; i++ {
		serve(t, h, us)
	}
	for i := 0; i < 2; i++ {
		serve(t, h, gb)
	}
	for i := 0; i < 3; i++ { // the global ceiling: denied, then from the cache
		if w := serve(t, h, gb); w.Code != http.StatusTooManyRequests {
			t.Fatalf("gb over the global ceiling: %d", w.Code)
		}
	}
	adminDelete(t, h.Name, "K", "us")
	if w := serve(t, h, gb); w.Code != http.StatusOK {
		t.Fatalf("gb after K's reset: %d %s (a cached denial outlived the reset)", w.Code, w.Body)
	}
}

// TestOneRequestCannotStallRedis: no request holds Redis long. A sliding
// log request of cost 1,000,000 is one member, not a million; the worst a
// check does is drop a full log of 10,000 requests at once. Every command
// Redis ran is timed by its SLOWLOG.
func TestOneRequestCannotStallRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000")
	clock := newTestClock()
	redisCfg := func() *RedisConfig {
		return &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(10 * time.Second)}
	}
	big := &Handler{Name: uniqueName(), Limit: "3000000", Cost: "{http.request.header.X-Cost}", Window: caddy.Duration(time.Minute), Redis: redisCfg()}
	provision(t, big, clock)
	million := map[string]string{"X-Cost": "1000000"}
	for i := 0; i < 3; i++ {
		if w := serve(t, big, million); w.Code != http.StatusOK {
			t.Fatalf("cost 1,000,000 #%d: %d", i+1, w.Code)
		}
	}
	if w := serve(t, big, million); w.Code != http.StatusTooManyRequests {
		t.Fatalf("4th million: %d, want 429", w.Code)
	}
	client := srv.Client(t)
	ctx := t.Context()
	members := int64(0)
	for _, k := range client.Keys(ctx, "*").Val() {
		if client.Type(ctx, k).Val() == "zset" {
			members += client.ZCard(ctx, k).Val()
		}
	}
	if members > 10 {
		t.Errorf("3 requests of cost 1,000,000 left %d members in Redis", members)
	}

	// The largest log: 10,000 requests at one instant, all leaving at once.
	full := &Handler{Name: uniqueName(), Limit: "10000", Window: caddy.Duration(time.Minute), Redis: redisCfg()}
	provision(t, full, clock)
	for i := 0; i < 10000; i++ {
		if w := serve(t, full, nil); w.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, w.Code)
		}
	}
	if w := serve(t, full, nil); w.Code != http.StatusTooManyRequests {
		t.Fatalf("10,001st: %d", w.Code)
	}
	clock.Advance(time.Minute + time.Second)
	if w := serve(t, full, nil); w.Code != http.StatusOK {
		t.Fatalf("after the window: %d", w.Code)
	}

	var worst time.Duration
	var worstCmd string
	for _, e := range client.SlowLogGet(ctx, -1).Val() {
		if e.Duration > worst {
			worst, worstCmd = e.Duration, strings.Join(e.Args[:min(len(e.Args), 4)], " ")
		}
	}
	t.Logf("longest command Redis ran: %s (%s)", worst, worstCmd)
	// About 1.4 ms here; the bound leaves room for a busy machine, and
	// catches a script that writes a member per unit (seconds).
	if worst > 25*time.Millisecond {
		t.Errorf("one command held Redis for %s (%s)", worst, worstCmd)
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

// TestReloadKeepsBudgetsSane: a reload changes a limiter's window or limit
// while clients have used it. Whatever changed, the next answer is sane:
// the budget is neither forgotten nor stuck, and no Retry-After (nor, on
// Redis, a key's TTL) goes beyond what the new policy allows.
func TestReloadKeepsBudgetsSane(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	for _, store := range []string{"memory", "redis"} {
		for _, alg := range []string{"sliding_log", "sliding_counter", "fixed_window", "token_bucket"} {
			for _, change := range []struct {
				name           string
				from, to       time.Duration
				fromLim, toLim string
			}{
				{"window shortened", time.Hour, time.Minute, "10", "10"},
				{"window lengthened", time.Minute, time.Hour, "10", "10"},
				{"limit lowered", time.Minute, time.Minute, "10", "4"},
			} {
				t.Run(store+"/"+alg+"/"+change.name, func(t *testing.T) {
					t.Parallel()
					// Far from a minute's or an hour's end: no fixed window
					// turns over during the test.
					clock := &testClock{t: time.Date(2026, 11, 29, 12, 20, 0, 0, time.UTC)}
					name := uniqueName()
					mk := func(limit string, window time.Duration) *Handler {
						h := &Handler{Name: name, Algorithm: alg, Limit: Amount(limit), Window: caddy.Duration(window)}
						if store == "redis" {
							h.Redis = &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(2 * time.Second), KeyPrefix: "reload:" + name + ":"}
						}
						return h
					}
					old := mk(change.fromLim, change.from)
					provision(t, old, clock)
					for i := 0; i < 10; i++ {
						if w := serve(t, old, nil); w.Code != http.StatusOK {
							t.Fatalf("before the reload, request %d: %d", i+1, w.Code)
						}
					}
					clock.Advance(10 * time.Second)
					next := mk(change.toLim, change.to)
					provision(t, next, clock)
					// 10 requests in the last 10 s: the new policy has at
					// most a little room (a token bucket refilled a bit),
					// never a fresh budget.
					toLim, _ := strconv.Atoi(change.toLim)
					admitted := 0
					var w *httptest.ResponseRecorder
					for w = serve(t, next, nil); w.Code == http.StatusOK && admitted <= toLim; w = serve(t, next, nil) {
						admitted++
					}
					if admitted >= toLim {
						t.Fatalf("after the reload %d admitted at once: the budget started again", admitted)
					}
					if w.Code != http.StatusTooManyRequests {
						t.Fatalf("after the reload: %d", w.Code)
					}
					retry, _ := strconv.Atoi(w.Header().Get("Retry-After"))
					bound := int(change.to / time.Second)
					if alg == "sliding_counter" {
						bound *= 2 // the previous window weighs into the next one
					}
					if retry < 1 || retry > bound {
						t.Errorf("Retry-After %d after the reload, want 1..%d", retry, bound)
					}
					if store != "redis" {
						return
					}
					// Once the new policy admits again, every key it
					// writes has a TTL it allows.
					clock.Advance(time.Duration(retry) * time.Second)
					if w := serve(t, next, nil); w.Code != http.StatusOK {
						t.Fatalf("after Retry-After: %d", w.Code)
					}
					for _, k := range client.Keys(t.Context(), "reload:"+name+":*").Val() {
						ttl := client.PTTL(t.Context(), k).Val()
						if ttl > 2*change.to+2*time.Second {
							t.Errorf("key %s has a TTL of %s under a window of %s", k, ttl, change.to)
						}
					}
				})
			}
		}
	}
}

// TestAdminGetTellsTheTruth: a limiter whose limit comes from a placeholder
// cannot guess a client's limit: the admin GET says which value it needs,
// and with it answers what the client's next request would get.
func TestAdminGetTellsTheTruth(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: "{http.request.header.X-Tier}", Window: caddy.Duration(time.Minute)}
	provision(t, h, newTestClock())
	for i := 0; i < 3; i++ {
		serve(t, h, map[string]string{"X-API-Key": "K", "X-Tier": "5"})
	}
	code, body := adminGet(t, h.Name, "key=K")
	if code != http.StatusBadRequest || !strings.Contains(body, "limit ({http.request.header.X-Tier})") {
		t.Fatalf("GET without the client's limit: %d %s, want 400 naming the placeholder", code, body)
	}
	code, body = adminGet(t, h.Name, "key=K&limit=5")
	var u struct {
		Allowed bool `json:"allowed"`
		Windows []struct {
			Count, Limit, Remaining int64
		} `json:"windows"`
	}
	if err := json.Unmarshal([]byte(body), &u); err != nil || code != http.StatusOK || len(u.Windows) != 1 {
		t.Fatalf("GET with limit=5: %d %s (%v)", code, body, err)
	}
	if w := u.Windows[0]; !u.Allowed || w.Count != 3 || w.Limit != 5 || w.Remaining != 2 {
		t.Errorf("GET with limit=5: %+v, want allowed with 3 of 5 used, 2 left", u)
	}
}

// TestValuesAtTheEdges: limits, costs and windows the scripts cannot
// compute exactly (Lua's doubles hold 2^53) are refused at load, or, from a
// placeholder, answered 500.
func TestValuesAtTheEdges(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		h    Handler
	}{
		{"limit 2^62", Handler{Limit: "4611686018427387904", Window: caddy.Duration(time.Minute)}},
		{"global limit 2^62", Handler{Limit: "5", Region: "{r}", GlobalLimit: "4611686018427387904", Window: caddy.Duration(time.Minute)}},
		{"window of 50 years", Handler{Limit: "5", Window: caddy.Duration(50 * 365 * 24 * time.Hour)}},
		{"burst 2^60", Handler{Algorithm: "token_bucket", Limit: "5", Burst: 1 << 60, Window: caddy.Duration(time.Minute)}},
		{"cost 2^60", Handler{Limit: "5", Cost: "1152921504606846976", Window: caddy.Duration(time.Minute)}},
	} {
		if err := c.h.Validate(); err == nil {
			t.Errorf("%s: accepted at load", c.name)
		}
	}
	h := &Handler{Name: uniqueName(), Limit: "{http.request.header.X-Limit}", Window: caddy.Duration(time.Minute)}
	provision(t, h, newTestClock())
	_, err := serveErr(t, h, map[string]string{"X-Limit": "4611686018427387904"})
	if code := statusOf(err); code != http.StatusInternalServerError {
		t.Errorf("limit 2^62 from a placeholder: %d (%v), want 500", code, err)
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

// TestGoRedisLogsLeftAlone: importing the plugin changes nothing for other
// go-redis users in the same process: go-redis still logs a failed dial
// through its own logger (to stderr). The test runs itself as a child
// process that dials a closed port.
func TestGoRedisLogsLeftAlone(t *testing.T) {
	if sock := os.Getenv("SLIDING_RATELIMIT_CHILD_DIAL"); sock != "" {
		c := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, MaxRetries: -1, DialTimeout: time.Second})
		_ = c.Ping(t.Context()).Err()
		return
	}
	t.Parallel()
	// A socket nobody listens on: the dial fails, whatever else runs.
	sock := filepath.Join(t.TempDir(), "nobody.sock")
	cmd := exec.Command(os.Args[0], "-test.run", "^TestGoRedisLogsLeftAlone$")
	cmd.Env = append(os.Environ(), "SLIDING_RATELIMIT_CHILD_DIAL="+sock)
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "failed to dial") {
		t.Errorf("go-redis's own log line is gone: the plugin replaced go-redis's process-wide logger\n%s", out)
	}
}

// TestTwoBlocksOneName: two blocks left at the default name (or one name
// with different settings) would share keys and corrupt each other's
// counts: the config is refused, naming the problem.
func TestTwoBlocksOneName(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, a, b, want string }{
		{"default name", "limit 5\n\t\twindow 1m", "algorithm sliding_counter\n\t\tlimit 50\n\t\twindow 1h", `left at the default name "default"`},
		{"same name, other settings", "name api\n\t\tlimit 5\n\t\twindow 1m", "name api\n\t\tlimit 50\n\t\twindow 1m", `named "api" with different settings`},
	} {
		src := `:8080 {
	route /a {
		sliding_ratelimit {
		` + c.a + `
		}
		respond ok
	}
	route /b {
		sliding_ratelimit {
		` + c.b + `
		}
		respond ok
	}
}`
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
		if err != nil {
			t.Fatalf("%s: adapt: %v", c.name, err)
		}
		var cfg caddy.Config
		if err := json.Unmarshal(out, &cfg); err != nil {
			t.Fatal(err)
		}
		err = caddy.Validate(&cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: loading gives %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// TestLateChecksAreNeverCharged: the network between Caddy and Redis
// stalls; requests fail open after their timeout while their scripts wait
// in a buffer. When the network delivers them, they are past their
// deadline and Redis records nothing: a request the fail mode answered is
// never also charged.
func TestLateChecksAreNeverCharged(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	proxy := newStallProxy(t, srv.Addr())
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: "100", Window: caddy.Duration(time.Minute),
		Redis: &RedisConfig{Addresses: []string{proxy.Addr()}, Timeout: caddy.Duration(100 * time.Millisecond)}}
	provision(t, h, nil)
	warm := map[string]string{"X-API-Key": "warm"}
	if w := serve(t, h, warm); w.Code != http.StatusOK { // connections made, Redis's clock learnt
		t.Fatalf("warm-up: %d", w.Code)
	}
	proxy.Stall(true)
	late := map[string]string{"X-API-Key": "late"}
	for i := 0; i < 3; i++ {
		w, r, repl := newRequest(late)
		if err := h.ServeHTTP(w, r, nextOK); err != nil || w.Code != http.StatusOK {
			t.Fatalf("request %d while stalled: %d %v", i+1, w.Code, err)
		}
		if src, _ := repl.GetString(phSource); src != sourceFailOpen {
			t.Fatalf("request %d while stalled: source %q, want fail_open", i+1, src)
		}
	}
	time.Sleep(200 * time.Millisecond) // a real stall: real time must pass
	proxy.Stall(false)                 // the buffered scripts reach Redis now
	client := srv.Client(t)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		for _, k := range client.Keys(t.Context(), "*late*").Val() {
			t.Fatalf("key %s exists: a check Redis ran after its caller failed open was charged", k)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestCircuitGaugeAtScrape: two limiters share a Redis; both see it fail,
// only one serves requests after it recovers. A scrape shows both circuits
// closed, and every store error kind exists (at zero) from the start.
func TestCircuitGaugeAtScrape(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	mk := func() *Handler {
		h := &Handler{Name: uniqueName(), Limit: "100", Window: caddy.Duration(time.Minute),
			Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(50 * time.Millisecond), PoolSize: 7}}
		provision(t, h, nil)
		return h
	}
	busy, idle := mk(), mk()
	if errs := gather(t, "caddy_sliding_ratelimit_store_errors_total", idle.Name); len(errs) < 6 {
		t.Errorf("store_errors_total of a new limiter: %v, want every kind at 0", errs)
	}
	srv.Kill()
	for i := 0; i < 10; i++ {
		serve(t, busy, nil)
		serve(t, idle, nil)
	}
	if g := gather(t, "caddy_sliding_ratelimit_circuit_state", idle.Name); len(g) != 1 || g[0] != 1 {
		t.Fatalf("circuit_state during the outage: %v, want open (1)", g)
	}
	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w, r, repl := newRequest(nil)
		_ = busy.ServeHTTP(w, r, nextOK)
		if src, _ := repl.GetString(phSource); src == "redis" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Redis did not come back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if g := gather(t, "caddy_sliding_ratelimit_circuit_state", idle.Name); len(g) != 1 || g[0] != 0 {
		t.Errorf("circuit_state of the idle limiter after Redis recovered: %v, want closed (0)", g)
	}
}

// gather scrapes the plugin's metrics as Prometheus would and returns the
// values of metric for one limiter.
func gather(t *testing.T, metric, name string) []float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "limiter" && l.GetValue() == name {
					switch {
					case m.GetGauge() != nil:
						out = append(out, m.GetGauge().GetValue())
					case m.GetCounter() != nil:
						out = append(out, m.GetCounter().GetValue())
					}
				}
			}
		}
	}
	return out
}

// statusOf is the HTTP status of a handler error (0 for none).
func statusOf(err error) int {
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		return he.StatusCode
	}
	return 0
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }
