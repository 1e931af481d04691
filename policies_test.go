package slidingratelimit

// Several windows at once, the penalty box and calendar quotas, across
// Caddy nodes that share a Redis.

import (
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// nodes provisions n handlers as n Caddy nodes on one Redis (a client and
// pool each), from one configuration.
func nodes(t *testing.T, n int, srv *redistest.Server, clock *testClock, mk func() *Handler) []*Handler {
	t.Helper()
	hs := make([]*Handler, n)
	for i := range hs {
		h := mk()
		h.Redis = &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(5 * time.Second), PoolSize: 30 + i}
		provision(t, h, clock)
		hs[i] = h
	}
	return hs
}

// TestSeveralWindowsAcrossNodes: three nodes on one Redis, `limit 5 1s` and
// `limit 20 1m` on one key, concurrent requests from every node over 90
// seconds of (injected) time: no second admits more than 5, no minute more
// than 20, and a request denied by either window is recorded in neither
// (Redis holds exactly the admitted requests).
func TestSeveralWindowsAcrossNodes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	clock := newTestClock()
	name := uniqueName()
	hs := nodes(t, 3, srv, clock, func() *Handler {
		return &Handler{Name: name, Key: "{http.request.header.X-API-Key}",
			Limits: []LimitConfig{{Limit: "5", Window: caddy.Duration(time.Second)}, {Limit: "20", Window: caddy.Duration(time.Minute)}}}
	})
	start := clock.Now()
	var admitted []time.Duration
	denied := 0
	hdr := map[string]string{"X-API-Key": "k_live_42"}
	for step := 0; step < 900; step++ { // 100 ms steps
		clock.Advance(100 * time.Millisecond)
		at := clock.Now().Sub(start)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, h := range hs {
			for r := 0; r < 2; r++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					w, err := serveErr(t, h, hdr) // no t.Fatal off the test's goroutine
					if err != nil {
						t.Errorf("ServeHTTP: %v", err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					switch w.Code {
					case http.StatusOK:
						admitted = append(admitted, at)
					case http.StatusTooManyRequests:
						denied++
						if got := w.Header().Get("RateLimit-Policy"); got != `"`+name+`-1s";q=5;w=1, "`+name+`-1m";q=20;w=60` {
							t.Errorf("RateLimit-Policy %q", got)
						}
					default:
						t.Errorf("status %d", w.Code)
					}
				}()
			}
		}
		wg.Wait()
	}
	sort.Slice(admitted, func(i, j int) bool { return admitted[i] < admitted[j] })
	// Every window (t - w, t] ends at an admission: check those.
	for i, end := range admitted {
		in := func(w time.Duration) int {
			n := 0
			for _, a := range admitted[:i+1] {
				if a > end-w {
					n++
				}
			}
			return n
		}
		if n := in(time.Second); n > 5 {
			t.Fatalf("%d admitted in the second before %s", n, end)
		}
		if n := in(time.Minute); n > 20 {
			t.Fatalf("%d admitted in the minute before %s", n, end)
		}
	}
	// 90 s: the minute window admits 20, then 20 more once the first leave.
	if len(admitted) < 30 || denied == 0 {
		t.Fatalf("%d admitted, %d denied: the test did not load both windows", len(admitted), denied)
	}
	key := hs[0].rt.lim.Keys().Key("log", "k_live_42", false, "")
	recorded := logEntries(t, srv, key, clock.Now().Add(-time.Minute).UnixMicro())
	// Redis holds the requests of the last minute: exactly those admitted.
	last := 0
	for _, a := range admitted {
		if a > clock.Now().Sub(start)-time.Minute {
			last++
		}
	}
	if recorded != last {
		t.Fatalf("Redis records %d requests in the last minute, %d were admitted: denied requests were counted", recorded, last)
	}
	t.Logf("%d admitted, %d denied over 90 s from 3 nodes", len(admitted), denied)
}

// TestBanAcrossNodes: a key that hammers node A past its limit is banned;
// node B honours the ban at once, with Retry-After the ban's time left; an
// operator's reset through node A lifts it on B too.
func TestBanAcrossNodes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	clock := newTestClock()
	name := uniqueName()
	hs := nodes(t, 2, srv, clock, func() *Handler {
		return &Handler{Name: name, Key: "{http.request.header.X-API-Key}", Limit: "3", Window: caddy.Duration(10 * time.Second),
			Ban: &BanConfig{For: caddy.Duration(time.Hour), After: 5, Within: caddy.Duration(10 * time.Second)}}
	})
	a, b := hs[0], hs[1]
	hdr := map[string]string{"X-API-Key": "abuser"}
	for i := 0; i < 3; i++ {
		serve(t, a, hdr)
	}
	banned := false
	for i := 0; i < 20 && !banned; i++ { // denials, served partly by A's deny cache
		clock.Advance(100 * time.Millisecond)
		rec, r, repl := newRequest(hdr)
		if err := a.ServeHTTP(rec, r, nextOK); err != nil || rec.Code != http.StatusTooManyRequests {
			t.Fatalf("denial %d on A: %d %v", i, rec.Code, err)
		}
		v, _ := repl.GetString("http.sliding_ratelimit.banned")
		banned = v == "true"
	}
	if !banned {
		t.Fatal("A never banned the key")
	}
	clock.Advance(10 * time.Minute) // the windows are long empty; the ban is not
	rec, r, repl := newRequest(hdr)
	if err := b.ServeHTTP(rec, r, nextOK); err != nil || rec.Code != http.StatusTooManyRequests {
		t.Fatalf("B, 10 minutes into the ban: %d %v", rec.Code, err)
	}
	if v, _ := repl.GetString("http.sliding_ratelimit.banned"); v != "true" {
		t.Errorf("B: banned placeholder %q", v)
	}
	retry, _ := strconv.Atoi(rec.Header().Get("Retry-After"))
	if left := 50 * 60; retry < left-2 || retry > left {
		t.Errorf("B: Retry-After %d, want the ban's time left, about %d", retry, left)
	}
	if !strings.Contains(rec.Body.String(), `"reason":"banned"`) {
		t.Errorf("B: body %s", rec.Body)
	}
	if _, err := a.rt.lim.Reset(t.Context(), "abuser", ""); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for serve(t, b, hdr).Code != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("B still refuses the key 2 s after the ban was lifted through A")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMonthlyQuotaInATimeZone: `limit 3 month` with `timezone
// Europe/Berlin`. In March 2026 the clocks go forward on the 29th; the month
// ends at midnight, Berlin time, on April 1st. A denial's Retry-After is
// the seconds until then, before and after the change; the policy's w is
// the month's length (an hour short of 31 days); on April 1st the quota
// starts again. On the in-process store and on Redis.
func TestMonthlyQuotaInATimeZone(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			clock := &testClock{t: time.Date(2026, 3, 27, 12, 0, 0, 0, berlin)}
			h := &Handler{Name: uniqueName(), Limits: []LimitConfig{{Limit: "3", Period: "month"}}, Timezone: "Europe/Berlin"}
			if store == "redis" {
				h.Redis = &RedisConfig{Addresses: []string{srv.Addr()}, Timeout: caddy.Duration(5 * time.Second)}
			}
			provision(t, h, clock)
			for i := 0; i < 3; i++ {
				if w := serve(t, h, nil); w.Code != http.StatusOK {
					t.Fatalf("request %d: %d", i+1, w.Code)
				}
			}
			next := time.Date(2026, 4, 1, 0, 0, 0, 0, berlin)
			for _, at := range []time.Time{
				time.Date(2026, 3, 27, 12, 0, 0, 0, berlin),
				time.Date(2026, 3, 29, 1, 59, 59, 0, berlin), // just before the change
				time.Date(2026, 3, 29, 3, 0, 0, 0, berlin),   // just after it
				time.Date(2026, 3, 31, 23, 59, 59, 0, berlin),
			} {
				clock.Set(at)
				w := serve(t, h, nil)
				if w.Code != http.StatusTooManyRequests {
					t.Fatalf("at %s: %d, want 429", at, w.Code)
				}
				want := int64(next.Sub(at) / time.Second)
				if got := w.Header().Get("Retry-After"); got != strconv.FormatInt(want, 10) {
					t.Errorf("at %s: Retry-After %s, want %d (until April 1st, Berlin)", at, got, want)
				}
				if got, wantW := w.Header().Get("RateLimit-Policy"), ";w="+strconv.Itoa(31*24*3600-3600); !strings.Contains(got, wantW) {
					t.Errorf("at %s: RateLimit-Policy %q, want %s", at, got, wantW)
				}
			}
			clock.Set(next)
			if w := serve(t, h, nil); w.Code != http.StatusOK {
				t.Fatalf("on April 1st: %d, want 200", w.Code)
			}
			if got := serve(t, h, nil).Header().Get("RateLimit-Policy"); !strings.Contains(got, ";w="+strconv.Itoa(30*24*3600)) {
				t.Errorf("in April: RateLimit-Policy %q, want a 30-day period", got)
			}
		})
	}
}
