package limiter_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestCounterFastPathMatchesMemory holds sliding_counter's format-4 fast
// path (one window, mode 0: FCALL, EVALSHA of its fast script, and checks
// batched into one call, whose replies are appended flat) to the
// in-process store, reply by reply (status, count, retry, reset to the
// µs), on bursty traffic: bursts within a bucket, pauses of one bucket to
// more than a window, a caller's clock behind the bucket stored, costs
// over the limit; windows of 20 buckets exactly (every length of whole ms)
// and one that is not (1,000,007 µs: the window starts in either of its
// two oldest buckets).
func TestCounterFastPathMatchesMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	evalSrv := redistest.Start(t)
	names := []string{"redis-server FCALL", "redis-server EVALSHA", "redis-server FCALL batched"}
	stores := []*limiter.RedisStore{limiter.NewRedisStore(srv.Client(t)),
		limiter.NewRedisStore(evalSrv.Client(t), limiter.WithScripts(limiter.ScriptsEval)),
		limiter.NewRedisStore(srv.Client(t), limiter.WithBatching(8, 16))}
	t.Cleanup(func() {
		for _, s := range stores {
			s.Close()
		}
	})
	type cas struct {
		len, limit int64
	}
	// Slot widths: 2 bytes (1 s windows), 3 (10 s, 60 s), 1 (2 ms), and 4
	// and 5 (an hour's buckets of 180 s, limits past 16M and 4G).
	cases := []cas{{1_000_000, 3}, {1_000_000, 7}, {10_000_000, 40}, {60_000_000, 25}, {1_000_007, 9}, {2_000, 5},
		{3_600_000_000, 25}, {1_000_000, 20_000_000}, {60_000_000, 100_000_000_000}}
	const keys, ops = 8, 400
	run := randomID(t)
	start := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC).UnixMicro()
	// seq is key i's checks of case c, the same for every store.
	seq := func(c cas, ci, i int) []*limiter.Op {
		rng := rand.New(rand.NewPCG(uint64(ci)*1000+uint64(i), 0xfa57))
		key := fmt.Sprintf("fast4:{%s:%d:%d}", run, ci, i)
		bw := (c.len + 19) / 20
		now := start + rng.Int64N(c.len)
		var out []*limiter.Op
		for range ops {
			switch x := rng.IntN(100); {
			case x < 60: // a burst: within a bucket
				now += rng.Int64N(bw/8 + 1)
			case x < 85: // up to a few buckets
				now += rng.Int64N(3*bw + 1)
			case x < 95: // a pause up to more than a window
				now += rng.Int64N(c.len + 2*bw)
			default: // a caller's clock behind
				now -= rng.Int64N(bw)
			}
			cost := int64(1 + rng.IntN(3))
			if rng.IntN(40) == 0 {
				cost = c.limit + 1
			}
			out = append(out, &limiter.Op{Now: now, Cost: cost, Parts: []limiter.Part{{Key: key, Kind: limiter.KindCounter,
				Windows: []limiter.Win{{Name: limiter.WindowName(time.Duration(c.len) * time.Microsecond), Len: c.len, Limit: c.limit}}}}})
		}
		return out
	}
	ctx := context.Background()
	seen := map[string]int{}
	for ci, c := range cases {
		// The in-process store's replies, key by key.
		want := make([][]limiter.Reply, keys)
		mem := limiter.NewMemoryStore()
		for i := range keys {
			for _, op := range seq(c, ci, i) {
				r, err := mem.Do(ctx, op)
				if err != nil {
					t.Fatalf("memory: %v", err)
				}
				want[i] = append(want[i], r)
				switch {
				case r.Status == limiter.StatusDenied:
					seen["denied"]++
				case r.Usage[0].Reset > 0 && r.Usage[0].Reset%(c.len/20) != 0:
					seen["admitted, reset within a bucket"]++
				default:
					seen["admitted"]++
				}
			}
		}
		mem.Close()
		for si, s := range stores {
			var wg sync.WaitGroup
			errs := make([]error, keys)
			for i := range keys {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j, op := range seq(c, ci, i) {
						// (each store its own key: the same traffic on each)
						op.Parts[0].Key += fmt.Sprintf(":%d", si)
						r, err := s.Do(ctx, op)
						if err != nil {
							errs[i] = fmt.Errorf("check %d: %w", j, err)
							return
						}
						if !reflect.DeepEqual(r, want[i][j]) {
							errs[i] = fmt.Errorf("check %d at %d cost %d: %+v, the in-process store %+v", j, op.Now, op.Cost, r, want[i][j])
							return
						}
					}
				}()
				if si != 2 {
					wg.Wait() // one check a call: key by key
				}
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("window %d µs, limit %d, key %d on %s: %v", c.len, c.limit, i, names[si], err)
				}
			}
		}
	}
	t.Logf("replies: %v", seen)
	for _, k := range []string{"denied", "admitted, reset within a bucket", "admitted"} {
		if seen[k] < 200 {
			t.Errorf("traffic too easy: %q only %d times (%v)", k, seen[k], seen)
		}
	}
}
