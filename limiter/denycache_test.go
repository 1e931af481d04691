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
