package httplimit_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sliding-ratelimit/sliding_ratelimit/httplimit"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// TestNoCaddyInTheDependencies: a Go service that uses the middleware
// builds no package of Caddy (go list -deps names every package it
// compiles).
func TestNoCaddyInTheDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 || !strings.Contains(string(out), "github.com/sliding-ratelimit/sliding_ratelimit/limiter\n") {
		t.Fatalf("go list -deps listed %d packages, without the engine: the check is broken\n%s", len(deps), out)
	}
	for _, d := range deps {
		if strings.Contains(d, "caddyserver") {
			t.Errorf("httplimit depends on %s", d)
		}
	}
}

// TestBadConfigIsAnError: every bad configuration is an error from New that
// names the field, never a panic nor a limiter.
func TestBadConfigIsAnError(t *testing.T) {
	t.Parallel()
	one := []httplimit.Limit{{Limit: 10, Window: time.Minute}}
	for _, c := range []struct {
		cfg  httplimit.Config
		want string
	}{
		{httplimit.Config{}, "Limits: at least one limit is required"},
		{httplimit.Config{Limits: []httplimit.Limit{{Limit: 10}}}, "Limits[0]: limit 10 has no window"},
		{httplimit.Config{Limits: []httplimit.Limit{{Limit: 0, Window: time.Minute}}}, "Limits[0]: Limit must be a positive integer"},
		{httplimit.Config{Limits: []httplimit.Limit{{Limit: 10, Period: "fortnight"}}}, "Limits[0]: Period must be hour, day, week or month"},
		{httplimit.Config{Limits: []httplimit.Limit{{Limit: 10, Window: time.Microsecond}}}, "Limits[0]: window must be at least 1ms"},
		{httplimit.Config{Limits: one, Algorithm: "leaky"}, "Algorithm: "},
		{httplimit.Config{Limits: one, Fail: "maybe"}, "Fail: must be open, closed, local, got 'maybe'"},
		{httplimit.Config{Limits: one, Fail: "closed"}, "Fail: fail closed applies to a Redis store"},
		{httplimit.Config{Limits: one, Headers: "all"}, "Headers: must be both, ietf, legacy, off"},
		{httplimit.Config{Limits: one, Name: "a b"}, "Name: "},
		{httplimit.Config{Limits: one, GlobalLimits: one}, "GlobalLimits: global_limit needs region"},
		{httplimit.Config{Limits: one, Cost: 11}, "Cost: cost 11 is above Limits[0]'s capacity 10"},
		{httplimit.Config{Limits: one, Burst: 5}, "Burst: burst is the capacity of algorithm token_bucket"},
		{httplimit.Config{Limits: one, Ban: &httplimit.Ban{After: 0, Within: time.Second, For: time.Second}}, "Ban: ban needs a positive number"},
		{httplimit.Config{Limits: one, TrustedProxies: []string{"10.0.0.0/33"}}, "TrustedProxies[0]: '10.0.0.0/33' is neither"},
		{httplimit.Config{Limits: one, Timezone: "Mars/Olympus"}, "Timezone: applies to calendar periods"},
		{httplimit.Config{Limits: one, Datacenter: "eu"}, "Datacenter: "},
		{httplimit.Config{Limits: one, Redis: &httplimit.RedisConfig{}}, "Redis: needs a URL or an address"},
		{httplimit.Config{Limits: one, Redis: &httplimit.RedisConfig{URL: "http://x"}}, "Redis.url: bad URL 'http://x'"},
		{httplimit.Config{Limits: one, Redis: &httplimit.RedisConfig{Addresses: []string{"a:1"}, KeyPrefix: "{x}"}}, "Redis.key_prefix: "},
		{httplimit.Config{Limits: one, Redis: &httplimit.RedisConfig{Addresses: []string{"a:1"}, TLS: &httplimit.RedisTLS{CA: "/nonexistent.pem"}}}, "Redis: tls ca: "},
		{httplimit.Config{Limits: one, Region: func(*http.Request) string { return "" }, GlobalLimits: one,
			GlobalRedis: &httplimit.RedisConfig{Addresses: []string{"a:1"}}}, "Datacenter: GlobalRedis needs a Datacenter"},
		{httplimit.Config{Limits: one, GlobalRedis: &httplimit.RedisConfig{Addresses: []string{"a:1"}}, Datacenter: "eu"}, "GlobalRedis: keeps GlobalLimits"},
		{httplimit.Config{Limits: []httplimit.Limit{{Limit: 1_000_000, Window: time.Minute}}}, "Limits[0]: limit 1000000 on sliding_log"},
	} {
		l, err := httplimit.New(c.cfg)
		if err == nil {
			l.Close()
			t.Errorf("New(%+v) = nil error, want %q", c.cfg, c.want)
			continue
		}
		if !strings.HasPrefix(err.Error(), "httplimit: "+c.want) {
			t.Errorf("New(%+v) = %q, want it to start with %q", c.cfg, err, "httplimit: "+c.want)
		}
	}
}

// get sends a GET with headers through srv and returns the status, the
// headers and the body.
func get(t *testing.T, srv *httptest.Server, hdr map[string]string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestHostileKeysAreBounded: header values with braces, colons, stars,
// control bytes or 64 KiB are keys like any other: each its own budget,
// none reaching another's (the engine hashes them), none failing a request.
func TestHostileKeysAreBounded(t *testing.T) {
	t.Parallel()
	srv := serve(t, httplimit.Config{Limits: []httplimit.Limit{{Limit: 1, Window: time.Minute}}, Key: httplimit.Header("X-Api-Key")})
	hostile := []string{"a}:{b", "*", "=", "x:y:z", "{", "}", strings.Repeat("k", 64<<10), strings.Repeat("k", 64<<10-1) + "j", "tab\there", "ünïcode"}
	for _, k := range hostile {
		if st, _, body := get(t, srv, map[string]string{"X-Api-Key": k}); st != http.StatusOK {
			t.Fatalf("first request of key %.20q: %d %s", k, st, body)
		}
	}
	for _, k := range hostile {
		if st, _, _ := get(t, srv, map[string]string{"X-Api-Key": k}); st != http.StatusTooManyRequests {
			t.Fatalf("second request of key %.20q: %d, want 429 (its own budget, spent)", k, st)
		}
	}
	// No key at all: one shared budget of its own.
	if st, _, _ := get(t, srv, nil); st != http.StatusOK {
		t.Fatalf("first request without a key: %d", st)
	}
	if st, _, _ := get(t, srv, nil); st != http.StatusTooManyRequests {
		t.Fatalf("second request without a key: %d, want 429", st)
	}
}

// TestClientIPTrustsOnlyItsProxies: X-Forwarded-For counts only from a
// trusted proxy, and then only what the trusted proxies appended.
func TestClientIPTrustsOnlyItsProxies(t *testing.T) {
	t.Parallel()
	key := httplimit.ClientIP(netip.MustParsePrefix("10.0.0.0/8"))
	for _, c := range []struct{ remote, xff, want string }{
		{"192.0.2.1:5000", "203.0.113.9", "192.0.2.1"},                               // not a proxy: its header is ignored
		{"10.1.1.1:5000", "203.0.113.9", "203.0.113.9"},                              // a trusted proxy's client
		{"10.1.1.1:5000", "6.6.6.6, 203.0.113.9, 10.2.2.2", "203.0.113.9"},           // the client prepended 6.6.6.6
		{"10.1.1.1:5000", "garbage, 10.2.2.2", "10.2.2.2"},                           // what no trusted proxy wrote
		{"10.1.1.1:5000", "", "10.1.1.1"},                                            // no header
		{"[::ffff:10.1.1.1]:5000", "2001:db8::1", "2001:db8::1"},                     // v4-mapped proxy, v6 client
		{"10.1.1.1:5000", strings.Repeat("10.3.3.3,", 100) + "10.4.4.4", "10.3.3.3"}, // at most 32 hops read
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = c.remote
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		if got := key(r); got != c.want {
			t.Errorf("remote %s, X-Forwarded-For %.40q: key %q, want %q", c.remote, c.xff, got, c.want)
		}
	}
}

// TestFailModesWithRedisStopped: with Redis gone, fail open passes with no
// rate limit headers, fail closed answers 503 with Retry-After 1 and its
// body, and both count the outcome in requests_total.
func TestFailModesWithRedisStopped(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	metrics := httplimit.NewMetrics("")
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.Collectors()...)
	servers := map[string]*httptest.Server{}
	for _, fail := range []string{"open", "closed"} {
		servers[fail] = serve(t, httplimit.Config{Name: "fail_" + fail, Fail: fail, Metrics: metrics,
			Limits: []httplimit.Limit{{Limit: 5, Window: time.Minute}},
			Redis:  &httplimit.RedisConfig{Addresses: []string{redis.Addr()}, Timeout: 200 * time.Millisecond}})
	}
	for fail, srv := range servers {
		if st, h, _ := get(t, srv, nil); st != http.StatusOK || h.Get("X-RateLimit-Remaining") != "4" {
			t.Fatalf("fail %s, Redis up: %d, remaining %q", fail, st, h.Get("X-RateLimit-Remaining"))
		}
	}
	redis.Kill()
	st, h, body := get(t, servers["open"], nil)
	if st != http.StatusOK || body != "ok\n" || h.Get("X-RateLimit-Remaining") != "" || h.Get("RateLimit") != "" {
		t.Errorf("fail open, Redis down: %d %q, headers %v", st, body, h)
	}
	st, h, body = get(t, servers["closed"], nil)
	if st != http.StatusServiceUnavailable || body != `{"error":"rate_limiter_unavailable"}`+"\n" || h.Get("Retry-After") != "1" {
		t.Errorf("fail closed, Redis down: %d %q, Retry-After %q", st, body, h.Get("Retry-After"))
	}
	for name, want := range map[string]string{"fail_open": "fail_open", "fail_closed": "fail_closed"} {
		c, err := counterOf(reg, "sliding_ratelimit_requests_total", map[string]string{"limiter": name, "result": want})
		if err != nil || c != 1 {
			t.Errorf("requests_total{limiter=%s,result=%s} = %v (%v), want 1", name, want, c, err)
		}
	}
}

// counterOf reads one series of a counter from reg.
func counterOf(reg *prometheus.Registry, name string, labels map[string]string) (float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue(), nil
		}
	}
	return -1, nil
}

// TestMetricsAndRefusals: the metrics a caller registers count what the
// middleware decided, as the Caddy handler's do; a cost that can never fit
// is a 413 with its body; a denial echoes the region.
func TestMetricsAndRefusals(t *testing.T) {
	t.Parallel()
	metrics := httplimit.NewMetrics("")
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.Collectors()...)
	srv := serve(t, httplimit.Config{Name: "api", Metrics: metrics, Limits: []httplimit.Limit{{Limit: 2, Window: time.Minute}},
		Key: httplimit.Header("X-Key"), Region: func(r *http.Request) string { return r.URL.Query().Get("region") },
		CostFunc: func(r *http.Request) int64 {
			if r.Header.Get("X-Bulk") != "" {
				return 3
			}
			return 1
		}})
	get(t, srv, map[string]string{"X-Key": "k"})
	get(t, srv, map[string]string{"X-Key": "k"})
	if st, h, body := get(t, srv, map[string]string{"X-Key": "k"}); st != http.StatusTooManyRequests ||
		body != `{"error":"rate_limited","retry_after":60,"region":""}`+"\n" || h.Get("Retry-After") != "60" ||
		h.Get("RateLimit-Policy") != `"api";q=2;w=60` || h.Get("RateLimit") != `"api";r=0;t=60` || h.Get("X-RateLimit-Limit") != "2" {
		t.Errorf("third request: %d %q %v", st, body, h)
	}
	if st, _, body := get(t, srv, map[string]string{"X-Key": "bulk", "X-Bulk": "1"}); st != http.StatusRequestEntityTooLarge ||
		body != `{"error":"cost_exceeds_limit","cost":3,"limit":2}`+"\n" {
		t.Errorf("a cost of 3 under a limit of 2: %d %q", st, body)
	}
	for result, want := range map[string]float64{"allowed": 2, "denied": 1, "too_large": 1, "fail_open": 0} {
		if got, _ := counterOf(reg, "sliding_ratelimit_requests_total", map[string]string{"limiter": "api", "result": result}); got != want {
			t.Errorf("requests_total{result=%s} = %v, want %v", result, got, want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "sliding_ratelimit_memory_keys"); err != nil || n != 1 {
		t.Errorf("memory_keys series: %d (%v), want 1", n, err)
	}
}
