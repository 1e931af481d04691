package limiter_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// brokenCircuit is a limiter over a breaker (threshold 1, cool-down 1 s on
// an injected clock) over a store that can be taken down.
type brokenCircuit struct {
	l       *limiter.Limiter
	store   *switchStore
	breaker *limiter.Breaker
	clock   *fakeClock
}

func newBrokenCircuit(t *testing.T, p limiter.Policy) *brokenCircuit {
	t.Helper()
	mem := limiter.NewMemoryStore()
	t.Cleanup(func() { _ = mem.Close() })
	c := &brokenCircuit{store: &switchStore{Store: mem}, clock: &fakeClock{t: t0}}
	c.breaker = limiter.NewBreaker(c.store, limiter.BreakerConfig{Threshold: 1, MinCooldown: time.Second, Now: c.clock.Now,
		IsFailure: limiter.IsUnavailable})
	p.Now = c.clock.Now
	l, err := limiter.New(p, limiter.Backend{Store: c.breaker, Base: c.store, Source: limiter.SourceRedis})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	c.l = l
	return c
}

// open takes the store down and opens the circuit with one failed request.
func (c *brokenCircuit) open(t *testing.T, in *limiter.Input) {
	t.Helper()
	c.store.down.Store(true)
	if d, _ := c.l.Decide(context.Background(), in); d.Outcome != limiter.OutcomeUnavailable || c.breaker.State() != limiter.Open {
		t.Fatalf("with the store down: %v, circuit %v; want unavailable, open", d.Outcome, c.breaker.State())
	}
}

// close brings the store back and closes the circuit with a probe.
func (c *brokenCircuit) close(t *testing.T, in *limiter.Input) {
	t.Helper()
	c.store.down.Store(false)
	c.clock.Advance(2 * time.Second)
	d, _ := c.l.Decide(context.Background(), in)
	c.l.Done(context.Background(), &d, http.StatusOK)
	if c.breaker.State() != limiter.Closed {
		t.Fatalf("after a probe that succeeded: circuit %v", c.breaker.State())
	}
}

// eventually asks until ok holds, for at most 2 s (a release is delivered
// by the breaker in the background once the circuit closes).
func eventually(ok func() bool) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if ok() {
			return true
		}
	}
	return false
}

// TestLeaseReleasedAfterCircuitCloses: a request decided by the store
// holds its lease; its response ends while the circuit is open, so its
// release cannot be sent then. The release reaches the store once the
// circuit closes: the key's next request gets the place, long before
// lease_timeout (1 minute on the injected clock, which stands still).
func TestLeaseReleasedAfterCircuitCloses(t *testing.T) {
	t.Parallel()
	c := newBrokenCircuit(t, limiter.Policy{Name: "lease", Windows: []limiter.Window{{Duration: time.Hour}},
		Concurrency: true, LeaseTimeout: time.Minute})
	in := &limiter.Input{Identity: "k", Limits: []int64{1000}, MaxConcurrent: 1}
	ctx := context.Background()
	held, _ := c.l.Decide(ctx, in)
	if held.Outcome != limiter.OutcomeAllowed || held.InFlight != 1 {
		t.Fatalf("first request: %v, in flight %d", held.Outcome, held.InFlight)
	}
	c.open(t, in)
	c.l.Done(ctx, &held, http.StatusOK) // the circuit is open: not sent now
	c.close(t, in)
	var last limiter.Decision
	if !eventually(func() bool {
		last, _ = c.l.Decide(ctx, in)
		c.l.Done(ctx, &last, http.StatusOK)
		return last.Outcome == limiter.OutcomeAllowed
	}) {
		t.Fatalf("after the circuit closed, the key's only request in flight having ended: %v (in flight %d); the release sent while the circuit was open never reached the store",
			last.Outcome, last.InFlight)
	}
}

// TestCountOnlyRecordedAfterCircuitCloses: count_only records a request's
// units after its response; a response that ends while the circuit is open
// is recorded once the circuit closes.
func TestCountOnlyRecordedAfterCircuitCloses(t *testing.T) {
	t.Parallel()
	c := newBrokenCircuit(t, limiter.Policy{Name: "count", Windows: []limiter.Window{{Duration: time.Hour}},
		CountOnly: func(status int) bool { return status == http.StatusUnauthorized }})
	in := &limiter.Input{Identity: "k", Limits: []int64{2}}
	other := &limiter.Input{Identity: "other", Limits: []int64{2}}
	ctx := context.Background()
	failed, _ := c.l.Decide(ctx, in)
	if failed.Outcome != limiter.OutcomeAllowed {
		t.Fatalf("first login: %v", failed.Outcome)
	}
	c.open(t, other)
	c.l.Done(ctx, &failed, http.StatusUnauthorized) // the circuit is open: not sent now
	c.close(t, other)
	var count int64
	if !eventually(func() bool {
		d, err := c.l.Peek(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		count = d.Windows[0].Count
		return count == 1
	}) {
		t.Fatalf("after the circuit closed, the key's window holds %d units; want the 1 of the failed login that ended while it was open", count)
	}
}

// TestAfterDoneWaitsForRequestsInFlight: the owner of a limiter's store
// (the adapter, at a reload) gives it back only once every request decided
// has released its lease: AfterDone runs at once with nothing in flight,
// and otherwise after the last Done, once, however many copies of the
// decision are done.
func TestAfterDoneWaitsForRequestsInFlight(t *testing.T) {
	t.Parallel()
	mem := limiter.NewMemoryStore()
	defer mem.Close()
	l, err := limiter.New(limiter.Policy{Name: "flight", Windows: []limiter.Window{{Duration: time.Hour}}, Concurrency: true},
		limiter.Backend{Store: mem, Source: limiter.SourceMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	in := &limiter.Input{Identity: "k", Limits: []int64{10}, MaxConcurrent: 5}
	a, _ := l.Decide(ctx, in)
	b, _ := l.Decide(ctx, in)
	copyOfA := a
	ran := make(chan bool, 2)
	l.AfterDone(func(deferred bool) { ran <- deferred })
	l.Done(ctx, &a, http.StatusOK)
	l.Done(ctx, &copyOfA, http.StatusOK)
	select {
	case <-ran:
		t.Fatal("AfterDone ran with a request still in flight")
	default:
	}
	if d, _ := l.Peek(ctx, in); d.InFlight != 1 {
		t.Fatalf("in flight after one of two requests ended (its decision done twice): %d, want 1", d.InFlight)
	}
	l.Done(ctx, &b, http.StatusOK)
	if deferred := <-ran; !deferred {
		t.Fatal("AfterDone ran before the last request was done")
	}
	l.AfterDone(func(deferred bool) { ran <- deferred })
	if deferred := <-ran; deferred {
		t.Fatal("with nothing in flight, AfterDone did not run at once")
	}
}

// releaseLog is a store that can be taken down and logs the lease ids
// released through it.
type releaseLog struct {
	flakyStore
	mu  sync.Mutex
	ids []string
}

func (r *releaseLog) Do(ctx context.Context, op *limiter.Op) (limiter.Reply, error) {
	reply, err := r.flakyStore.Do(ctx, op)
	if err == nil && op.Mode == limiter.ModeRelease {
		r.mu.Lock()
		r.ids = append(r.ids, op.Lease.ID)
		r.mu.Unlock()
	}
	return reply, err
}

func (r *releaseLog) released() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ids...)
}

// TestHeldReleasesExpireWithTheirLease: a release held while the circuit is
// open is sent when it closes only while its lease could still be held: one
// whose lease_timeout passed during the outage is not sent (the lease is
// gone by itself), one still within it is, once.
func TestHeldReleasesExpireWithTheirLease(t *testing.T) {
	t.Parallel()
	store := &releaseLog{}
	clock := &fakeClock{t: t0}
	b := limiter.NewBreaker(store, limiter.BreakerConfig{Threshold: 1, MinCooldown: time.Second, Now: clock.Now,
		IsFailure: limiter.IsUnavailable})
	ctx := context.Background()
	store.down.Store(true)
	if _, err := b.Do(ctx, &limiter.Op{Mode: limiter.ModeCheck}); err == nil || b.State() != limiter.Open {
		t.Fatalf("a failed check: %v, circuit %v", err, b.State())
	}
	for _, l := range []limiter.LeaseOp{{Key: "k", ID: "short", Timeout: time.Second.Microseconds()}, {Key: "k", ID: "long", Timeout: time.Minute.Microseconds()}} {
		if _, err := b.Do(ctx, &limiter.Op{Mode: limiter.ModeRelease, Lease: &l}); !errors.Is(err, limiter.ErrCircuitOpen) {
			t.Fatalf("a release with the circuit open: %v", err)
		}
	}
	store.down.Store(false)
	clock.Advance(5 * time.Second)
	if _, err := b.Do(ctx, &limiter.Op{Mode: limiter.ModeCheck}); err != nil || b.State() != limiter.Closed {
		t.Fatalf("the probe: %v, circuit %v", err, b.State())
	}
	if !eventually(func() bool { return len(store.released()) == 1 }) || store.released()[0] != "long" {
		t.Fatalf("released after the circuit closed: %v, want [long] (short's lease_timeout passed during the outage)", store.released())
	}
	if _, err := b.Do(ctx, &limiter.Op{Mode: limiter.ModeCheck}); err != nil {
		t.Fatal(err)
	}
	if got := store.released(); len(got) != 1 {
		t.Fatalf("released after a further call: %v, want each held release sent once", got)
	}
}
