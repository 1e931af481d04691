// Command accuracy measures how far the sliding-window counter
// (sliding_counter) is from the exact sliding-window log (sliding_log).
//
//	go run ./cmd/accuracy [-requests 1000000] [-keys 2000] [-seed 1] ...
//
// It builds a seeded synthetic trace of bursty traffic over many keys and
// decides every request twice, on two in-process stores fed the trace's own
// clock: once with sliding_counter, once with sliding_log. It prints the
// share of requests the two decide differently, split by direction, and the
// mean absolute error of the counter's reported count (its estimate rounded
// up) against the exact count of the same admitted requests.
//
// The trace: keys have Zipf-distributed popularity; each key alternates
// exponentially distributed on and off periods (Poisson arrivals while on,
// silence while off). Each key's limit is set from its own on-period rate per
// window: most keys get 2x to 5x that (limits well above their bursts, as
// operators set them), a share of keys (-near) gets 0.8x to 1.25x, so they
// hover around their limit and are denied now and then.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// config describes one synthetic trace and run.
type config struct {
	Requests  int           // requests in the trace
	Keys      int           // distinct keys
	Duration  time.Duration // nominal length of the trace
	Window    time.Duration // the limiters' window
	ZipfS     float64       // Zipf exponent of key popularity
	OnMean    time.Duration // mean length of a key's on period
	OffMean   time.Duration // mean length of a key's off period
	NearShare float64       // share of keys whose limit is near their on-period rate
	Seed      uint64
}

func defaultConfig() config {
	return config{
		Requests:  1_000_000,
		Keys:      2000,
		Duration:  30 * time.Minute,
		Window:    time.Minute,
		ZipfS:     1.0,
		OnMean:    20 * time.Second,
		OffMean:   40 * time.Second,
		NearShare: 0.10,
		Seed:      1,
	}
}

// event is one request of the trace.
type event struct {
	at  int64 // µs from the trace start
	key int32
}

// trace is a generated workload.
type trace struct {
	events []event
	limits []int64 // per key
	near   []bool  // per key: limit set near its on-period rate
}

// buildTrace generates the workload described by cfg, deterministically.
func buildTrace(cfg config) trace {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xacc))
	k := cfg.Keys
	weights := make([]float64, k)
	var h float64
	for i := range weights {
		weights[i] = math.Pow(float64(i+1), -cfg.ZipfS)
		h += weights[i]
	}
	onShare := cfg.OnMean.Seconds() / (cfg.OnMean + cfg.OffMean).Seconds()
	// Generate a little more than asked and cut the trace at cfg.Requests,
	// so the count is exact whatever the on/off draws were.
	total := float64(cfg.Requests) * 1.15 / cfg.Duration.Seconds() // req/s
	durUS := cfg.Duration.Microseconds()

	tr := trace{limits: make([]int64, k), near: make([]bool, k)}
	tr.events = make([]event, 0, cfg.Requests*6/5)
	for key := 0; key < k; key++ {
		mean := total * weights[key] / h // req/s averaged over on and off
		onRate := mean / onShare         // req/s while on
		perWindow := onRate * cfg.Window.Seconds()
		var f float64
		floor := 5.0
		if rng.Float64() < cfg.NearShare {
			tr.near[key] = true
			f = 0.8 + 0.45*rng.Float64()
			floor = 2
		} else {
			f = 2 + 3*rng.Float64()
		}
		tr.limits[key] = int64(max(math.Ceil(f*perWindow), floor))

		t := 0.0
		on := rng.Float64() < onShare
		for t < float64(durUS) {
			meanLen := cfg.OffMean
			if on {
				meanLen = cfg.OnMean
			}
			end := t + rng.ExpFloat64()*float64(meanLen.Microseconds())
			if on {
				for a := t + rng.ExpFloat64()*1e6/onRate; a < end && a < float64(durUS); a += rng.ExpFloat64() * 1e6 / onRate {
					tr.events = append(tr.events, event{at: int64(a), key: int32(key)})
				}
			}
			t, on = end, !on
		}
	}
	slices.SortFunc(tr.events, func(a, b event) int {
		if a.at != b.at {
			if a.at < b.at {
				return -1
			}
			return 1
		}
		return int(a.key - b.key)
	})
	if len(tr.events) > cfg.Requests {
		tr.events = tr.events[:cfg.Requests]
	}
	return tr
}

// traceOrigin is the trace's start: an arbitrary instant, not on a window
// boundary.
var traceOrigin = time.Date(2026, 11, 29, 11, 59, 59, 123456000, time.UTC)

// report is the outcome of a run.
type report struct {
	Requests, Keys, NearKeys int
	Span                     time.Duration // first to last request
	CounterAllowed           int
	LogAllowed               int
	CounterOnly              int // counter allowed, log denied
	LogOnly                  int // counter denied, log allowed
	AbsErr                   float64
	SignedErr                float64
	MaxAbsErr                int64
	MeanExact                float64
	KeysDenied               int // keys the log denied at least once
	EitherDenied             int // requests at least one of the two denied
	Elapsed                  time.Duration
}

// Disagreement is the share of requests decided differently.
func (r report) Disagreement() float64 {
	return float64(r.CounterOnly+r.LogOnly) / float64(r.Requests)
}

// MAE is the mean absolute error of the counter's count.
func (r report) MAE() float64 { return r.AbsErr / float64(r.Requests) }

// run decides every request of the trace with both algorithms.
func run(cfg config, tr trace) (report, error) { return runWith(cfg, tr, nil) }

// runWith is run, telling each request's decision by the counter and the
// count it reported to seen (when not nil).
func runWith(cfg config, tr trace, seen func(i int, allowed bool, count int64)) (report, error) {
	start := time.Now()
	ctx := context.Background()
	counter := limiter.NewMemoryStore()
	defer counter.Close()
	// The exact references are plain sliding-window logs kept here, one
	// timestamp per admitted request and no bound on their length:
	// sliding_log proper holds at most 10,000 requests per key and window,
	// and the busiest keys of the trace have limits above that. shadow holds
	// exactly the requests the counter admitted, so the counter's estimate
	// is compared with the truth of its own history.
	exact := newRefLogs(cfg.Keys, cfg.Window)
	shadow := newRefLogs(cfg.Keys, cfg.Window)

	origin := traceOrigin
	var now time.Time
	clock := func() time.Time { return now }
	lc, err := limiter.New(limiter.Policy{Name: "a", KeyPrefix: "acc:", Algorithm: limiter.SlidingCounter,
		Windows: []limiter.Window{{Duration: cfg.Window}}, Now: clock},
		limiter.Backend{Store: counter, Source: limiter.SourceMemory})
	if err != nil {
		return report{}, err
	}
	ids := make([]string, cfg.Keys)
	for i := range ids {
		ids[i] = "key-" + strconv.Itoa(i)
	}
	deniedKeys := make([]bool, cfg.Keys)

	r := report{Requests: len(tr.events), Keys: cfg.Keys}
	for _, n := range tr.near {
		if n {
			r.NearKeys++
		}
	}
	if len(tr.events) > 0 {
		r.Span = time.Duration(tr.events[len(tr.events)-1].at-tr.events[0].at) * time.Microsecond
	}
	var exactSum float64
	for i, ev := range tr.events {
		now = origin.Add(time.Duration(ev.at) * time.Microsecond)
		in := limiter.Input{Identity: ids[ev.key], Limits: []int64{tr.limits[ev.key]}}
		dc, err := lc.Decide(ctx, &in)
		if err != nil {
			return r, err
		}
		rcAllowed := dc.Outcome == limiter.OutcomeAllowed
		if seen != nil {
			seen(i, rcAllowed, dc.Windows[0].Count)
		}
		rlAllowed := exact.admit(int(ev.key), ev.at, tr.limits[ev.key])
		if rcAllowed {
			shadow.admit(int(ev.key), ev.at, math.MaxInt64)
		}
		shadowCount := shadow.count(int(ev.key), ev.at)
		est := dc.Windows[0].Count
		if rcAllowed {
			est-- // the counter's count includes this request; compare before it
			shadowCount--
		}
		diff := est - shadowCount
		r.SignedErr += float64(diff)
		if diff < 0 {
			diff = -diff
		}
		r.AbsErr += float64(diff)
		r.MaxAbsErr = max(r.MaxAbsErr, diff)
		exactSum += float64(shadowCount)

		if rcAllowed {
			r.CounterAllowed++
		}
		if rlAllowed {
			r.LogAllowed++
		} else {
			deniedKeys[ev.key] = true
		}
		if !rcAllowed || !rlAllowed {
			r.EitherDenied++
		}
		switch {
		case rcAllowed && !rlAllowed:
			r.CounterOnly++
		case !rcAllowed && rlAllowed:
			r.LogOnly++
		}
	}
	for _, d := range deniedKeys {
		if d {
			r.KeysDenied++
		}
	}
	if r.Requests > 0 {
		r.MeanExact = exactSum / float64(r.Requests)
	}
	r.Elapsed = time.Since(start)
	return r, nil
}

func pct(n, of int) float64 { return 100 * float64(n) / float64(of) }

func (r report) print(w io.Writer, cfg config) {
	fmt.Fprintf(w, "trace: %d requests over %d keys (%d with a limit near their burst rate), %s of traffic, window %s, seed %d\n",
		r.Requests, r.Keys, r.NearKeys, r.Span.Round(time.Second), cfg.Window, cfg.Seed)
	fmt.Fprintf(w, "  Zipf s=%.2f popularity, on %s / off %s periods (means)\n", cfg.ZipfS, cfg.OnMean, cfg.OffMean)
	fmt.Fprintf(w, "allowed:   sliding_log %d (%.3f%%), sliding_counter %d (%.3f%%); keys the log denied at least once: %d\n",
		r.LogAllowed, pct(r.LogAllowed, r.Requests), r.CounterAllowed, pct(r.CounterAllowed, r.Requests), r.KeysDenied)
	fmt.Fprintf(w, "decided differently: %d of %d = %.4f%%\n",
		r.CounterOnly+r.LogOnly, r.Requests, 100*r.Disagreement())
	fmt.Fprintf(w, "  counter allowed, log denied: %d (%.4f%%)\n", r.CounterOnly, pct(r.CounterOnly, r.Requests))
	fmt.Fprintf(w, "  counter denied, log allowed: %d (%.4f%%)\n", r.LogOnly, pct(r.LogOnly, r.Requests))
	fmt.Fprintf(w, "  of the %d requests at least one of them denied, %.1f%% were decided differently\n",
		r.EitherDenied, pct(r.CounterOnly+r.LogOnly, r.EitherDenied))
	fmt.Fprintf(w, "counter's count (estimate rounded up) vs the exact count of the same admitted requests:\n")
	fmt.Fprintf(w, "  mean absolute error %.3f units (max %d, mean signed error %+.3f), mean exact count %.1f units (error %.2f%% of it)\n",
		r.MAE(), r.MaxAbsErr, r.SignedErr/float64(r.Requests), r.MeanExact, 100*r.MAE()/r.MeanExact)
	fmt.Fprintf(w, "ran in %s\n", r.Elapsed.Round(time.Millisecond))
}

func main() {
	cfg := defaultConfig()
	flag.IntVar(&cfg.Requests, "requests", cfg.Requests, "requests in the trace")
	flag.IntVar(&cfg.Keys, "keys", cfg.Keys, "distinct keys")
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "nominal length of the trace")
	flag.DurationVar(&cfg.Window, "window", cfg.Window, "the limiters' window")
	flag.Float64Var(&cfg.ZipfS, "zipf", cfg.ZipfS, "Zipf exponent of key popularity")
	flag.DurationVar(&cfg.OnMean, "on", cfg.OnMean, "mean on period of a key")
	flag.DurationVar(&cfg.OffMean, "off", cfg.OffMean, "mean off period of a key")
	flag.Float64Var(&cfg.NearShare, "near", cfg.NearShare, "share of keys whose limit is near their on-period rate")
	flag.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
	cands := flag.Bool("candidates", false, "measure models of candidate counters instead (models.go)")
	flag.Parse()
	if cfg.Requests <= 0 || cfg.Keys <= 0 || cfg.Duration <= 0 || cfg.Window < time.Millisecond ||
		cfg.OnMean <= 0 || cfg.OffMean <= 0 || cfg.NearShare < 0 || cfg.NearShare > 1 {
		fmt.Fprintln(os.Stderr, "accuracy: bad flags")
		os.Exit(2)
	}
	if *cands {
		printCandidates(os.Stdout, cfg, buildTrace(cfg))
		return
	}
	rep, err := run(cfg, buildTrace(cfg))
	if err != nil {
		fmt.Fprintln(os.Stderr, "accuracy:", err)
		os.Exit(1)
	}
	rep.print(os.Stdout, cfg)
}

// refLogs are exact sliding-window logs, one per key: the reference the
// counter is measured against.
type refLogs struct {
	window int64 // µs
	times  [][]int64
}

func newRefLogs(keys int, window time.Duration) *refLogs {
	return &refLogs{window: window.Microseconds(), times: make([][]int64, keys)}
}

// count is the requests of key in (at - window, at].
func (l *refLogs) count(key int, at int64) int64 {
	ts := l.times[key]
	i := 0
	for i < len(ts) && ts[i] <= at-l.window {
		i++
	}
	l.times[key] = ts[i:]
	return int64(len(ts) - i)
}

// admit records a request of key at at when the window holds fewer than
// limit.
func (l *refLogs) admit(key int, at, limit int64) bool {
	if l.count(key, at) >= limit {
		return false
	}
	l.times[key] = append(l.times[key], at)
	return true
}
