package httplimit_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/httplimit"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// The conformance table of limiter/conformance_test.go, in its shape and on
// its clock, as a user of the middleware sees it: each step is requests
// through an httptest.Server with a real HTTP client, and what it must get
// is a status, the headers and the body.

// t0 is the table's origin (the engine's: 1 s before the start of a
// minute, and so of a 2 s or 10 s window); b0 is the first window boundary
// after it.
var t0 = time.Date(2026, 11, 29, 11, 59, 59, 0, time.UTC)

const b0 = time.Second

// hstep is one request (or n) of a case and what the last one gets.
type hstep struct {
	at     time.Duration // offset from t0
	region string
	cost   int64 // 0: no X-Cost header (cost 1)
	n      int   // repeat (0 means 1); every one gets status, the last the rest

	status    int
	remaining int64         // X-RateLimit-Remaining; -1 skips
	retry     time.Duration // the engine's retry time: Retry-After is its whole seconds rounded up (at least 1)
	banned    bool
}

type hcase struct {
	name    string
	alg     string
	limits  []httplimit.Limit
	globals []httplimit.Limit
	burst   int64
	region  bool
	ban     *httplimit.Ban
	steps   []hstep
}

func lim(n int64, w time.Duration) httplimit.Limit { return httplimit.Limit{Limit: n, Window: w} }

const ok, no = http.StatusOK, http.StatusTooManyRequests

var httpConformance = []hcase{
	{
		name: "sliding_log/window boundary", alg: "sliding_log", limits: []httplimit.Limit{lim(100, time.Minute)},
		steps: []hstep{
			{at: 0, n: 100, status: ok, remaining: 0},
			{at: 0, status: no, remaining: 0, retry: time.Minute},
			{at: time.Second, status: no, remaining: 0, retry: 59 * time.Second},
			{at: time.Minute - time.Microsecond, status: no, remaining: 0, retry: time.Microsecond},
			{at: time.Minute + time.Microsecond, status: ok, remaining: 99},
			{at: time.Minute + time.Microsecond, n: 99, status: ok, remaining: 0},
			{at: time.Minute + 2*time.Microsecond, status: no, remaining: 0, retry: time.Minute - time.Microsecond},
		},
	},
	{
		name: "sliding_log/cost", alg: "sliding_log", limits: []httplimit.Limit{lim(10, 10*time.Second)},
		steps: []hstep{
			{at: 0, cost: 4, status: ok, remaining: 6},
			{at: time.Second, cost: 4, status: ok, remaining: 2},
			{at: 2 * time.Second, cost: 4, status: no, remaining: 0, retry: 8 * time.Second},
			{at: 2 * time.Second, cost: 2, status: ok, remaining: 0},
			{at: 10 * time.Second, cost: 4, status: ok, remaining: 0},
		},
	},
	{
		name: "sliding_log/global ceiling", alg: "sliding_log", limits: []httplimit.Limit{lim(5, 10*time.Second)},
		globals: []httplimit.Limit{lim(7, 10*time.Second)}, region: true,
		steps: []hstep{
			{at: 0, region: "us", n: 5, status: ok, remaining: 0},
			{at: 0, region: "us", status: no, remaining: 0, retry: 10 * time.Second},
			{at: time.Second, region: "gb", n: 2, status: ok, remaining: 0}, // the global's 0
			{at: 2 * time.Second, region: "gb", status: no, remaining: 0, retry: 8 * time.Second},
			{at: 2 * time.Second, region: "us", status: no, remaining: 0, retry: 8 * time.Second},
			{at: 10 * time.Second, region: "gb", status: ok, remaining: 2},
			{at: 11 * time.Second, region: "us", n: 4, status: ok, remaining: 1},
		},
	},
	{
		name: "sliding_log/several windows", alg: "sliding_log", limits: []httplimit.Limit{lim(2, time.Second), lim(3, 10*time.Second)},
		steps: []hstep{
			{at: 0, n: 2, status: ok, remaining: 0},
			{at: 0, status: no, remaining: 0, retry: time.Second},
			{at: time.Second, status: ok, remaining: 0},
			{at: 1500 * time.Millisecond, status: no, remaining: 0, retry: 8500 * time.Millisecond},
			{at: 10 * time.Second, status: ok, remaining: 1},
		},
	},
	{
		name: "sliding_log/penalty box", alg: "sliding_log", limits: []httplimit.Limit{lim(2, 10*time.Second)},
		ban: &httplimit.Ban{After: 3, Within: 5 * time.Second, For: 20 * time.Second},
		steps: []hstep{
			{at: 0, n: 2, status: ok, remaining: 0},
			{at: time.Second, status: no, remaining: 0, retry: 9 * time.Second},
			{at: 2 * time.Second, status: no, remaining: 0, retry: 8 * time.Second},
			{at: 3 * time.Second, status: no, banned: true, remaining: -1, retry: 20 * time.Second},
			{at: 4 * time.Second, n: 30, status: no, banned: true, remaining: -1, retry: 19 * time.Second},
			{at: 10 * time.Second, status: no, banned: true, remaining: -1, retry: 13 * time.Second},
			{at: 23 * time.Second, status: ok, remaining: 1},
		},
	},
	{
		name: "sliding_counter/window boundary: at most limit + one bucket across a boundary", alg: "sliding_counter", limits: []httplimit.Limit{lim(100, time.Minute)},
		steps: []hstep{
			// The counter's format 3 (limiter's conformance table): the 100
			// count whole until they leave the window, then 100 - B = 95
			// until their bucket has left.
			{at: 0, n: 100, status: ok, remaining: 0},
			{at: 0, status: no, remaining: 0, retry: time.Minute},
			{at: time.Second, status: no, remaining: 0, retry: 59 * time.Second},
			{at: time.Minute - time.Microsecond, status: no, remaining: 0, retry: time.Microsecond},
			{at: time.Minute, n: 5, status: ok, remaining: 0},
			{at: time.Minute, status: no, remaining: 0, retry: time.Second},
			{at: 61 * time.Second, status: ok, remaining: 94},
		},
	},
	{
		name: "sliding_counter/global ceiling", alg: "sliding_counter", limits: []httplimit.Limit{lim(5, 10*time.Second)},
		globals: []httplimit.Limit{lim(7, 10*time.Second)}, region: true,
		steps: []hstep{
			{at: b0, region: "us", n: 5, status: ok, remaining: 0},
			{at: b0, region: "us", status: no, remaining: 0, retry: 10 * time.Second},
			{at: b0 + time.Second, region: "gb", n: 2, status: ok, remaining: 0},
			{at: b0 + 2*time.Second, region: "gb", status: no, remaining: 0, retry: 8 * time.Second},
			{at: b0 + 2*time.Second, region: "us", status: no, remaining: 0, retry: 8 * time.Second},
			{at: b0 + 20*time.Second, region: "gb", status: ok, remaining: 4},
		},
	},
	{
		name: "fixed_window/window boundary: lets 2x the limit through across a boundary (by design)", alg: "fixed_window",
		limits: []httplimit.Limit{lim(100, time.Minute)},
		steps: []hstep{
			{at: 0, n: 100, status: ok, remaining: 0},
			{at: 0, status: no, remaining: 0, retry: time.Second},
			{at: time.Second - time.Microsecond, status: no, remaining: 0, retry: time.Microsecond},
			{at: time.Second, n: 100, status: ok, remaining: 0},
			{at: time.Second, status: no, remaining: 0, retry: time.Minute},
			{at: 61 * time.Second, status: ok, remaining: 99},
		},
	},
	{
		name: "fixed_window/several windows", alg: "fixed_window", limits: []httplimit.Limit{lim(2, time.Second), lim(3, 10*time.Second)},
		steps: []hstep{
			{at: b0, n: 2, status: ok, remaining: 0},
			{at: b0, status: no, remaining: 0, retry: time.Second},
			{at: b0 + time.Second, status: ok, remaining: 0},
			{at: b0 + 1500*time.Millisecond, status: no, remaining: 0, retry: 8500 * time.Millisecond},
			{at: b0 + 10*time.Second, status: ok, remaining: 1},
		},
	},
	{
		name: "token_bucket/full burst, then one unit per interval", alg: "token_bucket", limits: []httplimit.Limit{lim(100, time.Minute)},
		steps: []hstep{
			{at: 0, n: 100, status: ok, remaining: 0},
			{at: 0, status: no, remaining: 0, retry: 600 * time.Millisecond},
			{at: 600*time.Millisecond - time.Microsecond, status: no, remaining: 0, retry: time.Microsecond},
			{at: 600 * time.Millisecond, status: ok, remaining: 0},
			{at: time.Second, status: no, remaining: 0, retry: 200 * time.Millisecond},
			{at: 60*time.Second + 600*time.Millisecond, n: 100, status: ok, remaining: 0},
		},
	},
	{
		name: "token_bucket/burst below the limit", alg: "token_bucket", limits: []httplimit.Limit{lim(10, 10*time.Second)}, burst: 3,
		steps: []hstep{
			{at: 0, n: 3, status: ok, remaining: 0},
			{at: 0, status: no, remaining: 0, retry: time.Second},
			{at: time.Second, status: ok, remaining: 0},
			{at: 5 * time.Second, cost: 3, status: ok, remaining: 0},
			{at: 8 * time.Second, cost: 3, status: ok, remaining: 0},
		},
	},
	{
		name: "token_bucket/global ceiling", alg: "token_bucket", limits: []httplimit.Limit{lim(5, 10*time.Second)},
		globals: []httplimit.Limit{lim(7, 10*time.Second)}, region: true,
		steps: []hstep{
			{at: b0, region: "us", n: 5, status: ok, remaining: 0},
			{at: b0, region: "us", status: no, remaining: 0, retry: 2 * time.Second},
			{at: b0 + time.Second, region: "gb", n: 2, status: ok, remaining: 0},
			{at: b0 + time.Second, region: "gb", status: no, remaining: 0, retry: 428571 * time.Microsecond},
			{at: b0 + time.Second, region: "us", status: no, remaining: 0, retry: time.Second},
			{at: b0 + 11*time.Second, region: "gb", status: ok, remaining: 4},
		},
	},
	{
		name: "token_bucket/several windows", alg: "token_bucket", limits: []httplimit.Limit{lim(2, time.Second), lim(3, 10*time.Second)},
		steps: []hstep{
			{at: 0, n: 2, status: ok, remaining: 0},
			{at: 0, status: no, remaining: 0, retry: 500 * time.Millisecond},
			{at: 500 * time.Millisecond, status: ok, remaining: 0},
			{at: 500 * time.Millisecond, status: no, remaining: 0, retry: 2833333 * time.Microsecond},
		},
	},
}

// clock is an injected clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func randomID(t testing.TB) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "id-" + hex.EncodeToString(b[:])
}

// stores are the stores the table runs on: in process, and a real
// redis-server of the test's own.
func stores(t *testing.T) map[string]*httplimit.RedisConfig {
	srv := redistest.Start(t)
	return map[string]*httplimit.RedisConfig{
		"memory":       nil,
		"redis-server": {Addresses: []string{srv.Addr()}, Timeout: 5 * time.Second, DialTimeout: 5 * time.Second},
	}
}

// TestConformanceThroughHTTP: every case of the table, on both stores.
func TestConformanceThroughHTTP(t *testing.T) {
	t.Parallel()
	for name, rc := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, hc := range httpConformance {
				t.Run(hc.name, func(t *testing.T) {
					t.Parallel()
					runHTTPCase(t, hc, rc)
				})
			}
		})
	}
}

// serve starts the middleware of cfg in front of a handler that answers
// "ok", on clk.
func serve(t *testing.T, cfg httplimit.Config) *httptest.Server {
	t.Helper()
	l, err := httplimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	srv := httptest.NewServer(l.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})))
	t.Cleanup(srv.Close)
	return srv
}

func runHTTPCase(t *testing.T, hc hcase, rc *httplimit.RedisConfig) {
	clk := &clock{t: t0}
	cfg := httplimit.Config{
		Name: "conf", Algorithm: hc.alg, Limits: hc.limits, GlobalLimits: hc.globals, Burst: hc.burst, Ban: hc.ban,
		Key: httplimit.Header("X-Key"), Clock: "app", Now: clk.Now, Redis: rc,
		CostFunc: func(r *http.Request) int64 {
			if c := r.Header.Get("X-Cost"); c != "" {
				n, _ := strconv.ParseInt(c, 10, 64)
				return n
			}
			return 1
		},
	}
	if hc.region {
		cfg.Region = func(r *http.Request) string { return r.Header.Get("X-Region") }
	}
	srv := serve(t, cfg)
	id := randomID(t)
	client := srv.Client()
	for i, st := range hc.steps {
		clk.Set(t0.Add(st.at))
		n := max(st.n, 1)
		for j := 0; j < n; j++ {
			req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			req.Header.Set("X-Key", id)
			if st.region != "" {
				req.Header.Set("X-Region", st.region)
			}
			if st.cost > 0 {
				req.Header.Set("X-Cost", strconv.FormatInt(st.cost, 10))
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("step %d (%d/%d): %v", i, j+1, n, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			where := fmt.Sprintf("step %d (%d/%d, at +%s, region %q)", i, j+1, n, st.at, st.region)
			if resp.StatusCode != st.status {
				t.Fatalf("%s: status %d, want %d (body %q)", where, resp.StatusCode, st.status, body)
			}
			if j == n-1 {
				checkReply(t, where, hc, st, resp, string(body))
			}
		}
	}
}

// checkReply holds a response to its step: the body, Retry-After and the
// rate limit headers.
func checkReply(t *testing.T, where string, hc hcase, st hstep, resp *http.Response, body string) {
	t.Helper()
	h := resp.Header
	if st.status == ok {
		if body != "ok\n" || h.Get("Retry-After") != "" {
			t.Errorf("%s: admitted, body %q, Retry-After %q", where, body, h.Get("Retry-After"))
		}
	} else {
		secs := max(int64((st.retry+time.Second-1)/time.Second), 1)
		want := `{"error":"rate_limited","retry_after":` + strconv.FormatInt(secs, 10)
		if hc.region {
			want += `,"region":"` + st.region + `"`
		}
		if st.banned {
			want += `,"reason":"banned"`
		}
		want += "}\n"
		if body != want || h.Get("Content-Type") != "application/json" {
			t.Errorf("%s: body %q (%s), want %q", where, body, h.Get("Content-Type"), want)
		}
		if got := h.Get("Retry-After"); got != strconv.FormatInt(secs, 10) {
			t.Errorf("%s: Retry-After %q, want %d (retry %s)", where, got, secs, st.retry)
		}
	}
	if st.remaining >= 0 {
		if got := h.Get("X-RateLimit-Remaining"); got != strconv.FormatInt(st.remaining, 10) {
			t.Errorf("%s: X-RateLimit-Remaining %q, want %d", where, got, st.remaining)
		}
	}
	// One RateLimit-Policy item per window, a quota and a window each.
	policy := h.Get("RateLimit-Policy")
	if items := strings.Count(policy, ";q="); items != len(hc.limits)+len(hc.globals) || !strings.HasPrefix(policy, `"conf`) {
		t.Errorf("%s: RateLimit-Policy %q, want %d items", where, policy, len(hc.limits)+len(hc.globals))
	}
	if !st.banned && !strings.Contains(h.Get("RateLimit"), `"conf`) {
		t.Errorf("%s: RateLimit %q", where, h.Get("RateLimit"))
	}
}
