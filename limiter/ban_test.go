package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestBanCountsEveryRefusalAtItsTime: two nodes, each with its deny cache,
// share one store; K's limit is 1 a minute, and 5 refusals within a minute
// ban it. K is refused on node A three times in a row (the second and third
// from A's cache), then on node B twice (the second from B's cache). The
// store, asked every time, would have counted 5: the fifth refusal is the
// one that bans K, and every node then refuses K as banned.
func TestBanCountsEveryRefusalAtItsTime(t *testing.T) {
	t.Parallel()
	mem := limiter.NewMemoryStore()
	t.Cleanup(func() { mem.Close() })
	clock := &testClock{t: t0.Add(2 * time.Second)}
	p := limiter.Policy{Name: "ban", Windows: []limiter.Window{{Duration: time.Minute}}, AppClock: true, Now: clock.Now,
		Ban: &limiter.Ban{After: 5, Within: time.Minute, For: time.Hour}}
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
	if d, _ := a.Decide(ctx, &k); !d.Pass {
		t.Fatalf("K's first request: %v", d.Outcome)
	}
	for i, n := range []*limiter.Limiter{a, a, a, b, b} {
		clock.Set(t0.Add(2*time.Second + time.Duration(i+1)*10*time.Millisecond))
		d, _ := n.Decide(ctx, &k)
		want := limiter.OutcomeLimited
		if i == 4 {
			want = limiter.OutcomeBanned
		}
		if d.Pass || d.Outcome != want || d.BanStarted != (i == 4) {
			t.Errorf("refusal %d (%s): %v, ban started %v; want %v (5 refusals ban K)", i+1, d.Source, d.Outcome, d.BanStarted, want)
		}
	}
	for name, n := range map[string]*limiter.Limiter{"A": a, "B": b} {
		if d, _ := n.Peek(ctx, &k); !d.Banned {
			t.Errorf("node %s after 5 refusals: K not banned (%v)", name, d.Outcome)
		}
	}
}

// TestQueuedRechecksAreNotDenials: K's limit is 1 per 50 ms (on a clock
// that stands still, so a waiting request never gets in), a refused request
// waits up to 300 ms, and 2 refusals ban K. Each of K's requests waits,
// is checked again several times and is refused once: the first refused
// request does not ban K, the second does, on every store.
func TestQueuedRechecksAreNotDenials(t *testing.T) {
	t.Parallel()
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			clock := &testClock{t: t0.Add(2 * time.Second)}
			l, err := limiter.New(limiter.Policy{Name: "queue", KeyPrefix: randomID(t) + ":",
				Windows: []limiter.Window{{Duration: 50 * time.Millisecond}}, AppClock: true, Now: clock.Now, Timeout: 5 * time.Second,
				Queue: limiter.Queue{MaxWait: 300 * time.Millisecond}, Ban: &limiter.Ban{After: 2, Within: time.Minute, For: time.Hour}}, be.open(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			ctx := context.Background()
			k := limiter.Input{Identity: "K", Limits: []int64{1}}
			if d, _ := l.Decide(ctx, &k); !d.Pass {
				t.Fatalf("K's first request: %v", d.Outcome)
			}
			d, _ := l.Decide(ctx, &k)
			if d.Pass || !d.Queued || d.Outcome != limiter.OutcomeLimited {
				t.Fatalf("K's second request, after waiting %s (queued %v): %v; want limited, once, not banned", d.Waited, d.Queued, d.Outcome)
			}
			d, _ = l.Decide(ctx, &k)
			if d.Pass || d.Outcome != limiter.OutcomeBanned || !d.BanStarted {
				t.Errorf("K's third request, the second refused: %v (ban started %v); want the ban", d.Outcome, d.BanStarted)
			}
		})
	}
}

// TestConcurrencyRefusalsAreNotDenials: a refusal by max_concurrent alone
// does not count toward a ban (the client is within its rate; the bound
// says a request of its is still running): K holds its one lease, is
// refused 5 times for concurrency under a ban after 2, and is not banned;
// once its request is done it is admitted.
func TestConcurrencyRefusalsAreNotDenials(t *testing.T) {
	t.Parallel()
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			clock := &testClock{t: t0.Add(2 * time.Second)}
			l, err := limiter.New(limiter.Policy{Name: "conc", KeyPrefix: randomID(t) + ":", Concurrency: true,
				Windows: []limiter.Window{{Duration: time.Minute}}, AppClock: true, Now: clock.Now, Timeout: 5 * time.Second,
				Ban: &limiter.Ban{After: 2, Within: time.Minute, For: time.Hour}}, be.open(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			ctx := context.Background()
			k := limiter.Input{Identity: "K", Limits: []int64{100}, MaxConcurrent: 1}
			first, _ := l.Decide(ctx, &k)
			if !first.Pass {
				t.Fatalf("K's first request: %v", first.Outcome)
			}
			for i := 0; i < 5; i++ {
				if d, _ := l.Decide(ctx, &k); d.Outcome != limiter.OutcomeConcurrency {
					t.Fatalf("K's request %d while its first runs: %v, want concurrency", i+2, d.Outcome)
				}
			}
			l.Done(ctx, &first, 200)
			if d, _ := l.Decide(ctx, &k); !d.Pass {
				t.Errorf("K after its request is done: %v (banned %v), want admitted: concurrency refusals are no ban's", d.Outcome, d.Banned)
			}
		})
	}
}

// TestRefusedRequestHoldsNoLease: node A caches K's denial under a ban
// rule; an operator resets K through node B, whose notice A never gets.
// Whatever A then decides for K, a request refused holds no lease (its
// Done has nothing to release, so a lease it kept would block K's
// max_concurrent until lease_timeout).
func TestRefusedRequestHoldsNoLease(t *testing.T) {
	t.Parallel()
	mem := limiter.NewMemoryStore()
	t.Cleanup(func() { mem.Close() })
	clock := &testClock{t: t0.Add(2 * time.Second)}
	p := limiter.Policy{Name: "lease", Windows: []limiter.Window{{Duration: time.Minute}}, AppClock: true, Now: clock.Now,
		Concurrency: true, Ban: &limiter.Ban{After: 2, Within: time.Minute, For: time.Hour}}
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
	k := limiter.Input{Identity: "K", Limits: []int64{1}, MaxConcurrent: 5}
	d, _ := a.Decide(ctx, &k)
	if !d.Pass {
		t.Fatalf("K's first request: %v", d.Outcome)
	}
	a.Done(ctx, &d, 200)
	for i := 1; i <= 3; i++ { // the store's denial, then cached ones
		clock.Set(t0.Add(2*time.Second + time.Duration(i)*10*time.Millisecond))
		if d, _ := a.Decide(ctx, &k); d.Pass {
			t.Fatalf("K's request %d: admitted over its limit of 1", i+1)
		}
	}
	if _, err := b.Reset(ctx, "K", ""); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0.Add(2*time.Second + 200*time.Millisecond))
	d, _ = a.Decide(ctx, &k)
	peek, err := b.Peek(ctx, &k)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Pass && peek.InFlight != 0 {
		t.Errorf("K's request after the reset was refused (%v, ban started %v) but holds a lease: %d in flight",
			d.Outcome, d.BanStarted, peek.InFlight)
	}
	a.Done(ctx, &d, 200)
}
