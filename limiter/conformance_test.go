package limiter_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// t0 is the conformance table's origin; every case runs on an injected clock.
// It is 1 s before the start of a minute (and so of a 2 s or 10 s window).
var t0 = time.Date(2026, 11, 29, 11, 59, 59, 0, time.UTC)

// b0 is the offset of the first window boundary after t0.
const b0 = time.Second

// step is one request of a conformance case and what it must get.
type step struct {
	at     time.Duration // offset from t0
	region string        // "" uses the case's default region
	cost   int64
	peek   bool
	n      int // repeat the step n times (0 means 1); expectations apply to the last

	allowed   bool
	count     int64 // bucket count after the request; -1 skips the check
	retry     time.Duration
	global    int64 // global count after the request, when the case has one; -1 skips
	globalDen bool
	reset     time.Duration // bucket's ResetAfter, checked when chkReset
	chkReset  bool
}

type confCase struct {
	name        string
	alg         limiter.Algorithm
	limit       int64
	burst       int64 // token_bucket capacity; 0 means limit
	window      time.Duration
	region      bool
	globalLimit int64
	steps       []step
}

var conformance = []confCase{
	{
		// DESIGN.md's window-boundary case: a fixed window would admit again
		// at t+1s; the sliding log must not, until t+60.000001s.
		name: "sliding_log/window boundary", alg: limiter.SlidingLog, limit: 100, window: time.Minute,
		steps: []step{
			{at: 0, n: 100, allowed: true, count: 100},
			{at: 0, allowed: false, count: 100, retry: time.Minute},
			{at: time.Second, allowed: false, count: 100, retry: 59 * time.Second},
			{at: time.Minute - time.Microsecond, allowed: false, count: 100, retry: time.Microsecond},
			{at: time.Minute + time.Microsecond, allowed: true, count: 1},
			{at: time.Minute + time.Microsecond, n: 99, allowed: true, count: 100},
			{at: time.Minute + 2*time.Microsecond, allowed: false, count: 100, retry: time.Minute - time.Microsecond},
		},
	},
	{
		name: "sliding_log/slides entry by entry", alg: limiter.SlidingLog, limit: 3, window: 10 * time.Second,
		steps: []step{
			{at: 0, allowed: true, count: 1},
			{at: 2 * time.Second, allowed: true, count: 2},
			{at: 4 * time.Second, allowed: true, count: 3},
			{at: 5 * time.Second, allowed: false, count: 3, retry: 5 * time.Second},
			{at: 10 * time.Second, allowed: true, count: 3}, // t0's entry is exactly one window old: out
			{at: 11 * time.Second, allowed: false, count: 3, retry: time.Second},
			{at: 12 * time.Second, allowed: true, count: 3},
		},
	},
	{
		name: "sliding_log/rejections are not recorded", alg: limiter.SlidingLog, limit: 2, window: 10 * time.Second,
		steps: []step{
			{at: 0, n: 2, allowed: true, count: 2},
			{at: 1 * time.Second, n: 50, allowed: false, count: 2, retry: 9 * time.Second},
			{at: 10 * time.Second, n: 2, allowed: true, count: 2},
		},
	},
	{
		name: "sliding_log/cost", alg: limiter.SlidingLog, limit: 10, window: 10 * time.Second,
		steps: []step{
			{at: 0, cost: 4, allowed: true, count: 4},
			{at: time.Second, cost: 4, allowed: true, count: 8},
			{at: 2 * time.Second, cost: 4, allowed: false, count: 8, retry: 8 * time.Second},
			{at: 2 * time.Second, cost: 2, allowed: true, count: 10},
			{at: 10 * time.Second, cost: 4, allowed: true, count: 10},
			{at: 10 * time.Second, cost: 11, allowed: false, count: 10, retry: 10 * time.Second},
		},
	},
	{
		name: "sliding_log/peek records nothing", alg: limiter.SlidingLog, limit: 2, window: 10 * time.Second,
		steps: []step{
			{at: 0, peek: true, n: 5, allowed: true, count: 0},
			{at: 0, allowed: true, count: 1},
			{at: 0, peek: true, allowed: true, count: 1},
			{at: 0, allowed: true, count: 2},
			{at: time.Second, peek: true, allowed: false, count: 2, retry: 9 * time.Second},
		},
	},
	{
		name: "sliding_log/regions are independent", alg: limiter.SlidingLog, limit: 2, window: 10 * time.Second, region: true,
		steps: []step{
			{at: 0, region: "us", n: 2, allowed: true, count: 2},
			{at: 0, region: "us", allowed: false, count: 2, retry: 10 * time.Second},
			{at: 0, region: "gb", allowed: true, count: 1},
		},
	},
	{
		// Issue 4's case: region limit 5, global 7. The global denial leaves
		// gb's bucket untouched, the region denial leaves the global alone.
		name: "sliding_log/global ceiling", alg: limiter.SlidingLog, limit: 5, window: 10 * time.Second, region: true, globalLimit: 7,
		steps: []step{
			{at: 0, region: "us", n: 5, allowed: true, count: 5, global: 5},
			{at: 0, region: "us", allowed: false, count: 5, global: 5, retry: 10 * time.Second},
			{at: time.Second, region: "gb", n: 2, allowed: true, count: 2, global: 7},
			{at: 2 * time.Second, region: "gb", allowed: false, count: 2, global: 7, globalDen: true, retry: 8 * time.Second},
			{at: 2 * time.Second, region: "us", allowed: false, count: 5, global: 7, globalDen: true, retry: 8 * time.Second},
			{at: 10 * time.Second, region: "gb", allowed: true, count: 3, global: 3},
			{at: 11 * time.Second, region: "us", n: 4, allowed: true, count: 4, global: 5},
		},
	},
	// ---- sliding_counter ------------------------------------------------
	// b0 = t0 + 1s starts a window of every length used below (t0 is 9 s
	// into a 10 s window and 59 s into a minute); e is the time elapsed in
	// the current window, est = prev*(W-e)/W + cur.
	{
		// DESIGN.md's window-boundary case on the counter: 100 at t0 (59 s
		// into the window), then the window turns over at t0+1s. The previous
		// window still weighs 100*(60-e)/60, so nothing gets in until that
		// drops to 99 at e = 0.6 s: no 2x across the boundary.
		name: "sliding_counter/window boundary: no 2x across a boundary", alg: limiter.SlidingCounter, limit: 100, window: time.Minute,
		steps: []step{
			{at: 0, n: 100, allowed: true, count: 100, reset: 1600 * time.Millisecond, chkReset: true},
			{at: 0, allowed: false, count: 100, retry: 1600 * time.Millisecond},
			{at: time.Second, allowed: false, count: 100, retry: 600 * time.Millisecond},
			{at: 1600*time.Millisecond - time.Microsecond, allowed: false, count: 100, retry: time.Microsecond},
			{at: 1600 * time.Millisecond, allowed: true, count: 100},
			// est = 99 + 1; 99 again at e = 1.2 s (100*58.8/60 + 1).
			{at: 1600 * time.Millisecond, allowed: false, count: 100, retry: 600 * time.Millisecond},
			{at: 2200 * time.Millisecond, allowed: true, count: 100},
		},
	},
	{
		name: "sliding_counter/previous window weighted by overlap", alg: limiter.SlidingCounter, limit: 10, window: 10 * time.Second,
		steps: []step{
			// est 6 drops to 5 at 6*(W-x)/W = 5 in the next window: x = W/6.
			{at: b0, cost: 6, allowed: true, count: 6, reset: 11666667 * time.Microsecond, chkReset: true},
			{at: b0 + 5*time.Second, cost: 4, allowed: true, count: 10},
			// Full; 10*(W-x)/W <= 9 at x = 1 s into the next window.
			{at: b0 + 9*time.Second, allowed: false, count: 10, retry: 2 * time.Second},
			{at: b0 + 11*time.Second, allowed: true, count: 10},                    // est 9 + 1
			{at: b0 + 12500*time.Millisecond, peek: true, allowed: true, count: 9}, // 7.5 + 1 = 8.5
			// Cost 2 needs est <= 8: 10*(W-x)/W + 1 <= 8 at x = 3 s.
			{at: b0 + 12500*time.Millisecond, cost: 2, allowed: false, count: 9, retry: 500 * time.Millisecond},
			{at: b0 + 13*time.Second, cost: 2, allowed: true, count: 10}, // 7 + 1 + 2
		},
	},
	{
		name: "sliding_counter/peek, cost and rejections", alg: limiter.SlidingCounter, limit: 4, window: 10 * time.Second,
		steps: []step{
			{at: b0, peek: true, n: 3, allowed: true, count: 0, reset: 0, chkReset: true},
			{at: b0, cost: 3, allowed: true, count: 3, reset: 13333334 * time.Microsecond, chkReset: true},
			// Cost 2 needs est <= 2: 3*(W-x)/W <= 2 at x = W/3 (rounded up
			// to the µs) into the next window.
			{at: b0 + 5*time.Second, cost: 2, allowed: false, count: 3, retry: 8333334 * time.Microsecond},
			{at: b0 + 5*time.Second, cost: 2, n: 10, allowed: false, count: 3, retry: 8333334 * time.Microsecond},
			{at: b0 + 5*time.Second, allowed: true, count: 4},
			{at: b0 + 5*time.Second, peek: true, allowed: false, count: 4, retry: 7500 * time.Millisecond},
			{at: b0 + 5*time.Second, cost: 5, allowed: false, count: 4, retry: 10 * time.Second},
			{at: b0 + 12500*time.Millisecond, allowed: true, count: 4}, // 4*0.75 + 1
		},
	},
	{
		// The hash carries its window index: a key two windows old reads as
		// empty on its own, whether or not Redis has expired it yet (on the
		// injected clock it has not).
		name: "sliding_counter/stale state reads as empty", alg: limiter.SlidingCounter, limit: 5, window: 10 * time.Second,
		steps: []step{
			{at: b0, n: 5, allowed: true, count: 5},
			{at: b0 + 10*time.Second, allowed: false, count: 5, retry: 2 * time.Second},
			{at: b0 + 20*time.Second, allowed: true, count: 1},
		},
	},
	{
		name: "sliding_counter/global ceiling", alg: limiter.SlidingCounter, limit: 5, window: 10 * time.Second, region: true, globalLimit: 7,
		steps: []step{
			{at: b0, region: "us", n: 5, allowed: true, count: 5, global: 5},
			// 5*(W-x)/W <= 4 at x = 2 s into the next window.
			{at: b0, region: "us", allowed: false, count: 5, global: 5, retry: 12 * time.Second},
			{at: b0 + time.Second, region: "gb", n: 2, allowed: true, count: 2, global: 7},
			// The global 7*(W-x)/W <= 6 at x = W/7 into the next window.
			{at: b0 + 2*time.Second, region: "gb", allowed: false, count: 2, global: 7, globalDen: true, retry: 9428572 * time.Microsecond},
			{at: b0 + 2*time.Second, region: "us", allowed: false, count: 5, global: 7, globalDen: true, retry: 10 * time.Second},
			{at: b0 + 20*time.Second, region: "gb", allowed: true, count: 1, global: 1},
			{at: b0 + 20*time.Second, region: "us", n: 5, allowed: true, count: 5, global: 6},
			{at: b0 + 20*time.Second, region: "gb", allowed: true, count: 2, global: 7},
		},
	},

	// ---- fixed_window ---------------------------------------------------
	{
		// DESIGN.md's window-boundary case on a fixed window: the minute
		// turns over at t0+1s and the counter starts from zero, so 200
		// requests pass within one second. This is the leak the sliding
		// algorithms exist to prevent.
		name: "fixed_window/window boundary: lets 2x the limit through across a boundary (by design)", alg: limiter.FixedWindow, limit: 100, window: time.Minute,
		steps: []step{
			{at: 0, n: 100, allowed: true, count: 100, reset: time.Second, chkReset: true},
			{at: 0, allowed: false, count: 100, retry: time.Second},
			{at: time.Second - time.Microsecond, allowed: false, count: 100, retry: time.Microsecond},
			{at: time.Second, n: 100, allowed: true, count: 100}, // 200 admitted in 1 s
			{at: time.Second, allowed: false, count: 100, retry: time.Minute},
			{at: 61*time.Second - time.Microsecond, allowed: false, count: 100, retry: time.Microsecond},
			{at: 61 * time.Second, allowed: true, count: 1, reset: time.Minute, chkReset: true},
		},
	},
	{
		name: "fixed_window/peek, cost and rejections", alg: limiter.FixedWindow, limit: 5, window: 10 * time.Second,
		steps: []step{
			{at: b0, peek: true, n: 3, allowed: true, count: 0, reset: 0, chkReset: true},
			{at: b0, cost: 3, allowed: true, count: 3, reset: 10 * time.Second, chkReset: true},
			{at: b0 + time.Second, cost: 3, allowed: false, count: 3, retry: 9 * time.Second},
			{at: b0 + 2*time.Second, cost: 3, n: 20, allowed: false, count: 3, retry: 8 * time.Second},
			{at: b0 + 2*time.Second, cost: 2, allowed: true, count: 5, reset: 8 * time.Second, chkReset: true},
			{at: b0 + 10*time.Second - time.Microsecond, peek: true, allowed: false, count: 5, retry: time.Microsecond},
			{at: b0 + 10*time.Second, cost: 6, allowed: false, count: 0, retry: 10 * time.Second},
			{at: b0 + 10*time.Second, cost: 5, allowed: true, count: 5},
		},
	},
	{
		name: "fixed_window/stale state reads as empty", alg: limiter.FixedWindow, limit: 5, window: 10 * time.Second,
		steps: []step{
			{at: b0, n: 5, allowed: true, count: 5},
			{at: b0 + 10*time.Second, allowed: true, count: 1},
			{at: b0 + 30*time.Second, allowed: true, count: 1},
		},
	},
	{
		name: "fixed_window/global ceiling", alg: limiter.FixedWindow, limit: 5, window: 10 * time.Second, region: true, globalLimit: 7,
		steps: []step{
			{at: b0, region: "us", n: 5, allowed: true, count: 5, global: 5},
			{at: b0, region: "us", allowed: false, count: 5, global: 5, retry: 10 * time.Second},
			{at: b0 + time.Second, region: "gb", n: 2, allowed: true, count: 2, global: 7},
			{at: b0 + 2*time.Second, region: "gb", allowed: false, count: 2, global: 7, globalDen: true, retry: 8 * time.Second},
			{at: b0 + 2*time.Second, region: "us", allowed: false, count: 5, global: 7, globalDen: true, retry: 8 * time.Second},
			{at: b0 + 10*time.Second, region: "gb", allowed: true, count: 1, global: 1},
			{at: b0 + 11*time.Second, region: "us", n: 5, allowed: true, count: 5, global: 6},
			{at: b0 + 11*time.Second, region: "gb", allowed: true, count: 2, global: 7},
		},
	},

	// ---- token_bucket (GCRA) ----------------------------------------------
	// Emission interval T = window/limit; the bucket holds burst units
	// (burst 0: limit); count = units in use; reset = time until full.
	{
		// 100 per minute: T = 600 ms. A full bucket takes 100 at once, then
		// one unit comes back every 600 ms.
		name: "token_bucket/full burst, then one unit per interval", alg: limiter.TokenBucket, limit: 100, window: time.Minute,
		steps: []step{
			{at: 0, n: 100, allowed: true, count: 100, reset: time.Minute, chkReset: true},
			{at: 0, allowed: false, count: 100, retry: 600 * time.Millisecond},
			{at: 600*time.Millisecond - time.Microsecond, allowed: false, count: 100, retry: time.Microsecond},
			{at: 600 * time.Millisecond, allowed: true, count: 100},
			{at: time.Second, allowed: false, count: 100, retry: 200 * time.Millisecond},
			{at: 30*time.Second + 600*time.Millisecond, peek: true, allowed: true, count: 50, reset: 30 * time.Second, chkReset: true},
			{at: 60*time.Second + 600*time.Millisecond, peek: true, allowed: true, count: 0, reset: 0, chkReset: true},
			{at: 60*time.Second + 600*time.Millisecond, n: 100, allowed: true, count: 100},
		},
	},
	{
		name: "token_bucket/burst below the limit", alg: limiter.TokenBucket, limit: 10, burst: 3, window: 10 * time.Second,
		steps: []step{
			{at: 0, n: 3, allowed: true, count: 3, reset: 3 * time.Second, chkReset: true},
			{at: 0, allowed: false, count: 3, retry: time.Second},
			{at: time.Second, allowed: true, count: 3},
			{at: 5 * time.Second, cost: 3, allowed: true, count: 3},
			{at: 5 * time.Second, cost: 4, allowed: false, count: 3, retry: 10 * time.Second}, // cost > burst
			{at: 8 * time.Second, cost: 3, allowed: true, count: 3},
		},
	},
	{
		// 3 per 2 s: T = 666666.67 µs, kept as 666667 µs. Rounding T once
		// keeps the state exact, so the third unit of the burst still fits at
		// once and one admission counts as exactly one unit.
		name: "token_bucket/interval not a whole µs: a full burst still fits at once", alg: limiter.TokenBucket, limit: 3, window: 2 * time.Second,
		steps: []step{
			{at: 0, allowed: true, count: 1, reset: 666667 * time.Microsecond, chkReset: true},
			{at: 0, n: 2, allowed: true, count: 3},
			{at: 0, allowed: false, count: 3, retry: 666667 * time.Microsecond},
			{at: 666667 * time.Microsecond, allowed: true, count: 3},
		},
	},
	{
		name: "token_bucket/peek and rejections record nothing", alg: limiter.TokenBucket, limit: 2, window: 10 * time.Second,
		steps: []step{
			{at: 0, peek: true, n: 5, allowed: true, count: 0},
			{at: 0, allowed: true, count: 1},
			{at: 0, peek: true, allowed: true, count: 1},
			{at: 0, allowed: true, count: 2},
			{at: time.Second, peek: true, allowed: false, count: 2, retry: 4 * time.Second},
			{at: time.Second, n: 50, allowed: false, count: 2, retry: 4 * time.Second},
			{at: 5 * time.Second, allowed: true, count: 2},
		},
	},
	{
		// Region: T = 2 s. Global: T = 10 s / 7 = 1428571 µs.
		name: "token_bucket/global ceiling", alg: limiter.TokenBucket, limit: 5, window: 10 * time.Second, region: true, globalLimit: 7,
		steps: []step{
			{at: b0, region: "us", n: 5, allowed: true, count: 5, global: 5},
			{at: b0, region: "us", allowed: false, count: 5, global: 5, retry: 2 * time.Second},
			{at: b0 + time.Second, region: "gb", n: 2, allowed: true, count: 2, global: 7},
			// The global's TAT is b0 + 1 s + 8999997 µs; one more unit needs
			// 8999997 + 1428571 - 7 * 1428571 = 428571 µs more.
			{at: b0 + time.Second, region: "gb", allowed: false, count: 2, global: 7, globalDen: true, retry: 428571 * time.Microsecond},
			{at: b0 + time.Second, region: "us", allowed: false, count: 5, global: 7, globalDen: true, retry: time.Second},
			{at: b0 + 11*time.Second, region: "gb", allowed: true, count: 1, global: 1},
			{at: b0 + 11*time.Second, region: "us", n: 5, allowed: true, count: 5, global: 6},
			{at: b0 + 11*time.Second, region: "us", allowed: false, count: 5, global: 6, retry: 2 * time.Second},
		},
	},
}

// storeFactory opens a store for one test.
type storeFactory struct {
	name string
	open func(t *testing.T) limiter.Store
}

// storeFactories lists every store the conformance table runs against. The
// real redis-server is started once for the calling test (t), and every case
// uses its own random identity on it.
func storeFactories(t *testing.T) []storeFactory {
	srv := redistest.Start(t)
	client := srv.Client(t)
	return []storeFactory{
		{"memory", func(t *testing.T) limiter.Store {
			s := limiter.NewMemoryStore()
			t.Cleanup(func() { s.Close() })
			return s
		}},
		{"miniredis", func(t *testing.T) limiter.Store {
			m := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { c.Close() })
			return limiter.NewRedisStore(c)
		}},
		{"redis-server", func(t *testing.T) limiter.Store {
			return limiter.NewRedisStore(client)
		}},
		{"redis-server, batched", func(t *testing.T) limiter.Store {
			s := limiter.NewRedisStore(client, limiter.WithBatching(2, 8))
			t.Cleanup(func() { s.Close() })
			return s
		}},
	}
}

func randomID(t testing.TB) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "id-" + hex.EncodeToString(b[:])
}

func TestConformance(t *testing.T) {
	t.Parallel()
	for _, sf := range storeFactories(t) {
		t.Run(sf.name, func(t *testing.T) {
			t.Parallel()
			store := sf.open(t)
			for _, cc := range conformance {
				t.Run(cc.name, func(t *testing.T) {
					t.Parallel()
					runCase(t, store, cc)
				})
			}
		})
	}
}

func runCase(t *testing.T, store limiter.Store, cc confCase) {
	kb, err := limiter.NewKeyBuilder("test:", "conf", cc.alg)
	if err != nil {
		t.Fatal(err)
	}
	id := randomID(t)
	ctx := context.Background()
	for i, st := range cc.steps {
		req := &limiter.Request{
			Algorithm: cc.alg,
			Window:    cc.window,
			Cost:      st.cost,
			Now:       t0.Add(st.at),
			Bucket:    limiter.Bucket{Key: kb.Bucket(id, cc.region, st.region), Limit: cc.limit, Burst: cc.burst},
		}
		if cc.globalLimit > 0 {
			req.Global = limiter.Bucket{Key: kb.Global(id), Limit: cc.globalLimit}
		}
		n := st.n
		if n == 0 {
			n = 1
		}
		var res limiter.Result
		for j := 0; j < n; j++ {
			if st.peek {
				res, err = store.Peek(ctx, req)
			} else {
				res, err = store.Allow(ctx, req)
			}
			if err != nil {
				t.Fatalf("step %d (%d/%d): %v", i, j+1, n, err)
			}
			if j < n-1 && res.Allowed != st.allowed {
				t.Fatalf("step %d (%d/%d): allowed=%v, want %v", i, j+1, n, res.Allowed, st.allowed)
			}
		}
		where := fmt.Sprintf("step %d (at +%s, region %q)", i, st.at, st.region)
		if res.Allowed != st.allowed {
			t.Fatalf("%s: allowed=%v, want %v (%+v)", where, res.Allowed, st.allowed, res)
		}
		if st.count >= 0 && res.Bucket.Count != st.count {
			t.Errorf("%s: count=%d, want %d", where, res.Bucket.Count, st.count)
		}
		// Limit (and so Remaining) is the token bucket's capacity when it
		// has a burst: Remaining counts the tokens left.
		capacity := cc.limit
		if cc.alg == limiter.TokenBucket && cc.burst > 0 {
			capacity = cc.burst
		}
		if res.Bucket.Limit != capacity {
			t.Errorf("%s: limit=%d, want %d", where, res.Bucket.Limit, capacity)
		}
		if want := max(capacity-res.Bucket.Count, 0); res.Bucket.Remaining != want {
			t.Errorf("%s: remaining=%d, want %d", where, res.Bucket.Remaining, want)
		}
		if res.RetryAfter != st.retry {
			t.Errorf("%s: retry after %s, want %s", where, res.RetryAfter, st.retry)
		}
		if st.chkReset && res.Bucket.ResetAfter != st.reset {
			t.Errorf("%s: reset after %s, want %s", where, res.Bucket.ResetAfter, st.reset)
		}
		if cc.globalLimit > 0 {
			if st.global >= 0 && res.Global.Count != st.global {
				t.Errorf("%s: global count=%d, want %d", where, res.Global.Count, st.global)
			}
			if res.Global.Denied != st.globalDen {
				t.Errorf("%s: global denied=%v, want %v", where, res.Global.Denied, st.globalDen)
			}
		}
	}
}
