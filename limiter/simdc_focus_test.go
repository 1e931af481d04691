package limiter_test

// The data-centre simulation's focused histories: fixed seeds after
// dcFixed's, each shaped to put pressure on one seam a random history
// rarely loads (SIM_FOCUS=0 leaves them out of make test's budget).

import (
	"math/rand/v2"
	"os"
)

// dcFoci are the focused histories, seeds len(dcFixed)+1 on.
var dcFoci = []func(rng *rand.Rand, c *dcCase){
	focusStatic,
	focusFailover,
	focusLostWrites,
}

// focusStatic: fail local, two data centres; dc0 asks three times the
// ceiling's rate throughout (it holds nearly all of it: dc1 asks 2 a
// second), and dc1 is cut off past its static share's wait while it asks the
// ceiling's rate. Its static share (half the ceiling) is room only once
// every grant dc0 got before dc1's membership lapsed has left every window:
// a static share that starts sooner (without its wait) puts half the
// ceiling on top of a window dc0 had nearly filled.
func focusStatic(rng *rand.Rand, c *dcCase) {
	c.Fail = "local"
	c.Limit = []int64{30, 40}[rng.IntN(2)]
	c.Stacks, c.Nodes = []string{"redis", "redis"}, []int{1, 1}
	c.Delay = []int64{int64(5 + rng.IntN(60)), int64(5 + rng.IntN(60))}
	c.Offset = []int64{0, 0}
	at := dcCalm(c)
	f := dcFault{Kind: "cut", DC: 1, At: at, For: c.staticWait() + 1000 + int64(rng.IntN(500))}
	c.Faults = []dcFault{f}
	end := f.At + f.For
	c.Run = end + (&dcWorld{c: c}).wait(f).Milliseconds() + 2500
	rate := int(c.Limit * 1000 / c.Win)
	c.Phases = []dcPhase{
		{DC: 0, From: 0, To: c.Run, Rate: 3 * rate, ID: "a"},
		{DC: 1, From: 0, To: at, Rate: 2, ID: "a"},
		{DC: 1, From: at, To: end + 1500, Rate: rate, ID: "a"},
		{DC: 1, From: end + 1500, To: c.Run, Rate: 2, ID: "a"},
	}
}

// focusFailover: fail closed, two or three data centres each asking more
// than the ceiling's rate, the ledger failed over (writes lost) onto a
// replica whose clock is apart from the old primary's by up to skew. The
// new primary counts the old one's grants on its own clock.
func focusFailover(rng *rand.Rand, c *dcCase) {
	c.Fail = "closed"
	c.Limit = []int64{30, 80}[rng.IntN(2)]
	n := 2 + rng.IntN(2)
	c.Stacks, c.Nodes, c.Delay, c.Offset = nil, nil, nil, nil
	for range n {
		c.Stacks, c.Nodes = append(c.Stacks, "redis"), append(c.Nodes, 1)
		c.Delay, c.Offset = append(c.Delay, int64(5+rng.IntN(60))), append(c.Offset, 0)
	}
	// Replication cut for most of a window: the grants made meanwhile (in
	// use only once a replica holds them) are what the new primary lost.
	f := dcFault{Kind: "failover", At: dcCalm(c), For: int64(700 + rng.IntN(300))}
	c.Faults = []dcFault{f}
	c.Run = f.At + f.For + (&dcWorld{c: c}).wait(f).Milliseconds() + 3000
	rate := int(c.Limit*1000/c.Win) * 3 / n
	for dc := range n {
		c.Phases = append(c.Phases, dcPhase{DC: dc, From: 0, To: c.Run, Rate: rate, ID: "a"})
	}
	c.LedgerOff = []int64{-c.Skew, c.Skew}[rng.IntN(2)]
}

// focusLostWrites: fail closed, two data centres, a small ceiling (20 per
// 2 s: a window long enough to hold both primaries' grants under load), the
// ledger failed over onto a replica cut off from it for a fraction of a
// window, and a new identity whose demand (three times the ceiling's rate
// from each) starts as the replication cut does. Every grant of it the old
// primary made is one the new primary lost, and the new one (its clock the
// old one's) starts that identity's buckets full again skew later, while
// the units the old one granted are still in the window: a grant used
// before a replica holds it (no WAIT) puts up to a second ceiling on top.
func focusLostWrites(rng *rand.Rand, c *dcCase) {
	c.Fail = "closed"
	c.Win, c.Limit, c.Skew = 2000, 20, 100
	c.Stacks, c.Nodes = []string{"redis", "redis"}, []int{1, 1}
	c.Delay = []int64{int64(5 + rng.IntN(30)), int64(5 + rng.IntN(30))}
	c.Offset = []int64{0, 0}
	f := dcFault{Kind: "failover", At: 2000, For: int64(200 + rng.IntN(100))}
	c.Faults = []dcFault{f}
	c.Run = f.At + f.For + (&dcWorld{c: c}).wait(f).Milliseconds() + 2500
	rate := int(c.Limit * 1000 / c.Win)
	for dc := range 2 {
		c.Phases = append(c.Phases,
			dcPhase{DC: dc, From: 0, To: f.At, Rate: 2, ID: "a"},
			dcPhase{DC: dc, From: f.At, To: c.Run, Rate: 3 * rate, ID: "b"})
	}
}

// dcFocusOn reports whether make test's budget runs the focused histories.
func dcFocusOn() bool { return os.Getenv("SIM_FOCUS") != "0" }
