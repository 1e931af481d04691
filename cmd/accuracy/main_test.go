package main

import (
	"strings"
	"testing"
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
