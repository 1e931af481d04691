package limiter_test

// The data-centre simulation's check of each grant's use (issue 28): every
// grant a data centre gives back tells the ledger the units it used and its
// last use, measured on the data centre's own clock from the time the grant's
// deadline is measured from (the share's start: the deadline is start +
// length, the grant's length as the ledger gave it). So the ledger's calls
// say, for every grant, whether a unit of it was used after its deadline
// (its last use later than its length), and whether a unit was used after
// it was given back (a later call reporting more used of it: a recall's
// grant still spent). A hook on each data centre's ledger client reads the
// calls as they go (the grants in the ledger's replies, the returns and the
// uses in the requests); nothing in the stack is changed. The totals check
// (uncovered) cannot see these: a unit used late spends room a grant would
// have left unused.

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// dcGrantLog is what a history's ledger calls said of each grant, keyed by
// the identity's grants key (the ledger's KEYS[3]) and the grant's id.
type dcGrantLog struct {
	start func() time.Time
	mu    sync.Mutex
	glen  map[string]int64 // a grant's length (µs), as the ledger granted it
	dup   map[string]bool  // an id granted twice (a ledger restarted or failed over reissues ids): not judged
	back  map[string]int64 // the units used when it was given back
	// recalls: the shares the ledger recalled from a data centre, as its
	// nodes took them (an event: "recalled")
	recalls int
	bad     []string
}

func newDCGrantLog(start func() time.Time) *dcGrantLog {
	return &dcGrantLog{start: start, glen: map[string]int64{}, dup: map[string]bool{}, back: map[string]int64{}}
}

// violation is the first misuse of a grant the calls showed ("" none).
func (g *dcGrantLog) violation() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.bad) == 0 {
		return ""
	}
	return fmt.Sprintf("%s (%d such)", g.bad[0], len(g.bad))
}

func argInt(v any) int64 {
	n, _ := strconv.ParseInt(fmt.Sprint(v), 10, 64)
	return n
}

// call reads one ledger call: its request before it goes, its reply after.
func (g *dcGrantLog) call(dc string, cmd redis.Cmder, after bool) {
	args := cmd.Args()
	if len(args) < 3 {
		return
	}
	if op := fmt.Sprint(args[0]); op != "evalsha" && op != "eval" {
		return
	}
	nk := int(argInt(args[2]))
	if after && nk == 3 && len(args) > 6 && fmt.Sprint(args[6]) == "recalls" {
		if c, ok := cmd.(*redis.Cmd); ok && c.Err() == nil {
			if raw, err := c.Slice(); err == nil && len(raw) > 2 {
				g.mu.Lock()
				g.recalls += len(raw) - 2
				g.mu.Unlock()
			}
		}
		return
	}
	if nk != 4 || len(args) < 3+nk+18 {
		return
	}
	zkey := fmt.Sprint(args[3+2])
	argv := args[3+nk:]
	if fmt.Sprint(argv[0]) != "grant" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	at := time.Since(g.start()).Round(time.Millisecond)
	if after {
		c, ok := cmd.(*redis.Cmd)
		if !ok || c.Err() != nil {
			return
		}
		raw, err := c.Slice()
		if err != nil || len(raw) < 9 {
			return
		}
		if units, _ := raw[2].(int64); units > 0 {
			id, _ := raw[8].(string)
			k := zkey + " " + id
			if _, seen := g.glen[k]; seen {
				g.dup[k] = true
			}
			g.glen[k], _ = raw[3].(int64)
		}
		return
	}
	// The request: returns (id used last), after the windows the uses of
	// grants not ended (id used).
	nret := int(argInt(argv[17]))
	a := 18
	used := func(id string, u int64, what string) {
		k := zkey + " " + id
		if g.dup[k] {
			return
		}
		if b, ok := g.back[k]; ok && u > b {
			g.bad = append(g.bad, fmt.Sprintf("%s's grant %s: %d units used after it was given back with %d used (%s, %v after the start)", dc, id, u-b, b, what, at))
		}
	}
	for range nret {
		if a+2 >= len(argv) {
			return
		}
		id, u, last := fmt.Sprint(argv[a]), argInt(argv[a+1]), argInt(argv[a+2])
		a += 3
		k := zkey + " " + id
		used(id, u, "its return")
		if l, ok := g.glen[k]; ok && !g.dup[k] && u > 0 && last > l {
			g.bad = append(g.bad, fmt.Sprintf("%s's grant %s: last used %v after its start, past its deadline (its length %v; returned %v after the start)",
				dc, id, time.Duration(last)*time.Microsecond, time.Duration(l)*time.Microsecond, at))
		}
		if b, ok := g.back[k]; !ok || u > b {
			g.back[k] = u
		}
	}
	if a >= len(argv) {
		return
	}
	a += 1 + 8*int(argInt(argv[a]))
	if a >= len(argv) {
		return
	}
	nuse := int(argInt(argv[a]))
	for i := range nuse {
		if a+2+2*i >= len(argv) {
			return
		}
		used(fmt.Sprint(argv[a+1+2*i]), argInt(argv[a+2+2*i]), "a renewal's report of its use")
	}
}

// dcGrantHook is the go-redis hook that hands a data centre's ledger calls
// to the log.
type dcGrantHook struct {
	g  *dcGrantLog
	dc string
}

func (h dcGrantHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h dcGrantHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.g.call(h.dc, cmd, false)
		err := next(ctx, cmd)
		h.g.call(h.dc, cmd, true)
		return err
	}
}

func (h dcGrantHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.g.call(h.dc, c, false)
		}
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.g.call(h.dc, c, true)
		}
		return err
	}
}
