package main

import (
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// result is what a run measured.
type result struct {
	c      config
	tr     trace
	win    time.Duration
	global *outcome
	local  *outcome
	all    []int64   // every admission of the multi-DC run, sorted
	fair   []float64 // each data centre's max-min fair rate at the plateau

	Admitted   int
	Over       int64 // most in a trailing window, less the limit
	OverAt     time.Duration
	LocalOver  int64 // the same without the ledger (each data centre its own ceiling)
	ODFrom     time.Duration
	ODWindows  float64 // whole windows in the over-demand phase
	Under      underUse
	Follow     follow
	Fair       float64 // the viral data centre's max-min fair rate at the plateau
	PerDC      []dcFigures
	P50, P99   [2]time.Duration // [multi, local]
	P999, PMax [2]time.Duration
	AP50, AP99 [2]time.Duration // admitted decisions only
	WP50, WP99 [2]time.Duration // decisions sent before the rise (the ceiling has room)
	OP50, OP99 [2]time.Duration // decisions sent in the over-demand phase
	Waited     [2][3]int        // decisions that took at least a round trip: all, before the rise, over-demand
	Decisions  [2][3]int
	Bins       [][]float64 // admitted per second, per data centre (multi run)
	BinLen     time.Duration
}

// dcFigures are one data centre's in the over-demand phase.
type dcFigures struct {
	Name              string
	Demand, Admitted  float64 // requests
	Fair              float64 // its max-min fair allocation (requests)
	WorstWindow       float64 // flat ones: the least admitted/demand in a whole window
	Denied, Unavail   int
	Starved, Grants   int
	Empty             int
	LedgerErrs, Ended int
	RTT               time.Duration
}

func analyse(c config, tr trace, win time.Duration, g, l *outcome) *result {
	r := &result{c: c, tr: tr, win: win, global: g, local: l}
	winUS, end := win.Microseconds(), tr.total().Microseconds()
	r.all = times(g.recs, func(record) bool { return true })
	r.Admitted = len(r.all)
	over, when := overAdmitted(r.all, winUS, c.Limit)
	r.Over, r.OverAt = over, time.Duration(when)*time.Microsecond
	r.LocalOver, _ = overAdmitted(times(l.recs, func(record) bool { return true }), winUS, c.Limit)
	ceiling := float64(c.Limit) / win.Seconds()
	od, ok := tr.overDemand(ceiling)
	if !ok {
		od = tr.total()
	}
	r.ODFrom = od
	r.ODWindows = float64(tr.total()-od) / float64(win)
	r.Under = measureUnderUse(r.all, od.Microseconds(), end, winUS, max(winUS/150, 1000), c.Limit)

	demands := make([]float64, c.DCs)
	for dc := range demands {
		demands[dc] = tr.rate(dc, tr.total())
	}
	r.fair = maxMinFair(demands, ceiling)
	r.Fair = r.fair[tr.viral()]
	viral := times(g.recs, func(x record) bool { return x.dc == tr.viral() })
	r.Follow = measureFollow(tr, r.all, viral, winUS, c.Limit, r.Fair)
	for dc := range c.DCs {
		r.PerDC = append(r.PerDC, r.analyseDC(dc))
	}
	for i, o := range []*outcome{g, l} {
		r.analyseLatency(i, o)
	}
	r.analyseBins()
	return r
}

// analyseDC is data centre dc's figures in the over-demand phase.
func (r *result) analyseDC(dc int) dcFigures {
	tr, win, g, od := r.tr, r.win, r.global, r.ODFrom
	mine := times(g.recs, func(x record) bool { return x.dc == dc })
	f := dcFigures{Name: fmt.Sprintf("dc%d", dc),
		Demand:   tr.cum(dc, tr.total()) - tr.cum(dc, od),
		Admitted: float64(count(mine, od.Microseconds(), tr.total().Microseconds())),
		Fair:     r.fair[dc] * (tr.total() - od).Seconds(), WorstWindow: -1}
	if dc == tr.viral() {
		f.Name += " (viral)"
	} else {
		for s := od; s+win <= tr.total(); s += win {
			d := tr.cum(dc, s+win) - tr.cum(dc, s)
			v := float64(count(mine, s.Microseconds(), (s+win).Microseconds())) / d
			if f.WorstWindow < 0 || v < f.WorstWindow {
				f.WorstWindow = v
			}
		}
	}
	for _, x := range g.recs {
		if x.dc == dc && x.sent >= od.Microseconds() && !x.pass {
			f.Denied++
			if x.down {
				f.Unavail++
			}
		}
	}
	ev := g.events[dc]
	f.Starved, f.Grants, f.LedgerErrs, f.Ended = ev[limiter.EventStarved], ev[limiter.EventGrant], ev[limiter.EventLedgerError], ev[limiter.EventReturn]
	f.RTT, f.Empty = g.rtt[dc], g.empty[dc]
	return f
}

// analyseLatency fills the latency figures of run i (0 multi-DC, 1 one
// store).
func (r *result) analyseLatency(i int, o *outcome) {
	warm, od := r.tr.warm.Microseconds(), r.ODFrom.Microseconds()
	lat := latencies(o.recs, func(record) bool { return true })
	r.P50[i], r.P99[i], r.P999[i] = percentile(lat, 0.50), percentile(lat, 0.99), percentile(lat, 0.999)
	if len(lat) > 0 {
		r.PMax[i] = lat[len(lat)-1]
	}
	alat := latencies(o.recs, func(x record) bool { return x.pass })
	r.AP50[i], r.AP99[i] = percentile(alat, 0.50), percentile(alat, 0.99)
	wlat := latencies(o.recs, func(x record) bool { return x.sent < warm })
	r.WP50[i], r.WP99[i] = percentile(wlat, 0.50), percentile(wlat, 0.99)
	olat := latencies(o.recs, func(x record) bool { return x.sent >= od })
	r.OP50[i], r.OP99[i] = percentile(olat, 0.50), percentile(olat, 0.99)
	r.Decisions[i] = [3]int{len(lat), len(wlat), len(olat)}
	for k, s := range [][]time.Duration{lat, wlat, olat} {
		for _, d := range s {
			if d >= 2*r.c.Delay {
				r.Waited[i][k]++
			}
		}
	}
}

// analyseBins counts the multi-DC run's admissions per second and data
// centre, for the plot.
func (r *result) analyseBins() {
	r.BinLen = time.Second
	nb := int(r.tr.total() / r.BinLen) // whole bins only
	r.Bins = make([][]float64, r.c.DCs)
	for dc := range r.Bins {
		r.Bins[dc] = make([]float64, nb)
	}
	for _, x := range r.global.recs {
		if i := int(time.Duration(x.at) * time.Microsecond / r.BinLen); x.pass && x.at >= 0 && i < nb {
			r.Bins[x.dc][i] += 1 / r.BinLen.Seconds()
		}
	}
}

func pct(v float64) string { return fmt.Sprintf("%.1f %%", 100*v) }

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond)) }

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// perWindow converts a rate (requests a second, real) to requests per
// window.
func (r *result) perWindow(rate float64) float64 { return rate * r.win.Seconds() }

// print writes the report.
func (r *result) print(out io.Writer) {
	r.printSetup(out)
	r.printCeiling(out)
	r.printFairness(out)
	r.printLatency(out)
}

// printSetup says what was measured and how.
func (r *result) printSetup(out io.Writer) {
	c, tr := r.c, r.tr
	p := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	rt := 2 * c.Delay
	p("")
	p("Setup")
	p("  nodes: one per data centre, in-process engine nodes: a limiter.Limiter over the data centre's redis-server with")
	p("    the store stack the plugin builds (pipelined Redis store, breaker) and Backend.Global, the Decide Caddy's handler")
	p("    calls for each request. %d Caddy processes and %d redis-servers on this machine's %d cores would measure the", c.DCs, c.DCs+1, runtime.NumCPU())
	p("    machine, not the limiter.")
	p("  servers: each data centre its own redis-server (region budgets, its share of the ceiling); the ledger its own")
	p("    redis-server, reached by each data centre through its own proxy (internal/netproxy) delaying %v each way:", c.Delay)
	p("    a %v round trip. All on 127.0.0.1.", rt)
	p("  time scaled ÷%g: the %v window is %v, every phase ÷%g, every rate ×%g; the %v round trip is not scaled,", c.Scale, c.Window, r.win, c.Scale, c.Scale, rt)
	p("    so it is %g times the part of the window it would be unscaled: the figures below are conservative.", c.Scale)
	p("  the trace (requests per window; a window is %v unscaled, %v here): global_limit %d.", c.Window, r.win, c.Limit)
	p("    dc0..dc%d flat at %.0f each; dc%d at %.0f, rising linearly to %.0f over %v (%v here) after %v (%v here),",
		c.DCs-2, r.perWindow(tr.flat), tr.viral(), r.perWindow(tr.flat), r.perWindow(tr.high), c.Ramp, tr.ramp, c.Warm, tr.warm)
	p("    then held %v (%v here). Total demand at the top: %.0f per window, %.1fx the ceiling.", c.Hold, tr.hold,
		r.perWindow(tr.totalRate(tr.total())), tr.totalRate(tr.total())/(float64(c.Limit)/r.win.Seconds()))
	p("    Requests are sent open-loop at the trace's times (evenly spread at its rate) by a dispatcher per data centre,")
	p("    each in a goroutine of its own calling Decide, as an HTTP server runs them (at most %d in flight per data", c.Inflight)
	p("    centre; one more is dropped and counted).")
	p("  over-demand phase: from %.2f s (the total demand first above the ceiling's rate, %.1f/s) to the end at %.2f s:",
		r.ODFrom.Seconds(), float64(c.Limit)/r.win.Seconds(), tr.total().Seconds())
	p("    %.2f whole windows.", r.ODWindows)
	for i, o := range []*outcome{r.global, r.local} {
		p("  %s run: %d decisions in %.1f s, dropped (too many in flight) %d, errors %d.", []string{"multi-data-centre", "one-store"}[i],
			len(o.recs), o.elapsed.Seconds(), o.dropped, o.errs)
	}

}

// printCeiling: over-admission, under-use, the share follow time.
func (r *result) printCeiling(out io.Writer) {
	c, tr := r.c, r.tr
	p := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	rt := 2 * c.Delay
	p("")
	p("Results: the ceiling in the ledger, %v round trip", rt)
	p("  over-admission: the most admitted in any trailing %v window (by each admission's store time, Decision.At),", r.win)
	p("    less global_limit: %d (must be <= 0: %s); %d admitted in all.", r.Over, verdict(r.Over <= 0), r.Admitted)
	p("    (without the ledger, each data centre keeping its own %d: %+d.)", c.Limit, r.LocalOver)
	p("  under-use: 1 - admitted/global_limit, for each window wholly inside the over-demand phase (one every %v, %d windows):",
		time.Duration(max(r.win.Microseconds()/150, 1000))*time.Microsecond, r.Under.Windows)
	p("    worst %s (the window from %.2f s), median %s. Acceptance: <= 3 %%: %s.", pct(r.Under.Worst),
		float64(r.Under.WorstAt)/1e6, pct(r.Under.Median), verdict(r.Under.Windows > 0 && r.Under.Worst <= 0.03))
	p("  share follow time: from the start of the rise (%.2f s) until the ceiling is first %.0f %% used (%.2f s), for each",
		tr.warm.Seconds(), 100*fullShare, r.Follow.Full.Seconds())
	p("    time t every %v, the least L such that dc%d's admitted rate at t+L reaches %.0f %% of its target at t: the lesser", followStep, tr.viral(), 100*followShare)
	p("    of its demand and its max-min fair rate (%.1f/s, %.0f per window); both rates over the trailing %v. The share", r.Fair, r.perWindow(r.Fair), followSpan)
	bound := 2*rt + time.Second
	lag := fmt.Sprintf("%.2f s", r.Follow.Lag.Seconds())
	if r.Follow.Bounded {
		lag = "more than " + lag + " (not reached before the ceiling filled)"
	}
	p("    follow time is the worst L over %d times: %s (at t = %.2f s). Bound: 2 round trips + 1 s = %v: %s.", r.Follow.Points,
		lag, r.Follow.At.Seconds(), bound, verdict(!r.Follow.Bounded && r.Follow.Lag <= bound))
}

// printFairness: each data centre's admissions against its demand.
func (r *result) printFairness(out io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	p("  fairness, in the over-demand phase (requests; fair: the max-min fair split of the ceiling's rate by the demands):")
	p("    %-12s %9s %9s %9s %8s %8s %8s %7s %8s %7s %6s %6s %9s", "dc", "demand", "fair", "admitted", "adm/dem", "adm/fair",
		"worstwin", "denied", "starved", "calls", "empty", "errs", "ledgerRT")
	for _, f := range r.PerDC {
		ww := "-"
		if f.WorstWindow >= 0 {
			ww = pct(f.WorstWindow)
		}
		p("    %-12s %9.0f %9.0f %9.0f %8s %8s %8s %7d %8d %7d %6d %6d %9s", f.Name, f.Demand, f.Fair, f.Admitted,
			pct(f.Admitted/f.Demand), pct(f.Admitted/f.Fair), ww, f.Denied, f.Starved, f.Grants, f.Empty, f.LedgerErrs, ms(f.RTT))
	}
	p("    (worstwin: a flat data centre's least admitted/demand in a whole window of the phase; starved: refused while the")
	p("    ledger had room, as the engine counts it; calls: its ledger calls that answered, the whole run; empty: those that")
	p("    granted nothing; ledgerRT: their mean round trip.)")
}

// printLatency: the latency the ledger adds, and the verdicts.
func (r *result) printLatency(out io.Writer) {
	c := r.c
	p := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	rt := 2 * c.Delay
	p("  added latency: Decide's time for every decision of the trace, the same nodes with the ceiling in the ledger")
	p("    against the ceiling in one local Redis (global_limit in the data centre's own redis-server, as one data centre):")
	p("    %-16s %12s %12s %12s", "", "multi-DC", "one store", "added")
	row := func(name string, v [2]time.Duration) {
		p("    %-16s %12s %12s %12s", name, ms(v[0]), ms(v[1]), ms(v[0]-v[1]))
	}
	row("p50", r.P50)
	row("p99", r.P99)
	row("p99.9", r.P999)
	row("max", r.PMax)
	p("    by decision (the same percentiles, of some decisions only):")
	row("admitted p50", r.AP50)
	row("admitted p99", r.AP99)
	row("before rise p50", r.WP50)
	row("before rise p99", r.WP99)
	row("over-demand p50", r.OP50)
	row("over-demand p99", r.OP99)
	p("    decisions that took a round trip (%v) or more, multi-DC: %d of %d (before the rise %d of %d, over-demand %d of %d);",
		rt, r.Waited[0][0], r.Decisions[0][0], r.Waited[0][1], r.Decisions[0][1], r.Waited[0][2], r.Decisions[0][2])
	p("    one store: %d of %d.", r.Waited[1][0], r.Decisions[1][0])
	p("    Acceptance: p99 added <= 1 ms: %s.", verdict(r.P99[0]-r.P99[1] <= time.Millisecond))
	p("")
	p("Acceptance 2 (issue #21): under-use <= 3 %%: %s (worst %s); p99 added <= 1 ms: %s (%s).",
		verdict(r.Under.Windows > 0 && r.Under.Worst <= 0.03), pct(r.Under.Worst),
		verdict(r.P99[0]-r.P99[1] <= time.Millisecond), ms(r.P99[0]-r.P99[1]))
}
