package limiter_test

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/netproxy"
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

	vip, replProxy *netproxy.Proxy // the ledger's one address (opts.vip): a failover moves it
	replica        *redistest.Server
	limit          atomic.Int64 // the global limit requests carry now (a reload changes it)
	offset         func(dc int) time.Duration

	mu          sync.Mutex
	admitted    []time.Time // every admission under the global ceiling
	limits      []int64     // the limit each was decided under
	who         []string    // the node of each, and the limit it carried
	perDC       map[string][]time.Time
	unavailable map[string]int
	failOpen    int
	staticAt    time.Time // the first node to go to its static share
	events      map[limiter.GlobalEventKind]int
	dropsFailed int // EventDropped with Err: a reset's drop given up
}

type mdcDC struct {
	name  string
	srv   *redistest.Server
	proxy *netproxy.Proxy // to the ledger
	store *netproxy.Proxy // to srv, for the nodes (mdcOpts.storeProxy)
	lg    *limiter.Ledger
	nodes []*limiter.Limiter
}

type mdcOpts struct {
	dcs, nodes int
	policy     limiter.Policy
	// delay is the one-way delay between data centre i and the ledger
	// (through a proxy each; nil: no proxy).
	delay  func(dc int) time.Duration
	length time.Duration
	beat   time.Duration
	skew   time.Duration
	lto    time.Duration // the ledger's timeout (default 1 s)
	// storeProxy puts the nodes' clients of their data centre's Redis
	// behind a proxy (mdcDC.store, which can cut them off), and bounds
	// their calls by the context, as the plugin's clients do
	// (internal/redisconf; otherwise go-redis's read timeout, 3 s).
	storeProxy bool
	// vip puts one proxy in front of the ledger (its address for every
	// data centre), and replica a replica behind a proxy of its own.
	vip, replica bool
	// offset is data centre i's clock against the store's (clock app).
	offset func(dc int) time.Duration
	// cluster keeps the ledger on a Redis Cluster of 3 (no proxies).
	cluster bool
}

func newMDCWorld(t *testing.T, o mdcOpts) *mdcWorld {
	t.Helper()
	// Diskless replication, at once: a replica is online within moments.
	w := &mdcWorld{t: t, ledger: redistest.Start(t, "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"), events: map[limiter.GlobalEventKind]int{},
		perDC: map[string][]time.Time{}, unavailable: map[string]int{}, offset: o.offset}
	ledgerAddr := w.ledger.Addr()
	if o.vip {
		w.vip = w.proxy(ledgerAddr)
		ledgerAddr = w.vip.Addr()
	}
	if o.replica {
		w.replProxy = w.proxy(w.ledger.Addr())
		host, port, _ := net.SplitHostPort(w.replProxy.Addr())
		w.replica = redistest.Start(t, "--replicaof", host, port)
		waitReplicas(t, w.ledger, 1)
	}
	var cluster *redistest.Cluster
	if o.cluster {
		cluster = redistest.StartCluster(t, 3)
	}
	for i := range o.dcs {
		dc := &mdcDC{name: fmt.Sprintf("dc%d", i), srv: redistest.Start(t)}
		if cluster != nil {
			cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), MaxRetries: -1, Protocol: 2, DisableIdentity: true})
			t.Cleanup(func() { cc.Close() })
			dc.lg = limiter.NewLedger(cc)
			for range o.nodes {
				dc.nodes = append(dc.nodes, w.node(dc, o))
			}
			w.dcs = append(w.dcs, dc)
			continue
		}
		addr := ledgerAddr
		if o.delay != nil {
			px := w.proxy(addr)
			d := o.delay(i)
			px.SetDelay(d, d)
			dc.proxy, addr = px, px.Addr()
		}
		lc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true, Protocol: 2, DisableIdentity: true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		t.Cleanup(func() { lc.Close() })
		dc.lg = limiter.NewLedger(lc)
		for range o.nodes {
			dc.nodes = append(dc.nodes, w.node(dc, o))
		}
		w.dcs = append(w.dcs, dc)
	}
	return w
}

func (w *mdcWorld) proxy(target string) *netproxy.Proxy {
	px, err := netproxy.New(target)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { px.Close() })
	return px
}

// waitReplicas waits until srv has n replicas online.
func waitReplicas(t *testing.T, srv *redistest.Server, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(srv.CLI(t, "INFO", "replication"), "state=online") < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %d replicas after 10 s", srv.Addr(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *mdcWorld) node(dc *mdcDC, o mdcOpts) *limiter.Limiter {
	addr := dc.srv.Addr()
	if o.storeProxy {
		if dc.store == nil {
			dc.store = w.proxy(addr)
		}
		addr = dc.store.Addr()
	}
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: o.storeProxy})
	w.t.Cleanup(func() { c.Close() })
	b := productionStack(w.t, c)
	b.Global = &limiter.Global{Ledger: dc.lg, Datacenter: dc.name, Length: o.length, Timeout: cmp.Or(o.lto, time.Second),
		Beat: o.beat, Skew: o.skew,
		OnEvent: func(ev limiter.GlobalEvent) {
			if debugMDC && (ev.Kind == limiter.EventGrant || ev.Kind == limiter.EventStatic || ev.Kind == limiter.EventNormal || ev.Kind == limiter.EventLedgerError) {
				w.t.Logf("%s %s: %+v", time.Now().Format("05.000"), dc.name, ev)
			}
			w.mu.Lock()
			if ev.Kind == limiter.EventStatic && w.staticAt.IsZero() {
				w.staticAt = time.Now()
			}
			w.events[ev.Kind]++
			if ev.Kind == limiter.EventDropped && ev.Err != nil {
				w.dropsFailed++
			}
			w.mu.Unlock()
		}}
	p := o.policy
	if o.offset != nil {
		off := o.offset(slices.Index(w.dcNames(), dc.name))
		p.AppClock, p.Now = true, func() time.Time { return time.Now().Add(off) }
	}
	l, err := limiter.New(p, b)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(l.Close)
	return l
}

func (w *mdcWorld) dcNames() []string {
	var names []string
	for i := range len(w.dcs) + 1 {
		names = append(names, fmt.Sprintf("dc%d", i))
	}
	return names
}

// hammer sends requests of identity id from every node of every data
// centre until ctx ends, recording the admitted ones (a pass by fail open
// is counted apart: the operator chose it).
func (w *mdcWorld) hammer(ctx context.Context, id string, global int64, gap time.Duration) {
	var wg sync.WaitGroup
	for _, dc := range w.dcs {
		for ni := range dc.nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.send(ctx, dc, ni, id, global, gap)
			}()
		}
	}
	wg.Wait()
}

func (w *mdcWorld) send(ctx context.Context, dc *mdcDC, ni int, id string, global int64, gap time.Duration) {
	var off time.Duration
	if w.offset != nil {
		off = w.offset(slices.Index(w.dcNames(), dc.name))
	}
	for ctx.Err() == nil {
		limit := w.limitNow(global)
		in := &limiter.Input{Identity: id, Region: dc.name, Limits: []int64{1 << 40}, GlobalLimits: []int64{limit}}
		w.mu.Lock()
		n := dc.nodes[ni]
		w.mu.Unlock()
		d, err := n.Decide(ctx, in)
		if err != nil {
			w.t.Error(err)
			return
		}
		w.mu.Lock()
		switch {
		case d.Pass && d.Source == limiter.SourceFailOpen:
			w.failOpen++
		case d.Pass:
			// The store's time: a node's own clock runs off by off. A
			// decision that straddles a reload is held to the higher of
			// the two limits (a reload is not atomic across nodes);
			// every other to its own.
			at := d.At.Add(-off)
			w.admitted = append(w.admitted, at)
			w.limits = append(w.limits, max(limit, w.limitNow(global)))
			w.who = append(w.who, fmt.Sprintf("%s/n%d under %d", dc.name, ni, limit))
			w.perDC[dc.name] = append(w.perDC[dc.name], at)
		case d.Outcome == limiter.OutcomeUnavailable:
			w.unavailable[dc.name]++
		}
		w.mu.Unlock()
		if gap > 0 {
			time.Sleep(gap)
		}
	}
}

// limitNow is the global limit requests carry now.
func (w *mdcWorld) limitNow(global int64) int64 {
	if l := w.limit.Load(); l > 0 {
		return l
	}
	return global
}

// since returns dc's admissions after t (w.mu held: the nodes' renewals
// go on in the background after the traffic).
func (w *mdcWorld) since(dc string, t time.Time) int {
	n := 0
	for _, a := range w.perDC[dc] {
		if a.After(t) {
			n++
		}
	}
	return n
}

var debugMDC = os.Getenv("DEBUG_MDC") != ""

// oracleOver is, over every admission, the admissions in the window of
// length win that ends with it less the limit it was decided under (0 or
// less: every decision held its ceiling), as the oracle (oracle_test.go)
// sees it:
// every admission goes into its ledger of the global ceiling, and each is
// held to its limit over the window that ends with it.
func oracleOver(at []time.Time, limits []int64, win time.Duration) (int64, time.Time) {
	g := newLedger()
	for _, a := range at {
		g.Admit("viral", a.UnixMicro(), 1)
	}
	worst, when := int64(math.MinInt64), time.Time{}
	for i, a := range at {
		t := a.UnixMicro()
		if o := g.AdmittedWithin("viral", t-win.Microseconds(), t) - limits[i]; o > worst {
			worst, when = o, a
		}
	}
	return worst, when
}

// window is the admissions in the window of length win that ends at end,
// per node and the limit the request carried (w.mu held): what to look at
// when a ceiling did not hold.
func (w *mdcWorld) window(end time.Time, win time.Duration) map[string]int {
	n := map[string]int{}
	for i, a := range w.admitted {
		if a.After(end.Add(-win)) && !a.After(end) {
			n[fmt.Sprintf("%s, judged at %d", w.who[i], w.limits[i])]++
		}
	}
	return n
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
	// Not parallel with the package's other tests: its traffic would stretch
	// the real time the simulation's stalls and notices take.
	p := limiter.Policy{Name: "mdc", Regions: true, Windows: []limiter.Window{{Duration: time.Minute}},
		GlobalWindows: []limiter.Window{{Duration: 2 * time.Second}}, Timeout: time.Second}
	w := newMDCWorld(t, mdcOpts{dcs: 3, nodes: 2, policy: p, length: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const limit = 200
	w.hammer(ctx, "viral", limit, time.Millisecond)
	// The nodes' renewals (and recalls) go on in the background.
	w.mu.Lock()
	defer w.mu.Unlock()
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

// TestGlobalCeilingOnAClusterLedger: the ledger on a Redis Cluster (its
// keys on one slot) holds the ceiling as one Redis does.
func TestGlobalCeilingOnAClusterLedger(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	o := mdcOptions(limiter.FailClosed)
	o.delay, o.cluster = nil, true
	w := newMDCWorld(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	w.hammer(ctx, "viral", mdcLimit, time.Millisecond)
	w.mu.Lock()
	defer w.mu.Unlock()
	over, when := overAdmitted(w.admitted, mdcWin, mdcLimit)
	if over > 0 {
		t.Fatalf("%d over the ceiling in the window ending %v", over, when)
	}
	// At most about 2 x limit in 3 s of a 2 s window; it works: more than one
	// window's worth.
	if n := len(w.admitted); n <= mdcLimit {
		t.Fatalf("admitted %d in 3 s, want more than %d (events %v)", n, mdcLimit, w.events)
	}
}

// mdcFault is one fault scenario: what happens at which time, and what
// must hold after.
type mdcFault struct {
	name  string
	fail  limiter.FailMode
	opts  []func(*mdcOpts)
	run   time.Duration
	fault func(w *mdcWorld, start time.Time)
	check func(t *testing.T, w *mdcWorld, start time.Time)
}

// mdcPolicy: the ceiling of the fault tests, 300 per 2 s.
const mdcLimit, mdcWin = 300, 2 * time.Second

func mdcOptions(fail limiter.FailMode, opts ...func(*mdcOpts)) mdcOpts {
	p := limiter.Policy{Name: "mdc", Regions: true, Windows: []limiter.Window{{Duration: time.Minute}},
		GlobalWindows: []limiter.Window{{Duration: mdcWin}}, Timeout: time.Second, Fail: fail}
	o := mdcOpts{dcs: 3, nodes: 2, policy: p, length: 100 * time.Millisecond, beat: 400 * time.Millisecond,
		skew: 100 * time.Millisecond,
		// The ledger's timeout: a new connection's HELLO, the call and the
		// replicas' WAIT, at 250 ms a round trip.
		lto: time.Second,
		// 10, 50 and 125 ms each way: round trips of 20 to 250 ms.
		delay: func(dc int) time.Duration { return []time.Duration{10, 50, 125}[dc] * time.Millisecond }}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// at runs f at start+d, or not when ctx ends first.
func at(ctx context.Context, start time.Time, d time.Duration, f func()) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(start.Add(d))):
		f()
	}
}

func TestGlobalCeilingFaults(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	cut := func(from, to time.Duration) func(w *mdcWorld, start time.Time) {
		return func(w *mdcWorld, start time.Time) {
			at(context.Background(), start, from, w.dcs[2].proxy.Cut)
			at(context.Background(), start, to, w.dcs[2].proxy.Heal)
		}
	}
	recovers := func(from time.Duration) func(t *testing.T, w *mdcWorld, start time.Time) {
		return func(t *testing.T, w *mdcWorld, start time.Time) {
			if n := w.since("dc2", start.Add(from)); n == 0 {
				t.Errorf("dc2 admitted nothing after %v: it did not recover (unavailable %v)", from, w.unavailable)
			}
		}
	}
	faults := []mdcFault{
		{name: "latency", run: 5 * time.Second, check: func(t *testing.T, w *mdcWorld, start time.Time) {
			// Windows wholly inside the run, after the first: most of the
			// ceiling is used.
			if n := len(w.admitted); n < 2*mdcLimit {
				t.Errorf("admitted %d in 5 s, want at least %d", n, 2*mdcLimit)
			}
		}},
		{name: "cut-off/closed", fail: limiter.FailClosed, run: 8 * time.Second, fault: cut(1500*time.Millisecond, 4500*time.Millisecond),
			check: func(t *testing.T, w *mdcWorld, start time.Time) {
				if w.unavailable["dc2"] == 0 {
					t.Errorf("dc2 cut off for 3 s with fail closed: no 503")
				}
				recovers(6500*time.Millisecond)(t, w, start)
			}},
		// 18 s: recovery is due by about 12.3 s; the run goes on past the
		// check's 14.8 s by 3.2 s, not 1.2, so that a loaded machine's late
		// renewal still lands inside it (it once admitted nothing by 16 s
		// with four busy processes on two CPUs).
		{name: "cut-off/local", fail: limiter.FailLocal, run: 18 * time.Second, fault: cut(1*time.Second, 10*time.Second),
			check: func(t *testing.T, w *mdcWorld, start time.Time) {
				// The static share: after the wait, dc2 admits on its own.
				if w.events[limiter.EventStatic] == 0 {
					t.Errorf("no node of dc2 went to its static share (events %v)", w.events)
				}
				from := start.Add(8 * time.Second)
				n := 0
				for _, a := range w.perDC["dc2"] {
					if a.After(from) && a.Before(start.Add(10*time.Second)) {
						n++
					}
				}
				if n == 0 {
					t.Errorf("dc2 admitted nothing on its static share between 8 and 10 s")
				}
				// Back, its static share stays reserved a window and the
				// tail (2.3 s) after the ledger heard it again.
				recovers(14800*time.Millisecond)(t, w, start)
			}},
		{name: "cut-off/open", fail: limiter.FailOpen, run: 8 * time.Second, fault: cut(1500*time.Millisecond, 3500*time.Millisecond),
			check: func(t *testing.T, w *mdcWorld, start time.Time) {
				if w.failOpen == 0 || w.events[limiter.EventFailOpen] == 0 {
					t.Errorf("fail open: %d passes, %d counted", w.failOpen, w.events[limiter.EventFailOpen])
				}
				recovers(6*time.Second)(t, w, start)
			}},
		{name: "ledger-restarted-empty", run: 10 * time.Second,
			fault: func(w *mdcWorld, start time.Time) {
				at(context.Background(), start, 2*time.Second, w.ledger.Restart)
			},
			check: func(t *testing.T, w *mdcWorld, start time.Time) {
				if n := len(w.admitted); n == 0 {
					t.Fatal("nothing admitted")
				}
				for _, dc := range []string{"dc0", "dc1", "dc2"} {
					if w.since(dc, start.Add(8*time.Second)) == 0 {
						t.Errorf("%s admitted nothing 6 s after the ledger restarted", dc)
					}
				}
			}},
		{name: "node-killed-holding-a-grant", run: 6 * time.Second,
			fault: func(w *mdcWorld, start time.Time) {
				at(context.Background(), start, 1500*time.Millisecond, func() {
					// The next grant node 0 of dc0 gets is never deposited:
					// its process died between the ledger's reply and the
					// share. A new node takes its place.
					old := w.dcs[0].nodes[0]
					limiter.SetGlobalHook(old, func(stage string) {
						if stage == "granted" {
							runtime.Goexit()
						}
					})
					time.Sleep(500 * time.Millisecond)
					n := w.node(w.dcs[0], mdcOptions(0))
					w.mu.Lock()
					w.dcs[0].nodes[0] = n
					w.mu.Unlock()
				})
			},
			check: recoversDC("dc0", 4*time.Second)},
		{name: "reload-lowers-then-raises-the-limit", run: 8 * time.Second,
			fault: func(w *mdcWorld, start time.Time) {
				at(context.Background(), start, 2500*time.Millisecond, func() { w.limit.Store(mdcLimit / 3) })
				at(context.Background(), start, 5*time.Second, func() { w.limit.Store(mdcLimit) })
			},
			check: recoversDC("dc0", 6*time.Second)},
		{name: "clocks-a-second-apart", run: 5 * time.Second,
			opts: []func(*mdcOpts){func(o *mdcOpts) {
				o.offset = func(dc int) time.Duration { return []time.Duration{-time.Second, 0, time.Second}[dc] }
			}},
			check: func(t *testing.T, w *mdcWorld, start time.Time) {
				if n := len(w.admitted); n < 2*mdcLimit {
					t.Errorf("admitted %d in 5 s, want at least %d", n, 2*mdcLimit)
				}
			}},
		{name: "ledger-failover-with-writes-lost", run: 10 * time.Second,
			opts: []func(*mdcOpts){func(o *mdcOpts) { o.vip, o.replica = true, true }},
			fault: func(w *mdcWorld, start time.Time) {
				// Replication stops (the grants since are not on the
				// replica), then the replica is promoted and the ledger's
				// address moves to it.
				at(context.Background(), start, 2*time.Second, w.replProxy.Cut)
				at(context.Background(), start, 4*time.Second, func() {
					w.replica.CLI(w.t, "REPLICAOF", "NO", "ONE")
					if err := w.vip.SetTarget(w.replica.Addr()); err != nil {
						w.t.Error(err)
					}
					w.vip.Reset()
				})
			},
			check: func(t *testing.T, w *mdcWorld, start time.Time) {
				for _, dc := range []string{"dc0", "dc1", "dc2"} {
					if w.since(dc, start.Add(7*time.Second)) == 0 {
						t.Errorf("%s admitted nothing 3 s after the failover", dc)
					}
				}
			}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			w := newMDCWorld(t, mdcOptions(f.fail, f.opts...))
			ctx, cancel := context.WithTimeout(context.Background(), f.run)
			defer cancel()
			start := time.Now()
			if f.fault != nil {
				go f.fault(w, start)
			}
			w.hammer(ctx, "viral", mdcLimit, 2*time.Millisecond)
			w.mu.Lock()
			defer w.mu.Unlock()
			over, when := oracleOver(w.admitted, w.limits, mdcWin)
			per := map[string][]int{}
			for dc, ts := range w.perDC {
				per[dc] = make([]int, int(f.run/time.Second)+1)
				for _, a := range ts {
					if i := int(a.Sub(start) / time.Second); i >= 0 && i < len(per[dc]) {
						per[dc][i]++
					}
				}
			}
			t.Logf("admitted %d (%d per window at most), per second %v, unavailable %v, fail open %d; events %v; static at %v",
				len(w.admitted), over+mdcLimit, per, w.unavailable, w.failOpen, w.events, w.staticAt.Sub(start))
			if over > 0 {
				t.Logf("the window's admissions: %v", w.window(when, mdcWin))
				t.Fatalf("%d over the ceiling in the window ending %v (%v after the start)", over, when, when.Sub(start))
			}
			if f.check != nil {
				f.check(t, w, start)
			}
		})
	}
}

func recoversDC(dc string, from time.Duration) func(t *testing.T, w *mdcWorld, start time.Time) {
	return func(t *testing.T, w *mdcWorld, start time.Time) {
		if w.since(dc, start.Add(from)) == 0 {
			t.Errorf("%s admitted nothing after %v", dc, from)
		}
	}
}

// TestGlobalCeilingOnInProcessStores: nodes with no Redis of their own
// (each its own data centre, its shares in process) hold the ceiling as
// Redis-backed ones do.
func TestGlobalCeilingOnInProcessStores(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	ledger := redistest.Start(t)
	p := limiter.Policy{Name: "mdc", Regions: true, Windows: []limiter.Window{{Duration: time.Minute}},
		GlobalWindows: []limiter.Window{{Duration: mdcWin}}, Timeout: time.Second, Fail: limiter.FailClosed}
	var nodes []*limiter.Limiter
	for i := range 3 {
		lc := redis.NewClient(&redis.Options{Addr: ledger.Addr(), MaxRetries: -1, Protocol: 2, DisableIdentity: true})
		t.Cleanup(func() { lc.Close() })
		ms := limiter.NewMemoryStore()
		t.Cleanup(func() { ms.Close() })
		l, err := limiter.New(p, limiter.Backend{Store: ms, Source: limiter.SourceMemory,
			Global: &limiter.Global{Ledger: limiter.NewLedger(lc), Datacenter: fmt.Sprintf("node%d", i), Length: 100 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		nodes = append(nodes, l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var mu sync.Mutex
	var admitted []time.Time
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := &limiter.Input{Identity: "viral", Region: fmt.Sprint(i), Limits: []int64{1 << 40}, GlobalLimits: []int64{mdcLimit}}
			for ctx.Err() == nil {
				d, err := n.Decide(ctx, in)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Pass {
					mu.Lock()
					admitted = append(admitted, d.At)
					mu.Unlock()
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	over, when := overAdmitted(admitted, mdcWin, mdcLimit)
	if over > 0 {
		t.Fatalf("%d over the ceiling in the window ending %v", over, when)
	}
	if len(admitted) < mdcLimit {
		t.Fatalf("admitted %d in 3 s, want at least %d", len(admitted), mdcLimit)
	}
}

// TestSpentShareFollowsTheFailModeWhileTheLedgerIsDown: once the share is
// spent and a renewal found the ledger down, a request the share alone
// refuses gets the fail mode (fail closed: unavailable), not a 429, and
// the ledger is not asked on the request path; when the ledger answers
// again the share is renewed and requests are admitted.
func TestSpentShareFollowsTheFailModeWhileTheLedgerIsDown(t *testing.T) {
	// Not parallel with the other tests (see TestGlobalCeilingAcrossDatacenters).
	o := mdcOptions(limiter.FailClosed)
	o.dcs, o.nodes = 1, 1
	o.delay = func(int) time.Duration { return 0 }
	w := newMDCWorld(t, o)
	n := w.dcs[0].nodes[0]
	ctx := context.Background()
	in := &limiter.Input{Identity: "k", Region: "dc0", Limits: []int64{1 << 40}, GlobalLimits: []int64{mdcLimit}}
	if d, err := n.Decide(ctx, in); err != nil || !d.Pass {
		t.Fatalf("first request: %+v, %v", d, err)
	}
	w.dcs[0].proxy.Cut()
	deadline := time.Now().Add(10 * time.Second)
	var last limiter.Decision
	for {
		d, err := n.Decide(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		last = d
		if d.Outcome == limiter.OutcomeUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s with the ledger cut off and no fail-mode answer; last %+v", last)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if last.Pass || last.Source != limiter.SourceFailClosed {
		t.Fatalf("fail closed, the ledger down: %+v", last)
	}
	w.dcs[0].proxy.Heal()
	deadline = time.Now().Add(10 * time.Second)
	for {
		d, err := n.Decide(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if d.Pass {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the ledger came back, still %+v", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
