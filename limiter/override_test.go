package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// overrideStacks are the stacks an override's end is held on: the
// conformance backends, and the in-process store behind a deny cache (a
// remote store's stack, without Redis).
func overrideStacks(t *testing.T) []backend {
	return append(backends(t), backend{"memory behind a deny cache", func(t *testing.T) limiter.Backend {
		s := limiter.NewMemoryStore()
		t.Cleanup(func() { s.Close() })
		return limiter.Backend{Store: s, Source: limiter.SourceMemory, Remote: true}
	}})
}

// TestOverrideEndBoundsWhatWasDecidedUnderIt: an operator lowers K's limit
// of 100 an hour to 2 for a minute. K's third request is refused; its
// Retry-After is at most the minute (the limit of 100 comes back then, it
// is not the hour the lowered limit would take to drain), and once the
// override has ended K is admitted at once (3 of 100), on every store and
// through the deny cache, which must not hold the denial past the
// override's end.
func TestOverrideEndBoundsWhatWasDecidedUnderIt(t *testing.T) {
	t.Parallel()
	for _, be := range overrideStacks(t) {
		for _, alg := range allAlgorithms {
			t.Run(be.name+"/"+alg.String(), func(t *testing.T) {
				t.Parallel()
				start := t0.Add(2 * time.Second) // just past the hour: a fixed window of an hour holds
				clock := &testClock{t: start}
				l, err := limiter.New(limiter.Policy{Name: "ovend", KeyPrefix: randomID(t) + ":", Algorithm: alg,
					Windows: []limiter.Window{{Duration: time.Hour}}, AppClock: true, Now: clock.Now, Timeout: 5 * time.Second}, be.open(t))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(l.Close)
				ctx := context.Background()
				in := limiter.Input{Identity: "K", Limits: []int64{100}}
				if _, err := l.SetOverride(ctx, "K", limiter.Override{Limits: []int64{2}, TTL: time.Minute}); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 2; i++ {
					if d, _ := l.Decide(ctx, &in); !d.Pass {
						t.Fatalf("request %d under the override of 2: %v (%v)", i+1, d.Outcome, d.Err)
					}
				}
				for i := 0; i < 3; i++ { // the store's denial, then cached ones
					clock.Set(start.Add(time.Duration(i) * 10 * time.Second))
					d, _ := l.Decide(ctx, &in)
					if d.Pass || d.Outcome != limiter.OutcomeLimited {
						t.Fatalf("request 3 at +%ds under the override of 2: %v, pass %v", 10*i, d.Outcome, d.Pass)
					}
					if left := time.Minute - time.Duration(i)*10*time.Second; d.RetryAfter > left {
						t.Errorf("at +%ds (%s): Retry-After %s, later than the override's end in %s", 10*i, d.Source, d.RetryAfter, left)
					}
				}
				clock.Set(start.Add(time.Minute + time.Second))
				d, _ := l.Decide(ctx, &in)
				if !d.Pass || d.Overridden {
					t.Errorf("a second after the override ended: %v from %s (overridden %v), want admitted under the limit of 100",
						d.Outcome, d.Source, d.Overridden)
				}
			})
		}
	}
}

// TestInProcessOverrideSurvivesANewLimiter: a config reload builds a new
// limiter of the same name on the same in-process store (Caddy keeps the
// store across reloads). An override set before the reload must still
// apply after it, until its TTL, as it does on Redis (where the new
// limiter reads the overrides' index at start).
func TestInProcessOverrideSurvivesANewLimiter(t *testing.T) {
	t.Parallel()
	s := limiter.NewMemoryStore()
	t.Cleanup(func() { s.Close() })
	clock := &testClock{t: t0}
	p := limiter.Policy{Name: "reload", Windows: []limiter.Window{{Duration: time.Hour}}, Now: clock.Now}
	b := limiter.Backend{Store: s, Source: limiter.SourceMemory, Notifier: s}
	before, err := limiter.New(p, b)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := before.SetOverride(ctx, "K", limiter.Override{Limits: []int64{2}, TTL: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	after, err := limiter.New(p, b) // the reload: the new limiter first, then the old one closed
	if err != nil {
		t.Fatal(err)
	}
	before.Close()
	t.Cleanup(after.Close)
	in := limiter.Input{Identity: "K", Limits: []int64{100}}
	admitted := 0
	for i := 0; i < 5; i++ {
		if d, _ := after.Decide(ctx, &in); d.Pass {
			admitted++
		}
	}
	if admitted != 2 || !after.KnowsOverride("K") {
		t.Errorf("after the reload K was admitted %d times of 5 (knows the override: %v), want 2 (its override of 2 lasts 10 minutes)",
			admitted, after.KnowsOverride("K"))
	}
	clock.Set(t0.Add(10*time.Minute + time.Second))
	if d, _ := after.Decide(ctx, &in); !d.Pass || d.Overridden {
		t.Errorf("after the override's TTL: %v (overridden %v), want admitted under 100", d.Outcome, d.Overridden)
	}
}

// TestIndexReadDropsCachedDenialsOfChangedOverrides: two nodes share a
// store, and node B's notices never reach node A. A learns of overrides set
// or ended on B from the index, which it reads every 5 s; whatever it had
// cached for an identity whose override changed was decided under other
// limits, so it is dropped then: K, refused on A at its limit of 1, gets
// in once B raises it to 10; L, refused on A under B's override of 1 (its
// limit is 100), gets in once B deletes the override.
func TestIndexReadDropsCachedDenialsOfChangedOverrides(t *testing.T) {
	t.Parallel()
	mem := limiter.NewMemoryStore()
	t.Cleanup(func() { mem.Close() })
	clock := &testClock{t: t0.Add(2 * time.Second)}
	p := limiter.Policy{Name: "index", Windows: []limiter.Window{{Duration: time.Hour}}, AppClock: true, Now: clock.Now}
	node := func() *limiter.Limiter {
		l, err := limiter.New(p, limiter.Backend{Store: mem, Source: limiter.SourceRedis, Remote: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		return l
	}
	a, b := node(), node()
	ctx := context.Background()
	k := limiter.Input{Identity: "K", Limits: []int64{1}}
	l := limiter.Input{Identity: "L", Limits: []int64{100}}
	if _, err := b.SetOverride(ctx, "L", limiter.Override{Limits: []int64{1}, TTL: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	limiter.ReadOverrideIndex(a)
	for _, in := range []*limiter.Input{&k, &l} {
		a.Decide(ctx, in)
		if d, _ := a.Decide(ctx, in); d.Pass {
			t.Fatalf("%s's second request on A: admitted over its limit of 1", in.Identity)
		}
	}
	if _, err := b.SetOverride(ctx, "K", limiter.Override{Limits: []int64{10}, TTL: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeleteOverride(ctx, "L", ""); err != nil {
		t.Fatal(err)
	}
	limiter.ReadOverrideIndex(a)
	for _, in := range []*limiter.Input{&k, &l} {
		if d, _ := a.Decide(ctx, in); !d.Pass {
			t.Errorf("%s on A after its override changed on B and A read the index: %v from %s", in.Identity, d.Outcome, d.Source)
		}
	}
}
