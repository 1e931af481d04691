package limiter_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestCounterBoundAtBucketEdges: bursts timed against the counter's buckets
// (lua/sliding_counter.lua, formats 4 and 3: a window W in N = 20 buckets of W/N,
// the oldest counted by its first and last arrival but never below its
// units minus B = ceil(limit / N); format 2, under state_format 2: N = 10,
// the oldest counted by its overlap, the same floor) never get more than
// limit + B units into any window (t - W, t]: each round sends a burst (as
// many requests as are admitted, costs 1 to 3) into one bucket (at its last
// µs, its first, or between), then bursts as the window comes to start in
// that bucket (d µs before the burst leaves it, down to 1 µs) and at the
// edges of the buckets after it. It checks the exact log of what was
// admitted after every admission, on the in-process store and on
// redis-server (formats 4, 3 and 2), and that the bursts do reach past the
// limit (the bound is met, not merely above what happened).
func TestCounterBoundAtBucketEdges(t *testing.T) {
	t.Parallel()
	client := redistest.Start(t).Client(t)
	ctx := context.Background()
	for _, st := range []struct {
		name  string
		store limiter.Store
		n     int64 // buckets a window
		slack int64 // the bound is limit + B - slack
	}{{"memory", limiter.NewMemoryStore(), limiter.CounterBuckets, 1}, {"redis-server", limiter.NewRedisStore(client), limiter.CounterBuckets, 1},
		{"redis-server, format 3", limiter.NewRedisStore(client, limiter.WithStateFormat(limiter.CounterFormat3)), limiter.CounterBuckets, 1},
		{"redis-server, format 2", limiter.NewRedisStore(client, limiter.WithStateFormat(limiter.LogFormat2)), 10, 0}} {
		for _, limit := range []int64{7, 100} {
			const w = int64(10_000_000)
			bw, b := w/st.n, (limit+st.n-1)/st.n
			rng := rand.New(rand.NewPCG(uint64(limit), 4))
			key := "bound:{" + st.name + "}"
			wins := []limiter.Win{{Name: limiter.WindowName(10 * time.Second), Len: w, Limit: limit}}
			start := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC).UnixMicro()/bw*bw + 100*bw*limit
			bound := limit + b - st.slack
			var log [][2]int64
			most := int64(0)
			send := func(at, cost int64) bool {
				op := &limiter.Op{Now: at, Cost: cost, Mode: limiter.ModeCheck,
					Parts: []limiter.Part{{Key: key, Kind: limiter.KindCounter, Windows: wins}}}
				r, err := st.store.Do(ctx, op)
				if err != nil {
					t.Fatal(err)
				}
				if r.Status != limiter.StatusAllowed {
					return false
				}
				log = append(log, [2]int64{at, op.Cost})
				var n int64
				for _, e := range log {
					if e[0] > at-w {
						n += e[1]
					}
				}
				if n > bound {
					t.Fatalf("%s, limit %d: %d units in the window ending %d µs after the start, over the bound %d", st.name, limit, n, at-start, bound)
				}
				most = max(most, n)
				return true
			}
			burst := func(at int64) {
				for cost := 1 + rng.Int64N(3); ; cost = 1 + rng.Int64N(3) {
					if !send(at, cost) && cost == 1 {
						return
					}
				}
			}
			for round := range int64(40) {
				// A burst in one bucket (at its last µs, its first, or
				// between; or one request at its first µs and the burst at
				// its last, or between: the two ends apart), then bursts as
				// the window comes to start in that bucket: d µs before the
				// first and the last arrival leave the window.
				edge := start + round*3*w + rng.Int64N(st.n)*bw
				first, last := edge, edge
				switch round % 5 {
				case 0:
					first, last = edge+bw-1, edge+bw-1
				case 2:
					first = edge + rng.Int64N(bw)
					last = first
				case 3:
					last = edge + bw - 1
				case 4:
					last = edge + 1 + rng.Int64N(bw-1)
				}
				if first != last {
					send(first, 1)
				}
				burst(last)
				for _, d := range []int64{bw, bw / 2, bw / 10, 3, 2, 1} {
					burst(first + w - d)
					burst(last + w - d)
				}
				// And at the edges of the buckets after it.
				for m := range st.n + 2 {
					e := edge + w + m*bw
					burst(e - 1)
					burst(e)
				}
			}
			if most != bound {
				t.Errorf("%s, limit %d: at most %d units in a window: the bursts never reached the bound %d", st.name, limit, most, bound)
			}
			t.Logf("%s, limit %d: at most %d units in a window (limit + B - %d = %d), %d admitted", st.name, limit, most, st.slack, bound, len(log))
		}
	}
}

// TestCounterResetToTheMicrosecond: the reset of a sliding counter is the
// first µs at which its estimate has dropped by one. A minute's window
// (buckets of 6 s), one request early in a bucket and one a minute and 3 s
// later: the estimate drops by one exactly 60 s after the second, when the
// window has come to start at it. The search compared the estimate with
// the estimate less one in doubles, rounded, and stopped a µs late
// (60.000001 s): a RateLimit reset of 61 where 60 is right. On the
// in-process store and on redis-server (the simulation's memory seed 1,
// shrunk).
func TestCounterResetToTheMicrosecond(t *testing.T) {
	t.Parallel()
	client := redistest.Start(t).Client(t)
	ctx := context.Background()
	start := time.Date(2026, 3, 8, 6, 59, 50, 0, time.UTC).UnixMicro()
	wins := []limiter.Win{{Name: limiter.WindowName(time.Minute), Len: time.Minute.Microseconds(), Limit: 5}}
	for _, st := range []struct {
		name  string
		store limiter.Store
	}{{"memory", limiter.NewMemoryStore()}, {"redis-server", limiter.NewRedisStore(client)}} {
		var last limiter.Reply
		for _, at := range []int64{start + 124_827, start + 124_827 + 59_999_999 + 2_924_313} {
			r, err := st.store.Do(ctx, &limiter.Op{Now: at, Cost: 1, Mode: limiter.ModeCheck,
				Parts: []limiter.Part{{Key: "reset:{" + st.name + "}", Kind: limiter.KindCounter, Windows: wins}}})
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != limiter.StatusAllowed {
				t.Fatalf("%s: request at %d refused: %+v", st.name, at, r)
			}
			last = r
		}
		if got := last.Usage[0].Reset; got != time.Minute.Microseconds() {
			t.Errorf("%s: reset %d µs after the second request, want exactly %d (a minute: the window then starts at it)",
				st.name, got, time.Minute.Microseconds())
		}
	}
}
