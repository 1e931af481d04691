package limiter_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestLeaseReleasedBeforeTheKeysNextCheck: max_concurrent 2; two requests
// hold leases; the store stalls and another key's failure opens the
// circuit; both requests end while it is open (their releases are held);
// the store comes back. The key's first request a second later (the probe
// that closes the circuit, or a request just after another key's probe)
// passes with one lease in flight, its own: never "concurrency" for leases
// this node knows are given back. Before the fix the probe reached the
// store before the held releases: 429 concurrency, Retry-After 1 s.
func TestLeaseReleasedBeforeTheKeysNextCheck(t *testing.T) {
	t.Parallel()
	for _, closer := range []string{"the key's own request", "another key's request"} {
		t.Run(closer, func(t *testing.T) {
			t.Parallel()
			c := newBrokenCircuit(t, limiter.Policy{Name: "lease2", Windows: []limiter.Window{{Duration: time.Hour}},
				Concurrency: true, LeaseTimeout: time.Minute})
			in := &limiter.Input{Identity: "k", Limits: []int64{1000}, MaxConcurrent: 2}
			other := &limiter.Input{Identity: "other", Limits: []int64{1000}, MaxConcurrent: 2}
			ctx := context.Background()
			var held [2]limiter.Decision
			for i := range held {
				held[i], _ = c.l.Decide(ctx, in)
				if held[i].Outcome != limiter.OutcomeAllowed || held[i].InFlight != int64(i+1) {
					t.Fatalf("request %d: %v, in flight %d", i+1, held[i].Outcome, held[i].InFlight)
				}
			}
			c.open(t, other)
			for i := range held {
				c.l.Done(ctx, &held[i], http.StatusOK) // the circuit is open: held
			}
			c.store.down.Store(false)
			c.clock.Advance(time.Second + time.Millisecond)
			if closer == "another key's request" {
				d, _ := c.l.Decide(ctx, other)
				c.l.Done(ctx, &d, http.StatusOK)
				if c.breaker.State() != limiter.Closed {
					t.Fatalf("after another key's probe: circuit %v", c.breaker.State())
				}
			}
			d, err := c.l.Decide(ctx, in)
			if err != nil || d.Outcome != limiter.OutcomeAllowed || d.InFlight != 1 {
				t.Fatalf("the key's first request after the circuit closed: %v (in flight %d, retry after %v, err %v); "+
					"want allowed with its own lease alone in flight", d.Outcome, d.InFlight, d.RetryAfter, err)
			}
			c.l.Done(ctx, &d, http.StatusOK)
		})
	}
}

// TestLeaseReleaseRacesTheKeysCheck: many keys' releases held, the circuit
// closed by another key's probe (their delivery starts in the
// background), and at once a check of each key: every one passes, with
// its own lease alone in flight, whichever of the delivery and the check
// goes first.
func TestLeaseReleaseRacesTheKeysCheck(t *testing.T) {
	t.Parallel()
	c := newBrokenCircuit(t, limiter.Policy{Name: "lease3", Windows: []limiter.Window{{Duration: time.Hour}},
		Concurrency: true, LeaseTimeout: time.Minute})
	ctx := context.Background()
	keys := make([]*limiter.Input, 32)
	var held []limiter.Decision
	for i := range keys {
		keys[i] = &limiter.Input{Identity: "k" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Limits: []int64{1000}, MaxConcurrent: 1}
		d, _ := c.l.Decide(ctx, keys[i])
		if d.Outcome != limiter.OutcomeAllowed {
			t.Fatalf("key %d: %v", i, d.Outcome)
		}
		held = append(held, d)
	}
	other := &limiter.Input{Identity: "other", Limits: []int64{1000}, MaxConcurrent: 1}
	c.open(t, other)
	for i := range held {
		c.l.Done(ctx, &held[i], http.StatusOK)
	}
	c.store.down.Store(false)
	c.clock.Advance(2 * time.Second)
	d, _ := c.l.Decide(ctx, other)
	c.l.Done(ctx, &d, http.StatusOK)
	var wg sync.WaitGroup
	for i, in := range keys {
		wg.Go(func() {
			d, err := c.l.Decide(ctx, in)
			if err != nil || d.Outcome != limiter.OutcomeAllowed || d.InFlight != 1 {
				t.Errorf("key %d after the circuit closed: %v (in flight %d, err %v)", i, d.Outcome, d.InFlight, err)
			}
			c.l.Done(ctx, &d, http.StatusOK)
		})
	}
	wg.Wait()
}
