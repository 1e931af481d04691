package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// record is one decision.
type record struct {
	dc   int
	pass bool     // admitted under the ceiling (a fail-open pass is not)
	open bool     // passed by fail open (the ledger unreachable): counted apart
	down bool     // refused as unavailable (fail closed)
	at   int64    // µs after the start: the store's time of the decision (Decision.At)
	sent int64    // µs after the start: when the trace sent it
	took duration // Decide's time
}

type duration = time.Duration

// load sends the trace open-loop, as an HTTP server meets it: per data
// centre one dispatcher starts each request at its time in the trace
// (catching up at once when it is late, never faster) in a goroutine of its
// own that calls Decide, so a decision that waits holds up no other. At
// most inflight requests per data centre are in flight; one more is
// dropped (counted). It ends with the trace.
type load struct {
	tr       trace
	nodes    []*node
	limit    int64
	cost     int64 // each request's units
	inflight int
	dropped  atomic.Int64
	errs     atomic.Int64
}

// run sends the whole trace from start and returns every decision.
func (ld *load) run(ctx context.Context, start time.Time) []record {
	var mu sync.Mutex
	var all []record
	var wg sync.WaitGroup
	for dc, n := range ld.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			recs := ld.dispatch(ctx, dc, n, start)
			mu.Lock()
			all = append(all, recs...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all
}

func (ld *load) dispatch(ctx context.Context, dc int, n *node, start time.Time) []record {
	in := &limiter.Input{Identity: "viral", Region: n.dc.name, Limits: []int64{1 << 40}, GlobalLimits: []int64{ld.limit}, Cost: ld.cost}
	sem := make(chan struct{}, ld.inflight)
	var mu sync.Mutex
	var recs []record
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; ; i++ {
		at, ok := ld.tr.arrival(dc, i)
		if !ok {
			break
		}
		if d := time.Until(start.Add(at)); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case sem <- struct{}{}:
		default:
			ld.dropped.Add(1)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r, ok := ld.decide(ctx, dc, n, in, start, at)
			if ok {
				mu.Lock()
				recs = append(recs, r)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return recs
}

func (ld *load) decide(ctx context.Context, dc int, n *node, in *limiter.Input, start time.Time, sent time.Duration) (record, bool) {
	t0 := time.Now()
	d, err := n.l.Decide(ctx, in)
	took := time.Since(t0)
	if err != nil {
		ld.errs.Add(1)
		return record{}, false
	}
	r := record{dc: dc, sent: sent.Microseconds(), took: took, at: d.At.Sub(start).Microseconds()}
	switch {
	case d.Pass && d.Source == limiter.SourceFailOpen:
		r.open = true
	case d.Pass:
		r.pass = true
	case d.Outcome == limiter.OutcomeUnavailable:
		r.down = true
	}
	if d.At.IsZero() {
		r.at = time.Since(start).Microseconds()
	}
	return r, true
}
