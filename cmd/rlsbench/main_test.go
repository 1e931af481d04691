package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Without -envoy / ENVOY_RLS the run measures ours alone and says so, in
// its log and in the report, with how to measure the reference too.
func TestEnvoyAbsentIsSaid(t *testing.T) {
	kind, err := envoySource("")
	if kind != "" || err != nil {
		t.Fatalf(`envoySource("") = %q, %v; want "", nil`, kind, err)
	}
	rep := &report{Rounds: 1, Run: time.Second, Envoy: envoyAbsent,
		Services: []*service{{Name: "ours fixed_window", Desc: "cmd/rls"}},
		Settings: []settingResult{{Setting: setting{1, 8}, Pairs: []pairSpec{{0, 0}},
			Rounds: [][]pairRun{{{A: runResult{Checks: 1000, Elapsed: time.Second}}}}}}}
	var b strings.Builder
	printReport(&b, rep)
	out := b.String()
	for _, want := range []string{"envoyproxy/ratelimit NOT measured", "ENVOY_RLS=", "No ratio:", "| ours fixed_window | 1000 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// A path that is neither a clone nor a binary is refused with what it is.
func TestEnvoySourceRefusesWhatItCannotRun(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "ratelimit")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	clone := filepath.Join(dir, "clone")
	if err := os.MkdirAll(filepath.Join(clone, "src", "service_cmd"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, kind, err string }{
		{filepath.Join(dir, "missing"), "", "no such file"},
		{dir, "", "not a clone of github.com/envoyproxy/ratelimit"},
		{plain, "", "not executable"},
		{bin, "binary", ""},
		{clone, "clone", ""},
	} {
		kind, err := envoySource(c.path)
		if kind != c.kind || (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("envoySource(%s) = %q, %v; want %q, error containing %q", c.path, kind, err, c.kind, c.err)
		}
	}
}

// A ratio is of a pair's two runs, back to back; the table gives the
// median of the pairs with their range (not the ratio of the medians,
// which mixes runs minutes apart), and every run of a service in its row.
func TestRatiosArePairByPair(t *testing.T) {
	run := func(n uint64) runResult { return runResult{Checks: n, Elapsed: time.Second} }
	sr := settingResult{Pairs: []pairSpec{{0, 2}, {1, 2}}, Rounds: [][]pairRun{
		{{run(200), run(100)}, {run(50), run(100)}}, // 2.0
		{{run(100), run(100)}, {run(50), run(100)}}, // 1.0 (a slow round for both)
		{{run(300), run(200)}, {run(50), run(200)}}, // 1.5
	}}
	got := spreadOf(ratios(sr, 0, 2, runResult.perSec)).format("%.2f")
	if want := "1.50 (1.00–2.00)"; got != want {
		t.Errorf("ratio = %s, want %s", got, want)
	}
	if got := len(column(sr, 2, runResult.perSec)); got != 6 {
		t.Errorf("service 2 has %d runs in its row, want 6 (two pairs a round)", got)
	}
}

func TestParseSettings(t *testing.T) {
	s, err := parseSettings("1x8, 4x64")
	if err != nil || len(s) != 2 || s[0] != (setting{1, 8}) || s[1] != (setting{4, 64}) {
		t.Fatalf("parseSettings = %v, %v", s, err)
	}
	for _, bad := range []string{"", "4", "0x8", "8x4", "ax8"} {
		if _, err := parseSettings(bad); err == nil {
			t.Errorf("parseSettings(%q) accepted", bad)
		}
	}
}
