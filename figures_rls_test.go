package slidingratelimit

import (
	"fmt"
	"strings"
	"testing"
)

// rlsBenchSection is docs/bench.md's record of cmd/rlsbench (make bench's
// Envoy part).
const rlsBenchSection = "\n## Envoy's rate limit service beside envoyproxy/ratelimit"

// rlsRatios reads, from the first run recorded in that section, the ratios
// of ours to envoyproxy/ratelimit with its defaults, per setting: the
// median of checks/s and of CPU per check (service + Redis).
func rlsRatios(t *testing.T) (checks, cpu map[string]string) {
	t.Helper()
	_, sec, ok := strings.Cut(readFile(t, "docs/bench.md"), rlsBenchSection)
	if !ok {
		t.Fatalf("docs/bench.md has no %q section", strings.TrimSpace(rlsBenchSection))
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	sec, _, _ = strings.Cut(sec, "\n### A second run")
	checks, cpu = map[string]string{}, map[string]string{}
	setting := ""
	for _, l := range strings.Split(sec, "\n") {
		if s, ok := strings.CutPrefix(l, "#### "); ok {
			setting = s
			continue
		}
		if !strings.HasPrefix(l, "| ") {
			continue
		}
		if c := mdCells(l); len(c) >= 5 && c[0] == "ours fixed_window" && c[1] == "envoy" && setting != "" {
			checks[setting], cpu[setting] = strings.Fields(c[2])[0], strings.Fields(c[4])[0]
		}
	}
	return checks, cpu
}

// rlsFigure is the README's cost row of cmd/rls beside envoyproxy/ratelimit,
// worked out from the record.
func rlsFigure(t *testing.T) string {
	checks, cpu := rlsRatios(t)
	const many, few = "4 conn x 64 in flight", "1 conn x 8 in flight"
	for _, s := range []string{many, few} {
		if checks[s] == "" || cpu[s] == "" {
			t.Fatalf("docs/bench.md's cmd/rlsbench record has no ratio of ours fixed_window to envoy at %s", s)
		}
	}
	return fmt.Sprintf("%s / %s; %s / %s", checks[many], checks[few], cpu[many], cpu[few])
}

// The record parses: the README's rule (TestFiguresBench) reads real cells.
func TestFiguresRLSRecord(t *testing.T) {
	if got := rlsFigure(t); strings.Count(got, "/") != 2 {
		t.Errorf("rlsFigure = %q", got)
	}
}

// fastPathSection is docs/bench.md's record of the callgrind counts after
// the call's floor was cut (issue 29, 2026-12-06; the fast paths' record,
// 2026-12-02, before it).
const fastPathSection = "\n## Redis's side, 2026-12-06 (issue 29): the call's floor"

// instructionsFigure is the README's row of instructions per check, FCALL
// 16 a call, log / counter / fixed / token: for each kind, the figure of its
// row in the last table that has one, from that section on (a
// row's figure is the cell before its last, "change").
func instructionsFigure(t *testing.T) string {
	t.Helper()
	_, sec, ok := strings.Cut(readFile(t, "docs/bench.md"), fastPathSection)
	if !ok {
		t.Fatalf("docs/bench.md has no %q section", strings.TrimSpace(fastPathSection))
	}
	var got []string
	for _, kind := range []string{"`sliding_log`", "`sliding_counter` (buckets)", "`fixed_window`", "`token_bucket`"} {
		found := ""
		for _, l := range strings.Split(sec, "\n") {
			if c := mdCells(l); len(c) >= 4 && c[0] == kind+", FCALL, 16 a call" {
				found = strings.Fields(c[len(c)-2])[0]
			}
		}
		if found == "" {
			t.Fatalf("docs/bench.md's fast path table has no row %q", kind+", FCALL, 16 a call")
		}
		got = append(got, found)
	}
	return strings.Join(got, " / ")
}
