package slidingratelimit

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// adminOverride sends an override request to the admin API as an operator
// would, and returns the status and body.
func adminOverride(t *testing.T, method, name, query string) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(method, "/sliding_ratelimit/"+name+"/override?"+query, nil)
	if err := (&AdminAPI{}).serve(w, r); err != nil {
		var ae caddy.APIError
		if errorsAs(err, &ae) {
			return ae.HTTPStatus, ae.Err.Error()
		}
		t.Fatal(err)
	}
	return w.Code, w.Body.String()
}

// admitted sends n requests through h and counts the 200s.
func admitted(t *testing.T, h *Handler, hdr map[string]string, n int) int {
	t.Helper()
	ok := 0
	for i := 0; i < n; i++ {
		if w := serve(t, h, hdr); w.Code == http.StatusOK {
			ok++
		}
	}
	return ok
}

// TestOverrideAppliesOnEveryNode: three nodes on one Redis, limit 5 per
// minute. An operator gives K a limit of 12 for 10 minutes through the admin
// API: every node admits K up to 12 at once (even the node holding K's
// cached denial), shows 12 in its headers, leaves other keys at 5; the
// override ends by itself at its TTL (K is back at 5), and its Redis key
// expires with it.
func TestOverrideAppliesOnEveryNode(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	clock := newTestClock()
	name := uniqueName()
	hs := nodes(t, 3, srv, clock, func() *Handler {
		return &Handler{Name: name, Key: "{http.request.header.X-API-Key}", Limit: "5", Window: caddy.Duration(time.Minute)}
	})
	k := map[string]string{"X-API-Key": "K"}
	other := map[string]string{"X-API-Key": "other"}
	if n := admitted(t, hs[0], k, 5); n != 5 {
		t.Fatalf("K admitted %d of its first 5", n)
	}
	for _, h := range hs { // every node denies K; node 0 and 1 cache it
		if w := serve(t, h, k); w.Code != http.StatusTooManyRequests {
			t.Fatalf("K's 6th: %d", w.Code)
		}
	}

	code, body := adminOverride(t, http.MethodPut, name, "key=K&limit=12&ttl=10m")
	if code != http.StatusOK || !strings.Contains(body, `"limits":[12]`) || !strings.Contains(body, `"ttl":600`) {
		t.Fatalf("PUT override: %d %s", code, body)
	}
	// Node 2 served the PUT; nodes 0 and 1 learn of it from its notice
	// (Redis pub/sub, milliseconds), which also drops their cached denial.
	for i, h := range hs[:2] {
		waitKnows(t, h, "K")
		if n := h.rt.lim.DenyCache().Len(); n != 0 {
			t.Errorf("node %d knows of the override but still caches %d denials", i, n)
		}
	}
	total := 0
	for i, h := range hs {
		w := serve(t, h, k)
		if w.Code != http.StatusOK {
			t.Fatalf("node %d, K under its override: %d %s", i, w.Code, w.Body)
		}
		if got := w.Header().Get("X-RateLimit-Limit"); got != "12" {
			t.Errorf("node %d: X-RateLimit-Limit %q, want 12 (the override)", i, got)
		}
		total++
	}
	total += admitted(t, hs[1], k, 10)
	if total != 7 {
		t.Errorf("K admitted %d more under a limit of 12 (5 used), want 7", total)
	}
	if w := serve(t, hs[0], other); w.Header().Get("X-RateLimit-Limit") != "5" {
		t.Errorf("another key: X-RateLimit-Limit %q, want 5", w.Header().Get("X-RateLimit-Limit"))
	}
	code, body = adminOverride(t, http.MethodGet, name, "")
	if code != http.StatusOK || !strings.Contains(body, `"key_hash":"`+keyHash("K")+`"`) || strings.Contains(body, `"key":"K"`) {
		t.Errorf("GET overrides: %d %s", code, body)
	}
	if got := overridesGauge(t, name); got != 1 {
		t.Errorf("overrides_active = %v, want 1", got)
	}
	pttl := srv.Client(t).PTTL(context.Background(), hs[0].rt.lim.Keys().Namespace()+"override:{K}").Val()
	if pttl <= 10*time.Minute-5*time.Second || pttl > 10*time.Minute+2*time.Second {
		t.Errorf("the override's key lives %s in Redis, want its TTL (10m)", pttl)
	}

	// A node that starts now (it missed the notice) learns of the override
	// from the index, which it reads at start and every 5 s.
	late := nodes(t, 1, srv, clock, func() *Handler {
		return &Handler{Name: name, Key: "{http.request.header.X-API-Key}", Limit: "5", Window: caddy.Duration(time.Minute)}
	})[0]
	waitKnows(t, late, "K")
	if w := serve(t, late, k); w.Code != http.StatusTooManyRequests || w.Header().Get("X-RateLimit-Limit") != "12" {
		t.Errorf("a node started after the override, K (12 used of 12): %d, X-RateLimit-Limit %q", w.Code, w.Header().Get("X-RateLimit-Limit"))
	}

	// Ten minutes later (K's window of a minute is long gone) the override
	// has ended: K gets 5 again, everywhere.
	clock.Advance(10*time.Minute + time.Second)
	for i, h := range hs {
		w := serve(t, h, k)
		if got := w.Header().Get("X-RateLimit-Limit"); w.Code != http.StatusOK || got != "5" {
			t.Errorf("node %d after the override's TTL: %d, X-RateLimit-Limit %q, want 200 and 5", i, w.Code, got)
		}
	}
	if n := admitted(t, hs[0], k, 5); n != 2 {
		t.Errorf("K admitted %d more after the override ended, want 2 (limit 5)", n)
	}
	if got := overridesGauge(t, name); got != 0 {
		t.Errorf("overrides_active after the TTL = %v, want 0", got)
	}
}

// waitKnows waits until h's node knows key may have an override.
func waitKnows(t *testing.T, h *Handler, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !h.rt.lim.KnowsOverride(key) {
		if time.Now().After(deadline) {
			t.Fatalf("limiter %s never learnt of %s's override", h.Name, key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// overridesGauge reads overrides_active of a limiter as a scrape would.
func overridesGauge(t *testing.T, name string) float64 {
	t.Helper()
	v, ok := scrapeGauge(t, "caddy_sliding_ratelimit_overrides_active", name)
	if !ok {
		t.Fatalf("no overrides_active for limiter %s", name)
	}
	return v
}

// TestOverrideForms: a factor, a region's own override winning over the
// identity's, the global ceiling, a lowered limit that a cost no longer
// fits (413), DELETE ending it early, and the errors an operator meets; on
// the in-process store, a Redis and a Redis Cluster.
func TestOverrideForms(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis", "cluster"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			clock := newTestClock()
			h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Region: "{http.request.header.X-Region}",
				Limit: "4", GlobalLimit: "10", Cost: "{http.request.header.X-Cost}", Window: caddy.Duration(time.Minute)}
			switch store {
			case "redis":
				srv := redistest.Start(t)
				h.Redis = &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(5 * time.Second)}
			case "cluster": // the overrides hash in the identity's slot, the index in its own
				cluster := redistest.StartCluster(t, 3)
				h.Redis = &RedisConfig{Addresses: cluster.Addrs(), Timeout: caddy.Duration(5 * time.Second)}
			}
			logs := provision(t, h, clock)
			eu := map[string]string{"X-API-Key": "K", "X-Region": "eu", "X-Cost": "1"}
			us := map[string]string{"X-API-Key": "K", "X-Region": "us", "X-Cost": "1"}

			// factor 2 for K everywhere: 8 per region, global 20.
			if code, body := adminOverride(t, http.MethodPut, h.Name, "key=K&factor=2&ttl=1h"); code != http.StatusOK {
				t.Fatalf("PUT factor: %d %s", code, body)
			}
			if n := admitted(t, h, eu, 10); n != 8 {
				t.Errorf("eu admitted %d under factor 2 (limit 4), want 8", n)
			}
			if code, body := adminGet(t, h.Name, "key=K&region=eu&cost=1"); code != http.StatusOK || !strings.Contains(body, `"count":8,"limit":8,"remaining":0`) {
				t.Errorf("admin GET under the override: %d %s, want the bucket's limit of 8", code, body)
			}
			w := serve(t, h, us)
			if got := w.Header().Get("RateLimit-Policy"); !strings.Contains(got, ";q=8;") || !strings.Contains(got, "-global\";q=20;") {
				t.Errorf("RateLimit-Policy %q, want q=8 and the global ceiling's q=20", got)
			}
			// us's own override (limit 1) wins over the identity's in us.
			if code, body := adminOverride(t, http.MethodPut, h.Name, "key=K&region=us&limit=1&ttl=30m"); code != http.StatusOK {
				t.Fatalf("PUT region: %d %s", code, body)
			}
			if w := serve(t, h, us); w.Code != http.StatusTooManyRequests || w.Header().Get("X-RateLimit-Limit") != "1" {
				t.Errorf("us under its own limit of 1 (1 used): %d, X-RateLimit-Limit %q", w.Code, w.Header().Get("X-RateLimit-Limit"))
			}
			code, body := adminOverride(t, http.MethodGet, h.Name, "key=K")
			var got struct {
				Overrides []overrideInfo `json:"overrides"`
			}
			if err := json.Unmarshal([]byte(body), &got); code != http.StatusOK || err != nil || len(got.Overrides) != 2 ||
				got.Overrides[0].Factor != 2 || got.Overrides[0].TTL != 3600 || got.Overrides[1].Region != "us" || got.Overrides[1].Limits[0] != 1 {
				t.Errorf("GET K's overrides: %d %s", code, body)
			}
			// A cost of 3 fits the configured limit of 4 but not us's 1: 413.
			big := map[string]string{"X-API-Key": "K", "X-Region": "us", "X-Cost": "3"}
			if w := serve(t, h, big); w.Code != http.StatusRequestEntityTooLarge {
				t.Errorf("cost 3 under an override limit of 1: %d, want 413", w.Code)
			}
			// DELETE us's: K in us is back under the identity's factor 2.
			if code, body := adminOverride(t, http.MethodDelete, h.Name, "key=K&region=us"); code != http.StatusOK || !strings.Contains(body, `"ended":true`) {
				t.Errorf("DELETE: %d %s", code, body)
			}
			if w := serve(t, h, us); w.Code != http.StatusOK || w.Header().Get("X-RateLimit-Limit") != "8" {
				t.Errorf("us after its override ended: %d, X-RateLimit-Limit %q, want 200 and 8", w.Code, w.Header().Get("X-RateLimit-Limit"))
			}
			if logs.FilterMessage("rate limit override set").Len() != 2 || logs.FilterMessage("rate limit override ended").Len() != 1 {
				t.Errorf("override changes logged: %s", renderLogs(logs))
			}
			for _, l := range logs.All() {
				if strings.Contains(l.Message, "override") && l.ContextMap()["key"] != nil {
					t.Errorf("the key logged without log_key: %v", l.ContextMap())
				}
			}
			// A reset leaves the override alone.
			adminDelete(t, h.Name, "K", "eu")
			if n := admitted(t, h, eu, 10); n != 8 {
				t.Errorf("eu after a reset admitted %d, want 8 (the override stays)", n)
			}

			for _, bad := range []struct{ query, want string }{
				{"key=K&factor=2", "ttl"},
				{"key=K&ttl=1h", "factor or limits"},
				{"key=K&ttl=1h&factor=2&limit=3", "not both"},
				{"key=K&ttl=1h&limit=3,4", "2 limits for 1 windows"},
				{"key=K&ttl=1h&factor=-1", "positive"},
				{"key=K&ttl=1h&limit=0", "1 to 2^50"},
				{"key=K&ttl=100d&factor=2", "1s to"},
				{"key=K&region=eu&ttl=1h&global_limit=50", "global ceiling"},
				{"ttl=1h&factor=2", "'key' is required"},
			} {
				if code, body := adminOverride(t, http.MethodPut, h.Name, bad.query); code != http.StatusBadRequest || !strings.Contains(body, bad.want) {
					t.Errorf("PUT %s: %d %q, want 400 naming %q", bad.query, code, body, bad.want)
				}
			}
		})
	}
}
