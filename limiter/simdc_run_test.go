package limiter_test

// The data-centre simulation's room-used and fairness figures, its budget,
// shrinking and tests.

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
)

// demand is identity id's demand at t: per data centre, requests a second.
func (w *dcWorld) demand(id string, t int64) map[int]int {
	d := map[int]int{}
	for _, p := range w.c.Phases {
		if p.ID == id && p.From <= t && t < p.To {
			d[p.DC] += p.Rate
		}
	}
	return d
}

// roomUsed samples identity "a"'s windows every 100 ms: those wholly inside
// an over-demand phase (every data centre's demand the same over the
// window, together at least the ceiling's), a window after the history
// began and outside every fault and its recovery. In each it measures the
// share of the ceiling admitted, and, for the data centres asking less than
// an equal share, what they got of what they asked.
func (w *dcWorld) roomUsed(res *dcResult) {
	W := w.c.Win
	var got, asked map[int]float64 = map[int]float64{}, map[int]float64{}
	for t := 2 * W; t <= w.c.Run; t += 100 {
		d := w.demand("a", t-W)
		if !mapsEqual(d, w.demand("a", t-1)) || !mapsEqual(d, w.demand("a", t-W/2)) {
			continue
		}
		total := 0
		for _, r := range d {
			total += r
		}
		if int64(total)*W/1000 < w.c.Limit || w.faultNear(t-W, t) {
			continue
		}
		end := w.start.Add(w.ms(t))
		used := w.admittedWithin("a", end)
		res.room = append(res.room, float64(used)/float64(w.c.Limit))
		if w.c.Limit-used > int64(len(w.sites)) && float64(used) < 0.93*float64(w.c.Limit) {
			w.seen["room_short"]++
		}
		equal := float64(w.c.Limit) / float64(len(d))
		for dc, r := range d {
			if ask := float64(r) * float64(W) / 1000; ask < equal {
				asked[dc] += ask
				got[dc] += float64(w.admittedDC("a", dc, end))
			}
		}
	}
	fair := []string{}
	for dc := range w.sites {
		if asked[dc] > 0 {
			fair = append(fair, fmt.Sprintf("dc%d %.0f%%", dc, 100*got[dc]/asked[dc]))
			if got[dc] < 0.95*asked[dc] {
				res.findings = append(res.findings, fmt.Sprintf("fair: dc%d asked less than an equal share and got %.0f%% of it (target 95%%)", dc, 100*got[dc]/asked[dc]))
			}
		}
	}
	if len(res.room) > 0 {
		med, worst := median(res.room), slices.Min(res.room)
		res.figures = append(res.figures, fmt.Sprintf("room used (%d windows, ceiling %d per %dms, %d data centres): median %.1f%%, worst %.1f%%; small data centres got %s",
			len(res.room), w.c.Limit, W, len(w.sites), 100*med, 100*worst, strings.Join(fair, ", ")))
		if w.seen["room_short"] > 0 {
			res.findings = append(res.findings, fmt.Sprintf("room: worst window used %.1f%% of the ceiling (target 93%%, or within one unit per data centre)", 100*worst))
		}
	}
}

func (w *dcWorld) admittedDC(id string, dc int, t time.Time) int64 {
	var n int64
	from := t.Add(-w.ms(w.c.Win))
	for _, r := range w.recs {
		if r.dc == dc && r.id == id && r.pass && !r.open && r.at.After(from) && !r.at.After(t) {
			n++
		}
	}
	return n
}

// faultNear reports whether a fault, or its recovery, overlaps (from, to]
// (ms from the start).
func (w *dcWorld) faultNear(from, to int64) bool {
	for _, f := range w.c.Faults {
		end := f.At + f.For + 1000 + 2*w.c.Delay[f.DC] + w.judgedWait(f).Milliseconds()
		if f.Kind == "reload" {
			end += w.c.Win
		}
		if f.At <= to && end > from {
			return true
		}
	}
	return false
}

func mapsEqual(a, b map[int]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// dcBudget is the histories to run: make test's fixed seeds and a few
// fresh ones (SIM_FRESH, default 1; printed, to replay one with SIM_SEED),
// SIM_SEED's one, or fresh ones until SIM_TIME has passed.
func dcBudget() (seeds []uint64, until time.Time) {
	if v := os.Getenv("SIM_SEED"); v != "" {
		var s uint64
		fmt.Sscan(v, &s)
		return []uint64{s}, time.Time{}
	}
	// Fresh seeds are never fixed ones: make test's have bit 40 set (short
	// histories), make simulate's bit 41 (longer).
	base := uint64(time.Now().UnixNano())&(1<<40-1) | 1<<40
	if d, err := time.ParseDuration(os.Getenv("SIM_TIME")); err == nil {
		return []uint64{base ^ 3<<40}, time.Now().Add(d)
	}
	for i := range dcFixed {
		seeds = append(seeds, uint64(i+1))
	}
	for i := range dcFoci {
		if dcFocusOn() {
			seeds = append(seeds, uint64(len(dcFixed)+i+1))
		}
	}
	for i := range simFresh("dc") {
		seeds = append(seeds, base+uint64(i))
	}
	return seeds, time.Time{}
}

// dcStrict: every finding fails its history (SIM_STRICT=1; the pending
// histories' replay fails on its own finding).
func dcStrict() bool { return os.Getenv("SIM_STRICT") != "" }

// shrinkDC drops faults, then phases, while the history still breaks the
// ceiling (each try a run in real time), within budget.
func (e *dcEnv) shrinkDC(c dcCase, budget time.Duration, fails func(dcResult) bool) dcCase {
	deadline := time.Now().Add(budget)
	for _, field := range []string{"faults", "phases"} {
		for i := 0; time.Now().Before(deadline); {
			t := c
			if field == "faults" {
				if i >= len(c.Faults) {
					break
				}
				t.Faults = slices.Delete(slices.Clone(c.Faults), i, i+1)
			} else {
				if i >= len(c.Phases) || len(c.Phases) == 1 {
					break
				}
				t.Phases = slices.Delete(slices.Clone(c.Phases), i, i+1)
			}
			if fails(e.runDC(&t)) {
				c = t
			} else {
				i++
			}
		}
	}
	return c
}

// simulateDC runs the budget (make test's histories side by side, each
// on servers of its own: they run in real time and use little of the
// machine), prints each history's figures and findings, fails on a broken
// ceiling (with the history shrunk) and, in strict mode, on a finding.
func simulateDC(t *testing.T) map[string]int {
	seeds, until := dcBudget()
	var mu sync.Mutex
	seen := map[string]int{}
	var room []float64
	var took []time.Duration
	one := func(t *testing.T, seed uint64) {
		e := &dcEnv{t: t, ledger: redistest.Start(t)}
		c := genDC(seed)
		res := e.judgeDC(t, &c, seed)
		mu.Lock()
		defer mu.Unlock()
		for k, v := range res.seen {
			seen[k] += v
		}
		room = append(room, res.room...)
		took = append(took, res.took...)
	}
	if !until.IsZero() {
		for seed := seeds[0]; time.Now().Before(until); seed++ {
			one(t, seed)
		}
	} else {
		t.Logf("histories (seeds) %v: replay one with SIM_SEED=<seed> go test -run 'TestSimDC$' ./limiter/", seeds)
		t.Run("histories", func(t *testing.T) {
			for _, seed := range seeds {
				t.Run(fmt.Sprint(seed), func(t *testing.T) {
					t.Parallel()
					one(t, seed)
				})
			}
		})
	}
	if len(room) > 0 {
		t.Logf("room used over every history: median %.1f%%, worst %.1f%% of %d windows; events %v", 100*median(room), 100*slices.Min(room), len(room), seen)
	}
	if len(took) > 0 {
		t.Logf("decision time over every history, outside faults: p50 %v, p99 %v of %d", dcQuantile(took, 0.5).Round(time.Millisecond/10), dcQuantile(took, 0.99).Round(time.Millisecond), len(took))
	}
	return seen
}

// judgeDC runs one history, prints it, and fails t on a broken ceiling
// (shrunk) or, in strict mode, on a finding.
func (e *dcEnv) judgeDC(t *testing.T, c *dcCase, seed uint64) dcResult {
	t0 := time.Now()
	res := e.runDC(c)
	t.Logf("%s (%d data centres %v, fail %s, ceiling %d per %dms, delays %v ms, offsets %v ms; %s):\n  faults %v\n  %s\n  findings: %d\n    %s",
		c.Name, len(c.Stacks), c.Stacks, c.Fail, c.Limit, c.Win, c.Delay, c.Offset, time.Since(t0).Round(time.Millisecond), c.Faults,
		strings.Join(res.figures, "\n  "), len(res.findings), strings.Join(res.findings, "\n    "))
	if res.err != nil {
		small := e.shrinkDC(*c, 2*time.Minute, func(r dcResult) bool { return r.err != nil })
		t.Fatalf("%s: %v\n\nshrunk (replay it with SIM_SEED=%d, or paste into dcPending/a test):\n%s", c.Name, res.err, seed, small.literal())
	}
	if dcStrict() && len(res.findings) > 0 {
		t.Errorf("%s: %d findings (SIM_SEED=%d):\n%s", c.Name, len(res.findings), seed, strings.Join(res.findings, "\n"))
	}
	return res
}

// TestSimDC runs the histories with data centres: make test's fixed seeds
// (and one fresh, printed), each reaching its fault kinds.
func TestSimDC(t *testing.T) {
	// Not parallel with the package's other tests: it runs in real time,
	// and their load would stretch its round trips (as the multidc tests).
	if os.Getenv("SIM_PENDING") != "" {
		replayPending(t)
		return
	}
	seen := simulateDC(t)
	if os.Getenv("SIM_SEED") == "" && os.Getenv("SIM_TIME") == "" {
		var kinds []string
		for _, k := range dcFaultKinds {
			kinds = append(kinds, "reached:"+k)
		}
		requireEvents(t, seen, append(kinds, "fail:closed", "fail:local", "fail:open", "static_share", "recalled", "clocks_apart", "memory_dc", "dcs>=5"))
	}
}

// TestSimDCFindingsFixed replays dcFindingsFixed: the histories of issue 28's findings that
// are fixed, each failing should its finding come back.
func TestSimDCFindingsFixed(t *testing.T) {
	// Not parallel with the package's other tests (as TestSimDC).
	replayCases(t, "fixed", dcFindingsFixed)
}

// replayPending replays dcPending in strict mode (SIM_PENDING=1), side by
// side: each fails while its finding stands.
func replayPending(t *testing.T) { replayCases(t, "pending", dcPending) }

// replayCases replays cases side by side, each failing on a finding of its
// kind.
func replayCases(t *testing.T, name string, cases []dcPendingCase) {
	t.Run(name, func(t *testing.T) {
		for _, p := range cases {
			t.Run(p.c.Name, func(t *testing.T) {
				t.Parallel()
				e := &dcEnv{t: t, ledger: redistest.Start(t)}
				c := p.c
				res := e.runDC(&c)
				t.Logf("%s:\n  %s\n  findings:\n    %s", c.Name, strings.Join(res.figures, "\n  "), strings.Join(res.findings, "\n    "))
				if res.err != nil {
					t.Errorf("%v", res.err)
				}
				for _, f := range res.findings {
					if strings.HasPrefix(f, p.finding+":") {
						t.Errorf("%s (expected: %s)", f, p.expect)
					}
				}
			})
		}
	})
}
