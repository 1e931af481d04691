package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The sweep (make multidc): data centres x ceiling x the ledger's delay, each
// cell one run of a short viral trace with a fault in it, against the
// targets of issue #28.

// sweep is the cells to run.
type sweep struct {
	DCs     []int
	Ceiling []int64         // units per window
	RTT     []time.Duration // the ledger's round trip
	Window  time.Duration
	// Requests is about how many requests one window's ceiling holds: a
	// request costs ceiling / Requests units (at least 1), so that every
	// cell sends about as many requests (a ceiling of 100,000 a window is
	// 300 requests of 333 units).
	Requests int64
	// The trace: the flat data centres ask Flat of an equal share each,
	// the viral one rises from that to Over times the ceiling's rate in
	// Ramp after Warm, and is cut off from the ledger at FaultAt for
	// FaultFor; Hold after the rise.
	Flat, Over          float64
	Warm, Ramp, Hold    time.Duration
	FaultAt, FaultFor   time.Duration
	Baseline            time.Duration // the one-store run's length (the latency's baseline)
	Median, Worst, Fair float64       // the targets: ceiling used (median, worst window), a flat one's part of its ask
}

func defaultSweep() sweep {
	return sweep{DCs: []int{2, 8}, Ceiling: []int64{10, 1000, 100000},
		RTT:    []time.Duration{10 * time.Millisecond, 50 * time.Millisecond, 250 * time.Millisecond},
		Window: 6 * time.Second, Requests: 300, Flat: 0.5, Over: 4,
		Warm: time.Second, Ramp: time.Second, Hold: 16 * time.Second, FaultAt: 13 * time.Second, FaultFor: time.Second,
		Baseline: 5 * time.Second, Median: 0.97, Worst: 0.93, Fair: 0.95}
}

// only keeps, of each dimension, the values named in list (comma-separated:
// data centres, ceilings and round trips, told apart by their form); a
// dimension none is named of stays whole.
func (s sweep) only(list string) (sweep, error) {
	if list == "" {
		return s, nil
	}
	var dcs []int
	var ceil []int64
	var rtt []time.Duration
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if d, err := time.ParseDuration(f); err == nil {
			rtt = append(rtt, d)
			continue
		}
		n, err := strconv.ParseInt(f, 10, 64)
		switch {
		case err != nil || n <= 0:
			return s, fmt.Errorf("-cells: %q is neither a count nor a round trip", f)
		case slices.Contains(s.DCs, int(n)):
			dcs = append(dcs, int(n))
		case slices.Contains(s.Ceiling, n):
			ceil = append(ceil, n)
		default:
			return s, fmt.Errorf("-cells: %d is neither a sweep's data centres %v nor its ceiling %v", n, s.DCs, s.Ceiling)
		}
	}
	if dcs != nil {
		s.DCs = dcs
	}
	if ceil != nil {
		s.Ceiling = ceil
	}
	if rtt != nil {
		s.RTT = rtt
	}
	return s, nil
}

// cell is one cell's figures.
type cell struct {
	DCs     int
	Ceiling int64
	RTT     time.Duration
	Cost    int64
	Over    int64   // units over the ceiling in the worst trailing window (must be <= 0)
	Median  float64 // ceiling used, the median window wholly in the over-demand phase, away from the fault
	Worst   float64 // and the least
	Windows int
	Slack   float64 // one unit per data centre, as a share of the ceiling
	Fair    float64 // the flat data centres' least admitted/asked in the over-demand phase
	Recover time.Duration
	Bound   time.Duration // 2 round trips + 1 s
	P99     [2]time.Duration
	Elapsed time.Duration
}

func (s sweep) config(dcs int, ceiling int64, rtt time.Duration) config {
	cost := max(ceiling/s.Requests, 1)
	// Requests a minute (the trace's unit; Scale 1): the ceiling's rate in
	// requests.
	perMin := float64(ceiling/cost) / s.Window.Minutes()
	return config{DCs: dcs, Scale: 1, Delay: rtt / 2, Limit: ceiling, Window: s.Window,
		Flat: s.Flat * perMin / float64(dcs), To: s.Over * perMin, Warm: s.Warm, Ramp: s.Ramp, Hold: s.Hold,
		Inflight: 1000, Cost: cost, FaultAt: s.Warm + s.Ramp + s.FaultAt, FaultFor: s.FaultFor}
}

// runSweep runs every cell, prints the table to out and, with plot, draws
// the ceiling used by cell.
func runSweep(ctx context.Context, s sweep, plot string, out io.Writer) error {
	runtime.LockOSThread() // the servers die with the thread that started them
	defer runtime.UnlockOSThread()
	began := time.Now()
	fmt.Fprintf(out, "multidc sweep: data centres %v x ceiling %v per %v x ledger round trip %v; started %s, load average %s\n",
		s.DCs, s.Ceiling, s.Window, s.RTT, began.UTC().Format(time.RFC3339), loadavg())
	s.describe(out)
	var cells []cell
	for _, dcs := range s.DCs {
		base := map[int64]time.Duration{}
		for _, rtt := range s.RTT {
			for _, ceiling := range s.Ceiling {
				// A world of its own: a ledger emptied between cells would
				// make the clients that saw its epoch wait (a ledger
				// restarted empty).
				w, err := newWorld(dcs, rtt/2)
				if err != nil {
					return err
				}
				c, err := s.runCell(ctx, w, dcs, ceiling, rtt, base)
				w.close()
				if err != nil {
					return fmt.Errorf("%d data centres, ceiling %d, %v: %w", dcs, ceiling, rtt, err)
				}
				cells = append(cells, c)
				fmt.Fprintln(out, c.row(s))
			}
		}
	}
	s.summary(out, cells)
	fmt.Fprintf(out, "\nended %s after %v, load average %s (the machine's 2 cores are shared with other work: it shows in the latency)\n",
		time.Now().UTC().Format(time.RFC3339), time.Since(began).Round(time.Second), loadavg())
	if plot != "" {
		if err := writeSweepPlot(plot, s, cells); err != nil {
			return err
		}
		fmt.Fprintf(out, "plot: %s\n", plot)
	}
	return nil
}

func (s sweep) describe(out io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	p("  each cell: one node per data centre over its own redis-server, the ledger its own redis-server behind a proxy")
	p("    per data centre delaying half the round trip each way, all on 127.0.0.1; fail closed. A request costs")
	p("    ceiling/%d units (at least 1): every cell sends about as many requests.", s.Requests)
	p("  the trace: the flat data centres each ask %.0f %% of an equal share of the ceiling's rate; the viral one (the last)", 100*s.Flat)
	p("    asks as much for %v, rises to %.0fx the ceiling's rate in %v and holds it %v; it is cut off from the ledger", s.Warm, s.Over, s.Ramp, s.Hold)
	p("    %v into the hold, for %v.", s.FaultAt, s.FaultFor)
	p("  used: admitted units / ceiling for every window (one every %v) wholly inside the over-demand phase (the total", s.Window/30)
	p("    demand above the ceiling's rate) and not overlapping the fault or 2 round trips + 1 s after it: median and worst;")
	p("    target >= %.0f %% and >= %.0f %%, or within one unit per data centre of it (slack). fair: the flat data centres' least",
		100*s.Median, 100*s.Worst)
	p("    admitted/asked in the over-demand phase (target >= %.0f %%). recover: from the fault's end to the viral one's first", 100*s.Fair)
	p("    admission (bound 2 round trips + 1 s). p99: Decide's time, every decision, against the same nodes with the")
	p("    ceiling in their own Redis (one store, %v of the trace, per data centres and ceiling). over: the most units", s.Baseline)
	p("    admitted in any trailing window less the ceiling (must be <= 0).")
	p("")
	p("  %3s %8s %6s %5s %6s %8s %8s %6s %7s %9s %7s %10s %10s %10s", "dcs", "ceiling", "rtt", "cost", "over", "median", "worst",
		"slack", "fair", "recover", "bound", "p99", "one store", "added")
}

func (c cell) row(s sweep) string {
	mark := func(ok bool) string {
		if ok {
			return " "
		}
		return "!"
	}
	return fmt.Sprintf("  %3d %8d %6v %5d %6d %7.1f%%%s %7.1f%%%s %5.1f%% %6.1f%%%s %8.2fs%s %6.2fs %10s %10s %10s",
		c.DCs, c.Ceiling, c.RTT, c.Cost, c.Over, 100*c.Median, mark(c.Median+c.Slack >= s.Median),
		100*c.Worst, mark(c.Worst+c.Slack >= s.Worst), 100*c.Slack, 100*c.Fair, mark(c.Fair >= s.Fair),
		c.Recover.Seconds(), mark(c.Recover <= c.Bound), c.Bound.Seconds(), ms(c.P99[0]), ms(c.P99[1]), ms(c.P99[0]-c.P99[1]))
}

// runCell runs one cell in w (new), and the one-store baseline of its data
// centres and ceiling when base has none yet.
func (s sweep) runCell(ctx context.Context, w *world, dcs int, ceiling int64, rtt time.Duration, base map[int64]time.Duration) (cell, error) {
	c := s.config(dcs, ceiling, rtt)
	tr, win := c.scaled()
	t0 := time.Now()
	g, err := runTrace(ctx, w, c, tr, win, true)
	if err != nil {
		return cell{}, err
	}
	if _, ok := base[ceiling]; !ok {
		if err := w.flush(); err != nil {
			return cell{}, err
		}
		bc := c
		bc.FaultFor = 0
		btr := tr
		btr.hold = max(s.Baseline-tr.warm-tr.ramp, time.Second)
		l, err := runTrace(ctx, w, bc, btr, win, false)
		if err != nil {
			return cell{}, err
		}
		base[ceiling] = percentile(latencies(l.recs, func(record) bool { return true }), 0.99)
	}
	out := s.measure(c, tr, win, g)
	out.P99[1] = base[ceiling]
	out.Elapsed = time.Since(t0)
	return out, nil
}

// measure is a cell's figures from its multi-data-centre run.
func (s sweep) measure(c config, tr trace, win time.Duration, g *outcome) cell {
	out := cell{DCs: c.DCs, Ceiling: c.Limit, RTT: 2 * c.Delay, Cost: c.Cost, Bound: 4*c.Delay + time.Second}
	all := times(g.recs, func(record) bool { return true })
	winUS, end := win.Microseconds(), tr.total().Microseconds()
	over, _ := overAdmitted(all, winUS, c.Limit/c.Cost)
	out.Over = over * c.Cost
	if c.Limit%c.Cost != 0 {
		// The ceiling in whole requests is less than the ceiling: what is
		// over it is measured in units.
		out.Over = over*c.Cost - c.Limit%c.Cost
	}
	od, ok := tr.overDemand(float64(c.Limit/c.Cost) / win.Seconds())
	if !ok {
		od = tr.total()
	}
	fault0, fault1 := c.FaultAt.Microseconds(), (c.FaultAt + c.FaultFor + out.Bound).Microseconds()
	var used []float64
	out.Worst = math.Inf(1)
	for st := od.Microseconds(); st+winUS <= end; st += winUS / 30 {
		if st < fault1 && st+winUS > fault0 {
			continue
		}
		u := float64(int64(count(all, st, st+winUS))*c.Cost) / float64(c.Limit)
		used = append(used, u)
		out.Worst = min(out.Worst, u)
	}
	if len(used) > 0 {
		slices.Sort(used)
		out.Median, out.Windows = used[len(used)/2], len(used)
	} else {
		out.Worst = 0
	}
	out.Slack = float64(int64(c.DCs)*c.Cost) / float64(c.Limit)
	out.Fair = 1
	for dc := range c.DCs - 1 {
		asked, got := 0, 0
		for _, r := range g.recs {
			if r.dc == dc && r.sent >= od.Microseconds() {
				asked++
				if r.pass {
					got++
				}
			}
		}
		if asked > 0 {
			out.Fair = min(out.Fair, float64(got)/float64(asked))
		}
	}
	heal := (c.FaultAt + c.FaultFor).Microseconds()
	out.Recover = tr.total() - (c.FaultAt + c.FaultFor)
	first := int64(math.MaxInt64)
	for _, r := range g.recs {
		if r.dc == tr.viral() && r.pass && r.at >= heal {
			first = min(first, r.at)
		}
	}
	if first < math.MaxInt64 {
		out.Recover = time.Duration(first-heal) * time.Microsecond
	}
	out.P99[0] = percentile(latencies(g.recs, func(record) bool { return true }), 0.99)
	return out
}

// summary prints, over every cell, how many met each target, and the
// least figures.
func (s sweep) summary(out io.Writer, cells []cell) {
	p := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	var n, over, med, worst, fair, rec int
	leastMed, leastWorst, leastFair := 2.0, 2.0, 2.0
	var slowest time.Duration
	added := time.Duration(math.MinInt64)
	for _, c := range cells {
		n++
		if c.Over > 0 {
			over++
		}
		if c.Median+c.Slack >= s.Median {
			med++
		}
		if c.Worst+c.Slack >= s.Worst {
			worst++
		}
		if c.Fair >= s.Fair {
			fair++
		}
		if c.Recover <= c.Bound {
			rec++
		}
		leastMed, leastWorst, leastFair = min(leastMed, c.Median), min(leastWorst, c.Worst), min(leastFair, c.Fair)
		slowest, added = max(slowest, c.Recover), max(added, c.P99[0]-c.P99[1])
	}
	p("")
	p("Summary over %d cells (! marks a cell that missed a target):", n)
	p("  over-admission: %d cells over the ceiling (must be 0).", over)
	p("  ceiling used, median window >= %.0f %% (or within the slack): %d of %d cells; the least median %.1f %%.", 100*s.Median, med, n, 100*leastMed)
	p("  ceiling used, worst window >= %.0f %% (or within the slack): %d of %d cells; the least %.1f %%.", 100*s.Worst, worst, n, 100*leastWorst)
	p("  fairness, a flat data centre >= %.0f %% of what it asked: %d of %d cells; the least %.1f %%.", 100*s.Fair, fair, n, 100*leastFair)
	p("  recovery within 2 round trips + 1 s of the fault's end: %d of %d cells; the slowest %.2f s.", rec, n, slowest.Seconds())
	p("  p99 added, the most of any cell: %s.", ms(added))
}
