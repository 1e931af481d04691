package limiter_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// switchStore is a store that fails while down is set; otherwise it asks
// the store it wraps. A hook, when set, runs before each call.
type switchStore struct {
	limiter.Store
	down atomic.Bool
	hook func(op *limiter.Op)
}

func (s *switchStore) Do(ctx context.Context, op *limiter.Op) (limiter.Reply, error) {
	if s.hook != nil {
		s.hook(op)
	}
	if s.down.Load() {
		return limiter.Reply{}, errDown
	}
	return s.Store.Do(ctx, op)
}

// TestQueuePlaceGivenBackOnStoreFailure: a queued request whose re-check
// meets a store failure (answered by the fail mode) gives its waiter's
// place back: with max_waiters 1, the next limited request still waits for
// its turn instead of being refused at once.
func TestQueuePlaceGivenBackOnStoreFailure(t *testing.T) {
	t.Parallel()
	mem := limiter.NewMemoryStore()
	defer mem.Close()
	store := &switchStore{Store: mem}
	checks := atomic.Int64{}
	store.hook = func(op *limiter.Op) {
		// The third check is the queued request's re-check: the store fails.
		if op.Mode == limiter.ModeCheck && checks.Add(1) == 3 {
			store.down.Store(true)
		}
	}
	l, err := limiter.New(limiter.Policy{Name: "q", Windows: []limiter.Window{{Duration: 20 * time.Millisecond}},
		Queue: limiter.Queue{MaxWait: time.Second, MaxWaiters: 1}},
		limiter.Backend{Store: store, Source: limiter.SourceMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	in := func(id string) *limiter.Input { return &limiter.Input{Identity: id, Limits: []int64{1}} }

	if d, _ := l.Decide(ctx, in("a")); d.Outcome != limiter.OutcomeAllowed {
		t.Fatalf("first request of a: %v", d.Outcome)
	}
	d, _ := l.Decide(ctx, in("a"))
	if !d.Queued || d.Outcome != limiter.OutcomeUnavailable || d.Source != limiter.SourceFailOpen {
		t.Fatalf("queued request whose re-check fails: queued %v, outcome %v, source %s; want queued, unavailable, fail_open",
			d.Queued, d.Outcome, d.Source)
	}

	store.down.Store(false)
	if d, _ := l.Decide(ctx, in("b")); d.Outcome != limiter.OutcomeAllowed {
		t.Fatalf("first request of b: %v", d.Outcome)
	}
	d, _ = l.Decide(ctx, in("b"))
	if !d.Queued || d.Outcome != limiter.OutcomeAllowed {
		t.Fatalf("limited request with the only waiter's place free: queued %v, outcome %v; want it queued and then allowed (the failed re-check kept the place)",
			d.Queued, d.Outcome)
	}
}
