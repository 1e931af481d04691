package slidingratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap/zapcore"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// TestGlobalCeiling: region limit 5, global 7, two
// regions. 5 admitted in us, 2 in gb, then gb is denied by the global
// ceiling while us's count is unchanged; after the window both recover.
func TestGlobalCeiling(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			clock := newTestClock()
			h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Region: "{http.request.header.X-Region}",
				Limit: "5", GlobalLimit: "7", Window: caddy.Duration(time.Minute)}
			if store == "redis" {
				h.Redis = &RedisConfig{Addresses: []string{srv.Addr()}}
			}
			provision(t, h, clock)
			us := map[string]string{"X-API-Key": "gold-1", "X-Region": "us"}
			gb := map[string]string{"X-API-Key": "gold-1", "X-Region": "gb"}
			peek := func(region string) int64 {
				t.Helper()
				u := h.usage(t, "gold-1", region)
				return u
			}

			for i := 0; i < 5; i++ {
				if w := serve(t, h, us); w.Code != http.StatusOK {
					t.Fatalf("us %d: status %d", i+1, w.Code)
				}
			}
			clock.Advance(10 * time.Second)
			for i := 0; i < 2; i++ {
				w := serve(t, h, gb)
				if w.Code != http.StatusOK {
					t.Fatalf("gb %d: status %d", i+1, w.Code)
				}
				if i == 1 {
					want := `"` + h.Name + `";q=5;w=60, "` + h.Name + `-global";q=7;w=60`
					if got := w.Header().Get("RateLimit-Policy"); got != want {
						t.Errorf("RateLimit-Policy %q, want %q", got, want)
					}
					want = `"` + h.Name + `";r=3;t=60, "` + h.Name + `-global";r=0;t=50`
					if got := w.Header().Get("RateLimit"); got != want {
						t.Errorf("RateLimit %q, want %q", got, want)
					}
					// Legacy headers describe the tighter budget: the global one.
					if w.Header().Get("X-RateLimit-Limit") != "7" || w.Header().Get("X-RateLimit-Remaining") != "0" {
						t.Errorf("legacy headers %q/%q, want 7/0", w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"))
					}
				}
			}
			clock.Advance(5 * time.Second)
			w := serve(t, h, gb)
			if w.Code != http.StatusTooManyRequests {
				t.Fatalf("gb 3rd: status %d, want 429 from the global ceiling", w.Code)
			}
			// The global ceiling frees its first slot 45 s from now (us's first
			// requests at t0); gb's own budget had room.
			if got := w.Header().Get("Retry-After"); got != "45" {
				t.Errorf("Retry-After %q, want 45", got)
			}
			var body denyBody
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Region == nil || *body.Region != "gb" {
				t.Errorf("429 body %q", w.Body.String())
			}
			if n := peek("gb"); n != 2 {
				t.Errorf("gb count after the global denial: %d, want 2 (denials are not recorded)", n)
			}
			if w := serve(t, h, us); w.Code != http.StatusTooManyRequests {
				t.Fatalf("us 6th: status %d, want 429", w.Code)
			}
			if n := peek("us"); n != 5 {
				t.Errorf("us count: %d, want 5 (unchanged)", n)
			}

			clock.Advance(time.Minute)
			for _, hdr := range []map[string]string{us, gb} {
				if w := serve(t, h, hdr); w.Code != http.StatusOK {
					t.Errorf("after the window, %s: status %d", hdr["X-Region"], w.Code)
				}
			}
		})
	}
}

// usage peeks at a bucket's count without recording anything.
func (h *Handler) usage(t *testing.T, identity, region string) int64 {
	t.Helper()
	in, err := h.adminInput(url.Values{"key": {identity}, "region": {region}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := h.rt.lim.Peek(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	return d.Windows[0].Count
}

func TestCost(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	h := &Handler{Name: uniqueName(), Limit: "10", Cost: "4", Window: caddy.Duration(time.Minute)}
	provision(t, h, clock)
	for i := 0; i < 2; i++ {
		if w := serve(t, h, nil); w.Code != http.StatusOK {
			t.Fatalf("request %d: status %d", i+1, w.Code)
		}
		clock.Advance(10 * time.Second)
	}
	w := serve(t, h, nil)
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("3rd: status %d, want 429", w.Code)
	}
	// 8 units used, 4 more need the first request's units to leave: it was
	// at t0, now is t0+20s, so 40 s.
	if got := w.Header().Get("Retry-After"); got != "40" {
		t.Errorf("Retry-After %q, want 40", got)
	}
	// 2 units are left, fewer than the cost: a denial says 0 remaining,
	// in every header and placeholder.
	if got := w.Header().Get("X-RateLimit-Remaining"); got != "0" {
		t.Errorf("X-RateLimit-Remaining %q, want 0 on a denial", got)
	}
	if got := w.Header().Get("RateLimit"); !strings.Contains(got, ";r=0;t=40") {
		t.Errorf("RateLimit %q, want r=0 and t=40", got)
	}
}

func TestDynamicCostAboveLimit(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Limit: "10", Cost: "{http.request.header.X-Cost}", Window: caddy.Duration(time.Minute)}
	provision(t, h, newTestClock())
	w := serve(t, h, map[string]string{"X-Cost": "11"})
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("cost 11 > limit 10: status %d, want 413", w.Code)
	}
	if !strings.Contains(w.Body.String(), `"error":"cost_exceeds_limit","cost":11,"limit":10`) {
		t.Errorf("body %q", w.Body.String())
	}
	if w := serve(t, h, map[string]string{"X-Cost": "10"}); w.Code != http.StatusOK {
		t.Errorf("cost 10: status %d", w.Code)
	}
}

// TestBadDynamicLimit: a limit placeholder that is not a positive integer
// fails the request with 500 and an error log naming the placeholder.
func TestBadDynamicLimit(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Limit: "{http.request.header.X-Tier-Limit}", Window: caddy.Duration(time.Minute)}
	logs := provision(t, h, newTestClock())
	next := func(hdr map[string]string) error {
		_, err := serveErr(t, h, hdr)
		return err
	}
	for _, v := range []string{"zero", "0", "-4", ""} {
		err := next(map[string]string{"X-Tier-Limit": v})
		var he caddyhttp.HandlerError
		if !errors.As(err, &he) || he.StatusCode != http.StatusInternalServerError {
			t.Fatalf("limit %q: error %v, want a 500 HandlerError", v, err)
		}
		if !strings.Contains(err.Error(), "{http.request.header.X-Tier-Limit}") {
			t.Errorf("error %q does not name the placeholder", err)
		}
	}
	errs := logs.FilterLevelExact(zapcore.ErrorLevel).All()
	if len(errs) != 1 {
		t.Fatalf("%d error lines, want 1 for the burst", len(errs))
	}
	if !strings.Contains(errs[0].ContextMap()["error"].(string), "{http.request.header.X-Tier-Limit} resolved to 'zero'") {
		t.Errorf("log %v does not name the placeholder and value", errs[0].ContextMap())
	}
	if w := serve(t, h, map[string]string{"X-Tier-Limit": "3"}); w.Code != http.StatusOK {
		t.Errorf("limit 3: status %d", w.Code)
	}
}

// tiersConfig maps API keys to tiers with Caddy's map handler, and puts two
// limiters in one route: a per-IP guard, then the per-key tier limit.
const tiersConfig = `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
	grace_period 1ns
}
http://localhost:9080 {
	map {http.request.header.X-API-Key} {tier_limit} {
		~^k_gold_   10
		~^k_basic_  3
		default     1
	}
	sliding_ratelimit {
		name    per_ip
		key     {client_ip}
		limit   20
		window  1m
	}
	sliding_ratelimit {
		name    tiers
		key     {http.request.header.X-API-Key}
		limit   {tier_limit}
		window  1m
	}
	respond "ok"
}
`

// TestTiersAndChainedLimiters: keys mapped to tiers 3 and 10 get 3 and 10
// admitted; a request denied by the first limiter never reaches the second.
func TestTiersAndChainedLimiters(t *testing.T) {
	tester := newTester(t)
	tester.InitServer(tiersConfig, "caddyfile")
	send := func(key string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, "http://localhost:9080/", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	suffix := uniqueName()
	admitted := func(key string, n int) int {
		got := 0
		for i := 0; i < n; i++ {
			if send(key).StatusCode == http.StatusOK {
				got++
			}
		}
		return got
	}
	if got := admitted("k_basic_"+suffix, 5); got != 3 {
		t.Errorf("basic tier: %d admitted of 5, want 3", got)
	}
	if got := admitted("k_gold_"+suffix, 12); got != 10 {
		t.Errorf("gold tier: %d admitted of 12, want 10", got)
	}
	// 17 requests so far count against per_ip's 20. The next 3 pass per_ip
	// (and are denied by tiers); then per_ip denies and tiers is not asked.
	for i := 0; i < 3; i++ {
		resp := send("k_gold_" + suffix)
		if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(policies(resp), `"tiers"`) {
			t.Fatalf("request %d: status %d policy %q, want 429 from tiers", 18+i, resp.StatusCode, policies(resp))
		}
	}
	resp := send("k_gold_" + suffix)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("21st: status %d", resp.StatusCode)
	}
	if p := policies(resp); strings.Contains(p, `"tiers"`) || !strings.Contains(p, `"per_ip"`) {
		t.Errorf("21st was denied by per_ip, yet RateLimit-Policy is %q: the second limiter ran", p)
	}
}

// policies joins every RateLimit-Policy field line of a response, as a
// structured-field list is joined.
func policies(resp *http.Response) string {
	return strings.Join(resp.Header.Values("RateLimit-Policy"), ", ")
}
