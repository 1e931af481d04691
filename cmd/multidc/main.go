// Command multidc measures the global ceiling across data centres (issue
// #21) on the viral trace: 8 data centres on loopback, each its own
// redis-server and one engine node, the ledger its own redis-server behind
// a latency proxy per data centre. It prints over-admission, under-use,
// the share follow time, fairness and the latency the ledger adds, and
// draws admitted requests per data centre against the ceiling. With
// -sweep (make multidc) it runs the sweep of issue #28 instead: data
// centres x ceiling x the ledger's round trip, each cell a short viral trace
// with a fault (sweep.go), and draws the ceiling used by cell.
//
//	go run ./cmd/multidc -plot docs/multidc.png
//	go run ./cmd/multidc -sweep -plot docs/multidc.png
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// config is one measurement. Rates and lengths are as the trace states
// them (requests a minute, real minutes); scale divides every length and
// multiplies every rate.
type config struct {
	DCs              int
	Scale            float64
	Delay            time.Duration // each way, data centre to ledger
	Limit            int64
	Window           time.Duration
	Flat, To         float64 // requests a minute
	Warm, Ramp, Hold time.Duration
	Inflight         int // requests in flight per data centre at most
	Plot             string
	// Cost is each request's units (0: 1); FaultFor, when set, cuts the
	// viral data centre off the ledger from FaultAt (real time) that long.
	Cost              int64
	FaultAt, FaultFor time.Duration
}

func defaults() config {
	return config{DCs: 8, Scale: 4, Delay: 25 * time.Millisecond, Limit: 10000, Window: time.Minute,
		Flat: 200, To: 40000, Warm: time.Minute, Ramp: 45 * time.Second, Hold: 4 * time.Minute, Inflight: 1000}
}

func main() {
	c := defaults()
	flag.IntVar(&c.DCs, "dcs", c.DCs, "data centres (one node each; the last is the viral one)")
	flag.Float64Var(&c.Scale, "scale", c.Scale, "time scale: every length ÷ scale, every rate × scale (the round trip stays real)")
	flag.DurationVar(&c.Delay, "delay", c.Delay, "delay each way between a data centre and the ledger")
	flag.Int64Var(&c.Limit, "limit", c.Limit, "global_limit: requests per window, across every data centre")
	flag.DurationVar(&c.Window, "window", c.Window, "global_limit's window (before scaling)")
	flag.Float64Var(&c.Flat, "flat", c.Flat, "requests a minute of each flat data centre (and of the viral one before its rise)")
	flag.Float64Var(&c.To, "to", c.To, "requests a minute of the viral data centre after its rise")
	flag.DurationVar(&c.Warm, "warm", c.Warm, "flat traffic before the rise (before scaling)")
	flag.DurationVar(&c.Ramp, "ramp", c.Ramp, "the rise's length (before scaling)")
	flag.DurationVar(&c.Hold, "hold", c.Hold, "traffic after the rise (before scaling)")
	flag.IntVar(&c.Inflight, "inflight", c.Inflight, "requests in flight per data centre at most (one more is dropped, counted)")
	flag.StringVar(&c.Plot, "plot", "", "write the plot of admitted requests here (.png or .svg)")
	sweep := flag.Bool("sweep", false, "sweep data centres x ceiling x delay (make multidc) instead of one run of the viral trace")
	only := flag.String("cells", "", "with -sweep: only the cells whose data centres, ceiling or round trip is one of these (comma-separated, e.g. 8,1000,250ms; empty: every cell)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *sweep {
		s, err := defaultSweep().only(*only)
		if err == nil {
			err = runSweep(ctx, s, c.Plot, os.Stdout)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "multidc:", err)
			stop()
			os.Exit(1)
		}
		return
	}
	if _, err := run(ctx, c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "multidc:", err)
		stop()
		os.Exit(1)
	}
}

func (c config) validate() error {
	switch {
	case c.DCs < 2:
		return errors.New("-dcs must be at least 2")
	case c.Scale <= 0:
		return errors.New("-scale must be positive")
	case c.Limit <= 0 || c.Window <= 0:
		return errors.New("-limit and -window must be positive")
	case c.Flat <= 0 || c.To < c.Flat:
		return errors.New("-flat must be positive and -to at least -flat")
	case c.Inflight <= 0:
		return errors.New("-inflight must be positive")
	}
	return nil
}

// scaled is the trace in real time.
func (c config) scaled() (trace, time.Duration) {
	d := func(x time.Duration) time.Duration { return time.Duration(float64(x) / c.Scale) }
	perSec := func(perMin float64) float64 { return perMin / 60 * c.Scale }
	return trace{dcs: c.DCs, flat: perSec(c.Flat), high: perSec(c.To), warm: d(c.Warm), ramp: d(c.Ramp), hold: d(c.Hold)},
		d(c.Window)
}

// outcome is one run's decisions, its nodes' events and load counters.
type outcome struct {
	recs    []record
	events  []map[limiter.GlobalEventKind]int
	rtt     []time.Duration // mean ledger round trip per data centre
	empty   []int           // ledger answers that granted nothing, per data centre
	dropped int64
	errs    int64
	elapsed time.Duration
}

// runTrace makes one node per data centre (global: with the ceiling in
// the ledger; otherwise in the data centre's own store) and sends the trace.
func runTrace(ctx context.Context, w *world, c config, tr trace, win time.Duration, global bool) (*outcome, error) {
	name := "local"
	if global {
		name = "multidc"
	}
	p := limiter.Policy{Name: name, Regions: true, Fail: limiter.FailClosed, Timeout: time.Second,
		Windows: []limiter.Window{{Duration: win}}, GlobalWindows: []limiter.Window{{Duration: win}}}
	var nodes []*node
	defer func() {
		for _, n := range nodes {
			n.close()
		}
	}()
	for _, dc := range w.dcs {
		n, err := newNode(dc, p, global)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	ld := &load{tr: tr, nodes: nodes, limit: c.Limit, inflight: c.Inflight, cost: max(c.Cost, 1)}
	// Bounded: the trace's length, and a margin for the last decisions.
	rctx, cancel := context.WithTimeout(ctx, tr.total()+10*time.Second)
	defer cancel()
	start := time.Now()
	if global && c.FaultFor > 0 {
		px := w.dcs[tr.viral()].proxy
		cut := time.AfterFunc(c.FaultAt, px.Cut)
		heal := time.AfterFunc(c.FaultAt+c.FaultFor, px.Heal)
		defer func() {
			cut.Stop()
			heal.Stop()
			px.Heal()
		}()
	}
	recs := ld.run(rctx, start)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := &outcome{recs: recs, dropped: ld.dropped.Load(), errs: ld.errs.Load(), elapsed: time.Since(start)}
	for _, n := range nodes {
		n.mu.Lock()
		ev := map[limiter.GlobalEventKind]int{}
		for k, v := range n.events {
			ev[k] = v
		}
		var rtt time.Duration
		if g := n.events[limiter.EventGrant]; g > 0 {
			rtt = n.rtt / time.Duration(g)
		}
		empty := n.empty
		n.mu.Unlock()
		o.events, o.rtt, o.empty = append(o.events, ev), append(o.rtt, rtt), append(o.empty, empty)
	}
	return o, nil
}

// run measures c, prints the report to out and, with c.Plot, draws it.
func run(ctx context.Context, c config, out io.Writer) (*result, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	// The servers die with the thread that started them (redistest.Launch):
	// keep this goroutine on its thread until they are stopped.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tr, win := c.scaled()
	w, err := newWorld(c.DCs, c.Delay)
	if err != nil {
		return nil, err
	}
	defer w.close()
	fmt.Fprintf(out, "multidc: %d data centres on loopback, one identity, the viral trace; started %s, load average %s\n",
		c.DCs, time.Now().UTC().Format(time.RFC3339), loadavg())
	global, err := runTrace(ctx, w, c, tr, win, true)
	if err != nil {
		return nil, fmt.Errorf("multi-data-centre run: %w", err)
	}
	if err := w.flush(); err != nil {
		return nil, err
	}
	local, err := runTrace(ctx, w, c, tr, win, false)
	if err != nil {
		return nil, fmt.Errorf("one-store run: %w", err)
	}
	res := analyse(c, tr, win, global, local)
	res.print(out)
	fmt.Fprintf(out, "\nended %s, load average %s (other work on this machine, if any, shows in the latency)\n",
		time.Now().UTC().Format(time.RFC3339), loadavg())
	if c.Plot != "" {
		if err := writePlot(c.Plot, res); err != nil {
			return res, err
		}
		fmt.Fprintf(out, "\nplot: %s\n", c.Plot)
	}
	return res, nil
}

// loadavg is the machine's 1, 5 and 15 minute load average ("?" where
// unknown).
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if err != nil || len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
