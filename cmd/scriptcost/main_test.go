package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
)

// TestScriptCost: every kind, on both call paths, prints a positive Redis
// time per check for ours and the baseline, and keys that hold entries.
func TestScriptCost(t *testing.T) {
	fig := regexp.MustCompile(`(?m)^(ours|baseline): +µs in the call per check ([\d.]+) `)
	for _, eval := range []bool{false, true} {
		for kind := 1; kind <= 4; kind++ {
			var out bytes.Buffer
			if err := run(&out, "", 50, 20, 400, 4, kind, eval, 1, true); err != nil {
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
