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

// load sends the trace open-loop: per data centre one dispatcher sends
// each request at its time in the trace (catching up at once when it is
// late, never faster), to workers that call Decide; a request that finds
// every worker busy and the queue full is dropped (counted). It ends with
// the trace.
type load struct {
	tr      trace
	nodes   []*node
	limit   int64
	workers func(dc int) int
	dropped atomic.Int64
	errs    atomic.Int64
}

type job struct {
	sent time.Duration
}

// run sends the whole trace from start and returns every decision.
func (ld *load) run(ctx context.Context, start time.Time) []record {
	var mu sync.Mutex
	var all []record
	var wg sync.WaitGroup
	for dc, n := range ld.nodes {
		jobs := make(chan job, 4096)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(jobs)
			ld.dispatch(ctx, dc, start, jobs)
		}()
		for range ld.workers(dc) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				recs := ld.work(ctx, dc, n, start, jobs)
				mu.Lock()
				all = append(all, recs...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return all
}

func (ld *load) dispatch(ctx context.Context, dc int, start time.Time, jobs chan<- job) {
	for i := 0; ; i++ {
		at, ok := ld.tr.arrival(dc, i)
		if !ok {
			return
		}
		if d := time.Until(start.Add(at)); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		select {
		case jobs <- job{sent: at}:
		default:
			ld.dropped.Add(1)
		}
	}
}

func (ld *load) work(ctx context.Context, dc int, n *node, start time.Time, jobs <-chan job) []record {
	in := &limiter.Input{Identity: "viral", Region: n.dc.name, Limits: []int64{1 << 40}, GlobalLimits: []int64{ld.limit}}
	var recs []record
	for j := range jobs {
		if ctx.Err() != nil {
			continue // drain: the run was stopped
		}
		t0 := time.Now()
		d, err := n.l.Decide(ctx, in)
		took := time.Since(t0)
		if err != nil {
			ld.errs.Add(1)
			continue
		}
		r := record{dc: dc, sent: j.sent.Microseconds(), took: took, at: d.At.Sub(start).Microseconds()}
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
		recs = append(recs, r)
	}
	return recs
}
