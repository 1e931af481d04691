package limiter_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// A multi-data-centre world on loopback: a ledger redis-server, and per
// data centre its own redis-server and nodes (Limiters with their own
// clients). Every admitted request is recorded at its store's time.

type mdcWorld struct {
	t      *testing.T
	ledger *redistest.Server
	lg     *limiter.Ledger
	dcs    []*mdcDC

	mu       sync.Mutex
	admitted []time.Time // every admission under the global ceiling
	events   map[limiter.GlobalEventKind]int
}

type mdcDC struct {
	name  string
	srv   *redistest.Server
	nodes []*limiter.Limiter
}

type mdcOpts struct {
	dcs, nodes int
	policy     limiter.Policy
	ledgerAddr func(dc int) string // the ledger's address as dc sees it (a proxy); default the ledger
	length     time.Duration
}

func newMDCWorld(t *testing.T, o mdcOpts) *mdcWorld {
	t.Helper()
	w := &mdcWorld{t: t, ledger: redistest.Start(t), events: map[limiter.GlobalEventKind]int{}}
	for i := range o.dcs {
		dc := &mdcDC{name: fmt.Sprintf("dc%d", i), srv: redistest.Start(t)}
		addr := w.ledger.Addr()
		if o.ledgerAddr != nil {
			addr = o.ledgerAddr(i)
		}
		lc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { lc.Close() })
		lg := limiter.NewLedger(lc)
		for range o.nodes {
			dc.nodes = append(dc.nodes, w.node(dc, lg, o))
		}
		w.dcs = append(w.dcs, dc)
	}
	return w
}

func (w *mdcWorld) node(dc *mdcDC, lg *limiter.Ledger, o mdcOpts) *limiter.Limiter {
	c := redis.NewClient(&redis.Options{Addr: dc.srv.Addr()})
	w.t.Cleanup(func() { c.Close() })
	b := productionStack(w.t, c)
	b.Global = &limiter.Global{Ledger: lg, Datacenter: dc.name, Length: o.length, Timeout: time.Second,
		OnEvent: func(ev limiter.GlobalEvent) {
			w.mu.Lock()
			w.events[ev.Kind]++
			w.mu.Unlock()
		}}
	l, err := limiter.New(o.policy, b)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(l.Close)
	return l
}

// hammer sends requests of identity id from every node of every data
// centre until stop, recording the admitted ones.
func (w *mdcWorld) hammer(ctx context.Context, id string, global int64, gap time.Duration) {
	var wg sync.WaitGroup
	for _, dc := range w.dcs {
		for _, n := range dc.nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				in := &limiter.Input{Identity: id, Region: dc.name, Limits: []int64{1 << 40}, GlobalLimits: []int64{global}}
				for ctx.Err() == nil {
					d, err := n.Decide(ctx, in)
					if err != nil {
						w.t.Error(err)
						return
					}
					if d.Pass {
						w.mu.Lock()
						w.admitted = append(w.admitted, d.At)
						w.mu.Unlock()
					}
					if gap > 0 {
						time.Sleep(gap)
					}
				}
			}()
		}
	}
	wg.Wait()
}

// overAdmitted is the most admissions in any window of length win, less
// limit (0 or less: the ceiling held).
func overAdmitted(at []time.Time, win time.Duration, limit int64) (int64, time.Time) {
	s := slices.Clone(at)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	var most int64
	var when time.Time
	j := 0
	for i := range s {
		for s[j].Add(win).Compare(s[i]) <= 0 {
			j++
		}
		if n := int64(i - j + 1); n > most {
			most, when = n, s[i]
		}
	}
	return most - limit, when
}

func TestGlobalCeilingAcrossDatacenters(t *testing.T) {
	t.Parallel()
	p := limiter.Policy{Name: "mdc", Regions: true, Windows: []limiter.Window{{Duration: time.Minute}},
		GlobalWindows: []limiter.Window{{Duration: 2 * time.Second}}, Timeout: time.Second}
	w := newMDCWorld(t, mdcOpts{dcs: 3, nodes: 2, policy: p, length: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const limit = 200
	w.hammer(ctx, "viral", limit, time.Millisecond)
	over, when := overAdmitted(w.admitted, 2*time.Second, limit)
	t.Logf("admitted %d in 5 s (ceiling %d per 2 s); events %v", len(w.admitted), limit, w.events)
	if over > 0 {
		t.Fatalf("%d over the ceiling in the window ending %v", over, when)
	}
	// Little left unused: the ceiling admits about limit per window.
	if min := int64(2 * limit); int64(len(w.admitted)) < min {
		t.Fatalf("admitted %d in 5 s, want at least %d", len(w.admitted), min)
	}
}
