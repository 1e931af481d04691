package limiter_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// outageStore is a store that can be taken down: while down, every call
// fails as an unreachable Redis does.
type outageStore struct {
	limiter.Store
	down atomic.Bool
}

var errOutage = errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")

func (s *outageStore) Do(ctx context.Context, op *limiter.Op) (limiter.Reply, error) {
	if s.down.Load() {
		return limiter.Reply{}, errOutage
	}
	return s.Store.Do(ctx, op)
}

// TestCachedDenialHoldsThroughAnOutage: K is over its limit of 1 a minute
// and its denial is cached; then the store goes down (fail open). For the
// rest of the minute the store would still deny K, so every request of K
// is refused from the deny cache, with or without a ban rule, however the
// requests are spaced; another key, which the cache knows nothing of, fails
// open.
func TestCachedDenialHoldsThroughAnOutage(t *testing.T) {
	t.Parallel()
	for _, ban := range []*limiter.Ban{nil, {After: 100, Within: time.Minute, For: time.Hour}} {
		name := "no ban rule"
		if ban != nil {
			name = "a ban rule"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			mem := limiter.NewMemoryStore()
			t.Cleanup(func() { mem.Close() })
			st := &outageStore{Store: mem}
			clock := &testClock{t: t0.Add(2 * time.Second)}
			l, err := limiter.New(limiter.Policy{Name: "outage", Windows: []limiter.Window{{Duration: time.Minute}},
				Ban: ban, AppClock: true, Now: clock.Now, Fail: limiter.FailOpen},
				limiter.Backend{Store: st, Source: limiter.SourceRedis, Remote: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			ctx := context.Background()
			k := limiter.Input{Identity: "K", Limits: []int64{1}}
			if d, _ := l.Decide(ctx, &k); !d.Pass {
				t.Fatalf("K's first request: %v", d.Outcome)
			}
			if d, _ := l.Decide(ctx, &k); d.Pass || d.Source != limiter.SourceRedis {
				t.Fatalf("K's second request: pass %v from %s, want refused by the store", d.Pass, d.Source)
			}
			st.down.Store(true)
			for i := 1; i <= 50; i++ {
				clock.Set(t0.Add(2*time.Second + time.Duration(i)*time.Second)) // a second apart, within the minute
				d, _ := l.Decide(ctx, &k)
				if d.Pass || d.Source != limiter.SourceDenyCache || d.Outcome != limiter.OutcomeLimited {
					t.Fatalf("%ds into the outage: K pass %v, %v from %s (%v); the store would still deny it",
						i, d.Pass, d.Outcome, d.Source, d.Err)
				}
			}
			other := limiter.Input{Identity: "other", Limits: []int64{1}}
			if d, _ := l.Decide(ctx, &other); !d.Pass || d.Source != limiter.SourceFailOpen {
				t.Errorf("another key in the outage: pass %v from %s, want fail open", d.Pass, d.Source)
			}
		})
	}
}

// TestCachedDenialHoldsThroughAnOutageWhenAnotherIdentityIsForgotten: a
// reset of another identity during an outage leaves this one's cached
// denial holding (it used to drop every held denial).
func TestCachedDenialHoldsThroughAnOutageWhenAnotherIdentityIsForgotten(t *testing.T) {
	st := &forgetDuringStore{}
	c := limiter.NewDenyCache(st, 0, nil)
	st.cache = c
	op := &limiter.Op{Mode: limiter.ModeCheck, Cost: 1, Ban: &limiter.BanOp{Key: "rl:ban:{a}", After: 5, Within: 1e6, For: 1e7},
		Parts: []limiter.Part{{Key: "rl:log:{a}", Kind: limiter.KindLog, Windows: []limiter.Win{{Name: "60000000", Len: 60e6, Limit: 1}}}}}
	ctx := context.Background()
	if r, err := c.Do(ctx, op); err != nil || r.Status != limiter.StatusDenied {
		t.Fatalf("first: %+v, %v", r, err)
	}
	st.down = true
	r, err := c.Do(ctx, op)
	if err != nil || r.Status != limiter.StatusDenied || !r.Cached {
		t.Fatalf("through the outage, another identity forgotten meanwhile: %+v, %v; want the cached denial", r, err)
	}
	st.forgetSelf = true
	if _, err := c.Do(ctx, op); err == nil {
		t.Fatal("this identity forgotten during the outage: the cached denial still served")
	}
}

// forgetDuringStore denies, or, when down, forgets an identity while it
// fails (another's, or a's when forgetSelf).
type forgetDuringStore struct {
	cache            *limiter.DenyCache
	down, forgetSelf bool
}

func (s *forgetDuringStore) Do(_ context.Context, op *limiter.Op) (limiter.Reply, error) {
	if s.down {
		tag := "b"
		if s.forgetSelf {
			tag = "a"
		}
		s.cache.Forget(tag)
		return limiter.Reply{}, errors.New("store down")
	}
	return limiter.Reply{Status: limiter.StatusDenied, InFlight: -1, Usage: []limiter.Usage{{Count: 1, Retry: 30e6}}}, nil
}

func (s *forgetDuringStore) Reset(context.Context, ...string) error { return nil }

// TestCachedDenialIsNotServedToARequestThatReadsOverrides: K's denial was
// decided and cached before this node learnt that K has an override (a
// higher limit, set through another node). Once it knows, K's requests
// read the override: the store decides them (here it admits, as the higher
// limit does), not the denial cached without it. The node marks an
// identity as having an override and drops its cached denials in two
// steps (the notice); in between, a request that read the override was
// answered by the stale denial (TestOverrideAppliesOnEveryNode, once in
// CI: 429 under a limit the override had raised).
func TestCachedDenialIsNotServedToARequestThatReadsOverrides(t *testing.T) {
	t.Parallel()
	st := &overrideStore{}
	c := limiter.NewDenyCache(st, 0, nil)
	op := &limiter.Op{Mode: limiter.ModeCheck, Cost: 1,
		Parts: []limiter.Part{{Key: "rl:log:{K}", Kind: limiter.KindLog, Windows: []limiter.Win{{Name: "60000000", Len: 60e6, Limit: 5}}}}}
	ctx := context.Background()
	if r, err := c.Do(ctx, op); err != nil || r.Status != limiter.StatusDenied || r.Cached {
		t.Fatalf("K over its limit: %+v, %v; want the store's denial", r, err)
	}
	if r, err := c.Do(ctx, op); err != nil || r.Status != limiter.StatusDenied || !r.Cached || st.calls != 1 {
		t.Fatalf("K again: %+v, %v, %d store calls; want the cached denial", r, err, st.calls)
	}
	withOverride := *op
	withOverride.Override = &limiter.OverrideRef{Key: "rl:ov:{K}"}
	if r, err := c.Do(ctx, &withOverride); err != nil || r.Status != limiter.StatusAllowed || r.Cached || st.calls != 2 {
		t.Fatalf("K reading its override: %+v, %v, %d store calls; want the store's answer under the override (admitted)", r, err, st.calls)
	}
}

// overrideStore denies a request that reads no override and admits one
// that does (an override raised the limit).
type overrideStore struct{ calls int }

func (s *overrideStore) Do(_ context.Context, op *limiter.Op) (limiter.Reply, error) {
	s.calls++
	if op.Override == nil {
		return limiter.Reply{Status: limiter.StatusDenied, InFlight: -1, Usage: []limiter.Usage{{Count: 5, Retry: 30e6}}}, nil
	}
	return limiter.Reply{Status: limiter.StatusAllowed, InFlight: -1, Usage: []limiter.Usage{{Count: 6}}}, nil
}

func (s *overrideStore) Reset(context.Context, ...string) error { return nil }
