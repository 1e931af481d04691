package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
)

// TestScriptCostRedisRate: -kind 20 runs go-redis/redis_rate's script by
// the library, every check admitted, and prints a positive Redis time per
// check.
func TestScriptCostRedisRate(t *testing.T) {
	var out bytes.Buffer
	if err := runRedisRate(&out, "", 50, 20, 400, 1); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^redis_rate: +µs in the call per check ([\d.]+) `).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("output lacks the figure:\n%s", out.String())
	}
	if v, _ := strconv.ParseFloat(m[1], 64); v <= 0 {
		t.Errorf("µs per check is %s, want > 0", m[1])
	}
}
