package limiter_test

import (
	"context"
	"math/rand"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// countingStore counts the calls that reach the store behind a cache.
type countingStore struct {
	limiter.Store
	allows atomic.Int64
}

func (c *countingStore) Allow(ctx context.Context, r *limiter.Request) (limiter.Result, error) {
	c.allows.Add(1)
	return c.Store.Allow(ctx, r)
}

// TestDenyCacheNeverDeniesWhatTheStoreWouldAdmit runs one random sequence
// twice: on a store with the deny cache in front, and on an identical store
// without. Every decision must be the same, for every algorithm, and the
// retry times too (see below for the global ceiling); and the cache must
// have answered repeated denials.
func TestDenyCacheNeverDeniesWhatTheStoreWouldAdmit(t *testing.T) {
	t.Parallel()
	algs := []limiter.Algorithm{limiter.SlidingLog}
	for _, name := range []string{"sliding_counter", "fixed_window", "token_bucket"} {
		if a, err := limiter.ParseAlgorithm(name); err == nil {
			algs = append(algs, a)
		}
	}
	for _, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			plain := limiter.NewMemoryStore()
			behind := &countingStore{Store: limiter.NewMemoryStore()}
			t.Cleanup(func() { plain.Close(); behind.Store.(*limiter.MemoryStore).Close() })
			cached := limiter.NewDenyCache(behind, 64, nil)
			kb, _ := limiter.NewKeyBuilder("t:", "dc", alg)
			rng := rand.New(rand.NewSource(7))
			now := t0
			ctx := context.Background()
			denials, hits := 0, 0
			for i := 0; i < 20000; i++ {
				now = now.Add(time.Duration(rng.Intn(40)) * time.Millisecond)
				id := "k" + strconv.Itoa(rng.Intn(5))
				region := []string{"us", "gb"}[rng.Intn(2)]
				req := &limiter.Request{
					Algorithm: alg, Window: 2 * time.Second, Cost: int64(1 + rng.Intn(2)), Now: now,
					Bucket: limiter.Bucket{Key: kb.Bucket(id, true, region), Limit: 10},
				}
				if rng.Intn(3) == 0 {
					req.Global = limiter.Bucket{Key: kb.Global(id), Limit: 15}
				}
				if i%5000 == 4999 {
					// A reset must clear cached denials too.
					keys := []string{req.Bucket.Key, kb.Global(id)}
					if err := cached.Reset(ctx, keys...); err != nil {
						t.Fatal(err)
					}
					if err := plain.Reset(ctx, keys...); err != nil {
						t.Fatal(err)
					}
				}
				want, err := plain.Allow(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				got, err := cached.Allow(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				// Exact retry times, except where other regions of the
				// identity filled the global ceiling since the denial was
				// cached: then the wait can only have grown, and the cache
				// under-reports it (the client asks again early, is denied
				// by the store with the new time). Never the other way.
				retryOK := got.RetryAfter == want.RetryAfter || (req.HasGlobal() && got.Cached && got.RetryAfter < want.RetryAfter)
				if got.Allowed != want.Allowed || !retryOK {
					t.Fatalf("request %d (%s, cost %d, cached %v): allowed %v retry %s; the store says %v, %s",
						i, req.Bucket.Key, req.Cost, got.Cached, got.Allowed, got.RetryAfter, want.Allowed, want.RetryAfter)
				}
				if !want.Allowed {
					denials++
				}
				if got.Cached {
					hits++
				}
			}
			if hits == 0 || behind.allows.Load() != int64(20000-hits) {
				t.Fatalf("cache hits %d, store calls %d of 20000: want hits, and the store spared each", hits, behind.allows.Load())
			}
			t.Logf("%d denials, %d served from the cache", denials, hits)
		})
	}
}

// TestDenyCacheSavesRedisCalls: against a real redis-server, a hot key over
// its limit is denied from the cache without any script call, with the
// exact remaining retry time.
func TestDenyCacheSavesRedisCalls(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	cache := limiter.NewDenyCache(limiter.NewRedisStore(client), 0, nil)
	kb, _ := limiter.NewKeyBuilder("t:", "dc", limiter.SlidingLog)
	ctx := context.Background()
	req := func(at time.Duration) *limiter.Request {
		return &limiter.Request{Algorithm: limiter.SlidingLog, Window: time.Minute, Now: t0.Add(at),
			Bucket: limiter.Bucket{Key: kb.Bucket("hot", false, ""), Limit: 3}}
	}
	for i := 0; i < 3; i++ {
		if res, err := cache.Allow(ctx, req(0)); err != nil || !res.Allowed {
			t.Fatalf("request %d: %+v %v", i, res, err)
		}
	}
	if res, err := cache.Allow(ctx, req(time.Second)); err != nil || res.Allowed || res.Cached || res.RetryAfter != 59*time.Second {
		t.Fatalf("first denial: %+v %v; want a store denial with retry 59s", res, err)
	}
	before := scriptCalls(t, srv)
	for i := 0; i < 1000; i++ {
		res, err := cache.Allow(ctx, req(2*time.Second))
		if err != nil || res.Allowed || !res.Cached || res.RetryAfter != 58*time.Second {
			t.Fatalf("cached denial %d: %+v %v; want cached with retry 58s", i, res, err)
		}
	}
	if after := scriptCalls(t, srv); after != before {
		t.Fatalf("1000 cached denials made %d script calls, want 0", after-before)
	}
	// Once the retry time has passed, the store decides again, and admits.
	if res, err := cache.Allow(ctx, req(time.Minute)); err != nil || !res.Allowed || res.Cached {
		t.Fatalf("after the retry time: %+v %v", res, err)
	}
	if after := scriptCalls(t, srv); after != before+1 {
		t.Fatalf("script calls %d, want exactly 1 more", after-before)
	}
}

// scriptCalls sums EVALSHA and EVAL calls from INFO commandstats.
func scriptCalls(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	var n int64
	for _, line := range strings.Split(srv.CLI(t, "INFO", "commandstats"), "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		for _, f := range strings.Split(strings.SplitN(line, ":", 2)[1], ",") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(f), "calls="); ok {
				c, _ := strconv.ParseInt(v, 10, 64)
				n += c
			}
		}
	}
	return n
}

func TestDenyCacheIsBounded(t *testing.T) {
	t.Parallel()
	store := limiter.NewMemoryStore()
	t.Cleanup(func() { store.Close() })
	cache := limiter.NewDenyCache(store, 320, nil)
	kb, _ := limiter.NewKeyBuilder("t:", "dcb", limiter.SlidingLog)
	ctx := context.Background()
	for i := 0; i < 5000; i++ {
		req := &limiter.Request{Algorithm: limiter.SlidingLog, Window: time.Hour, Now: t0,
			Bucket: limiter.Bucket{Key: kb.Bucket(strconv.Itoa(i), false, ""), Limit: 1}}
		cache.Allow(ctx, req)
		cache.Allow(ctx, req) // denied, cached
	}
	if n := cache.Len(); n > 320 {
		t.Fatalf("deny cache holds %d entries, bound is 320", n)
	}
}
