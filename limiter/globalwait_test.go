package limiter_test

// global_redis: what a client sees while the ledger is slow (not down),
// and the Retry-After of a ceiling the ledger says is full (a review of
// limiter/dc/global.go, issue 28).

import (
	"context"
	"fmt"
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

// TestGlobalSlowLedgerIsNotAFault: the ledger slower than the lead a share
// is renewed ahead by (a round trip of 300 ms where it was 1 ms), but well
// within its timeout (1 s), is slow, not down: a request whose share ran
// out before its renewal landed gets a 429 with the lead as its
// Retry-After (a second in the header), not the fail mode: no 503 under
// fail closed or fail local, no pass the ceiling does not count under fail
// open (each happened before the fix).
func TestGlobalSlowLedgerIsNotAFault(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	for _, fail := range []limiter.FailMode{limiter.FailClosed, limiter.FailLocal, limiter.FailOpen} {
		t.Run(fmt.Sprint(fail), func(t *testing.T) {
			o := mdcOptions(fail)
			o.dcs, o.nodes = 1, 0
			o.delay = func(int) time.Duration { return 0 }
			w := newMDCWorld(t, o)
			p := o.policy
			p.GlobalWindows = []limiter.Window{{Duration: 10 * time.Second}}
			n, _ := waitNode(t, w, p, time.Second)
			in := &limiter.Input{Identity: "k", Region: "dc0", Limits: []int64{1 << 40}, GlobalLimits: []int64{1 << 30}}
			ctx := context.Background()
			pace := func(d time.Duration) (limited, unavailable, open int, worst time.Duration) {
				for end := time.Now().Add(d); time.Now().Before(end); {
					dec, err := n.Decide(ctx, in)
					if err != nil {
						t.Fatal(err)
					}
					switch {
					case dec.Pass && dec.Source == limiter.SourceFailOpen:
						open++
					case dec.Outcome == limiter.OutcomeUnavailable:
						unavailable++
					case dec.Outcome == limiter.OutcomeLimited:
						limited++
						if dec.RetryAfter <= 0 || dec.RetryAfter > time.Second {
							t.Errorf("a 429 while the ledger is slow: Retry-After %v; want the lead (a second at most)", dec.RetryAfter)
						}
						worst = max(worst, dec.RetryAfter)
					}
					time.Sleep(2 * time.Millisecond) // pacing the demand, not crossing a window
				}
				return
			}
			pace(1500 * time.Millisecond) // the round trip and the renewals' time learnt: about 1 ms
			w.dcs[0].proxy.SetDelay(150*time.Millisecond, 150*time.Millisecond)
			limited, unavailable, open, worst := pace(1500 * time.Millisecond)
			t.Logf("the ledger 300 ms a round trip (timeout 1 s): %d refused (429, Retry-After up to %v), %d 503, %d passed by fail open",
				limited, worst, unavailable, open)
			if unavailable > 0 || open > 0 {
				t.Errorf("the ledger slow, not down: %d requests got 503 and %d were passed by fail open, uncounted; want a 429 with the lead as Retry-After",
					unavailable, open)
			}
		})
	}
}

// TestGlobalFullRetryAfterIsWhenRoomFrees: a ceiling the ledger says is
// full is refused with the Retry-After of when the data centre's share
// has room again, as docs/multidc.md says: the ledger's retry (its first
// unit leaves the window) and the lead, for the renewal the share asks
// then to land; never before the ledger's retry (a client told so would be
// refused again), at most the lead's bound (2 x timeout + 20 ms) after it.
// The ledger is 250 ms away each way.
func TestGlobalFullRetryAfterIsWhenRoomFrees(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	const limit, win, oneWay, timeout = 10, time.Minute, 250 * time.Millisecond, 2 * time.Second
	o := mdcOptions(limiter.FailClosed)
	o.dcs, o.nodes = 1, 0
	o.delay = func(int) time.Duration { return oneWay }
	w := newMDCWorld(t, o)
	p := o.policy
	p.GlobalWindows = []limiter.Window{{Duration: win}}
	n, grants := waitNode(t, w, p, timeout)
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
		// after the event, and the lead more.
		told, retry, ok := grants.last()
		if !ok || retry < win/2 {
			t.Fatalf("refused as full (Retry-After %v) with no such retry from the ledger (last %v, %v)", d.RetryAfter, retry, ok)
		}
		frees, lead := told.Add(retry), 2*timeout+20*time.Millisecond
		t.Logf("%d admitted; refused: Retry-After %v, %v after the ledger's retry ends",
			admitted, d.RetryAfter, start.Add(d.RetryAfter).Sub(frees))
		if admitted > limit {
			t.Errorf("%d admitted under a ceiling of %d", admitted, limit)
		}
		if got := start.Add(d.RetryAfter); got.Before(frees.Add(-100*time.Millisecond)) || got.After(frees.Add(lead+100*time.Millisecond)) {
			t.Errorf("the ceiling full: Retry-After %v, %v after the ledger's retry ends; want from 0 to the lead (at most %v)",
				d.RetryAfter, got.Sub(frees), lead)
		}
		return
	}
}
