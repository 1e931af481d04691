package main

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestScriptCost: every kind, on each call path (FCALL, EVALSHA of the
// kind's script, EVALSHA of the cached script: uncached on Redis 7),
// prints a positive Redis time per check for ours and the baseline, and
// keys that hold entries.
func TestScriptCost(t *testing.T) {
	fig := regexp.MustCompile(`(?m)^(ours|baseline): +µs in the call per check ([\d.]+) `)
	for _, eval := range []int{0, 1, 2} {
		for kind := 1; kind <= 4; kind++ {
			var out bytes.Buffer
			if err := run(&out, "", 50, 20, 400, 4, kind, 10000, eval > 0, eval == 2, 1, true, false); err != nil {
				t.Fatalf("kind %d eval %v: %v", kind, eval, err)
			}
			m := fig.FindAllStringSubmatch(out.String(), -1)
			if len(m) != 2 {
				t.Fatalf("kind %d eval %v: output lacks the two figures:\n%s", kind, eval, out.String())
			}
			for _, f := range m {
				if v, _ := strconv.ParseFloat(f[2], 64); v <= 0 {
					t.Errorf("kind %d eval %v: %s µs per check is %s, want > 0", kind, eval, f[1], f[2])
				}
			}
		}
	}
}

// TestScriptCostSameRun: -redis_rate puts redis_rate's GCRA in the same
// run as ours and the baseline, each with a positive Redis CPU per check,
// and the summary's medians and ratios are those of the printed figures.
func TestScriptCostSameRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out, "", 50, 20, 400, 4, 4, 10000, false, false, 1, true, true); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	cpu := map[string][]string{}
	for _, m := range regexp.MustCompile(`(?m)^(ours|baseline|redis_rate): +µs in the call per check [\d. ]+; Redis CPU µs per check ([\d. ]+)`).FindAllStringSubmatch(s, -1) {
		cpu[m[1]] = strings.Fields(m[2])
	}
	if len(cpu) != 3 {
		t.Fatalf("want ours, baseline and redis_rate, got %v in:\n%s", cpu, s)
	}
	for who, figs := range cpu {
		if len(figs) != 5 || medianOf(figs) <= 0 {
			t.Errorf("%s: Redis CPU per check %v, want 5 rounds, median > 0", who, figs)
		}
	}
	want := "median Redis CPU µs per check, this run: ours " + median(cpu["ours"]) +
		", the four-command baseline " + median(cpu["baseline"]) + " (ours ÷ it " + ratio(cpu["ours"], cpu["baseline"]) + ")" +
		", redis_rate " + median(cpu["redis_rate"]) + " (ours ÷ it " + ratio(cpu["ours"], cpu["redis_rate"]) + ")"
	if !strings.Contains(s, want+"\n") {
		t.Errorf("summary: want %q in:\n%s", want, s)
	}
}

func TestMedian(t *testing.T) {
	if got := median([]string{"3.00", "1.00", "2.00", "9.00", "4.00"}); got != "3.00" {
		t.Errorf("median = %s, want 3.00", got)
	}
	if got := ratio([]string{"2.00"}, []string{"4.00"}); got != "0.50x" {
		t.Errorf("ratio = %s, want 0.50x", got)
	}
}
