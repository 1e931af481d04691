package limiter_test

// The data-centre simulation's histories (simdc_test.go): drawn from a
// seed, run, judged, shrunk; the figures each prints; the tests.

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// dcFixed is make test's budget: five fixed seeds, each with the fault
// kinds it must draw (so that every kind, fail mode and the static share
// are reached each run), the number of data centres it draws among.
var dcFixed = []struct {
	fail string
	must []string
	dcs  [2]int
}{
	{"closed", []string{"reload", "stall", "dcdown", "reset"}, [2]int{2, 3}},
	{"local", []string{"cut:static", "kill", "stall"}, [2]int{3, 3}},
	{"open", []string{"restart", "cut", "dcdown"}, [2]int{2, 4}},
	{"local", []string{"failover", "dcdown", "kill", "reload"}, [2]int{6, 8}},
	// A failover that loses writes while the ceiling is full (a grant used
	// before the replicas hold it breaks the ceiling then), then a stall
	// of the new primary.
	{"closed", []string{"failover", "stall"}, [2]int{2, 3}},
}

// genDC draws history seed: fixed seeds (1 to len(dcFixed)) with their
// kinds; any other seed draws its fail mode and one to three kinds.
func genDC(seed uint64) dcCase {
	rng := rand.New(rand.NewPCG(seed, 28))
	fail, must, dcs := []string{"closed", "local", "open"}[rng.IntN(3)], []string(nil), [2]int{2, 8}
	win := []int64{1000, 2000}[rng.IntN(2)]
	if seed >= 1 && seed <= uint64(len(dcFixed)) {
		f := dcFixed[seed-1]
		fail, must, dcs = f.fail, f.must, f.dcs
		win = 1000
	} else {
		// make test's fresh seeds (1<<40 set) draw one or two kinds,
		// make simulate's (1<<41) up to four, and windows up to 3 s.
		most := 2
		if seed&(1<<41) != 0 {
			most, win = 4, []int64{1000, 2000, 3000}[rng.IntN(3)]
		}
		for _, i := range rng.Perm(len(dcFaultKinds))[:1+rng.IntN(most)] {
			must = append(must, dcFaultKinds[i])
		}
		if fail == "local" && rng.IntN(2) == 0 {
			must = append(must, "cut:static")
		}
	}
	c := dcCase{Name: fmt.Sprintf("dc seed %d", seed), Fail: fail, Win: win,
		Skew: int64(100 + rng.IntN(201))}
	if i := int(seed) - len(dcFixed) - 1; seed > uint64(len(dcFixed)) && i < len(dcFoci) {
		c.Name, c.Win = fmt.Sprintf("dc seed %d (focus)", seed), 1000
		dcFoci[i](rng, &c)
		return c
	}
	// Ceilings a viral data centre can over-demand within the machine's
	// budget of requests (250 a second at most).
	c.Limit = []int64{10, 30, 80}[rng.IntN(3)] * c.Win / 1000
	n := dcs[0] + rng.IntN(dcs[1]-dcs[0]+1)
	apart := rng.IntN(2) == 0
	for i := range n {
		stack, nodes := "redis", 1+rng.IntN(2)
		if i > 0 && rng.IntN(5) == 0 {
			stack, nodes = "memory", 1
		}
		c.Stacks, c.Nodes = append(c.Stacks, stack), append(c.Nodes, nodes)
		c.Delay = append(c.Delay, int64(5+rng.IntN(121)))
		off := int64(0)
		if apart {
			off = int64(rng.IntN(int(2*c.Skew+1))) - c.Skew
		}
		c.Offset = append(c.Offset, off)
	}
	genDCFaults(rng, &c, must, seed > uint64(len(dcFixed)))
	genDCPhases(rng, &c)
	busyFaulted(&c)
	if hasFault(&c, "failover") {
		// The promoted replica's clock, within skew of the old primary's
		// (drawn last: the rest of a fixed seed's history stays as it was).
		c.LedgerOff = int64(rng.IntN(int(2*c.Skew+1))) - c.Skew
	}
	return c
}

// busyFaulted gives a data centre a fault of its own strikes ten requests
// a second more, from before the fault until its recovery, so that what
// it answers then is seen.
func busyFaulted(c *dcCase) {
	for _, f := range c.Faults {
		if !affects(f, -1) && f.Kind != "reload" {
			from, to := max(f.At-500, 0), min(f.At+f.For+2000, c.Run)
			c.Phases = append(c.Phases, dcPhase{DC: f.DC, From: from, To: to, Rate: 10, ID: "a"})
		}
	}
}

// genDCFaults places the faults one after another after a calm first
// phase (three windows, the room used is measured there), each followed by
// a gap for its recovery (a second, the documented wait, half a window);
// the run lasts until the last one has had time to recover. In a fresh
// history (not a fixed seed, whose draws stay as they were), an operator's
// reset drawn after a fault of one data centre (cut off from the ledger,
// its Redis down, a node killed in a renewal) falls, one time in two,
// amid it, through another data centre: the data centre at fault drops
// its share late (after the cut), or its drop fails and is tried again
// until its Redis is back. One drawn after a fault of the ledger (a
// stall, a failover's cut replication) falls amid it one time in two as
// well: the ledger's reset then answers late or fails (and may still be
// carried out when the ledger wakes), or lands on a primary whose
// replica, promoted, never had it.
func genDCFaults(rng *rand.Rand, c *dcCase, must []string, fresh bool) {
	t := dcCalm(c)
	redisDC := func() int {
		var ok []int
		for i, s := range c.Stacks {
			if s == "redis" {
				ok = append(ok, i)
			}
		}
		return ok[rng.IntN(len(ok))]
	}
	w := &dcWorld{c: c}
	for _, k := range must {
		f := dcFault{Kind: k, DC: rng.IntN(len(c.Stacks))}
		switch k {
		case "stall":
			f.For = int64(500 + rng.IntN(1501))
		case "cut":
			f.For = int64(500 + rng.IntN(1501))
		case "cut:static":
			// Past the static share's wait (beat + 2 x timeout + the
			// longest grant + the window + skew), and a second on it.
			f.Kind, f.For = "cut", c.staticWait()+1000+int64(rng.IntN(500))
		case "failover":
			f.For = int64(300 + rng.IntN(701))
		case "dcdown":
			f.DC, f.For = redisDC(), int64(500+rng.IntN(1001))
		case "kill":
			f.DC, f.For = redisDC(), int64(300+rng.IntN(301))
		case "reload":
			f.Limit = max(c.Limit/3, 1)
			if rng.IntN(2) == 0 {
				f.Limit = 2 * c.Limit
			}
			f.For = []int64{0, 1500}[rng.IntN(2)]
		}
		if n := len(c.Faults); k == "reset" && fresh && n > 0 && len(c.Stacks) > 1 {
			prev := c.Faults[n-1]
			ofDC := prev.Kind == "cut" || prev.Kind == "dcdown" || prev.Kind == "kill"
			if (ofDC || prev.Kind == "stall" || prev.Kind == "failover") && rng.IntN(2) == 0 {
				if ofDC {
					f.DC = (prev.DC + 1 + rng.IntN(len(c.Stacks)-1)) % len(c.Stacks)
				}
				f.At = prev.At + prev.For/2
				c.Faults = append(c.Faults, f) // t is past prev's recovery already
				continue
			}
		}
		f.At = t
		c.Faults = append(c.Faults, f)
		t += f.For + 800 + w.wait(f).Milliseconds() + c.Win/2 + int64(rng.IntN(300))
	}
	c.Run = t + 500
}

// staticWait is how long no node of a data centre asked the ledger before
// its static share starts (ms): beat + 2 x timeout + the longest grant
// (half the window) + the window + skew.
func (c *dcCase) staticWait() int64 {
	return 400 + 2*dcTimeout.Milliseconds() + c.Win/2 + c.Win + c.Skew
}

// dcCalm is the calm first phase's length: three windows, at least 3 s.
func dcCalm(c *dcCase) int64 { return max(3*c.Win, 3000) }

// genDCPhases draws each data centre's demand in three phases: one viral
// (two to four times the ceiling's rate, within 250 a second), the others
// flat (2 to 10 a second) or idle, or (a third of the phases) every one
// over-demanding (always in the phase of the first fault, when it is one
// of the ledger's state); the first phase over-demands the ceiling. Now and then
// a data centre asks for a new identity instead (a newcomer, as after a
// stall).
func genDCPhases(rng *rand.Rand, c *dcCase) {
	rate := float64(c.Limit) * 1000 / float64(c.Win) // the ceiling's, per second
	// A fault of the ledger's state (a restart, a failover, the static
	// share, a reload) breaks the ceiling, if at all, when it is full: the
	// phase of the first fault is every data centre over-demanding.
	ledgerState := slices.ContainsFunc(c.Faults, func(f dcFault) bool {
		return f.Kind == "restart" || f.Kind == "failover" || f.Kind == "reload" || f.Kind == "reset" || f.Kind == "cut" && f.For >= c.staticWait()
	})
	calm := dcCalm(c)
	cuts := []int64{0, calm, calm + (c.Run-calm)/2, c.Run}
	budget := 400 // requests a second, all data centres together
	for p := range 3 {
		viral := rng.IntN(len(c.Stacks))
		// Now and then every data centre over-demands: the ceiling is
		// full, and what is used past a grant's or a wait's end shows.
		sat := rng.IntN(3) == 0 || p == 1 && ledgerState
		for dc := range c.Stacks {
			r := 0
			switch {
			case sat:
				r = min(max(int(rate*3)/len(c.Stacks), 10), 400/len(c.Stacks))
			case dc == viral:
				r = min(int(rate*float64(2+rng.IntN(3))), 250)
			case rng.IntN(4) > 0:
				r = 2 + rng.IntN(9)
			}
			if r = min(r, budget); r == 0 {
				continue
			}
			budget -= r
			id := "a"
			if p > 0 && dc != viral && rng.IntN(4) == 0 {
				id = fmt.Sprintf("n%d", p)
			}
			c.Phases = append(c.Phases, dcPhase{DC: dc, From: cuts[p], To: cuts[p+1], Rate: r, ID: id})
		}
		budget = 400
	}
}

// dcResult is what a history's judge found: a hard failure (the ceiling
// broken), the findings (what the documents promise and the run did not
// do: reported, failing only in strict mode), the figures.
type dcResult struct {
	err      error
	findings []string
	figures  []string
	room     []float64       // fractions of the ceiling used, per sampled window
	took     []time.Duration // every decision's time, outside faults and their recovery
	seen     map[string]int
}

// runDC runs one history and judges it.
func (e *dcEnv) runDC(c *dcCase) dcResult {
	w := e.newDCWorld(c)
	w.run()
	w.close()
	w.mu.Lock()
	defer w.mu.Unlock()
	res := dcResult{}
	if over, r := w.overAdmission(); over > 0 {
		res.err = fmt.Errorf("%d over the ceiling (%d per %dms) in the window ending %v after the start, at dc%d (%s, limit %d)",
			over, r.limit, c.Win, r.at.Sub(w.start).Round(time.Millisecond), r.dc, r.id, r.limit)
	} else if v := w.glog.violation(); v != "" {
		res.err = fmt.Errorf("misused (a grant or a claim): %s", v)
	} else if v := w.glog.demandOver(w.redisDCs()); v != "" {
		res.err = fmt.Errorf("a demand inflated: %s", v)
	} else if r, what, ok := w.uncovered(); ok {
		if os.Getenv("SIM_DEBUG") != "" {
			w.dumpDC(r.dc)
		}
		res.err = fmt.Errorf("dc%d admitted requests no grant covers: %s (the last of them %s's, decided by %s)", r.dc, what, r.id, r.src)
	}
	w.reached(&res)
	w.statuses(&res)
	w.recovery(&res)
	w.roomUsed(&res)
	w.latency(&res)
	// A copy: a node closed in the run (killed, replaced) may still be
	// closing, its beat telling w.seen (under w.mu) what it did.
	res.seen = maps.Clone(w.seen)
	return res
}

// latency measures the decisions' time outside faults and their recovery
// (a figure: a request that waits for the ledger takes a round trip or
// more; no decision should wait on a renewal that was not asked).
func (w *dcWorld) latency(res *dcResult) {
	for _, r := range w.recs {
		if !w.inFault(r.dc, r.done, time.Second+2*w.rtt(r.dc)) {
			res.took = append(res.took, r.took)
		}
	}
	if len(res.took) > 0 {
		p50, p99 := dcQuantile(res.took, 0.5), dcQuantile(res.took, 0.99)
		res.figures = append(res.figures, fmt.Sprintf("decision time outside faults (%d): p50 %v, p99 %v", len(res.took), p50.Round(time.Millisecond/10), p99.Round(time.Millisecond)))
	}
}

func dcQuantile(v []time.Duration, q float64) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

// dumpDC logs a data centre's grants and admissions (SIM_DEBUG).
func (w *dcWorld) dumpDC(dc int) {
	for _, g := range w.grants[dc] {
		w.t.Logf("dc%d grant %d at %v until %v", dc, g.units, g.at.Sub(w.start).Round(time.Millisecond), g.until.Sub(w.start).Round(time.Millisecond))
	}
	for _, m := range w.modes[dc] {
		w.t.Logf("dc%d static %v at %v", dc, m.static, m.at.Sub(w.start).Round(time.Millisecond))
	}
	for _, r := range w.recs {
		if r.dc == dc && r.pass {
			how := string(r.src)
			if r.static {
				how += ", static share"
			}
			w.t.Logf("dc%d admitted %s at %v (back %v) by %s", dc, r.id, r.at.Sub(w.start).Round(time.Millisecond), r.done.Sub(w.start).Round(time.Millisecond), how)
		}
	}
}

// reached records the events the history reached: each fault kind that
// had an effect, under its fail mode.
func (w *dcWorld) reached(res *dcResult) {
	c := w.c
	for _, f := range c.Faults {
		from, to := w.start.Add(w.ms(f.At)), w.start.Add(w.ms(f.At+f.For)+dcTimeout)
		hit := false
		switch f.Kind {
		case "stall", "cut":
			for dc, errs := range w.errsAt {
				hit = hit || (f.Kind == "stall" || dc == f.DC) && slices.ContainsFunc(errs, func(t time.Time) bool { return !t.Before(from) && t.Before(to) })
			}
		case "dcdown":
			hit = slices.ContainsFunc(w.recs, func(r dcRec) bool { return r.dc == f.DC && r.err })
		case "kill":
			hit = w.seen["kill"] > 0
		case "reload":
			hit = slices.ContainsFunc(w.recs, func(r dcRec) bool { return r.limit == f.Limit })
		default:
			hit = w.seen["fault:"+f.Kind] > 0
		}
		if hit {
			w.seen["reached:"+f.Kind]++
			w.seen["fail:"+c.Fail]++
		}
	}
	w.glog.mu.Lock()
	if w.glog.recalls > 0 {
		w.seen["recalled"] += w.glog.recalls
	}
	w.glog.mu.Unlock()
	if slices.ContainsFunc(c.Offset, func(o int64) bool { return o != 0 }) {
		w.seen["clocks_apart"]++
	}
	if slices.Contains(c.Stacks, "memory") {
		w.seen["memory_dc"]++
	}
	if len(c.Stacks) >= 5 {
		w.seen["dcs>=5"]++
	}
}

// affects reports whether fault f affects data centre dc.
func affects(f dcFault, dc int) bool {
	switch f.Kind {
	case "cut", "dcdown", "kill":
		return dc == f.DC
	}
	return true
}

// statuses counts what each fault's affected data centres answered while it
// lasted, and checks the statuses the fail-mode table promises: a data
// centre's own Redis down gives its fail mode (under fail local, 503 for a
// request under the ceiling), never a 429 the ceiling did not make.
func (w *dcWorld) statuses(res *dcResult) {
	for _, f := range w.c.Faults {
		if f.For == 0 || f.Kind == "reload" {
			continue
		}
		from, to := w.start.Add(w.ms(f.At)), w.start.Add(w.ms(f.At+f.For))
		n := map[string]int{}
		refused := map[dcWaiter]time.Time{} // each node's first refusal of each identity in the fault
		for _, r := range w.recs {
			if !affects(f, r.dc) || r.done.Before(from) || !r.done.Before(to) {
				continue
			}
			if k := (dcWaiter{r.dc, r.node, r.id}); !r.pass {
				if t, ok := refused[k]; !ok || r.done.Before(t) {
					refused[k] = r.done
				}
			}
		}
		for _, r := range w.recs {
			if !affects(f, r.dc) || r.done.Before(from) || !r.done.Before(to) {
				continue
			}
			n[dcStatus(r)]++
			if os.Getenv("SIM_DEBUG") != "" {
				first := refused[dcWaiter{r.dc, r.node, r.id}]
				w.t.Logf("%v dc%d/n%d %s %s: %s %s err=%v retry %v (%v after the node's first refusal; the table's: %v)",
					r.done.Sub(w.start).Round(time.Millisecond), r.dc, r.node, r.id, f.Kind, dcStatus(r), r.src, r.err, r.retry,
					r.done.Sub(first).Round(time.Millisecond), !w.ledgerFault(f, r, first))
			}
			if f.Kind == "dcdown" && r.out == limiter.OutcomeLimited && r.done.After(from.Add(dcTimeout)) {
				n["bad"]++
			}
			if w.ledgerFault(f, r, refused[dcWaiter{r.dc, r.node, r.id}]) {
				n["bad ledger"]++
			}
		}
		res.figures = append(res.figures, fmt.Sprintf("statuses during %v (fail %s): %s", f, w.c.Fail, dcCounts(n)))
		if n["bad ledger"] > 0 {
			res.findings = append(res.findings, fmt.Sprintf("status: %d requests got 429 during %v while the ceiling had more than half its room (fail %s; the table: %s)",
				n["bad ledger"], f, w.c.Fail, "429 while the renewal waited for is within the timeout, then "+
					map[string]string{"closed": "503", "local": "503 until the static share starts", "open": "pass, counted"}[w.c.Fail]))
		}
		if n["bad"] > 0 {
			res.findings = append(res.findings, fmt.Sprintf("status: %d requests got 429 while dc%d's own Redis was down (fail %s; the table: the fail mode, 503 under fail local)",
				n["bad"], f.DC, w.c.Fail))
		}
	}
	w.starved(res)
}

// dcWaiter is a node's requests of one identity: they wait for one renewal.
type dcWaiter struct {
	dc, node int
	id       string
}

// ledgerFault reports whether r is a 429 during f, a fault of the ledger
// or of the way to it, that the table does not give: the ceiling had more
// than half its room (so no share could have known it full), it came more
// than the ledger's timeout after the node's first refusal of the identity
// in the fault (first: the renewal they wait for began before it, and a
// stalled ledger is only slow until that renewal has been out the
// timeout), and under fail local the static share had not started (its
// own 429s are its own).
func (w *dcWorld) ledgerFault(f dcFault, r dcRec, first time.Time) bool {
	switch f.Kind {
	case "stall", "cut":
	default:
		return false
	}
	if r.out != limiter.OutcomeLimited || w.admittedWithin(r.id, r.at) >= r.limit/2 {
		return false
	}
	if !first.IsZero() && r.done.Before(first.Add(dcTimeout+100*time.Millisecond)) {
		// Slow, not yet down: the share's refusal, Retry-After the lead
		// (two renewals, each within the timeout, and 20 ms).
		return r.retry > 2*dcTimeout+20*time.Millisecond
	}
	return w.c.Fail != "local" || r.done.Before(w.start.Add(w.ms(f.At+w.c.staticWait())))
}

func dcStatus(r dcRec) string {
	switch {
	case r.open:
		return "fail-open pass"
	case r.pass && r.src == limiter.SourceLocal:
		return "static/local 200"
	case r.pass:
		return "200"
	case r.out == limiter.OutcomeUnavailable:
		return "503"
	case r.out == limiter.OutcomeLimited:
		return "429"
	}
	return r.out.String()
}

func dcCounts(n map[string]int) string {
	var keys []string
	for k := range n {
		if !strings.HasPrefix(k, "bad") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, n[k]))
	}
	return strings.Join(parts, ", ")
}

// admittedWithin is the oracle's count of identity id's admissions under
// the ceiling in (t-W, t], since the last reset of id that ended by t.
func (w *dcWorld) admittedWithin(id string, t time.Time) int64 {
	var n int64
	from := t.Add(-w.ms(w.c.Win))
	if e, _ := w.epoch(id, t, t); e.After(from) {
		from = e
	}
	for _, r := range w.recs {
		if r.id == id && r.pass && !r.open && r.at.After(from) && !r.at.After(t) {
			n++
		}
	}
	return n
}

// starved counts the 429s the ceiling gave while the oracle's window held
// less than half of it: room no data centre used, refused (a data centre
// starved, or locked out after a fault). Outside faults and their recovery
// (two round trips and a second) they are a finding.
func (w *dcWorld) starved(res *dcResult) {
	per := map[int]int{}
	var first time.Time
	var fr dcRec
	for _, r := range w.recs {
		if r.out != limiter.OutcomeLimited || w.inFault(r.dc, r.done, time.Second+2*w.rtt(r.dc)) {
			continue
		}
		if w.admittedWithin(r.id, r.at) < r.limit/2 {
			per[r.dc]++
			if first.IsZero() || r.at.Before(first) {
				first, fr = r.at, r
			}
		}
	}
	if len(per) > 0 {
		res.findings = append(res.findings, fmt.Sprintf("starved: 429s while the ceiling had more than half its room, outside faults, per data centre %v (first %v after the start, dc%d, %s, Retry-After %v, %d admitted in its window)",
			per, first.Sub(w.start).Round(time.Millisecond), fr.dc, fr.src, fr.retry.Round(time.Millisecond), w.admittedWithin(fr.id, fr.at)))
	}
}

func (w *dcWorld) rtt(dc int) time.Duration { return 2 * w.ms(w.c.Delay[dc]) }

// inFault reports whether t is within a fault affecting dc, or within
// grace after its end (a reload: grace after it, and its end).
func (w *dcWorld) inFault(dc int, t time.Time, grace time.Duration) bool {
	for _, f := range w.c.Faults {
		from, to := w.start.Add(w.ms(f.At)), w.start.Add(w.ms(f.At+f.For)+grace+w.judgedWait(f))
		if affects(f, dc) && !t.Before(from) && t.Before(to) {
			return true
		}
	}
	return false
}

// wait is the documented wait after fault f ends: after a restart the
// epoch's (the window, the longest grant, skew, timeout); after a failover
// skew; under fail local, once a data centre went to its static share, a
// window and the tail (beat/2 + 2 x timeout + skew) more.
func (w *dcWorld) wait(f dcFault) time.Duration {
	skew, win := w.ms(w.c.Skew), w.ms(w.c.Win)
	switch {
	case f.Kind == "restart":
		return win + win/2 + skew + dcTimeout
	case f.Kind == "failover":
		return skew
	case w.c.Fail == "local" && (f.Kind == "cut" || f.Kind == "stall") && f.For >= w.c.staticWait():
		return win + 200*time.Millisecond + 2*dcTimeout + skew
	}
	return 0
}

// judgedWait is the wait the judge allows after fault f: wait's, and under
// fail local, after a data centre went unheard (a stall of the ledger, a
// cut) longer than the ledger's heard (its static wait less 4 timeouts and
// 2 skews, from its last call: a beat before the fault at most) but not
// as long as the static wait, the reservation the ledger then keeps: a
// window and the tail after it hears the data centre again, as after a
// static share (docs/multidc.md, "heard again sooner"). genDCFaults spaces
// the faults by wait alone, so the fixed seeds' histories stay as they were.
func (w *dcWorld) judgedWait(f dcFault) time.Duration {
	if d := w.wait(f); d > 0 || w.c.Fail != "local" || f.Kind != "cut" && f.Kind != "stall" {
		return d
	}
	if f.For+400 >= w.c.staticWait()-4*dcTimeout.Milliseconds()-2*w.c.Skew {
		return w.ms(w.c.Win) + 200*time.Millisecond + 2*dcTimeout + w.ms(w.c.Skew)
	}
	return 0
}

// recovery measures, after each fault ends, how long each affected data
// centre that asks takes to admit again; beyond two round trips, a second
// and the documented wait (and a window more when the ceiling was full
// then) it is a finding.
func (w *dcWorld) recovery(res *dcResult) {
	for _, f := range w.c.Faults {
		var parts []string
		for dc := range w.sites {
			if !affects(f, dc) || f.Kind == "reload" {
				continue
			}
			end, amid := w.recoveryFrom(f, dc)
			asked, first := false, time.Time{}
			for _, r := range w.recs {
				if r.dc == dc && !r.at.Before(end) {
					asked = true
					if r.pass && !r.open && (first.IsZero() || r.at.Before(first)) {
						first = r.at
					}
				}
			}
			if !asked {
				continue
			}
			bound := 2*w.rtt(dc) + time.Second + w.judgedWait(f)
			if w.admittedWithin("a", end) >= w.limit.Load()/2 {
				bound += w.ms(w.c.Win)
			}
			left := w.start.Add(w.ms(w.c.Run)).Sub(end)
			took := "never"
			if !first.IsZero() {
				took = first.Sub(end).Round(time.Millisecond).String()
			}
			parts = append(parts, fmt.Sprintf("dc%d %s", dc, took))
			if !amid && (first.IsZero() && left > bound || !first.IsZero() && first.Sub(end) > bound) {
				res.findings = append(res.findings, fmt.Sprintf("recovery: dc%d admitted again %s after %v ended (bound %v)", dc, took, f, bound.Round(time.Millisecond)))
			}
		}
		res.figures = append(res.figures, fmt.Sprintf("recovery after %v: %s", f, strings.Join(parts, ", ")))
	}
}

// recoveryFrom is when data centre dc's recovery from fault f is timed
// from: f's end; for a reset that falls amid another fault of dc (a cut,
// a stall of the ledger), that fault's end and its documented wait, when
// later, and amid says so: that fault's recovery (judged from its end) is
// the one a finding names.
func (w *dcWorld) recoveryFrom(f dcFault, dc int) (end time.Time, amid bool) {
	end = w.start.Add(w.ms(f.At + f.For))
	if f.Kind != "reset" {
		return end, false
	}
	for _, g := range w.c.Faults {
		if g.Kind == "reset" || g.Kind == "reload" || !affects(g, dc) || f.At < g.At || f.At >= g.At+g.For {
			continue
		}
		amid = true
		if e := w.start.Add(w.ms(g.At+g.For) + w.judgedWait(g)); e.After(end) {
			end = e
		}
	}
	return end, amid
}

// redisDCs names the data centres on Redis (their store's calls are seen).
func (w *dcWorld) redisDCs() map[string]bool {
	m := map[string]bool{}
	for _, s := range w.sites {
		if s.srv != nil {
			m[s.name] = true
		}
	}
	return m
}
