package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestAccuracy runs a smaller trace (100k requests) and holds the sliding
// counter to its promise: it decides fewer than 1% of requests differently
// from the exact sliding log.
func TestAccuracy(t *testing.T) {
	t.Parallel()
	cfg := defaultConfig()
	cfg.Requests = 100_000
	tr := buildTrace(cfg)
	if len(tr.events) != cfg.Requests {
		t.Fatalf("trace has %d requests, want %d", len(tr.events), cfg.Requests)
	}
	rep, err := run(cfg, tr)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.print(&out, cfg)
	t.Log("\n" + out.String())
	// The trace must exercise the limit, or agreement proves nothing.
	if rep.LogAllowed == rep.Requests || rep.KeysDenied < 10 {
		t.Fatalf("trace never reaches the limit: %d of %d allowed, %d keys denied", rep.LogAllowed, rep.Requests, rep.KeysDenied)
	}
	if d := rep.Disagreement(); d >= 0.01 {
		t.Fatalf("sliding_counter decided %.3f%% of requests differently from sliding_log, want < 1%%", 100*d)
	}
}

// TestTraceDeterministic: the same seed gives the same trace.
func TestTraceDeterministic(t *testing.T) {
	t.Parallel()
	cfg := defaultConfig()
	cfg.Requests = 20_000
	a, b := buildTrace(cfg), buildTrace(cfg)
	if len(a.events) != len(b.events) {
		t.Fatalf("lengths %d and %d", len(a.events), len(b.events))
	}
	for i := range a.events {
		if a.events[i] != b.events[i] {
			t.Fatalf("event %d differs: %+v vs %+v", i, a.events[i], b.events[i])
		}
	}
}

// TestModelIsTheBuiltCounter: the model of the counter as built (endpoints,
// 20 buckets, to the µs: state format 3) decides every request of a 100k trace as the in-process
// sliding_counter does, with the same count, so the candidates' figures (-candidates) are
// measured by the same rules as the counter's own.
func TestModelIsTheBuiltCounter(t *testing.T) {
	t.Parallel()
	cfg := defaultConfig()
	cfg.Requests = 100_000
	tr := buildTrace(cfg)
	md := candidates[0]
	if md.name != "endpoints" || md.n != limiter.CounterBuckets || md.q != 0 {
		t.Fatalf("candidates[0] is %+v, want the built counter: endpoints, %d buckets", md, limiter.CounterBuckets)
	}
	got := runModel(cfg, tr, md, true)
	differ, first := 0, -1
	if _, err := runWith(cfg, tr, func(i int, allowed bool, count int64) {
		if got.decisions[i] != allowed || got.counts[i] != count {
			differ++
			if first < 0 {
				first = i
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if differ > 0 {
		t.Fatalf("the model decides or counts %d of %d requests otherwise than the in-process counter, the first request %d", differ, len(got.decisions), first)
	}
}

// TestCandidatesKeepTheBound: no candidate admits more than limit + B in
// a window ending at one of its admissions, on a 100k trace and on bursts
// timed against its bucket edges (edgeBursts), where the same models
// without the cap c - B do break it.
func TestCandidatesKeepTheBound(t *testing.T) {
	t.Parallel()
	cfg := defaultConfig()
	cfg.Requests = 100_000
	tr := buildTrace(cfg)
	for _, md := range candidates {
		if r := runModel(cfg, tr, md, false); r.OverB > 0 {
			t.Errorf("%+v: a window of the trace held %d units over limit + B", md, r.OverB)
		}
		edges, ecfg := edgeBursts(cfg.Window, md.n)
		r := runModel(ecfg, edges, md, false)
		if r.OverB > 0 {
			t.Errorf("%+v: a window of the edge bursts held %d units over limit + B", md, r.OverB)
		}
		if r.Excess < 0 {
			t.Errorf("%+v: the edge bursts never reached the limit (%d short), so they test nothing", md, -r.Excess)
		}
		md.nocap = true
		if r := runModel(ecfg, edges, md, false); r.OverB <= 0 {
			t.Errorf("%+v: without the cap the edge bursts stay within limit + B (%d over)", md, r.OverB)
		}
	}
}

// edgeBursts is one key's bursts against the edges of n buckets, limit
// 100: a request as a bucket starts and 99 in its last 99 µs (its first
// and last arrival as far apart as they go, its units at the end), then, a
// window later, a burst of 100 at each twentieth of the bucket as the
// window comes to start in it.
func edgeBursts(window time.Duration, n int) (trace, config) {
	cfg := defaultConfig()
	cfg.Keys = 1
	tr := trace{limits: []int64{100}, near: []bool{true}}
	w := window.Microseconds()
	bw := (w + int64(n) - 1) / int64(n)
	origin := traceOrigin.UnixMicro()
	m := (origin+1_000_000)/bw + 1
	at := func(abs int64) int64 { return abs - origin }
	tr.events = append(tr.events, event{at: at(m * bw)})
	for i := int64(99); i > 0; i-- {
		tr.events = append(tr.events, event{at: at((m+1)*bw - i)})
	}
	for j := int64(1); j < 20; j++ {
		t := m*bw + w + j*bw/20
		for range 100 {
			tr.events = append(tr.events, event{at: at(t)})
		}
	}
	return tr, cfg
}
