package main

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/procs"
)

// microBench is one sub-benchmark line of go test -bench -benchmem.
type microBench struct {
	Name        string   `json:"name"` // without the -GOMAXPROCS suffix
	NsPerOp     *float64 `json:"ns_per_op,omitempty"`
	BytesPerOp  *float64 `json:"bytes_per_op,omitempty"`
	AllocsPerOp *float64 `json:"allocs_per_op,omitempty"`
	// Failed is the first line of a sub-benchmark's failure ("--- FAIL").
	Failed string `json:"failed,omitempty"`
}

// microResult is the micro-benchmark's outcome: its lines, or why there are
// none (Err).
type microResult struct {
	Command string       `json:"command"`
	Benches []microBench `json:"benchmarks,omitempty"`
	Err     string       `json:"error,omitempty"`
}

// microBenchName is the benchmark of the root package whose allocs/op are
// reported.
const microBenchName = "BenchmarkHandler"

const microTimeout = 5 * time.Minute

// runMicro runs the handler micro-benchmark in the module root. It never
// fails the run: a missing benchmark, a build error or a timeout is
// reported in Err.
func runMicro(ctx context.Context, goBin, root, benchtime string) *microResult {
	args := []string{"test", "-run", "^$", "-bench", "^" + microBenchName + "$", "-benchmem", "-benchtime", benchtime, "-count", "1", "."}
	res := &microResult{Command: "go " + strings.Join(args, " ")}
	if goBin == "" || root == "" {
		res.Err = "go or the module root not found"
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, microTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = root
	cmd.SysProcAttr = procs.Attr()
	cmd.Cancel = func() error { return procs.KillGroup(cmd) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	res.Benches = parseBench(string(out))
	failed := 0
	for _, b := range res.Benches {
		if b.Failed != "" {
			failed++
		}
	}
	switch {
	case ctx.Err() != nil:
		res.Err = fmt.Sprintf("stopped after %v", microTimeout)
		if ctx.Err() == context.Canceled {
			res.Err = "interrupted"
		}
	case err != nil && failed > 0:
		res.Err = fmt.Sprintf("%d sub-benchmark(s) failed", failed)
	case err != nil:
		res.Err = fmt.Sprintf("%v: %s", err, lastLines(string(out), 3))
	case len(res.Benches) == 0:
		res.Err = "no " + microBenchName + " results in the output: " + lastLines(string(out), 3)
	}
	return res
}

var (
	benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+([0-9.]+) ns/op(.*)$`)
	benchFail = regexp.MustCompile(`^--- FAIL: (Benchmark\S+)`)
)

// parseBench reads the benchmark lines of go test -bench output, in order,
// with a row for each sub-benchmark that failed (a parent that failed only
// because a child did gets none).
func parseBench(out string) []microBench {
	var bs []microBench
	lines := strings.Split(out, "\n")
	for i, line := range lines {
		line = strings.TrimSpace(line)
		if sm := benchFail.FindStringSubmatch(line); sm != nil {
			msg := "failed"
			if i+1 < len(lines) {
				if next := strings.TrimSpace(lines[i+1]); next != "" && !strings.HasPrefix(next, "---") && !strings.HasPrefix(next, "Benchmark") {
					msg = next
				}
			}
			bs = append(bs, microBench{Name: sm[1], Failed: msg})
			continue
		}
		sm := benchLine.FindStringSubmatch(line)
		if sm == nil {
			continue
		}
		b := microBench{Name: sm[1]}
		if v, err := strconv.ParseFloat(sm[2], 64); err == nil {
			b.NsPerOp = &v
		}
		f := strings.Fields(sm[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "B/op":
				b.BytesPerOp = &v
			case "allocs/op":
				b.AllocsPerOp = &v
			}
		}
		bs = append(bs, b)
	}
	// Drop the failure of a parent whose children are listed.
	return slices.DeleteFunc(slices.Clone(bs), func(b microBench) bool {
		if b.Failed == "" {
			return false
		}
		for _, o := range bs {
			if strings.HasPrefix(o.Name, b.Name+"/") {
				return true
			}
		}
		return false
	})
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
