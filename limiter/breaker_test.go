package limiter_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// flakyStore fails while down is set, and counts the calls that reach it.
type flakyStore struct {
	down  atomic.Bool
	calls atomic.Int64
}

var errDown = errors.New("connection refused")

func (f *flakyStore) Do(context.Context, *limiter.Op) (limiter.Reply, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return limiter.Reply{}, errDown
	}
	return limiter.Reply{Status: limiter.StatusAllowed}, nil
}

func (f *flakyStore) Reset(context.Context, ...string) error { return nil }

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	store := &flakyStore{}
	clock := &fakeClock{t: t0}
	var mu sync.Mutex
	var changes []string
	b := limiter.NewBreaker(store, limiter.BreakerConfig{
		Threshold: 3, MinCooldown: time.Second, MaxCooldown: 4 * time.Second, Now: clock.Now,
		OnChange: func(from, to limiter.BreakerState, _ error) {
			mu.Lock()
			changes = append(changes, from.String()+">"+to.String())
			mu.Unlock()
		},
	})
	ctx := context.Background()
	req := &limiter.Op{}
	call := func() error { _, err := b.Do(ctx, req); return err }

	if err := call(); err != nil {
		t.Fatal(err)
	}
	store.down.Store(true)
	for i := 0; i < 3; i++ {
		if err := call(); !errors.Is(err, errDown) {
			t.Fatalf("failure %d: %v", i, err)
		}
	}
	if b.State() != limiter.Open {
		t.Fatalf("after 3 failures: %s, want open", b.State())
	}
	before := store.calls.Load()
	for i := 0; i < 100; i++ {
		if err := call(); !errors.Is(err, limiter.ErrCircuitOpen) {
			t.Fatalf("open circuit: %v", err)
		}
	}
	if store.calls.Load() != before {
		t.Fatalf("open circuit called the store %d times", store.calls.Load()-before)
	}
	// Cool-down over: one probe, which fails: open again for 2 s.
	clock.Advance(time.Second)
	if err := call(); !errors.Is(err, errDown) {
		t.Fatalf("probe: %v", err)
	}
	clock.Advance(1500 * time.Millisecond)
	if err := call(); !errors.Is(err, limiter.ErrCircuitOpen) {
		t.Fatalf("cool-down should have doubled: %v", err)
	}
	clock.Advance(500 * time.Millisecond)
	store.down.Store(false)
	if err := call(); err != nil {
		t.Fatalf("successful probe: %v", err)
	}
	if b.State() != limiter.Closed {
		t.Fatalf("after a good probe: %s", b.State())
	}
	// Canceled callers do not count as failures.
	store.down.Store(true)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	for i := 0; i < 10; i++ {
		b.Do(cctx, req)
	}
	if b.State() != limiter.Closed {
		t.Fatalf("canceled calls opened the circuit")
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"closed>open", "open>half_open", "half_open>open", "open>half_open", "half_open>closed"}
	if len(changes) != len(want) {
		t.Fatalf("state changes %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Fatalf("state changes %v, want %v", changes, want)
		}
	}
}

// TestBreakerOneProbe: while half open, concurrent callers do not pile onto
// a store that may still be down: exactly one call goes through.
func TestBreakerOneProbe(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	store := &blockingStore{release: block}
	clock := &fakeClock{t: t0}
	b := limiter.NewBreaker(store, limiter.BreakerConfig{Threshold: 1, MinCooldown: time.Second, Now: clock.Now})
	store.fail.Store(true)
	b.Do(context.Background(), &limiter.Op{})
	clock.Advance(time.Second)
	store.fail.Store(false)
	var wg sync.WaitGroup
	var open atomic.Int64
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.Do(context.Background(), &limiter.Op{}); errors.Is(err, limiter.ErrCircuitOpen) {
				open.Add(1)
			}
		}()
	}
	// Wait until the probe is in the store and the other 19 were refused
	// (bounded: a broken breaker fails below rather than hanging here).
	for deadline := time.Now().Add(5 * time.Second); (store.calls.Load() < 2 || open.Load() < 19) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	close(block)
	wg.Wait()
	if store.calls.Load() != 2 || open.Load() != 19 {
		t.Fatalf("store calls %d (want 1 failure + 1 probe), refused %d (want 19)", store.calls.Load(), open.Load())
	}
}

type blockingStore struct {
	flakyStore
	fail    atomic.Bool
	release chan struct{}
}

func (s *blockingStore) Do(context.Context, *limiter.Op) (limiter.Reply, error) {
	s.calls.Add(1)
	if s.fail.Load() {
		return limiter.Reply{}, errDown
	}
	<-s.release
	return limiter.Reply{Status: limiter.StatusAllowed}, nil
}

func TestIsUnavailable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{errDown, true}, // not a Redis reply: connection-level
		{redis.ErrPoolTimeout, true},
		{redis.ErrClosed, true},
		{proto("LOADING Redis is loading the dataset in memory"), true},
		{proto("READONLY You can't write against a read only replica."), true},
		{proto("OOM command not allowed when used memory > 'maxmemory'."), true},
		{proto("WRONGPASS invalid username-password pair"), true},
		{proto("NOPERM this user has no permissions to access one of the keys"), false},
		{proto("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{proto("ERR Error running script"), false},
		{limiter.ErrBadReply, false},
		{limiter.ErrInvalidOp, false},
		{limiter.ErrLate, true},
	}
	for _, c := range cases {
		if got := limiter.IsUnavailable(c.err); got != c.want {
			t.Errorf("IsUnavailable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	kinds := []struct {
		err  error
		want limiter.ErrKind
	}{
		{context.DeadlineExceeded, limiter.ErrKindTimeout},
		{limiter.ErrLate, limiter.ErrKindTimeout},
		{limiter.ErrCircuitOpen, limiter.ErrKindCircuitOpen},
		{errDown, limiter.ErrKindConnection},
		{proto("READONLY You can't write against a read only replica."), limiter.ErrKindConnection},
		{proto("WRONGPASS invalid username-password pair"), limiter.ErrKindAuth},
		{proto("NOPERM this user has no permissions to run the 'evalsha' command"), limiter.ErrKindAuth},
		{proto("WRONGTYPE Operation against a key holding the wrong kind of value"), limiter.ErrKindScript},
		{limiter.ErrBadReply, limiter.ErrKindScript},
		{limiter.ErrInvalidOp, limiter.ErrKindOther},
	}
	for _, c := range kinds {
		if got := limiter.KindOf(c.err); got != c.want {
			t.Errorf("KindOf(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// proto is an error reply as go-redis returns it.
type proto string

func (p proto) Error() string { return string(p) }
func (p proto) RedisError()   {}
