package limiter_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

var allAlgorithms = []limiter.Algorithm{
	limiter.SlidingLog, limiter.SlidingCounter, limiter.FixedWindow, limiter.TokenBucket,
}

func TestParseAlgorithm(t *testing.T) {
	t.Parallel()
	for _, a := range allAlgorithms {
		got, err := limiter.ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", a.String(), got, err, a)
		}
	}
	for _, bad := range []string{"", "sliding", "Sliding_Log", "leaky_bucket"} {
		if _, err := limiter.ParseAlgorithm(bad); err == nil {
			t.Errorf("ParseAlgorithm(%q) succeeded", bad)
		} else if !strings.Contains(err.Error(), "token_bucket") {
			t.Errorf("ParseAlgorithm(%q): error %q does not list the names", bad, err)
		}
	}
}

// diffOp is one request of a differential script.
type diffOp struct {
	at     time.Time
	ident  int
	region int // -1: no region
	global bool
	cost   int64
	peek   bool
}

func (op diffOp) String() string {
	return fmt.Sprintf("{t=%dµs ident=%d region=%d global=%v cost=%d peek=%v}",
		op.at.UnixMicro(), op.ident, op.region, op.global, op.cost, op.peek)
}

// diffScript builds a seeded random sequence of requests for one algorithm:
// a few identities with regions, costs 1-3, some peeks, some requests with a
// global ceiling, and time steps that are mostly zero or small, land exactly
// on a window boundary (or one µs either side) when they cross one, now and
// then go back a little (a caller whose clock lags), and now and then skip
// half a window, a window, or a long idle gap.
func diffScript(seed uint64, n int, window time.Duration) []diffOp {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	w := window.Microseconds()
	now := t0.UnixMicro() + rng.Int64N(w)
	ops := make([]diffOp, n)
	for i := range ops {
		switch r := rng.IntN(100); {
		case r < 40: // same instant
		case r < 94:
			next := now + 1 + rng.Int64N(w/50)
			if b := (now/w + 1) * w; next >= b && rng.IntN(2) == 0 {
				next = b + rng.Int64N(3) - 1 // exactly on the boundary, or 1 µs off
			}
			now = next
		case r < 95: // a node whose clock lags: back a little, maybe across a boundary
			now -= 1 + rng.Int64N(w/10)
		case r < 97:
			now += w/2 + rng.Int64N(w/2)
		case r < 98:
			now += w
		default:
			now += w + rng.Int64N(2*w)
		}
		op := diffOp{
			at:     time.UnixMicro(now),
			ident:  rng.IntN(3),
			region: rng.IntN(3) - 1,
			cost:   1 + rng.Int64N(3),
			peek:   rng.IntN(10) == 0,
		}
		op.global = op.region >= 0 && rng.IntN(2) == 0
		ops[i] = op
	}
	return ops
}

// diffStores are the stores a differential test compares, in order.
func diffStores(t *testing.T, real redis.Scripter) (names []string, stores []limiter.Store) {
	mem := limiter.NewMemoryStore()
	t.Cleanup(func() { mem.Close() })
	m := miniredis.RunT(t)
	mc := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { mc.Close() })
	return []string{"memory", "miniredis", "redis-server"},
		[]limiter.Store{mem, limiter.NewRedisStore(mc), limiter.NewRedisStore(real)}
}

// TestDifferential runs the same seeded random script on the in-process
// store, miniredis and a real redis-server (clock app) and requires every
// answer to be identical: decision, counts, remaining, retry and reset of
// both buckets, to the microsecond.
func TestDifferential(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	const n = 2000
	// Limits per identity and region; bursts only matter to token_bucket.
	limits := [3][3]int64{{3, 5, 8}, {10, 4, 6}, {20, 7, 2}}
	bursts := [3][3]int64{{0, 2, 0}, {15, 0, 6}, {0, 1, 0}}
	globals := [3]int64{6, 8, 12}
	globalBursts := [3]int64{0, 4, 0}
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			// Windows of 10 s keep the real Redis TTLs (>= 1 s of wall time)
			// far longer than the wall time a key spends idle in the script
			// while the injected clock has not passed its expiry.
			window := 10 * time.Second
			if alg == limiter.TokenBucket {
				window = 7 * time.Second // 7 s / 3 per window: a fractional interval
			}
			kb, err := limiter.NewKeyBuilder("diff:", "d", alg)
			if err != nil {
				t.Fatal(err)
			}
			run := randomID(t)
			names, stores := diffStores(t, client)
			ctx := context.Background()
			var allowed, denied, globalDenied int
			for i, op := range diffScript(uint64(alg)+1, n, window) {
				id := fmt.Sprintf("%s-%d", run, op.ident)
				req := &limiter.Request{Algorithm: alg, Window: window, Cost: op.cost, Now: op.at}
				reg := max(op.region, 0)
				req.Bucket = limiter.Bucket{
					Key:   kb.Bucket(id, op.region >= 0, fmt.Sprint("r", op.region)),
					Limit: limits[op.ident][reg],
					Burst: bursts[op.ident][reg],
				}
				if op.global {
					req.Global = limiter.Bucket{Key: kb.Global(id), Limit: globals[op.ident], Burst: globalBursts[op.ident]}
				}
				var results []limiter.Result
				for j, s := range stores {
					var res limiter.Result
					if op.peek {
						res, err = s.Peek(ctx, req)
					} else {
						res, err = s.Allow(ctx, req)
					}
					if err != nil {
						t.Fatalf("op %d on %s: %v", i, names[j], err)
					}
					results = append(results, res)
				}
				for j := 1; j < len(results); j++ {
					if results[j] != results[0] {
						t.Fatalf("op %d %s (bucket %s limit %d burst %d, global %v):\n  %-12s %+v\n  %-12s %+v",
							i, op, req.Bucket.Key, req.Bucket.Limit, req.Bucket.Burst, op.global,
							names[0], results[0], names[j], results[j])
					}
				}
				if results[0].Allowed {
					allowed++
				} else {
					denied++
					if results[0].Global.Denied {
						globalDenied++
					}
				}
			}
			t.Logf("%s: %d requests identical on %v: %d allowed, %d denied (%d by the global ceiling)",
				alg, n, names, allowed, denied, globalDenied)
			if denied < n/10 || allowed < n/10 || globalDenied == 0 {
				t.Errorf("script too easy: %d allowed, %d denied, %d by the global", allowed, denied, globalDenied)
			}
		})
	}
}

// TestRedisClock runs every script with Now zero: the script reads Redis TIME.
func TestRedisClock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := limiter.NewRedisStore(srv.Client(t))
	ctx := context.Background()
	const window = time.Hour
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			kb, err := limiter.NewKeyBuilder("clock:", "c", alg)
			if err != nil {
				t.Fatal(err)
			}
			// A fixed window (or the counter's pair) could turn over during
			// the run; that happens once an hour, so retry then.
			for attempt := 0; ; attempt++ {
				start := time.Now()
				req := &limiter.Request{
					Algorithm: alg, Window: window,
					Bucket: limiter.Bucket{Key: kb.Bucket(randomID(t), false, ""), Limit: 3},
				}
				var results [4]limiter.Result
				for i := range results {
					if results[i], err = store.Allow(ctx, req); err != nil {
						t.Fatal(err)
					}
				}
				if start.Truncate(window) != time.Now().Truncate(window) && attempt < 2 {
					continue // the hour turned: a fixed window may have restarted
				}
				for i, res := range results[:3] {
					if !res.Allowed || res.Bucket.Count != int64(i+1) {
						t.Fatalf("request %d: %+v, want allowed with count %d", i+1, res, i+1)
					}
				}
				res := results[3]
				if res.Allowed || res.Bucket.Count != 3 {
					t.Fatalf("request 4: %+v, want denied with count 3", res)
				}
				// Plausible: the retry is at most a window (the counter's
				// weighted estimate may need part of the next one too), and
				// for the token bucket close to one emission interval (20 min).
				lo, hi := time.Duration(0), window
				switch alg {
				case limiter.TokenBucket:
					lo, hi = window/3-time.Minute, window/3
				case limiter.SlidingCounter:
					hi = 2 * window
				}
				if res.RetryAfter <= lo || res.RetryAfter > hi {
					t.Fatalf("request 4: retry after %s, want in (%s, %s]", res.RetryAfter, lo, hi)
				}
				if res.Bucket.ResetAfter <= 0 || res.Bucket.ResetAfter > 2*window {
					t.Fatalf("request 4: reset after %s", res.Bucket.ResetAfter)
				}
				peek, err := store.Peek(ctx, req)
				if err != nil || peek.Allowed || peek.Bucket.Count != 3 {
					t.Fatalf("peek: %+v, %v; want denied with count 3", peek, err)
				}
				return
			}
		})
	}
}

// TestRedisTTL checks on a real redis-server that every key a script writes
// has a TTL, and that the keys are gone once it has run out.
func TestRedisTTL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	store := limiter.NewRedisStore(client)
	ctx := context.Background()
	const window = 300 * time.Millisecond
	var keys []string
	var longest time.Duration
	for _, alg := range allAlgorithms {
		kb, err := limiter.NewKeyBuilder("ttl:", "t", alg)
		if err != nil {
			t.Fatal(err)
		}
		req := &limiter.Request{
			Algorithm: alg, Window: window,
			Bucket: limiter.Bucket{Key: kb.Bucket("id", true, "eu"), Limit: 100},
			Global: limiter.Bucket{Key: kb.Global("id"), Limit: 1000},
		}
		for range 5 {
			if res, err := store.Allow(ctx, req); err != nil || !res.Allowed {
				t.Fatalf("%s: %+v, %v", alg, res, err)
			}
		}
		for _, k := range []string{req.Bucket.Key, req.Global.Key} {
			ttl, err := client.PTTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl <= 0 {
				t.Fatalf("%s: key %s has PTTL %s, want > 0", alg, k, ttl)
			}
			t.Logf("%-16s PTTL %s", alg, ttl)
			longest = max(longest, ttl)
			keys = append(keys, k)
		}
	}
	if n, err := client.DBSize(ctx).Result(); err != nil || n != int64(len(keys)) {
		t.Fatalf("DBSIZE = %d, %v; want %d", n, err, len(keys))
	}
	time.Sleep(longest + 100*time.Millisecond) // a real TTL: real time must pass
	if n, err := client.Exists(ctx, keys...).Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS = %d, %v after the TTL; want 0", n, err)
	}
	if n, err := client.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE = %d, %v after the TTL; want 0", n, err)
	}
}

// TestRedisMemoryUsage logs the memory a full key of each algorithm takes in
// a real redis-server (limit 100, 100 units admitted).
func TestRedisMemoryUsage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	store := limiter.NewRedisStore(client)
	ctx := context.Background()
	now := time.Now()
	for _, limit := range []int64{100, 1000} {
		for _, alg := range allAlgorithms {
			kb, err := limiter.NewKeyBuilder(limiter.DefaultKeyPrefix, "default", alg)
			if err != nil {
				t.Fatal(err)
			}
			req := &limiter.Request{
				Algorithm: alg, Window: time.Minute, Now: now,
				Bucket: limiter.Bucket{Key: kb.Bucket(fmt.Sprintf("203.0.113.7-%d", limit), false, ""), Limit: limit},
			}
			for i := int64(0); i < limit; i++ {
				if res, err := store.Allow(ctx, req); err != nil || !res.Allowed {
					t.Fatalf("%s: %+v, %v", alg, res, err)
				}
			}
			res, err := store.Allow(ctx, req)
			if err != nil || res.Allowed {
				t.Fatalf("%s: request %d: %+v, %v; want denied", alg, limit+1, res, err)
			}
			bytes, err := client.MemoryUsage(ctx, req.Bucket.Key, 0).Result()
			if err != nil {
				t.Fatal(err)
			}
			typ := client.Type(ctx, req.Bucket.Key).Val()
			enc := client.ObjectEncoding(ctx, req.Bucket.Key).Val()
			t.Logf("MEMORY USAGE %-16s limit %4d, full: %6d bytes (%s, %s; key %d bytes)",
				alg, limit, bytes, typ, enc, len(req.Bucket.Key))
		}
	}
}
