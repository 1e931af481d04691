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
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
	"github.com/sliding-ratelimit/sliding_ratelimit/lua"
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
	// checks: per data centre on Redis, when each script call on its store
	// that may have counted a request's demand was sent and answered
	// (every call but dcshare.lua's); rates: the demand each grant call
	// reported, and when it went
	checks map[string][]dcSpan
	rates  []dcRate
	// deposited: per data centre and share key, the latest sending of a
	// renewal's deposit that has answered (it released the claim by then)
	deposited map[string]map[string]time.Time
	bad       []string
}

func newDCGrantLog(start func() time.Time) *dcGrantLog {
	return &dcGrantLog{start: start, glen: map[string]int64{}, dup: map[string]bool{}, back: map[string]int64{}, checks: map[string][]dcSpan{},
		deposited: map[string]map[string]time.Time{}}
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
	if !after {
		g.rates = append(g.rates, dcRate{dc: dc, at: time.Now(), rate: argInt(argv[14])})
	}
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
		dcLedgerClock(cmd)
		h.g.call(h.dc, cmd, false)
		err := next(ctx, cmd)
		h.g.call(h.dc, cmd, true)
		return err
	}
}

func (h dcGrantHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			dcLedgerClock(c)
			h.g.call(h.dc, c, false)
		}
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.g.call(h.dc, c, true)
		}
		return err
	}
}

// The ledger's clock in the simulation: the ledger and its replica run on
// one machine, one clock, so a failover never moves the ledger's clock. The
// hook sends the ledger a variant of lua/ledger.lua that reads TIME plus an
// offset kept in the server's own key "simclock" (µs; none: 0, the script
// as it is), and a failover sets the promoted replica's offset (its clock
// apart from the old primary's, within skew). Only that line differs.
var (
	dcLedgerSrc     = lua.Ledger
	dcLedgerVariant = strings.Replace(lua.Ledger, "local t = tonumber(t0[1]) * 1000000 + tonumber(t0[2])\n",
		"local t = tonumber(t0[1]) * 1000000 + tonumber(t0[2]) + (tonumber(redis.call(\"GET\", \"simclock\")) or 0)\n", 1)
	dcLedgerSHA, dcVariantSHA = scriptSHA(dcLedgerSrc), scriptSHA(dcLedgerVariant)
)

func scriptSHA(src string) string {
	h := sha1.Sum([]byte(src))
	return hex.EncodeToString(h[:])
}

// dcLedgerClock rewrites a call of the ledger's script into one of its
// variant.
func dcLedgerClock(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 {
		return
	}
	switch fmt.Sprint(args[0]) {
	case "evalsha":
		if args[1] == dcLedgerSHA {
			args[1] = dcVariantSHA
		}
	case "eval":
		if args[1] == dcLedgerSrc {
			args[1] = dcLedgerVariant
		}
	}
}

// TestSimDCLedgerClock: the simulation's variant of the ledger's script
// is the script with its clock read moved by the server's "simclock" (so a
// change to that line of lua/ledger.lua shows here, not as failovers that
// silently keep one clock), and the hook sends it.
func TestSimDCLedgerClock(t *testing.T) {
	if dcLedgerVariant == dcLedgerSrc {
		t.Fatal(`lua/ledger.lua's clock line changed: simdc_grants_test.go's variant (the ledger's clock apart after a failover) no longer applies`)
	}
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	t.Cleanup(func() { c.Close() })
	c.AddHook(dcGrantHook{g: newDCGrantLog(time.Now), dc: "dc0"})
	lg := limiter.NewLedger(c)
	ctx := context.Background()
	req := &limiter.LedgerRequest{Namespace: "clock:", DC: "dc0", QWait: 1, Skew: 1, Beat: 1_000_000, WMax: 1_000_000}
	before, err := lg.Do(ctx, "beat", req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Proc().RunCLI("SET", "simclock", "30000000"); err != nil {
		t.Fatal(err)
	}
	req.Deadline = time.Time{}
	after, err := lg.Do(ctx, "beat", req)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Duration(after.Now-before.Now) * time.Microsecond; d < 30*time.Second || d > 40*time.Second {
		t.Fatalf("the ledger's clock moved %v with simclock 30 s", d)
	}
}

type dcSpan struct{ sent, back time.Time }

type dcRate struct {
	dc   string
	at   time.Time
	rate int64
}

// dcshareOps are dcshare.lua's operations: they count no demand.
var dcshareOps = map[string]bool{"begin": true, "deposit": true, "send": true, "static": true, "normal": true, "poll": true}

// dcCheckHook records the script calls on a data centre's store (its
// Redis) that may count a request's demand.
type dcCheckHook struct {
	g  *dcGrantLog
	dc string
}

func (h dcCheckHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

// counts is how many checks a call on the store runs that may count a
// request's demand: decide.lua's calls carry their number of checks first
// (a batch decides several); dcshare.lua's count none.
func (h dcCheckHook) counts(cmd redis.Cmder) int {
	args := cmd.Args()
	if len(args) < 3 {
		return 0
	}
	switch fmt.Sprint(args[0]) {
	case "evalsha", "eval", "fcall", "fcall_ro":
	default:
		return 0
	}
	nk := int(argInt(args[2]))
	if len(args) <= 3+nk {
		return 1
	}
	if v := fmt.Sprint(args[3+nk]); dcshareOps[v] {
		return 0
	}
	return max(int(argInt(args[3+nk])), 1)
}

func (h dcCheckHook) record(sent time.Time, n int) {
	back := time.Now()
	h.g.mu.Lock()
	for range n {
		h.g.checks[h.dc] = append(h.g.checks[h.dc], dcSpan{sent, back})
	}
	h.g.mu.Unlock()
}

func (h dcCheckHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if key := h.deposit(cmd); key != "" {
			sent := time.Now()
			err := next(ctx, cmd)
			// A deposit into a share reset since its renewal read it (-1)
			// changes nothing, and releases no claim: one there is the
			// new share's.
			if c, ok := cmd.(*redis.Cmd); err == nil && !(ok && c.Val() == int64(-1)) {
				h.g.mu.Lock()
				m := h.g.deposited[h.dc]
				if m == nil {
					m = map[string]time.Time{}
					h.g.deposited[h.dc] = m
				}
				if sent.After(m[key]) {
					m[key] = sent
				}
				h.g.mu.Unlock()
			}
			return err
		}
		n := h.counts(cmd)
		if n == 0 {
			return next(ctx, cmd)
		}
		sent := time.Now()
		err := next(ctx, cmd)
		h.record(sent, n)
		return err
	}
}

func (h dcCheckHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, c := range cmds {
			n += h.counts(c)
		}
		sent := time.Now()
		err := next(ctx, cmds)
		if n > 0 {
			h.record(sent, n)
		}
		return err
	}
}

// dcDemandWindow: how long before its ledger call a renewal may have read
// the share's demand (its calls' timeouts, 1.5 s, with as much again for a
// machine under load), and the demand's two seconds.
const dcDemandWindow = 6*dcTimeout + 2*time.Second

// demandOver is the first demand a data centre on Redis reported above
// what its store was asked: the share's demand is the most of two
// consecutive seconds' requests (this one's so far and the last), counted
// in the store's script calls, so it never exceeds the calls that may have
// run in some second before the renewal read it (a call runs between its
// sending and its answer; every call counts, whatever its identity).
func (g *dcGrantLog) demandOver(redisDC map[string]bool) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	sent, back := map[string][]time.Time{}, map[string][]time.Time{}
	for dc, spans := range g.checks {
		for _, sp := range spans {
			sent[dc], back[dc] = append(sent[dc], sp.sent), append(back[dc], sp.back)
		}
		slices.SortFunc(sent[dc], time.Time.Compare)
		slices.SortFunc(back[dc], time.Time.Compare)
	}
	// within: the calls that may have run in [s-2ms, s+1s+12ms]: with s
	// stepped every 10 ms, every span of a second lies within one of them
	// (and 2 ms for the clocks read a moment apart).
	within := func(dc string, s time.Time) int {
		hi, _ := slices.BinarySearchFunc(sent[dc], s.Add(time.Second+12*time.Millisecond), func(a, b time.Time) int {
			if a.After(b) {
				return 1
			}
			return -1
		})
		lo, _ := slices.BinarySearchFunc(back[dc], s.Add(-2*time.Millisecond), func(a, b time.Time) int {
			if a.Before(b) {
				return -1
			}
			return 1
		})
		return hi - lo
	}
	for _, r := range g.rates {
		if !redisDC[r.dc] || r.rate == 0 {
			continue
		}
		most := 0
		for s := r.at.Add(-dcDemandWindow - 20*time.Millisecond); !s.After(r.at.Add(20 * time.Millisecond)); s = s.Add(10 * time.Millisecond) {
			most = max(most, within(r.dc, s))
		}
		if r.rate > int64(most) {
			return fmt.Sprintf("%s reported a demand of %d a second at %v after the start, when its store was asked at most %d times in any second of the %v before",
				r.dc, r.rate, r.at.Sub(g.start()).Round(time.Millisecond), most, dcDemandWindow)
		}
	}
	return ""
}

// deposit is the share key of a renewal's deposit (dcshare.lua's
// "deposit", which releases the claim unless the share was reset since
// the renewal read it), or "".
func (h dcCheckHook) deposit(cmd redis.Cmder) string {
	args := cmd.Args()
	if len(args) < 5 || fmt.Sprint(args[0]) != "evalsha" && fmt.Sprint(args[0]) != "eval" || argInt(args[2]) != 1 {
		return ""
	}
	if fmt.Sprint(args[4]) != "deposit" {
		return ""
	}
	return fmt.Sprint(args[3])
}

// dcClaim is the claim to renew a share, as the nodes take it (2 x timeout
// + 200ms): the share's "c" is the time of the check that took it plus
// this.
const dcClaim = 2*dcTimeout + 200*time.Millisecond

// watchClaims reads, every 50 ms until ctx ends, the claim ("c") of every
// share of site s a deposit has been made to: a deposit releases the
// claim, so a claim there was taken after the last deposit that answered
// before the read was sent (its check's time, the claim less dcClaim, is
// no earlier than that deposit's sending). One taken before it is a claim
// a deposit never released.
func (w *dcWorld) watchClaims(ctx context.Context, s *dcSite) {
	c := redis.NewClient(&redis.Options{Addr: s.srv.Addr(), MaxRetries: -1, Protocol: 2, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer c.Close()
	g := w.glog
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		g.mu.Lock()
		dep := maps.Clone(g.deposited[s.name])
		g.mu.Unlock()
		for key, sent := range dep {
			rctx, cancel := context.WithTimeout(ctx, dcTimeout)
			v, err := c.HGet(rctx, key, "c").Int64()
			cancel()
			if err != nil || v == 0 {
				continue // no claim, the key gone (its Redis restarted), or no answer
			}
			if took := time.UnixMicro(v).Add(-dcClaim); took.Before(sent.Add(-2 * time.Millisecond)) {
				g.mu.Lock()
				g.bad = append(g.bad, fmt.Sprintf("%s's share %s: a claim taken %v before a deposit that answered (%v after the start) still held %v after it",
					s.name, key, sent.Sub(took).Round(time.Millisecond), sent.Sub(w.start).Round(time.Millisecond), time.Since(sent).Round(time.Millisecond)))
				g.mu.Unlock()
				return
			}
		}
	}
}
