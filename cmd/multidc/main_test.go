package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs a tiny configuration end to end (3 data centres, a 1 s
// window, 5 ms each way, 1.7 s of trace per run, twice): the ceiling holds,
// something is admitted, and the report and the plot are written.
func TestSmoke(t *testing.T) {
	c := config{DCs: 3, Scale: 1, Delay: 5 * time.Millisecond, Limit: 100, Window: time.Second,
		Flat: 600, To: 30000, Warm: 300 * time.Millisecond, Ramp: 400 * time.Millisecond, Hold: time.Second,
		Inflight: 200, Plot: filepath.Join(t.TempDir(), "multidc.png")}
	var out bytes.Buffer
	res, err := run(context.Background(), c, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if res.Over > 0 {
		t.Errorf("over-admission %d (window ending %v): the ceiling did not hold", res.Over, res.OverAt)
	}
	if res.Admitted == 0 {
		t.Error("nothing admitted")
	}
	for _, want := range []string{"over-admission:", "under-use:", "share follow time:", "added latency:", "p99"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report has no %q", want)
		}
	}
	if fi, err := os.Stat(c.Plot); err != nil || fi.Size() == 0 {
		t.Errorf("plot: %v", err)
	}
}

// TestSweepSmoke runs a one-cell sweep end to end (2 data centres, a
// ceiling of 100 per second, 10 ms away, 2.6 s of trace with a fault): the
// ceiling holds, and the table, the summary and the plot are written.
func TestSweepSmoke(t *testing.T) {
	s := defaultSweep()
	s.DCs, s.Ceiling, s.RTT = []int{2}, []int64{100}, []time.Duration{10 * time.Millisecond}
	s.Window, s.Warm, s.Ramp, s.Hold = time.Second, 300*time.Millisecond, 300*time.Millisecond, 2*time.Second
	s.FaultAt, s.FaultFor, s.Baseline = time.Second, 300*time.Millisecond, time.Second
	plot := filepath.Join(t.TempDir(), "sweep.png")
	var out bytes.Buffer
	err := runSweep(context.Background(), s, plot, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"  over-admission: 0 cells over the ceiling", "ceiling used, median", "recovery within", "p99 added"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the sweep's report has no %q", want)
		}
	}
	if fi, err := os.Stat(plot); err != nil || fi.Size() == 0 {
		t.Errorf("plot: %v", err)
	}
}
