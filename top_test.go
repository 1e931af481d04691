package slidingratelimit

// Top offenders: what the admin API's /top shows after traffic, over which
// span, with which keys; the hammered key found among a million.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// sha12 is the first 12 hex digits of the SHA-256 of s, as an operator
// computes it: printf %s "$KEY" | sha256sum | cut -c1-12.
func sha12(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:12]
}

// adminTop reads the limiter's top offenders through the admin API.
func adminTop(t *testing.T, name, query string) topInfo {
	t.Helper()
	code, body := adminGet(t, name+"/top", query)
	if code != http.StatusOK {
		t.Fatalf("GET /top?%s: %d %s", query, code, body)
	}
	var info topInfo
	if err := json.Unmarshal([]byte(body), &info); err != nil {
		t.Fatalf("top: %v in %s", err, body)
	}
	return info
}

// TestTopOffenders: after traffic, /top lists the keys by denials and by
// near-limit crossings, as hashes the key GET also shows; with log_key as
// the keys themselves.
func TestTopOffenders(t *testing.T) {
	t.Parallel()
	for _, logKey := range []bool{false, true} {
		t.Run("log_key="+strconv.FormatBool(logKey), func(t *testing.T) {
			t.Parallel()
			clock := newTestClock()
			h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-Key}", Region: "{http.request.header.X-Region}",
				Limit: "3", Window: caddy.Duration(time.Minute), WarnAt: 0.6, LogKey: logKey}
			provision(t, h, clock)
			send := func(key string, n int) {
				for range n {
					serve(t, h, map[string]string{"X-Key": key, "X-Region": "us"})
				}
			}
			send("k_live_A", 10) // 7 denied; the 2nd crosses 0.6 of 3
			clock.Advance(time.Second)
			send("k_live_B", 5) // 2 denied
			clock.Advance(time.Second)
			send("k_live_C", 2) // near only
			info := adminTop(t, h.Name, "")
			if len(info.Denied) != 2 || len(info.NearLimit) != 3 {
				t.Fatalf("top: %+v, want 2 denied and 3 near-limit keys", info)
			}
			a, b := info.Denied[0], info.Denied[1]
			if a.KeyHash != sha12("k_live_A") || a.Region != "us" || a.Denials != 7 || a.DenialsError != 0 ||
				a.NearLimit != 1 || a.RetryAfter < 59 || a.RetryAfter > 60 || !a.LastSeen.Equal(clock.Now().Add(-2*time.Second)) {
				t.Errorf("first: %+v, want k_live_A's hash, us, 7 denials, 1 near-limit crossing, retry 60, seen 2s ago", a)
			}
			if b.KeyHash != sha12("k_live_B") || b.Denials != 2 {
				t.Errorf("second: %+v, want k_live_B's hash, 2 denials", b)
			}
			// Near-limit crossings: one each; the most recent first.
			for i, k := range []string{"k_live_C", "k_live_B", "k_live_A"} {
				if n := info.NearLimit[i]; n.KeyHash != sha12(k) || n.NearLimit != 1 {
					t.Errorf("near_limit[%d]: %+v, want %s once", i, n, k)
				}
			}
			if c := info.NearLimit[0]; c.Denials != 0 || c.RetryAfter != 0 {
				t.Errorf("k_live_C was never denied: %+v", c)
			}
			if logKey != (a.Key == "k_live_A") || info.KeysShown != map[bool]string{false: "hash", true: "raw"}[logKey] {
				t.Errorf("log_key %v: key %q, keys_shown %q", logKey, a.Key, info.KeysShown)
			}
			if logKey != strings.Contains(mustGet(t, h.Name+"/top", "").body, "k_live_A") {
				t.Errorf("log_key %v: the raw key in the answer: %v", logKey, !logKey)
			}
			// The key GET shows the same hash.
			code, body := adminGet(t, h.Name, "key=k_live_A&region=us")
			var u usageInfo
			if err := json.Unmarshal([]byte(body), &u); err != nil || code != http.StatusOK || u.KeyHash != a.KeyHash {
				t.Errorf("GET ?key=k_live_A: %d %s, want key_hash %s", code, body, a.KeyHash)
			}
			if got := adminTop(t, h.Name, "n=1"); len(got.Denied) != 1 || len(got.NearLimit) != 1 {
				t.Errorf("n=1: %d and %d entries", len(got.Denied), len(got.NearLimit))
			}
		})
	}
}

type response struct {
	code int
	body string
}

func mustGet(t *testing.T, path, query string) response {
	t.Helper()
	code, body := adminGet(t, path, query)
	return response{code, body}
}

// TestTopRequests: the path and n are checked; a trailing slash is fine.
func TestTopRequests(t *testing.T) {
	t.Parallel()
	h := &Handler{Name: uniqueName(), Limit: "3", Window: caddy.Duration(time.Minute)}
	provision(t, h, newTestClock())
	for _, tc := range []struct {
		path, query string
		code        int
		body        string
	}{
		{h.Name + "/top", "", http.StatusOK, `"denied":[]`},
		{h.Name + "/top/", "n=1024", http.StatusOK, `"counters":1024`},
		{h.Name + "/top", "n=0", http.StatusBadRequest, "n must be an integer from 1 to 1024, got '0'"},
		{h.Name + "/top", "n=1025", http.StatusBadRequest, "got '1025'"},
		{h.Name + "/top", "n=ten", http.StatusBadRequest, "got 'ten'"},
		{h.Name + "/nope", "", http.StatusNotFound, "limiter '" + h.Name + "' has no 'nope' (it has: top, override)"},
		{"no_such_limiter/top", "", http.StatusNotFound, "no limiter named 'no_such_limiter'"},
		{h.Name + "/", "", http.StatusBadRequest, "query parameter 'key' is required"},
	} {
		if r := mustGet(t, tc.path, tc.query); r.code != tc.code || !strings.Contains(r.body, tc.body) {
			t.Errorf("GET %s?%s: %d %s, want %d %s", tc.path, tc.query, r.code, r.body, tc.code, tc.body)
		}
	}
	w, r := httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/sliding_ratelimit/"+h.Name+"/top", nil)
	var ae caddy.APIError
	if err := (&AdminAPI{}).serve(w, r); !errorsAs(err, &ae) || ae.HTTPStatus != http.StatusMethodNotAllowed {
		t.Errorf("POST /top: %v, want 405", err)
	}
}

// TestTopSpan: an event counts for the epoch it fell in and the next: the
// last 5 to 10 minutes. Counts of one key in both epochs add up.
func TestTopSpan(t *testing.T) {
	t.Parallel()
	o := newOffenders()
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	note := func(key string, at time.Duration) { o.note(kindDenied, key, "", false, 1, t0.Add(at)) }
	denials := func(at time.Duration) map[string]int64 {
		got := map[string]int64{}
		for _, of := range o.report("x", 10, false, t0.Add(at)).Denied {
			got[of.KeyHash] = of.Denials
		}
		return got
	}
	for range 3 {
		note("A", 0)
	}
	note("A", 4*time.Minute)
	note("B", 6*time.Minute)
	note("A", 7*time.Minute)
	if got := denials(9 * time.Minute); got[sha12("A")] != 5 || got[sha12("B")] != 1 {
		t.Fatalf("at 9m: %v, want A 5 (both epochs), B 1", got)
	}
	if since := o.report("x", 10, false, t0.Add(9*time.Minute)).Since; !since.Equal(t0) {
		t.Fatalf("since %v, want %v", since, t0)
	}
	// At 10m the first epoch ends: A keeps its denial of 7m.
	if got := denials(10 * time.Minute); got[sha12("A")] != 1 || got[sha12("B")] != 1 {
		t.Fatalf("at 10m: %v, want A 1, B 1", got)
	}
	if got := denials(20 * time.Minute); len(got) != 0 {
		t.Fatalf("at 20m: %v, want nothing", got)
	}
	// A quiet hour, then an event: a fresh start.
	note("C", 90*time.Minute)
	if got := denials(91 * time.Minute); len(got) != 1 || got[sha12("C")] != 1 {
		t.Fatalf("after an hour: %v, want C 1", got)
	}
}

// TestTopCountsCachedDenials: on Redis, denials served by the deny cache
// are counted as every other denial.
func TestTopCountsCachedDenials(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-Key}", Limit: "2", Window: caddy.Duration(time.Minute),
		Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(2 * time.Second)}}
	provision(t, h, newTestClock())
	cached := 0
	for range 6 {
		w, r, repl := newRequest(map[string]string{"X-Key": "K"})
		if err := h.ServeHTTP(w, r, nextOK); err != nil {
			t.Fatal(err)
		}
		if v, _ := repl.GetString(phSource); v == sourceDenyCache {
			cached++
		}
	}
	info := adminTop(t, h.Name, "")
	if cached == 0 || len(info.Denied) != 1 || info.Denied[0].Denials != 4 || info.Denied[0].KeyHash != sha12("K") {
		t.Fatalf("%d cached denials; top %+v, want K with 4 denials", cached, info.Denied)
	}
}

// TestTopSurvivesReload: a new config's limiter of the same name keeps the
// top offenders.
func TestTopSurvivesReload(t *testing.T) {
	t.Parallel()
	name := uniqueName()
	old := &Handler{Name: name, Key: "{http.request.header.X-Key}", Limit: "1", Window: caddy.Duration(time.Minute)}
	provision(t, old, newTestClock())
	serve(t, old, map[string]string{"X-Key": "K"})
	serve(t, old, map[string]string{"X-Key": "K"})
	reloaded := &Handler{Name: name, Key: "{http.request.header.X-Key}", Limit: "5", Window: caddy.Duration(time.Minute)}
	provision(t, reloaded, newTestClock())
	old.Cleanup()
	if info := adminTop(t, name, ""); len(info.Denied) != 1 || info.Denied[0].Denials != 1 {
		t.Fatalf("after a reload: %+v, want K's denial", info.Denied)
	}
}

// TestTopNoteAllocatesNothingForAKnownKey: counting a key that holds a
// counter allocates nothing (and allowed requests never reach it).
func TestTopNoteAllocatesNothingForAKnownKey(t *testing.T) {
	o := newOffenders()
	now := time.Now()
	o.note(kindDenied, "hot", "us", true, 3, now)
	if n := testing.AllocsPerRun(1000, func() { o.note(kindDenied, "hot", "us", true, 3, now) }); n != 0 {
		t.Fatalf("%v allocations per denial of a known key", n)
	}
}

// TestTopFindsTheHammeredKeyAmongAMillion: one key of 1,000 hammered past
// its limit is listed first by /top on a node whose limiter has denied a
// million distinct keys meanwhile, and the sketch's memory stays flat. The
// 1,000 keys go through the handler; the million distinct denials go
// through the handler's observe, where the decision is rendered and the
// sketch is fed.
func TestTopFindsTheHammeredKeyAmongAMillion(t *testing.T) {
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-Key}", Limit: "10", Window: caddy.Duration(time.Hour)}
	provision(t, h, newTestClock())
	hot := "k_live_hammer"
	hotDenied := 0
	request := func(key string) {
		w := serve(t, h, map[string]string{"X-Key": key})
		if key == hot && w.Code == http.StatusTooManyRequests {
			hotDenied++
		}
	}
	// The 1,000 keys: 999 under their limit, one hammered.
	for i := range 999 {
		for range 3 {
			request("k_live_" + strconv.Itoa(i))
		}
		request(hot)
	}
	// A million distinct keys, each denied once; the hammered key goes on.
	repl := caddy.NewReplacer()
	d := limiter.Decision{Outcome: limiter.OutcomeLimited, Source: limiter.SourceMemory, RetryAfter: 30 * time.Second, Cost: 1}
	var heap100k uint64
	for i := 1; i <= 1_000_000; i++ {
		d.Identity = "k_one_" + strconv.Itoa(i)
		h.observe(placeholders(context.Background(), repl), &d)
		if i%250 == 0 {
			request(hot)
		}
		if i == 100_000 {
			heap100k = liveHeap()
		}
	}
	heap1M := liveHeap()

	info := adminTop(t, h.Name, "n=3")
	first := info.Denied[0]
	if first.KeyHash != sha12(hot) {
		t.Fatalf("top: %+v, want %s (%s) first", info.Denied, hot, sha12(hot))
	}
	if int64(hotDenied) < first.Denials-first.DenialsError || int64(hotDenied) > first.Denials {
		t.Fatalf("%s denied %d times; top says %d (error %d)", hot, hotDenied, first.Denials, first.DenialsError)
	}
	if second := info.Denied[1]; second.Denials >= first.Denials-first.DenialsError {
		t.Fatalf("second %+v not below the first %+v", second, first)
	}
	t.Logf("top after 1,000,000 distinct denied keys: %s denied %d, top says %d±%d; next %+v",
		hot, hotDenied, first.Denials, first.DenialsError, info.Denied[1])

	// Fixed memory: the sketch holds its 1,024 counters, in its own
	// arrays; the live heap did not grow with 900,000 more keys (storing
	// even 8 bytes per key would take 7 MB).
	for _, s := range h.rt.top.epochs[kindDenied] {
		if s != nil && (len(s.counters) > topCounters || cap(s.counters) != topCounters || len(s.index) != 2*topCounters) {
			t.Fatalf("sketch: %d counters (cap %d), %d index slots", len(s.counters), cap(s.counters), len(s.index))
		}
	}
	if s := h.rt.top.epochs[kindDenied][0]; len(s.counters) != topCounters {
		t.Fatalf("%d counters in use, want all %d", len(s.counters), topCounters)
	}
	growth := int64(heap1M) - int64(heap100k)
	t.Logf("live heap: %d KiB after 100,000 keys, %d KiB after 1,000,000 (%+d KiB)", heap100k>>10, heap1M>>10, growth>>10)
	if growth > 2<<20 {
		t.Fatalf("the live heap grew by %d KiB from 100,000 to 1,000,000 keys", growth>>10)
	}
}

// liveHeap is the bytes of live heap objects after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
