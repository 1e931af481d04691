package limiter_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// The room the ceiling leaves used, and no lockout after a fault (issue
// #28): each test here failed before its fix. Every admission goes into the
// oracle's ledger (oracleOver): over-admission 0 in every trailing window.

// roomDecide decides one request of id in data centre dc (node ni) and
// records it as hammer does.
func (w *mdcWorld) roomDecide(ctx context.Context, dc, ni int, id string, limit int64) limiter.Decision {
	w.t.Helper()
	return w.costDecide(ctx, dc, ni, id, limit, 1)
}

// costDecide is roomDecide for a request of cost units: the oracle holds
// it to the ceiling in whole requests, limit / cost.
func (w *mdcWorld) costDecide(ctx context.Context, dc, ni int, id string, limit, cost int64) limiter.Decision {
	w.t.Helper()
	in := &limiter.Input{Identity: id, Region: w.dcs[dc].name, Limits: []int64{1 << 40}, GlobalLimits: []int64{limit}, Cost: cost}
	w.mu.Lock()
	n := w.dcs[dc].nodes[ni]
	w.mu.Unlock()
	d, err := n.Decide(ctx, in)
	if err != nil {
		w.t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case d.Pass && d.Source == limiter.SourceFailOpen:
		w.failOpen++
	case d.Pass:
		w.admitted = append(w.admitted, d.At)
		w.limits = append(w.limits, limit/cost)
		w.perDC[w.dcs[dc].name] = append(w.perDC[w.dcs[dc].name], d.At)
	case d.Outcome == limiter.OutcomeUnavailable:
		w.unavailable[w.dcs[dc].name]++
	}
	return d
}

// exact fails t when any trailing window of win admitted more than its
// limit.
func (w *mdcWorld) exact(t *testing.T, win time.Duration) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if over, when := oracleOver(w.admitted, w.limits, win); over > 0 {
		t.Fatalf("%d over the ceiling in the window ending %v", over, when)
	}
}

// TestGlobalNoLockoutAfterALedgerStall: fail local, the ledger stalled for 1.5 s
// (longer than a membership, far shorter than the static share's wait)
// while a new identity asks (503), then back: every data centre admits
// again within 2 round trips + 1 s, for new identities too, and so does a
// node started afterwards. The ledger used to hold each data centre's
// static share reserved for a window after it was heard again, as if it
// might have been on it: a data centre whose share is empty got 429 with
// the global remaining 0 for a window.
func TestGlobalNoLockoutAfterALedgerStall(t *testing.T) {
	const limit, win = 100, 20 * time.Second
	o := mdcOptions(limiter.FailLocal)
	o.dcs, o.nodes = 2, 1
	o.policy.GlobalWindows = []limiter.Window{{Duration: win}}
	o.lto, o.beat = 300*time.Millisecond, 400*time.Millisecond
	o.delay = func(int) time.Duration { return 5 * time.Millisecond }
	w := newMDCWorld(t, o)
	ctx := context.Background()
	for dc := range w.dcs {
		if d := w.roomDecide(ctx, dc, 0, "before", limit); !d.Pass {
			t.Fatalf("dc%d, before the stall: %+v", dc, d)
		}
	}
	for _, dc := range w.dcs {
		dc.proxy.Cut()
	}
	stall := time.Now()
	if d := w.roomDecide(ctx, 0, 0, "new-in-the-stall", limit); d.Outcome != limiter.OutcomeUnavailable {
		t.Fatalf("a new identity while the ledger is stalled: %+v, want 503 (fail local, before the static share)", d)
	}
	time.Sleep(1500*time.Millisecond - time.Since(stall))
	for _, dc := range w.dcs {
		dc.proxy.Heal()
	}
	healed := time.Now()
	// 2 round trips + 1 s, and as much again for a loaded machine (-race,
	// other work): the lockout was a window, 20 s.
	bound := 2 * (2*10*time.Millisecond + time.Second)
	// A node started after the fault, in dc0.
	fresh := w.node(w.dcs[0], o)
	w.mu.Lock()
	w.dcs[0].nodes = append(w.dcs[0].nodes, fresh)
	w.mu.Unlock()
	// Each data centre's first node asks for the identity it asked for
	// before, the one refused in the stall and a new one; the fresh node
	// for a new one of its own.
	type ask struct {
		dc, ni int
		id     string
	}
	var asks []ask
	for dc := range w.dcs {
		for _, id := range []string{"before", "new-in-the-stall", fmt.Sprintf("new-after-%d", dc)} {
			asks = append(asks, ask{dc, 0, id})
		}
	}
	asks = append(asks, ask{0, 1, "new-at-a-fresh-node"})
	var wg sync.WaitGroup
	for _, a := range asks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				d := w.roomDecide(ctx, a.dc, a.ni, a.id, limit)
				if d.Pass {
					return
				}
				if took := time.Since(healed); took > bound {
					t.Errorf("dc%d node %d, %s: still refused %v after the ledger answered again (bound %v): %v %+v",
						a.dc, a.ni, a.id, took.Round(time.Millisecond), bound, d.Outcome, d.Windows)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	w.exact(t, win)
}

// paced sends id's requests from data centre dc at rate a second from
// start until end, evenly spaced (a late one is sent at once, never two
// at the same time), and returns how many it asked and how many were
// admitted.
func (w *mdcWorld) paced(ctx context.Context, dc int, id string, limit, cost int64, rate float64, start, end time.Time) (asked, admitted int) {
	for i := 0; ; i++ {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if !at.Before(end) || ctx.Err() != nil {
			return asked, admitted
		}
		time.Sleep(time.Until(at))
		asked++
		if d := w.costDecide(ctx, dc, i%len(w.dcs[dc].nodes), id, limit, cost); d.Pass {
			admitted++
		} else if debugMDC && rate < 10 {
			w.t.Logf("%v dc%d refused: %v %+v", time.Since(start), dc, d.Outcome, d.Windows[1])
		}
	}
}

// underUse is, for every window of length win starting every step from
// from until the last that ends by to, the share of limit it admitted: the
// median and the least.
func (w *mdcWorld) underUse(from, to time.Time, win, step time.Duration, limit int64) (median, least float64, leastAt time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var used []float64
	least = 2
	for s := from; !s.Add(win).After(to); s = s.Add(step) {
		n := 0
		for _, a := range w.admitted {
			if !a.Before(s) && a.Before(s.Add(win)) {
				n++
			}
		}
		u := float64(n) / float64(limit)
		used = append(used, u)
		if u < least {
			least, leastAt = u, s
		}
	}
	if len(used) == 0 {
		return 0, 0, time.Time{}
	}
	slices.Sort(used)
	return used[len(used)/2], least, leastAt
}

// bins counts the admissions in n bins of length d from start.
func (w *mdcWorld) bins(start time.Time, d time.Duration, n int) []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]int, n)
	for _, a := range w.admitted {
		if i := int(a.Sub(start) / d); a.After(start) && i < n {
			out[i]++
		}
	}
	return out
}

// viralWorld is 3 data centres (the ledger 20, 50 and 100 ms away, a round
// trip), one node each, a ceiling of limit per win; dc2 sends viral a
// second, dc0 and dc1 flat a second each, for run. It returns each data
// centre's asked and admitted, and when the traffic started.
func viralWorld(t *testing.T, limit, cost int64, win, run time.Duration, viral, flat float64) (*mdcWorld, [3][2]int, time.Time) {
	o := mdcOptions(limiter.FailClosed)
	o.nodes = 1
	o.length = 0 // the default: the window / 60
	o.policy.GlobalWindows = []limiter.Window{{Duration: win}}
	o.delay = func(dc int) time.Duration { return []time.Duration{10, 25, 50}[dc] * time.Millisecond }
	w := newMDCWorld(t, o)
	ctx := context.Background()
	start := time.Now().Add(50 * time.Millisecond)
	end := start.Add(run)
	var got [3][2]int
	var wg sync.WaitGroup
	for dc, rate := range []float64{flat, flat, viral} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[dc][0], got[dc][1] = w.paced(ctx, dc, "viral", limit, cost, rate, start, end)
		}()
	}
	wg.Wait()
	t.Logf("asked, admitted per data centre: %v; events %v", got, w.events)
	return w, got, start
}

// TestGlobalSmallDatacentresAreNotStarved: one data centre viral (5 times the
// ceiling's rate), two asking 3 a second each (less than an equal share,
// 6.7 a second): the two get at least 95 % of what they ask (36 of 36 on a
// quiet machine; 85 % asserted: under -race and other work, a renewal late
// by a request's gap costs one). They got 2 of
// 60 (issue #28): refused once, a share waited until the ledger's first
// unit left the window before asking again, and the ledger, not hearing
// their demand, kept nothing for them.
func TestGlobalSmallDatacentresAreNotStarved(t *testing.T) {
	const limit, win = 100, 5 * time.Second
	w, got, _ := viralWorld(t, limit, 1, win, 12*time.Second, 100, 3)
	for dc := range 2 {
		if asked, admitted := got[dc][0], got[dc][1]; float64(admitted) < 0.85*float64(asked) {
			t.Errorf("dc%d asked %d (less than an equal share) and got %d: %.0f %%, want at least 85 %% (95 %% on a quiet machine)", dc, asked, admitted,
				100*float64(admitted)/float64(asked))
		}
	}
	w.exact(t, win)
}

// TestGlobalCostlyRequestsAreServed: as
// TestGlobalSmallDatacentresAreNotStarved, with requests of 50 units against a ceiling of 5,000: the two asking less
// than an equal share get at least 90 % of what they ask (28 or more of
// 30; the one or two refused, one window in). A renewal in the
// background asked for one unit more than the share held, whatever the
// requests cost: the ledger's grants, a few units each, filled the share's
// slots and no request could spend them (found by make multidc's sweep:
// 4 % for a flat data centre at 100,000 a window).
func TestGlobalCostlyRequestsAreServed(t *testing.T) {
	const limit, cost, win = 5000, 50, 5 * time.Second
	w, got, _ := viralWorld(t, limit, cost, win, 10*time.Second, 100, 3)
	for dc := range 2 {
		if asked, admitted := got[dc][0], got[dc][1]; float64(admitted) < 0.90*float64(asked) {
			t.Errorf("dc%d asked %d of %d units each and got %d: %.0f %%, want at least 90 %%", dc, asked, cost, admitted,
				100*float64(admitted)/float64(asked))
		}
	}
	w.exact(t, win)
}

// TestGlobalCeilingUsedWithOneDatacentreViral: the same traffic: the windows
// of the ceiling (all of them over-demanded, from half a second in) admit
// at least 90 % of the ceiling (the median) and 75 % (the least: the first
// windows, which hold the viral one's start), one unit per data centre
// aside. The targets (97 % and 93 %) are measured by make multidc, on a
// rising demand (docs/multidc.txt). The least window admitted 234 of 400 (issue #28): the viral data
// centre, its grants not capped below half full, filled the ceiling in
// seconds and then waited for its units to leave the window, and the flat
// ones' trickle read as 4 a second kept room for them they never used.
func TestGlobalCeilingUsedWithOneDatacentreViral(t *testing.T) {
	const limit, win = 200, 5 * time.Second
	w, _, start := viralWorld(t, limit, 1, win, 11*time.Second, 150, 3)
	median, least, at := w.underUse(start.Add(500*time.Millisecond), start.Add(11*time.Second), win, 100*time.Millisecond, limit)
	t.Logf("windows of the ceiling used: median %.1f %%, least %.1f %% (from %v); admitted per half second %v", 100*median, 100*least, at.Sub(start), w.bins(start, 500*time.Millisecond, 22))
	slack := 3.0 / limit // one unit per data centre
	if median < 0.90-slack || least < 0.75-slack {
		t.Errorf("the ceiling used: median %.1f %%, least %.1f %% (the window from %v); want at least 90 %% and 75 %%",
			100*median, 100*least, at.Sub(start).Round(time.Millisecond))
	}
	w.exact(t, win)
}

// TestGlobalUnspentGrantsAreRecalled: a small ceiling, 10 per 6 s, 2 data
// centres that have met the ledger. A sends 4 at once (once each), B 6 at
// once a second later, and B retries what was refused every 250 ms: within
// a window the ceiling is used, but for one unit per data centre. B's 6
// were refused with Retry-After 61 while the ledger showed A holding all
// 10 (issue #28, 10 a minute): A's grants, sized by a demand read as 16 a
// second, came back only at A's next renewal, and A asked nothing more.
func TestGlobalUnspentGrantsAreRecalled(t *testing.T) {
	const limit, win = 10, 6 * time.Second
	o := mdcOptions(limiter.FailClosed)
	o.dcs, o.nodes, o.length = 2, 1, 0
	o.policy.GlobalWindows = []limiter.Window{{Duration: win}}
	o.delay = func(int) time.Duration { return 10 * time.Millisecond }
	w := newMDCWorld(t, o)
	ctx := context.Background()
	for dc := range 2 {
		if d := w.roomDecide(ctx, dc, 0, "k", limit); !d.Pass {
			t.Fatalf("dc%d's first request: %+v", dc, d)
		}
	}
	time.Sleep(1500 * time.Millisecond)
	begin := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := [2]int{1, 1}
	burst := func(dc, n int, retry bool) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Since(begin) < win+time.Second && (retry || time.Since(begin) < 100*time.Millisecond) {
					if w.roomDecide(ctx, dc, 0, "k", limit).Pass {
						mu.Lock()
						got[dc]++
						mu.Unlock()
						return
					}
					time.Sleep(250 * time.Millisecond)
				}
			}()
		}
	}
	burst(0, 4, false)
	time.Sleep(time.Second)
	burst(1, 6, true)
	wg.Wait()
	shares, _ := w.dcs[0].nodes[0].Shares(ctx, "k")
	t.Logf("admitted per data centre %v; the ledger: %+v", got, shares)
	if got[0]+got[1] < limit-2 {
		t.Errorf("admitted %v of %d in a window (A asked 5, B 7, retrying): want all but one unit per data centre", got, limit)
	}
	w.exact(t, win)
}

// TestGlobalNoRequestWaitsOnTheLedger: the ledger 200 ms away (a round
// trip), 2 data centres each asking 30 a second of a ceiling of 120 per 6 s
// (20 a second: over-demand, each share spent faster than one grant per
// renewal brings), 4 senders each: after 4 s of it, at most 5 % of the
// requests wait on the ledger (EventWait, counted, not timed; a data centre's first request, which
// waits for its first grant, is not one): each data centre asks more than
// its fair rate, the ledger caps its grants at that rate and says until
// when, and the share refuses at once. A request whose share ran out while
// the ledger had not said it was full used to wait for the share's
// renewal: the cap said nothing, so under over-demand most refusals waited
// a round trip or more (make multidc: p99 added 697-856 ms in every cell;
// here 26 of 240 waited; now none, or one on a loaded machine).
func TestGlobalNoRequestWaitsOnTheLedger(t *testing.T) {
	const limit, win, rate = 120, 6 * time.Second, 30.0
	o := mdcOptions(limiter.FailClosed)
	o.dcs, o.nodes, o.length = 2, 1, 0
	o.policy.GlobalWindows = []limiter.Window{{Duration: win}}
	o.delay = func(int) time.Duration { return 100 * time.Millisecond }
	w := newMDCWorld(t, o)
	ctx := context.Background()
	start := time.Now().Add(50 * time.Millisecond)
	full := start.Add(4 * time.Second) // 4 s at 3 times the ceiling's rate
	end := full.Add(4 * time.Second)
	var asked [2]int
	var waits int
	var wg sync.WaitGroup
	var mu sync.Mutex
	// Per data centre 4 senders, each a quarter of the rate: a request
	// that waits holds up no other.
	send := func(from, to time.Time, count bool) {
		for dc := range 2 {
			for i := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n, _ := w.paced(ctx, dc, "k", limit, 1, rate/4, from.Add(time.Duration(i)*time.Second/time.Duration(rate)), to)
					if count {
						mu.Lock()
						asked[dc] += n
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
	}
	send(start, full, false)
	w.mu.Lock()
	before := w.events[limiter.EventWait]
	w.mu.Unlock()
	send(full, end, true)
	w.mu.Lock()
	waits = w.events[limiter.EventWait] - before
	w.mu.Unlock()
	median, least, _ := w.underUse(full.Add(-win/2), end, win, 200*time.Millisecond, limit)
	t.Logf("asked %v after the ceiling filled; %d waited on the ledger; windows used: median %.0f %%, least %.0f %%; events %v",
		asked, waits, 100*median, 100*least, w.events)
	// 5 %: the bug waited 26 of 240 (11 %); a quiet machine waits none or
	// one, a busy one a few renewals late (4 of 240 in CI with two
	// `yes > /dev/null` beside the tests, 2026-12-03).
	if n := asked[0] + asked[1]; waits*100 > 5*n {
		t.Errorf("%d of %d requests waited on the ledger under over-demand; want 5 %% at most (the share says when the ledger capped it; a renewal late on a loaded machine may still be waited for)",
			waits, n)
	}
	w.exact(t, win)
}
