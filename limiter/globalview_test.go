package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// TestGlobalWindowCountsTheLedger: on both stacks (a data centre's Redis,
// and the in-process store of a node that is its own data centre), a
// decision's window of a ceiling kept in a ledger counts what the ledger
// counted at the last renewal less what the share holds unspent: with one
// data centre asking, what it admitted (1, 2, ...), and remaining the
// limit less that; never the limit less the share (the share's units shown
// as the ceiling's remaining).
func TestGlobalWindowCountsTheLedger(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	ledger := redistest.Start(t)
	const limit = 20
	for _, stack := range []string{"memory", "redis"} {
		t.Run(stack, func(t *testing.T) {
			lc := redis.NewClient(&redis.Options{Addr: ledger.Addr(), MaxRetries: -1, Protocol: 2, DisableIdentity: true})
			t.Cleanup(func() { lc.Close() })
			p := limiter.Policy{Name: "gv" + stack, Regions: true, Windows: []limiter.Window{{Duration: time.Minute}},
				GlobalWindows: []limiter.Window{{Duration: time.Minute}}, Timeout: time.Second, Fail: limiter.FailClosed}
			var b limiter.Backend
			if stack == "memory" {
				ms := limiter.NewMemoryStore()
				t.Cleanup(func() { ms.Close() })
				b = limiter.Backend{Store: ms, Source: limiter.SourceMemory}
			} else {
				srv := redistest.Start(t)
				c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
				t.Cleanup(func() { c.Close() })
				b = productionStack(t, c)
			}
			b.Global = &limiter.Global{Ledger: limiter.NewLedger(lc), Datacenter: "dc-" + stack}
			l, err := limiter.New(p, b)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			in := &limiter.Input{Identity: "k", Region: "r", Limits: []int64{1000}, GlobalLimits: []int64{limit}}
			for i := int64(1); i <= 4; i++ {
				d, err := l.Decide(context.Background(), in)
				if err != nil {
					t.Fatal(err)
				}
				g := d.Windows[1]
				if !d.Pass || !g.Global || !g.Known || g.Count != i || g.Remaining != limit-i {
					t.Fatalf("request %d: %s, the ceiling's window %+v: want count %d, remaining %d", i, d.Outcome, g, i, limit-i)
				}
			}
		})
	}
}
