package slidingratelimit

// Tests of the seams: features tried together, as an operator and a
// hostile client would, where a wrong answer hides.

import (
	"encoding/json"
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
	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

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
	self, err := os.Executable() // not os.Args[0]: Caddy's tests set it to "caddy"
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run", "^TestGoRedisLogsLeftAlone$")
	cmd.Env = append(os.Environ(), "SLIDING_RATELIMIT_CHILD_DIAL="+sock)
	out, err := cmd.CombinedOutput()
	if !strings.Contains(string(out), "failed to dial") {
		t.Errorf("go-redis's own log line is gone: the plugin replaced go-redis's process-wide logger (child: %v)\n%s", err, out)
	}
}

// TestTwoBlocksOneName: two blocks left at the default name (or one name
// with different settings) would share keys and corrupt each other's
// counts: the Caddyfile is refused at the second block's line, naming the
// problem. The same limiter given on purpose in two places, and one block
// in a site of several addresses (one handler in two servers), load.
func TestTwoBlocksOneName(t *testing.T) {
	t.Parallel()
	site := func(a, b string) string {
		return `:8080 {
	route /a {
		sliding_ratelimit {
			` + a + `
		}
		respond ok
	}
	route /b {
		sliding_ratelimit {
			` + b + `
		}
		respond ok
	}
}`
	}
	for _, c := range []struct{ name, src, want, line string }{
		{"default name", site("limit 5\n\t\t\twindow 1m", "algorithm sliding_counter\n\t\t\tlimit 50\n\t\t\twindow 1h"),
			`two blocks left at the default name "default", at Caddyfile:3 and Caddyfile:10`, "Caddyfile:10"},
		{"default name, same settings", site("limit 5\n\t\t\twindow 1m", "limit 5\n\t\t\twindow 1m"),
			`two blocks left at the default name "default"`, "Caddyfile:10"},
		{"same name, other settings", site("name api\n\t\t\tlimit 5\n\t\t\twindow 1m", "name api\n\t\t\tlimit 50\n\t\t\twindow 1m"),
			`two blocks named "api" with different settings, at Caddyfile:4 and Caddyfile:12`, "Caddyfile:12"},
		{"a snippet imported twice", "(rl) {\n\tsliding_ratelimit {\n\t\tlimit 5\n\t\twindow 1m\n\t}\n}\n:8080 {\n\timport rl\n\trespond ok\n}\n:8081 {\n\timport rl\n\trespond ok\n}\n",
			`the block at Caddyfile:2 is used twice (a snippet imported twice?)`, "Caddyfile:2"},
		{"same name, same settings", site("name api\n\t\t\tlimit 5\n\t\t\twindow 1m", "name api\n\t\t\tlimit 5\n\t\t\twindow 1m"), "", ""},
		{"one block, two addresses", ":8080, :8081 {\n\tsliding_ratelimit {\n\t\tlimit 5\n\t\twindow 1m\n\t}\n\trespond ok\n}\n", "", ""},
	} {
		src := strings.ReplaceAll(strings.ReplaceAll(c.src, `\n`, "\n"), `\t`, "\t")
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
		if c.want != "" {
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.line) {
				t.Errorf("%s: adapting gives %v, want an error containing %q at %s", c.name, err, c.want, c.line)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: adapt: %v", c.name, err)
		}
		var cfg caddy.Config
		if err := json.Unmarshal(out, &cfg); err != nil {
			t.Fatal(err)
		}
		if err := validateConfig(&cfg); err != nil {
			t.Errorf("%s: loading gives %v, want it to load", c.name, err)
		}
	}
}

// TestTwoHandlersOneNameJSON: in a JSON config, two handlers under one name
// with different settings are refused when it loads; the same settings
// twice are one limiter.
func TestTwoHandlersOneNameJSON(t *testing.T) {
	t.Parallel()
	cfg := func(a, b string) string {
		return `{"apps":{"http":{"servers":{"s":{"listen":[":8080"],"routes":[
			{"match":[{"path":["/a"]}],"handle":[` + a + `]},
			{"match":[{"path":["/b"]}],"handle":[` + b + `]}]}}}}}`
	}
	five := `{"handler":"sliding_ratelimit","limit":5,"window":"1m"}`
	fifty := `{"handler":"sliding_ratelimit","limit":50,"window":"1m"}`
	for _, c := range []struct{ name, cfg, want string }{
		{"default name, other settings", cfg(five, fifty), `with different settings are left at the default name "default"`},
		{"named, other settings", cfg(strings.Replace(five, `{`, `{"name":"api",`, 1), strings.Replace(fifty, `{`, `{"name":"api",`, 1)), `named "api" with different settings`},
		{"same settings", cfg(five, five), ""},
	} {
		var cc caddy.Config
		if err := json.Unmarshal([]byte(c.cfg), &cc); err != nil {
			t.Fatal(err)
		}
		err := validateConfig(&cc)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: loading gives %v, want %q", c.name, err, c.want)
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
