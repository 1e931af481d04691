package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// countingStore counts the calls that reach the store behind a cache.
type countingStore struct {
	limiter.Store
	calls atomic.Int64
}

func (c *countingStore) Do(ctx context.Context, op *limiter.Op) (limiter.Reply, error) {
	c.calls.Add(1)
	return c.Store.Do(ctx, op)
}

// scriptCalls is the EVALSHA and EVAL calls srv has run.
func scriptCalls(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	return srv.CommandStats(t).Scripts().Calls
}

// TestDenyCacheNeverDeniesWhatTheStoreWouldAdmit runs one random sequence
// twice, through two limiters of one policy: on a store with the deny cache
// in front, and on an identical store without. Every decision must be the
// same, for every algorithm, with several windows, regions and a global
// ceiling, and the retry times too (see below); and the cache must have
// spared the store every denial it answered.
func TestDenyCacheNeverDeniesWhatTheStoreWouldAdmit(t *testing.T) {
	t.Parallel()
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			clock := &testClock{t: t0}
			plainStore := limiter.NewMemoryStore()
			behind := &countingStore{Store: limiter.NewMemoryStore()}
			t.Cleanup(func() { plainStore.Close(); behind.Store.(*limiter.MemoryStore).Close() })
			p := limiter.Policy{Name: "dc", Algorithm: alg, Regions: true, AppClock: true, Now: clock.Now,
				Windows:       []limiter.Window{{Duration: 2 * time.Second}, {Duration: 10 * time.Second}},
				GlobalWindows: []limiter.Window{{Duration: 2 * time.Second}}}
			plain, err := limiter.New(p, limiter.Backend{Store: plainStore, Source: limiter.SourceMemory})
			if err != nil {
				t.Fatal(err)
			}
			cached, err := limiter.New(p, limiter.Backend{Store: behind, Source: limiter.SourceRedis, Remote: true, DenyCacheSize: 64})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(7, uint64(alg)))
			ctx := context.Background()
			const n = 20000
			denials, hits := 0, 0
			for i := 0; i < n; i++ {
				clock.Set(clock.Now().Add(time.Duration(rng.IntN(40)) * time.Millisecond))
				in := limiter.Input{Identity: "k" + strconv.Itoa(rng.IntN(5)), Region: []string{"us", "gb"}[rng.IntN(2)],
					Limits: []int64{10, 30}, GlobalLimits: []int64{15}, Cost: int64(1 + rng.IntN(2))}
				if i%5000 == 4999 {
					// A reset must clear cached denials too.
					for _, l := range []*limiter.Limiter{plain, cached} {
						if _, err := l.Reset(ctx, in.Identity, in.Region); err != nil {
							t.Fatal(err)
						}
					}
				}
				want, err := plain.Decide(ctx, &in)
				if err != nil {
					t.Fatal(err)
				}
				got, err := cached.Decide(ctx, &in)
				if err != nil {
					t.Fatal(err)
				}
				cachedAnswer := got.Source == limiter.SourceDenyCache
				// Exact retry times, except where other regions of the
				// identity filled the global ceiling since the denial was
				// cached: then the wait can only have grown, and the cache
				// under-reports it (the client asks again early and the
				// store answers with the new time). Never the other way.
				retryOK := got.RetryAfter == want.RetryAfter || cachedAnswer && got.RetryAfter < want.RetryAfter
				if got.Pass != want.Pass || !retryOK {
					t.Fatalf("request %d (%s/%s, cost %d, from %s): pass %v retry %s; the store says %v, %s",
						i, in.Identity, in.Region, in.Cost, got.Source, got.Pass, got.RetryAfter, want.Pass, want.RetryAfter)
				}
				if !want.Pass {
					denials++
				}
				if cachedAnswer {
					hits++
				}
			}
			if hits == 0 || behind.calls.Load() != int64(n-hits) {
				t.Fatalf("cache hits %d, store calls %d of %d: want hits, and the store spared each", hits, behind.calls.Load(), n)
			}
			t.Logf("%d denials, %d served from the cache", denials, hits)
		})
	}
}

// TestDenyCacheSavesRedisCalls: against a real redis-server, through the
// production stack, a hot key over its limit is denied from the cache
// without any script call, with the exact remaining retry time.
func TestDenyCacheSavesRedisCalls(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	clock := &testClock{t: t0}
	l, err := limiter.New(limiter.Policy{Name: "hot", Windows: []limiter.Window{{Duration: time.Minute}}, AppClock: true, Now: clock.Now},
		productionStack(t, srv.Client(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in := &limiter.Input{Identity: "hot", Limits: []int64{3}}
	for i := 0; i < 3; i++ {
		if d, err := l.Decide(ctx, in); err != nil || !d.Pass {
			t.Fatalf("request %d: %+v %v", i, d, err)
		}
	}
	clock.Set(t0.Add(time.Second))
	if d, _ := l.Decide(ctx, in); d.Pass || d.Source != limiter.SourceRedis || d.RetryAfter != 59*time.Second {
		t.Fatalf("first denial: %+v; want a store denial with retry 59s", d)
	}
	before := scriptCalls(t, srv)
	clock.Set(t0.Add(2 * time.Second))
	for i := 0; i < 1000; i++ {
		d, _ := l.Decide(ctx, in)
		if d.Pass || d.Source != limiter.SourceDenyCache || d.RetryAfter != 58*time.Second {
			t.Fatalf("cached denial %d: %+v; want cached with retry 58s", i, d)
		}
	}
	if after := scriptCalls(t, srv); after != before {
		t.Fatalf("1000 cached denials made %d script calls, want 0", after-before)
	}
	// Once the retry time has passed, the store decides again, and admits.
	clock.Set(t0.Add(time.Minute))
	if d, _ := l.Decide(ctx, in); !d.Pass || d.Source != limiter.SourceRedis {
		t.Fatalf("after the retry time: %+v", d)
	}
	if after := scriptCalls(t, srv); after != before+1 {
		t.Fatalf("script calls %d, want exactly 1 more", after-before)
	}
}

// TestDenyCacheIsBounded: denials of 5,000 keys are cached, at most 320 at
// a time, and a cached key is answered without the store.
func TestDenyCacheIsBounded(t *testing.T) {
	t.Parallel()
	store := &countingStore{Store: limiter.NewMemoryStore()}
	t.Cleanup(func() { store.Store.(*limiter.MemoryStore).Close() })
	clock := &testClock{t: t0}
	l, err := limiter.New(limiter.Policy{Name: "dcb", Windows: []limiter.Window{{Duration: time.Hour}}, AppClock: true, Now: clock.Now},
		limiter.Backend{Store: store, Source: limiter.SourceRedis, Remote: true, DenyCacheSize: 320})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	maxLen := 0
	for i := 0; i < 5000; i++ {
		in := &limiter.Input{Identity: strconv.Itoa(i), Limits: []int64{1}}
		l.Decide(ctx, in)
		l.Decide(ctx, in) // denied by the store, then cached
		calls := store.calls.Load()
		if d, _ := l.Decide(ctx, in); d.Source != limiter.SourceDenyCache || store.calls.Load() != calls {
			t.Fatalf("key %d: third request from %s; want the cache", i, d.Source)
		}
		maxLen = max(maxLen, l.DenyCache().Len())
	}
	if maxLen > 320 || l.DenyCache().Len() == 0 {
		t.Fatalf("deny cache held up to %d entries (now %d), bound is 320", maxLen, l.DenyCache().Len())
	}
}

// TestResetReachesEveryNode: two Caddy nodes share a Redis. Node B has a
// client's denial cached; an operator resets the client through node A:
// node B admits it at once (a notice through Redis drops B's cached
// denial), not after the cached retry time.
func TestResetReachesEveryNode(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	clock := &testClock{t: t0}
	p := limiter.Policy{Name: "nodes", Regions: true, Windows: []limiter.Window{{Duration: time.Minute}},
		GlobalWindows: []limiter.Window{{Duration: time.Minute}}, AppClock: true, Now: clock.Now, Timeout: 2 * time.Second}
	var nodes [2]*limiter.Limiter
	for i := range nodes {
		// A client each, as two processes have.
		c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { c.Close() })
		l, err := limiter.New(p, productionStack(t, c))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		nodes[i] = l
	}
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	us := &limiter.Input{Identity: "K", Region: "us", Limits: []int64{5}, GlobalLimits: []int64{7}}
	gb := &limiter.Input{Identity: "K", Region: "gb", Limits: []int64{5}, GlobalLimits: []int64{7}}
	for i := 0; i < 5; i++ {
		a.Decide(ctx, us)
	}
	for i := 0; i < 2; i++ {
		b.Decide(ctx, gb)
	}
	b.Decide(ctx, gb) // the global ceiling denies
	if d, _ := b.Decide(ctx, gb); d.Source != limiter.SourceDenyCache {
		t.Fatalf("node B: %+v; want the denial cached", d)
	}
	if notified, err := a.Reset(ctx, "K", "us"); err != nil || !notified {
		t.Fatalf("reset through node A: notified %v, %v", notified, err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		d, _ := b.Decide(ctx, gb)
		if d.Pass {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node B still denies K in gb 2s after the reset: %+v", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gateStore answers its first call with a denial, but only once the test
// releases it; later calls admit.
type gateStore struct {
	entered, release chan struct{}
	calls            atomic.Int64
}

func (g *gateStore) Do(_ context.Context, op *limiter.Op) (limiter.Reply, error) {
	r := limiter.Reply{Status: limiter.StatusAllowed, InFlight: -1, Usage: make([]limiter.Usage, 1)}
	if g.calls.Add(1) == 1 {
		close(g.entered)
		<-g.release
		r.Status, r.Usage[0].Retry = limiter.StatusDenied, time.Minute.Microseconds()
	}
	return r, nil
}

func (g *gateStore) Reset(context.Context, ...string) error { return nil }

// TestResetNotUndoneByADecisionInFlight: a denial the store decided before
// an operator's reset, and that returns after it, is not cached: the next
// request asks the store.
func TestResetNotUndoneByADecisionInFlight(t *testing.T) {
	t.Parallel()
	g := &gateStore{entered: make(chan struct{}), release: make(chan struct{})}
	l, err := limiter.New(limiter.Policy{Name: "gate", Windows: []limiter.Window{{Duration: time.Minute}}},
		limiter.Backend{Store: g, Source: limiter.SourceRedis, Remote: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in := &limiter.Input{Identity: "K", Limits: []int64{1}}
	done := make(chan limiter.Decision)
	go func() {
		d, _ := l.Decide(ctx, in)
		done <- d
	}()
	<-g.entered
	if _, err := l.Reset(ctx, "K", ""); err != nil {
		t.Fatal(err)
	}
	close(g.release)
	if d := <-done; d.Pass {
		t.Fatalf("the request in flight: %+v, want the store's denial", d)
	}
	if d, _ := l.Decide(ctx, in); !d.Pass || d.Source == limiter.SourceDenyCache {
		t.Fatalf("after the reset: %+v; want the store's answer, not the denial decided before the reset", d)
	}
}

// TestBatchingIsExactUnderConcurrency: 500 concurrent checks of one key
// with limit 50 through a batching store admit exactly 50, with fewer
// script calls than checks, and survive a SCRIPT FLUSH mid-way.
func TestBatchingIsExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	store := limiter.NewRedisStore(client, limiter.WithBatching(2, 64))
	t.Cleanup(func() { store.Close() })
	l, err := limiter.New(limiter.Policy{Name: "batch", Windows: []limiter.Window{{Duration: time.Minute}}, Timeout: 5 * time.Second},
		limiter.Backend{Store: store, Source: limiter.SourceRedis, Remote: true, DenyCacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	in := &limiter.Input{Identity: randomID(t), Limits: []int64{50}}
	flusher := srv.Client(t) // no t.Fatal off the test's goroutine: no srv.CLI there
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 500; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			if i == 250 {
				if err := flusher.ScriptFlush(context.Background()).Err(); err != nil {
					t.Errorf("SCRIPT FLUSH: %v", err)
				}
			}
			d, err := l.Decide(context.Background(), in)
			switch {
			case err != nil || d.Err != nil:
				t.Error(err, d.Err)
			case d.Pass:
				admitted.Add(1)
			default:
				denied.Add(1)
			}
		}(i)
	}
	close(start)
	wg.Wait()
	if admitted.Load() != 50 || denied.Load() != 450 {
		t.Fatalf("admitted %d denied %d, want 50 and 450", admitted.Load(), denied.Load())
	}
	calls := scriptCalls(t, srv)
	t.Logf("500 checks in %d script calls", calls)
	if calls >= 500 {
		t.Errorf("%d script calls for 500 concurrent checks: not batched", calls)
	}
}

// TestBatchingHonoursDeadlines: a caller whose deadline passes while Redis
// hangs gets its error at its deadline, not when the batch ends.
func TestBatchingHonoursDeadlines(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	store := limiter.NewRedisStore(srv.Client(t), limiter.WithBatching(1, 8))
	t.Cleanup(func() { store.Close() })
	srv.Pause()
	t.Cleanup(srv.Resume)
	kb, _ := limiter.NewKeyBuilder("t:", "batch")
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		id := randomID(t) // here: randomID may t.Fatal, not allowed off the test's goroutine
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			began := time.Now()
			_, err := store.Do(ctx, logOp(kb.Key("log", id, false, ""), time.Minute, 5, 0))
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v, want a deadline", err)
			}
			if took := time.Since(began); took > 250*time.Millisecond {
				t.Errorf("a call with a 100ms deadline took %s", took)
			}
		}()
	}
	wg.Wait()
}

// logOp is a one-window sliding_log check of key.
func logOp(key string, window time.Duration, limit, now int64) *limiter.Op {
	return &limiter.Op{Now: now, Cost: 1, Parts: []limiter.Part{{Key: key, Kind: limiter.KindLog,
		Windows: []limiter.Win{{Name: limiter.WindowName(window), Len: window.Microseconds(), Limit: limit}}}}}
}

// TestBatchesDecideAsSingleCalls: the same random checks, wave after wave,
// on two stores of one redis-server: one call per check, and batched (the
// checks of a wave sent at once, so they share script calls). Every reply
// is the same: decisions, every window of the region and global buckets
// (all or nothing), bans, leases. A check whose key holds the wrong type
// fails alone: its neighbours in the batch are decided as usual.
func TestBatchesDecideAsSingleCalls(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	single := limiter.NewRedisStore(client)
	batched := limiter.NewRedisStore(client, limiter.WithBatching(1, 64))
	t.Cleanup(func() { batched.Close() })
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 3))
	now := t0.UnixMicro()
	const waves, width = 150, 16
	before := scriptCalls(t, srv)
	for wave := 0; wave < waves; wave++ {
		now += rng.Int64N(2_000_000)
		ops := [2][]*limiter.Op{}
		broken := -1
		if wave%25 == 24 {
			broken = rng.IntN(width)
		}
		for i := 0; i < width; i++ {
			for s, prefix := range []string{"single:", "batched:"} {
				kb, _ := limiter.NewKeyBuilder(prefix, "w")
				id := strconv.Itoa(i)
				wins := []limiter.Win{{Name: limiter.WindowName(10 * time.Second), Len: 10_000_000, Limit: 5},
					{Name: limiter.WindowName(time.Minute), Len: 60_000_000, Limit: 12}}
				op := &limiter.Op{Now: now, Cost: 1 + int64(i%2), Mode: limiter.ModeCheck,
					Parts: []limiter.Part{
						{Key: kb.Key("log", id, true, "eu"), Kind: limiter.KindLog, Windows: wins},
						{Key: kb.Global("log", id), Kind: limiter.KindLog, Windows: wins[1:]},
					},
					Ban:   &limiter.BanOp{Key: kb.Key("ban", id, true, "eu"), After: 6, Within: 30_000_000, For: 20_000_000},
					Lease: &limiter.LeaseOp{Key: kb.Key("lease", id, true, "eu"), Max: 3, Timeout: 5_000_000, ID: fmt.Sprint("L", wave, "-", i)}}
				if i%5 == 0 {
					op.Mode = limiter.ModePeek
				}
				if i == broken {
					client.Set(ctx, op.Parts[0].Key, "not a sorted set", time.Minute)
				}
				ops[s] = append(ops[s], op)
			}
		}
		want := make([]limiter.Reply, width)
		wantErr := make([]error, width)
		for i, op := range ops[0] {
			want[i], wantErr[i] = single.Do(ctx, op)
		}
		got := make([]limiter.Reply, width)
		gotErr := make([]error, width)
		var wg sync.WaitGroup
		for i, op := range ops[1] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i], gotErr[i] = batched.Do(ctx, op)
			}()
		}
		wg.Wait()
		for i := range want {
			switch {
			case i == broken:
				if wantErr[i] == nil || gotErr[i] == nil || !strings.Contains(gotErr[i].Error(), "WRONGTYPE") {
					t.Fatalf("wave %d, the broken check: %v / %v, want WRONGTYPE from both", wave, wantErr[i], gotErr[i])
				}
			case wantErr[i] != nil || gotErr[i] != nil:
				t.Fatalf("wave %d, check %d: errors %v / %v", wave, i, wantErr[i], gotErr[i])
			case !reflect.DeepEqual(want[i], got[i]):
				t.Fatalf("wave %d, check %d:\n  single  %+v\n  batched %+v", wave, i, want[i], got[i])
			}
		}
		if broken >= 0 {
			for s := range ops {
				client.Del(ctx, ops[s][broken].Parts[0].Key)
			}
		}
	}
	calls := scriptCalls(t, srv) - before
	t.Logf("%d checks: %d script calls in all (one per check single, batched the rest)", 2*waves*width, calls)
	if calls >= 2*waves*width-width {
		t.Errorf("%d script calls for %d checks: the batched store did not batch", calls, 2*waves*width)
	}
}

// TestResetForgetsEveryAlgorithmsBudget: while a reload that changes the
// algorithm rolls across the nodes, node A still runs sliding_log and node B
// fixed_window (its budget in a key of its own). An operator resets the
// client through node A: node B's budget is forgotten too, and so is A's own
// when B's algorithm is rolled back, on the in-process store and on Redis.
func TestResetForgetsEveryAlgorithmsBudget(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	stores := map[string]limiter.Store{"in-process": limiter.NewMemoryStore(), "redis": limiter.NewRedisStore(c)}
	ctx := context.Background()
	for name, st := range stores {
		t.Run(name, func(t *testing.T) {
			clock := &testClock{t: t0}
			node := func(alg limiter.Algorithm) *limiter.Limiter {
				p := limiter.Policy{Name: "roll", Algorithm: alg, Windows: []limiter.Window{{Duration: time.Minute}},
					GlobalWindows: []limiter.Window{{Duration: time.Minute}}, Regions: true, AppClock: true, Now: clock.Now,
					Timeout: 2 * time.Second}
				l, err := limiter.New(p, limiter.Backend{Store: st, Base: st, Remote: name == "redis"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(l.Close)
				return l
			}
			a, b := node(limiter.SlidingLog), node(limiter.FixedWindow)
			in := &limiter.Input{Identity: "K", Region: "us", Limits: []int64{3}, GlobalLimits: []int64{5}}
			spend := func(l *limiter.Limiter) {
				for i := 0; i < 3; i++ {
					if d, err := l.Decide(ctx, in); err != nil || !d.Pass {
						t.Fatalf("request %d: %+v %v, want it admitted", i+1, d, err)
					}
				}
			}
			spend(a)
			spend(b)
			if _, err := a.Reset(ctx, "K", "us"); err != nil {
				t.Fatal(err)
			}
			if d, err := b.Decide(ctx, in); err != nil || !d.Pass || d.Windows[0].Remaining != 2 {
				t.Fatalf("fixed_window after a reset through the sliding_log node: %+v %v, want admitted with 2 left", d, err)
			}
			spend(a)
			if _, err := b.Reset(ctx, "K", "us"); err != nil {
				t.Fatal(err)
			}
			if d, err := a.Decide(ctx, in); err != nil || !d.Pass || d.Windows[0].Remaining != 2 {
				t.Fatalf("sliding_log after a reset through the fixed_window node: %+v %v, want admitted with 2 left", d, err)
			}
		})
	}
}
