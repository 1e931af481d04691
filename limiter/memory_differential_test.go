package limiter_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

var allAlgorithms = []limiter.Algorithm{
	limiter.SlidingLog, limiter.SlidingCounter, limiter.FixedWindow, limiter.TokenBucket,
}

func TestParseAlgorithm(t *testing.T) {
	t.Parallel()
	for _, a := range allAlgorithms {
		got, err := limiter.ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", a.String(), got, err, a)
		}
	}
	for _, bad := range []string{"", "sliding", "Sliding_Log", "leaky_bucket"} {
		if _, err := limiter.ParseAlgorithm(bad); err == nil {
			t.Errorf("ParseAlgorithm(%q) succeeded", bad)
		} else if !strings.Contains(err.Error(), "token_bucket") {
			t.Errorf("ParseAlgorithm(%q): error %q does not list the names", bad, err)
		}
	}
}

// diffGen builds a seeded random sequence of Ops for one algorithm: a few
// identities with regions, global ceilings, calendar periods, a ban, a
// concurrency bound with releases, costs 1-3, every mode, window sets and
// limits that change now and then (a reload, or nodes that disagree), and
// time steps that are mostly zero or small, land on a window boundary (or
// one µs either side), go back a little (a caller whose clock lags), or skip
// half a window, a window, or a long idle gap.
type diffGen struct {
	rng    *rand.Rand
	kb     limiter.KeyBuilder
	kind   limiter.Kind
	run    string
	now    int64
	leases []limiter.LeaseOp
	nlease int

	// The stores that expire keys do so on the wall clock (redis-server,
	// the in-process store), with a second to spare beyond the injected
	// time a key still has to live. So between any two ops the wall must
	// not gain more than that second on the injected clock: on a slow
	// machine (the race detector, a busy CPU) a run of ops at one instant
	// could take longer, and a key the injected clock says is live would be
	// gone in one store and not in miniredis, which never expires.
	// keepAhead moves the injected clock on by what the wall gained beyond
	// 100 ms since the moment it was furthest ahead (d = wall elapsed minus
	// injected elapsed, on the injected high-water mark hw). A step back
	// (a caller whose clock lags) makes a key that was dead at hw live
	// again, so it eats into the same second: steps back are at most
	// 250 ms, which leaves 650 ms for one op on the four stores. On a quick
	// machine keepAhead rarely fires, and the history is the seed's alone.
	wall0    time.Time
	now0, hw int64
	minD     int64
	bumps    int
}

// keepAhead keeps the wall from gaining more than 100 ms on the
// injected clock between any two ops (see diffGen).
func (g *diffGen) keepAhead() {
	if g.wall0.IsZero() {
		g.wall0, g.now0, g.hw = time.Now(), g.now, g.now
	}
	g.hw = max(g.hw, g.now)
	d := time.Since(g.wall0).Microseconds() - (g.hw - g.now0)
	if lag := d - g.minD - 100_000; lag > 0 {
		g.now += lag
		g.hw += lag
		g.bumps++
		d -= lag
	}
	g.minD = min(g.minD, d)
}

// ovAction is an operator's override change between two Ops.
type ovAction struct {
	key, scope string
	ttl        int64 // 0: delete
	fields     []string
}

// override returns, now and then, an override to set or end on one of the
// identities: a factor or some windows' limits, for every region or one,
// for a few seconds (so some end while the test runs).
// applyOverride sets or ends (a.ttl 0) the override a on every store at
// now; stores[j] is named names[j] in a failure.
func applyOverride(t *testing.T, ctx context.Context, a *ovAction, now int64, stores []limiter.Store, names []string) {
	t.Helper()
	for j, s := range stores {
		var err error
		if a.ttl == 0 {
			_, err = limiter.DeleteOverrideScope(ctx, s, a.key, a.scope, now)
		} else {
			_, err = limiter.SetOverrideFields(ctx, s, a.key, a.scope, now, a.ttl, a.fields)
		}
		if err != nil {
			t.Fatalf("override %+v on %s: %v", a, names[j], err)
		}
	}
}

func (g *diffGen) override() *ovAction {
	r := g.rng
	if r.IntN(100) >= 4 {
		return nil
	}
	ident := fmt.Sprintf("%s-%d", g.run, r.IntN(3))
	a := &ovAction{key: g.kb.Key("override", ident, false, "")}
	if r.IntN(3) > 0 {
		a.scope = fmt.Sprint("r", r.IntN(2))
	}
	if r.IntN(5) == 0 {
		return a
	}
	a.ttl = 1_000_000 + r.Int64N(20_000_000)
	if r.IntN(2) == 0 {
		a.fields = []string{"f", []string{"0.5", "2", "1.5", "0.1", "3"}[r.IntN(5)]}
		return a
	}
	for _, name := range []string{"10000000", "30000000", "20000000", "21000000", "day", "month"} {
		if r.IntN(2) == 0 {
			a.fields = append(a.fields, "l"+name, fmt.Sprint(1+r.Int64N(12)))
		}
		if a.scope == "" && r.IntN(3) == 0 {
			a.fields = append(a.fields, "g"+name, fmt.Sprint(1+r.Int64N(12)))
		}
	}
	return a
}

// Windows of 10 s and more keep the real Redis TTLs (>= 10 s of wall time)
// longer than the whole test: a key never expires in Redis while the
// injected clock says it is live.
var diffWindowSets = [][]time.Duration{
	{10 * time.Second},
	{10 * time.Second, 30 * time.Second},
	{20 * time.Second},
	{7 * time.Second * 3}, // 21 s: an interval that is not a whole µs for the token bucket
}

func (g *diffGen) op() (*limiter.Op, string) {
	r := g.rng
	w := int64(10_000_000)
	switch x := r.IntN(100); {
	case x < 40: // same instant
	case x < 94:
		next := g.now + 1 + r.Int64N(w/50)
		if b := (g.now/w + 1) * w; next >= b && r.IntN(2) == 0 {
			next = b + r.Int64N(3) - 1
		}
		g.now = next
	case x < 95:
		g.now -= 1 + r.Int64N(w/40) // at most 250 ms: see keepAhead
	case x < 97:
		g.now += w/2 + r.Int64N(w/2)
	case x < 98:
		g.now += w
	default:
		g.now += w + r.Int64N(2*w)
	}
	op := &limiter.Op{Now: g.now, Cost: 1 + r.Int64N(3)}
	switch x := r.IntN(100); {
	case x < 70:
		op.Mode = limiter.ModeCheck
	case x < 80:
		op.Mode = limiter.ModePeek
	case x < 88:
		op.Mode = limiter.ModeCheckOnly
	case x < 95:
		op.Mode = limiter.ModeRecord
	default:
		if len(g.leases) > 0 {
			i := r.IntN(len(g.leases))
			l := g.leases[i]
			g.leases = append(g.leases[:i], g.leases[i+1:]...)
			return &limiter.Op{Mode: limiter.ModeRelease, Now: g.now, Lease: &l}, "release " + l.ID
		}
		op.Mode = limiter.ModeCheck
	}
	ident := fmt.Sprintf("%s-%d", g.run, r.IntN(3))
	region := r.IntN(3) - 1
	withRegion := region >= 0
	reg := fmt.Sprint("r", region)
	set := diffWindowSets[r.IntN(len(diffWindowSets))]
	limits := []int64{3, 5, 8, 20}
	wins := func() []limiter.Win {
		var out []limiter.Win
		for _, d := range set {
			w := limiter.Win{Name: limiter.WindowName(d), Len: d.Microseconds(), Limit: limits[r.IntN(len(limits))]}
			if g.kind == limiter.KindToken && len(set) == 1 && r.IntN(2) == 0 {
				w.Burst = 1 + r.Int64N(10)
			}
			out = append(out, w)
		}
		return out
	}
	cal := func() []limiter.Win {
		var out []limiter.Win
		at := time.UnixMicro(g.now)
		for _, p := range []limiter.Period{limiter.PeriodDay, limiter.PeriodMonth} {
			if r.IntN(2) == 0 {
				out = append(out, limiter.Win{Name: p.String(), Limit: 10 + r.Int64N(30), Bounds: p.Bounds(at, time.UTC)})
			}
		}
		return out
	}
	key := func(seg string, global bool) string {
		if global {
			return g.kb.Key(seg, ident, true, limiter.GlobalRegion)
		}
		return g.kb.Key(seg, ident, withRegion, reg)
	}
	op.Override = &limiter.OverrideRef{Key: g.kb.Key("override", ident, false, "")}
	if withRegion {
		op.Override.Scope = reg
	}
	op.Parts = append(op.Parts, limiter.Part{Key: key(g.kind.String(), false), Kind: g.kind, Windows: wins()})
	if c := cal(); len(c) > 0 {
		op.Parts = append(op.Parts, limiter.Part{Key: key("calendar", false), Kind: limiter.KindCalendar, Windows: c})
	}
	if withRegion && r.IntN(2) == 0 {
		op.Parts = append(op.Parts, limiter.Part{Key: key(g.kind.String(), true), Kind: g.kind, Global: true, Windows: wins()})
	}
	if r.IntN(3) == 0 {
		op.Ban = &limiter.BanOp{Key: key("ban", false), After: 3, Within: 15_000_000, For: 12_000_000, Wait: []int64{0, 0, 0, 0, 0, 1_000_000, 1e12}[r.IntN(7)]}
	}
	if r.IntN(3) == 0 {
		g.nlease++
		op.Lease = &limiter.LeaseOp{Key: key("lease", false), Max: 2, Timeout: 15_000_000, ID: fmt.Sprint("L", g.nlease)}
		if op.Mode == limiter.ModeCheck || op.Mode == limiter.ModeCheckOnly {
			g.leases = append(g.leases, *op.Lease)
		}
	}
	return op, fmt.Sprintf("%v %s region=%v cost=%d parts=%d ban=%v lease=%v", op.Mode, ident, region, op.Cost, len(op.Parts), op.Ban != nil, op.Lease != nil)
}

// TestDifferential runs the same seeded random Ops on the in-process store,
// miniredis, two real redis-servers (clock app), one called through the
// function library (FCALL), one by EVALSHA, and two of Redis 6, one called
// by EVALSHA of the cached body (lua.DecideCached, as a store calls Redis 6
// unless told otherwise), one by the scripts that define all on each call
// (ScriptsEval), and requires every reply to be
// identical: status, ban, leases, and every window's count, retry and
// reset, to the microsecond.
func TestDifferential(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	evalClient := redistest.Start(t).Client(t)
	client6, eval6 := redistest.StartRedis6(t).Client(t), redistest.StartRedis6(t).Client(t)
	const n = 2500
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			mem := limiter.NewMemoryStore()
			t.Cleanup(func() { mem.Close() })
			m := miniredis.RunT(t)
			mc := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { mc.Close() })
			names := []string{"memory", "miniredis", "redis-server FCALL", "redis-server EVALSHA", "Redis 6 cached", "Redis 6 EVALSHA"}
			stores := []limiter.Store{mem, limiter.NewRedisStore(mc), limiter.NewRedisStore(client),
				limiter.NewRedisStore(evalClient, limiter.WithScripts(limiter.ScriptsEval)),
				limiter.NewRedisStore(client6), limiter.NewRedisStore(eval6, limiter.WithScripts(limiter.ScriptsEval))}

			kb, _ := limiter.NewKeyBuilder("diff:", "d")
			rng := rand.New(rand.NewPCG(uint64(alg)+1, 0x5eed))
			g := &diffGen{rng: rng, kb: kb, kind: kindOf(alg), run: randomID(t), now: time.Date(2026, 11, 29, 12, 10, 0, 0, time.UTC).UnixMicro()}
			ctx := context.Background()
			seen := map[string]int{}
			for i := 0; i < n; i++ {
				g.keepAhead()
				if a := g.override(); a != nil {
					applyOverride(t, ctx, a, g.now, stores, names)
					seen["override"]++
				}
				op, what := g.op()
				var replies []limiter.Reply
				for j, s := range stores {
					cp := cloneOp(op)
					r, err := s.Do(ctx, cp)
					if err != nil {
						t.Fatalf("op %d %s on %s: %v", i, what, names[j], err)
					}
					if testing.Verbose() && j < 2 && strings.Contains(what, debugIdent) && debugIdent != "" && alg == limiter.SlidingLog {
						t.Logf("op %d %s at %d: %v %+v", i, what, op.Now, cp.Parts[0].Windows, r)
					}
					replies = append(replies, r)
				}
				for j := 1; j < len(replies); j++ {
					if !reflect.DeepEqual(replies[j], replies[0]) {
						t.Fatalf("op %d %s:\n  %-12s %+v\n  %-12s %+v", i, what, names[0], replies[0], names[j], replies[j])
					}
				}
				r := replies[0]
				if r.Limits != nil {
					seen["overridden"]++
				}
				switch {
				case r.Status == limiter.StatusTooLarge:
					seen["too large"]++
				case r.Status == limiter.StatusBanned && r.BanStarted:
					seen["ban started"]++
				case r.Status == limiter.StatusBanned:
					seen["banned"]++
				case r.LeaseDenied:
					seen["lease denied"]++
				case r.Status == limiter.StatusDenied:
					seen["denied"]++
				default:
					seen["allowed"]++
				}
			}
			t.Logf("%s: %d ops identical on %v: %v (injected clock moved on %d times for a slow machine)", alg, n, names, seen, g.bumps)
			for _, k := range []string{"allowed", "denied", "banned", "ban started", "lease denied", "override", "overridden", "too large"} {
				if seen[k] < 5 {
					t.Errorf("script too easy: %q only %d times (%v)", k, seen[k], seen)
				}
			}
		})
	}
}

var debugIdent = ""

func kindOf(a limiter.Algorithm) limiter.Kind {
	return [...]limiter.Kind{limiter.KindLog, limiter.KindCounter, limiter.KindFixed, limiter.KindToken}[a]
}

// cloneOp copies an Op, so a store cannot change what the next one sees.
func cloneOp(op *limiter.Op) *limiter.Op {
	cp := *op
	cp.Parts = nil
	for _, p := range op.Parts {
		p.Windows = append([]limiter.Win(nil), p.Windows...)
		cp.Parts = append(cp.Parts, p)
	}
	if op.Ban != nil {
		b := *op.Ban
		cp.Ban = &b
	}
	if op.Lease != nil {
		l := *op.Lease
		cp.Lease = &l
	}
	if op.Override != nil {
		o := *op.Override
		cp.Override = &o
	}
	return &cp
}
