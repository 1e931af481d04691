package main

import (
	"fmt"
	"io"
	"math"
)

// Candidate counters, for choosing the next layout of sliding_counter by
// measurement (issue 29, build 3): `go run ./cmd/accuracy -candidates`
// replays the same trace against models of counters that are not built,
// beside a model of the one that is (TestModelIsTheBuiltCounter holds it to
// the in-process store, request by request), and prints for each the share
// of requests decided differently from the exact log and the most units any
// window ending at one of its admissions held beyond the limit (the bound
// says at most B = ceil(limit / N)).
//
// Every model splits the window of length L in N buckets of bw = ceil(L /
// N) µs, keeps the N + 1 newest, and counts the buckets after the oldest
// one, m0 (where the window (t - L, t] starts), whole and m0's c units by an
// estimate, never below c - B: a request fits when the estimate is at most
// limit - 1 (every request of the trace costs 1). They differ in what a
// bucket keeps and how m0's part is estimated:
//
//	overlap    c: c x / bw, x the µs of m0 inside the window (state format 2)
//	firstlast  c, the first and last arrival f <= l: 0 once l is out of the
//	           window, c while f is in, else c spread evenly over [f, l]
//	endpoints  as firstlast, but the two ends are requests: once f is out
//	           and l still in, 1 + (c - 2) spread evenly over [f, l] (as
//	           built at N = 20, to the µs: state format 3)
//
// q > 0 keeps f rounded down and l rounded up to steps of bw / q (a byte
// each at q = 256), as a packed layout would store them.
type model struct {
	name  string
	n     int  // buckets
	q     int  // f and l in steps of bw / q; 0: to the µs
	nocap bool // without the cap c - B (for the test that the bound is seen to break)
}

// mbucket is one bucket of a model's key.
type mbucket struct {
	m    int64 // its index; -1: never written
	c    float64
	f, l float64 // first and last arrival, µs
}

// mkey is one key's buckets, bucket m at m % (N + 1).
type mkey []mbucket

func (md model) est(k mkey, t, w, bw, limit float64) float64 {
	s := t - w
	m0 := int64(math.Floor(s / bw))
	b := math.Ceil(limit / float64(md.n))
	est := 0.0
	for i := range k {
		bk := &k[i]
		if bk.c == 0 || bk.m < m0 {
			continue
		}
		if bk.m > m0 {
			est += bk.c
			continue
		}
		var part float64
		switch {
		case md.name == "overlap":
			x := float64(m0+1)*bw - s
			part = bk.c * x / bw
		case bk.l <= s:
			part = 0
		case bk.f > s:
			part = bk.c
		case md.name == "firstlast":
			part = bk.c * (bk.l - s) / (bk.l - bk.f)
		default: // endpoints: f out, l in, so f < l and c >= 2
			part = 1 + (bk.c-2)*(bk.l-s)/(bk.l-bk.f)
		}
		if !md.nocap && bk.c-b > part {
			part = bk.c - b
		}
		est += part
	}
	return est
}

func (md model) add(k mkey, t, bw float64) {
	m := int64(math.Floor(t / bw))
	bk := &k[int(m%int64(len(k)))]
	f, l := t, t
	if md.q > 0 {
		step, start := bw/float64(md.q), float64(m)*bw
		f = start + math.Floor((t-start)/step)*step
		l = start + math.Ceil((t-start)/step)*step
	}
	if bk.m != m {
		*bk = mbucket{m: m, f: f}
	}
	bk.c++
	bk.l = l
}

// candidates are the models measured, the built counter's first.
var candidates = []model{
	{"endpoints", 20, 0, false}, // as built (state format 3)
	{"overlap", 10, 0, false},   // state format 2 {"overlap", 16, 0, false}, {"overlap", 24, 0, false}, {"overlap", 60, 0, false},
	{"overlap", 100, 0, false},
	{"firstlast", 10, 0, false}, {"firstlast", 16, 0, false}, {"firstlast", 24, 0, false},
	{"endpoints", 10, 0, false}, {"endpoints", 12, 0, false}, {"endpoints", 16, 0, false}, {"endpoints", 20, 0, false},
	{"endpoints", 24, 0, false}, {"endpoints", 16, 256, false}, {"endpoints", 20, 256, false},
	{"endpoints", 20, 4096, false}, {"endpoints", 20, 65536, false},
}

// modelRun is one model's outcome on a trace.
type modelRun struct {
	model
	Allowed, CounterOnly, LogOnly int
	Excess                        int64   // the most units beyond the limit in a window ending at an admission
	ExcessLimit, B                int64   // the limit of that key, and its B
	OverB                         int64   // the most units beyond limit + B in such a window (<= 0: the bound held)
	decisions                     []bool  // with keep
	counts                        []int64 // with keep: the estimate rounded up (at most the units kept), after the request
}

// runModel decides every request of tr with md and with an exact log (keep:
// the model's decisions are kept, for the test).
func runModel(cfg config, tr trace, md model, keep bool) modelRun {
	origin := traceOrigin.UnixMicro()
	w := float64(cfg.Window.Microseconds())
	bw := math.Ceil(w / float64(md.n))
	keys := make([]mkey, cfg.Keys)
	exact := newRefLogs(cfg.Keys, cfg.Window)
	shadow := newRefLogs(cfg.Keys, cfg.Window) // what the model admitted
	r := modelRun{model: md, Excess: math.MinInt64, OverB: math.MinInt64}
	for _, ev := range tr.events {
		t := origin + ev.at
		limit := tr.limits[ev.key]
		la := exact.admit(int(ev.key), ev.at, limit)
		k := keys[ev.key]
		if k == nil {
			k = make(mkey, md.n+1)
			for i := range k {
				k[i].m = -1
			}
			keys[ev.key] = k
		}
		e := md.est(k, float64(t), w, bw, float64(limit))
		ca := e <= float64(limit)-1
		if keep {
			held := 0.0
			for i := range k {
				if k[i].m > int64(math.Floor(float64(t)/bw))-int64(len(k)) {
					held += k[i].c
				}
			}
			count := int64(min(math.Ceil(e), held))
			if ca {
				count++
			}
			r.counts = append(r.counts, count)
		}
		if ca {
			md.add(k, float64(t), bw)
			r.Allowed++
			shadow.admit(int(ev.key), ev.at, math.MaxInt64)
			x, b := shadow.count(int(ev.key), ev.at)-limit, int64(math.Ceil(float64(limit)/float64(md.n)))
			if x > r.Excess {
				r.Excess, r.ExcessLimit, r.B = x, limit, b
			}
			r.OverB = max(r.OverB, x-b)
		}
		if keep {
			r.decisions = append(r.decisions, ca)
		}
		switch {
		case ca && !la:
			r.CounterOnly++
		case !ca && la:
			r.LogOnly++
		}
	}
	return r
}

// printCandidates runs every candidate on tr and prints the table.
func printCandidates(w io.Writer, cfg config, tr trace) {
	fmt.Fprintf(w, "candidates on the trace of %d requests over %d keys, window %s, seed %d (every estimate capped at c - B, B = ceil(limit/N))\n",
		len(tr.events), cfg.Keys, cfg.Window, cfg.Seed)
	fmt.Fprintf(w, "%-10s %4s %4s %10s %9s %9s  %s\n", "model", "N", "q", "differ", "c-only", "log-only",
		"most units over the limit in a window (that key's limit, B); most over limit + B")
	for _, md := range candidates {
		r := runModel(cfg, tr, md, false)
		fmt.Fprintf(w, "%-10s %4d %4d %9.4f%% %9d %9d  %d (%d, %d); %d\n", md.name, md.n, md.q,
			pct(r.CounterOnly+r.LogOnly, len(tr.events)), r.CounterOnly, r.LogOnly, r.Excess, r.ExcessLimit, r.B, r.OverB)
	}
}
