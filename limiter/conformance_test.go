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
var t0 = time.Date(2026, 11, 29, 11, 59, 59, 0, time.UTC)

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
}

type confCase struct {
	name        string
	alg         limiter.Algorithm
	limit       int64
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
			Bucket:    limiter.Bucket{Key: kb.Bucket(id, cc.region, st.region), Limit: cc.limit},
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
		if want := max(cc.limit-res.Bucket.Count, 0); res.Bucket.Remaining != want {
			t.Errorf("%s: remaining=%d, want %d", where, res.Bucket.Remaining, want)
		}
		if res.RetryAfter != st.retry {
			t.Errorf("%s: retry after %s, want %s", where, res.RetryAfter, st.retry)
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
