package main

import (
	"strings"
	"testing"

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

// TestModelIsTheBuiltCounter: the model of the counter as built (overlap,
// 10 buckets) decides every request of a 100k trace as the in-process
// sliding_counter does, with the same count, so the candidates' figures (-candidates) are
// measured by the same rules as the counter's own.
func TestModelIsTheBuiltCounter(t *testing.T) {
	t.Parallel()
	cfg := defaultConfig()
	cfg.Requests = 100_000
	tr := buildTrace(cfg)
	md := candidates[0]
	if md.name != "overlap" || md.n != limiter.CounterBuckets || md.q != 0 {
		t.Fatalf("candidates[0] is %+v, want the built counter: overlap, %d buckets", md, limiter.CounterBuckets)
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

// TestCandidatesKeepTheBound: on the trace, no candidate admits more than
// limit + B in a window ending at one of its admissions.
func TestCandidatesKeepTheBound(t *testing.T) {
	t.Parallel()
	cfg := defaultConfig()
	cfg.Requests = 100_000
	tr := buildTrace(cfg)
	for _, md := range candidates {
		if r := runModel(cfg, tr, md, false); r.OverB > 0 {
			t.Errorf("%+v: a window held %d units over limit + B", md, r.OverB)
		}
	}
}
