package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestVerdict: flat figures after warm-up pass; a figure that keeps growing
// in the second half, or a store error, fails.
func TestVerdict(t *testing.T) {
	cfg := defaultConfig()
	cfg.Duration, cfg.Window = 100*time.Second, 5*time.Second
	flat := func(i int) sample {
		return sample{elapsed: time.Duration(i*10) * time.Second, usedMem: 9 << 20, dbsize: 42000 + int64(i), memKeys: 34000, heapInuse: 10 << 20}
	}
	var ok, growing []sample
	for i := 1; i <= 10; i++ {
		ok = append(ok, flat(i))
		g := flat(i)
		g.dbsize = int64(i) * 10000 // a leak: never flat
		growing = append(growing, g)
	}
	// Warm-up is ignored: the first half may climb.
	ok[0].dbsize, ok[1].dbsize = 10, 20000
	var out bytes.Buffer
	if !verdict(cfg, ok, 0, &out) || !strings.Contains(out.String(), "VERDICT: PASS") {
		t.Errorf("flat run: %s", out.String())
	}
	out.Reset()
	if verdict(cfg, growing, 0, &out) || !strings.Contains(out.String(), "dbsize 50000..100000 (x2.00, OUT OF BAND)") {
		t.Errorf("growing run: %s", out.String())
	}
	out.Reset()
	if verdict(cfg, ok, 3, &out) || !strings.Contains(out.String(), "VERDICT: FAIL") {
		t.Errorf("run with store errors: %s", out.String())
	}
	out.Reset()
	if verdict(cfg, ok[:1], 0, &out) {
		t.Errorf("one sample passed: %s", out.String())
	}
}

// TestRunShort runs the whole command for a few seconds against its own
// redis-server (needs redis-server on PATH) and checks that it reports.
func TestRunShort(t *testing.T) {
	cfg := defaultConfig()
	cfg.Duration, cfg.Window, cfg.Interval = 3*time.Second, 500*time.Millisecond, 500*time.Millisecond
	cfg.Rate, cfg.HotRate, cfg.Workers = 300, 100, 4
	var out bytes.Buffer
	_, err := run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"redis_used_mem", "dbsize", "store errors 0", "VERDICT: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if n := strings.Count(out.String(), "MiB\n"); n < 4 {
		t.Errorf("%d sample lines, want at least 4:\n%s", n, out.String())
	}
	t.Log("\n" + out.String())
}
