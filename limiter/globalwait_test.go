package limiter_test

// global_redis: the Retry-After of a ceiling the ledger says is full (a
// review of limiter/global.go, issue 28).

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// grantLog is a node's answered EventGrant events, in order: when each
// was told (after the ledger answered, before the share kept it), and the
// ledger's retry.
type grantLog struct {
	mu    sync.Mutex
	at    []time.Time
	retry []time.Duration
}

// last returns the last grant event's time and retry.
func (g *grantLog) last() (time.Time, time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.at) == 0 {
		return time.Time{}, 0, false
	}
	return g.at[len(g.at)-1], g.retry[len(g.retry)-1], true
}

// waitNode is a node of w's data centre 0 with policy p, its grants logged.
func waitNode(t *testing.T, w *mdcWorld, p limiter.Policy, timeout time.Duration) (*limiter.Limiter, *grantLog) {
	t.Helper()
	dc := w.dcs[0]
	c := redis.NewClient(&redis.Options{Addr: dc.srv.Addr()})
	t.Cleanup(func() { c.Close() })
	b := productionStack(t, c)
	log := &grantLog{}
	b.Global = &limiter.Global{Ledger: dc.lg, Datacenter: dc.name, Timeout: timeout,
		OnEvent: func(ev limiter.GlobalEvent) {
			if ev.Kind == limiter.EventGrant && ev.Err == nil {
				log.mu.Lock()
				log.at, log.retry = append(log.at, time.Now()), append(log.retry, ev.Retry)
				log.mu.Unlock()
			}
		}}
	l, err := limiter.New(p, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, log
}

// TestGlobalFullRetryAfterIsWhenRoomFrees: a ceiling the ledger says is
// full is refused with the Retry-After the ledger gave (when its first
// unit leaves the window), as docs/multidc.md says, not a renewal's lead
// later. The ledger is 250 ms away each way, so the lead (two renewals'
// time) is over half a second: before the fix it was added to every retry
// of the ledger, not only to a grant capped at the data centre's fair rate.
func TestGlobalFullRetryAfterIsWhenRoomFrees(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	const limit, win, oneWay = 10, time.Minute, 250 * time.Millisecond
	o := mdcOptions(limiter.FailClosed)
	o.dcs, o.nodes = 1, 0
	o.delay = func(int) time.Duration { return oneWay }
	w := newMDCWorld(t, o)
	p := o.policy
	p.GlobalWindows = []limiter.Window{{Duration: win}}
	n, grants := waitNode(t, w, p, 2*time.Second)
	in := &limiter.Input{Identity: "k", Region: "dc0", Limits: []int64{1 << 40}, GlobalLimits: []int64{limit}}
	ctx := context.Background()
	admitted := 0
	for i := 0; ; i++ {
		if i == 200 {
			t.Fatalf("%d admitted of a ceiling of %d, and the ledger never said it was full", admitted, limit)
		}
		start := time.Now()
		d, err := n.Decide(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if d.Pass {
			admitted++
		}
		if d.Pass || d.RetryAfter < win/2 {
			time.Sleep(20 * time.Millisecond) // pacing, for the renewals to land, not crossing a window
			continue
		}
		// Full: the ledger's retry counts from when it answered (before
		// the event); the share keeps it from its deposit, a Redis call
		// after the event.
		told, retry, ok := grants.last()
		if !ok || retry < win/2 {
			t.Fatalf("refused as full (Retry-After %v) with no such retry from the ledger (last %v, %v)", d.RetryAfter, retry, ok)
		}
		bound := told.Add(retry + 100*time.Millisecond)
		t.Logf("%d admitted; refused: Retry-After %v; the ledger's retry %v, told %v before the request",
			admitted, d.RetryAfter, retry, start.Sub(told))
		if admitted > limit {
			t.Errorf("%d admitted under a ceiling of %d", admitted, limit)
		}
		if got := start.Add(d.RetryAfter); got.After(bound) {
			t.Errorf("the ceiling full: Retry-After %v, %v after the ledger's retry ends (a Redis call after, at most: 100 ms)",
				d.RetryAfter, got.Sub(told.Add(retry)))
		}
		return
	}
}
