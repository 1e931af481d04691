package limiter_test

// The simulation with data centres (issue 28): seeded random histories of
// 2 to 8 data centres, each with its own store (a redis-server and one or
// two nodes on the production stack, or one node on the in-process store)
// and a proxy to one ledger (a real redis-server) with a delay of its own,
// the traffic of each data centre drawn in phases, and data-centre faults
// drawn on top: the ledger stalled, a data centre cut off, the ledger
// restarted empty, a failover that loses writes, a data centre's own Redis
// down, a node killed holding the renewal claim, a reload that changes the
// global limit, an operator's reset of the identity (the ledger, then each
// data centre's store) amid renewals; clocks apart within skew, and every
// fail mode.
//
// The ledger works on real clocks (the data centres' and the ledger's
// TIME), so a history runs in real time: seconds, not steps. Every
// decision is recorded, and the oracle's ledger of the global ceiling
// (oLedger) holds it: over-admission 0 in every trailing window is a hard
// failure. The rest is measured and printed per history (simdc_gen_test.go
// judges it): the statuses per fault and fail mode, the recovery after each
// fault, the room used in over-demand phases with no fault, and what the
// data centres that ask less than an equal share get.

import (
	"context"
	"errors"
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

// dcCase is one history with data centres. Times are ms from its start.
type dcCase struct {
	Name   string
	Fail   string // closed, local, open
	Win    int64  // the global window (ms)
	Limit  int64
	Run    int64
	Skew   int64    // ms
	Stacks []string // per data centre: redis (Nodes[i] nodes) or memory (one node)
	Nodes  []int
	Delay  []int64 // one-way delay to the ledger (ms)
	Offset []int64 // the nodes' clock against the store's (ms, clock app)
	// LedgerOff: a failover's promoted replica's clock against the old
	// primary's (ms, within skew; simdc_grants_test.go's variant of the
	// ledger's script)
	LedgerOff int64
	Phases    []dcPhase
	Faults    []dcFault
}

// dcPhase is one data centre's demand from From to To: Rate requests a
// second of identity ID.
type dcPhase struct {
	DC       int
	From, To int64
	Rate     int
	ID       string
}

// dcFault is a fault from At for For ms (Limit: a reload's new limit).
type dcFault struct {
	Kind    string // stall, cut, restart, failover, dcdown, kill, reload, reset
	DC      int
	At, For int64
	Limit   int64
}

// The fault kinds, and the events a history can reach (required events).
var dcFaultKinds = []string{"stall", "cut", "restart", "failover", "dcdown", "kill", "reload", "reset"}

// dcRec is one decision.
type dcRec struct {
	dc   int
	node int
	id   string
	at   time.Time // the store's time (the node's clock less its offset)
	done time.Time // when the decision came back (the wall clock)
	took time.Duration
	pass bool
	open bool // passed by fail open (not under the ceiling: counted apart)
	// static: decided on the data centre's static share (fail local), not
	// on a grant (limiter.DecidedStatic)
	static bool
	out    limiter.Outcome
	src    limiter.Source
	retry  time.Duration
	limit  int64
	err    bool
}

// dcReset is an operator's reset of identity id, from its start to when
// the last data centre's store was reset (the wall clock).
type dcReset struct {
	id       string
	from, to time.Time
}

// dcGrant is a grant a node of a data centre was given (EventGrant), on
// the wall clock: when it was told, and the latest its deadline can be.
type dcGrant struct {
	at, until time.Time
	units     int64
}

// dcMode is a node of a data centre going to its static share, or back.
type dcMode struct {
	at     time.Time
	static bool
}

// dcEnv is what histories share: the ledger and the data centres'
// redis-servers, started once (each history has its own limiter name, so
// its keys are its own).
type dcEnv struct {
	t      *testing.T
	ledger *redistest.Server
	srvs   []*redistest.Server
	n      int // histories run (their names)
}

func (e *dcEnv) srv(i int) *redistest.Server {
	for len(e.srvs) <= i {
		e.srvs = append(e.srvs, redistest.Start(e.t))
	}
	return e.srvs[i]
}

// dcWorld is one history being run.
type dcWorld struct {
	t       *testing.T
	c       *dcCase
	name    string
	ledger  *redistest.Server // the primary now
	vip     *netproxy.Proxy   // failover histories: the ledger's one address
	replica *redistest.Server
	repl    *netproxy.Proxy
	sites   []*dcSite
	limit   atomic.Int64
	start   time.Time

	mu     sync.Mutex
	recs   []dcRec
	seen   map[string]int
	errsAt [][]time.Time // per data centre: ledger errors (wall clock)
	grants [][]dcGrant   // per data centre: the grants its nodes were given
	modes  [][]dcMode    // per data centre: its nodes going to their static share and back
	static []int
	glog   *dcGrantLog // what the ledger calls said of each grant's use
	resets []dcReset   // the operator's resets, as they ran
	drops  []time.Time // when a node dropped its data centre's share, as a reset asked
	wg     sync.WaitGroup
	closed []*limiter.Limiter
}

type dcSite struct {
	i     int
	name  string
	srv   *redistest.Server // nil: the in-process store
	proxy *netproxy.Proxy
	lg    *limiter.Ledger
	nodes []*dcNode
	off   time.Duration
}

type dcNode struct {
	l    atomic.Pointer[limiter.Limiter]
	kill atomic.Bool // the next grant's renewal dies before its deposit
}

func (w *dcWorld) event(kind string) {
	w.mu.Lock()
	w.seen[kind]++
	w.mu.Unlock()
}

func (w *dcWorld) ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

func (w *dcWorld) proxy(target string) *netproxy.Proxy {
	px, err := netproxy.New(target)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { px.Close() })
	return px
}

// newDCWorld sets a history up: a proxy per data centre to the ledger (to
// its one address, vip, when the history fails it over), the nodes.
func (e *dcEnv) newDCWorld(c *dcCase) *dcWorld {
	e.n++
	w := &dcWorld{t: e.t, c: c, name: fmt.Sprintf("dcsim%d", e.n), ledger: e.ledger, seen: map[string]int{},
		errsAt: make([][]time.Time, len(c.Stacks)), grants: make([][]dcGrant, len(c.Stacks)), modes: make([][]dcMode, len(c.Stacks)),
		static: make([]int, len(c.Stacks))}
	w.glog = newDCGrantLog(func() time.Time { return w.start })
	w.limit.Store(c.Limit)
	addr := e.ledger.Addr()
	if hasFault(c, "failover") {
		// A primary and its replica of the history's own; a failover
		// moves the ledger's address (vip) to the replica.
		w.ledger = redistest.Start(e.t, "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")
		w.repl = w.proxy(w.ledger.Addr())
		host, port, _ := net.SplitHostPort(w.repl.Addr())
		w.replica = redistest.Start(e.t, "--replicaof", host, port)
		waitReplicas(e.t, w.ledger, 1)
		w.vip = w.proxy(w.ledger.Addr())
		addr = w.vip.Addr()
	}
	for i, stack := range c.Stacks {
		s := &dcSite{i: i, name: fmt.Sprintf("dc%d", i), off: w.ms(c.Offset[i])}
		if stack == "redis" {
			s.srv = e.srv(i)
		}
		s.proxy = w.proxy(addr)
		d := w.ms(c.Delay[i])
		s.proxy.SetDelay(d, d)
		lc := redis.NewClient(&redis.Options{Addr: s.proxy.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true, Protocol: 2, DisableIdentity: true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		e.t.Cleanup(func() { lc.Close() })
		lc.AddHook(dcGrantHook{g: w.glog, dc: s.name})
		s.lg = limiter.NewLedger(lc)
		for range c.Nodes[i] {
			n := &dcNode{}
			n.l.Store(w.node(s, n))
			s.nodes = append(s.nodes, n)
		}
		w.sites = append(w.sites, s)
	}
	return w
}

func hasFault(c *dcCase, kind string) bool {
	return slices.ContainsFunc(c.Faults, func(f dcFault) bool { return f.Kind == kind })
}

// dcTimeout is the ledger's and the data centres' Redis timeout.
const dcTimeout = 500 * time.Millisecond

// node is one Caddy node of site s.
func (w *dcWorld) node(s *dcSite, n *dcNode) *limiter.Limiter {
	fail, _ := limiter.ParseFailMode(w.c.Fail)
	p := limiter.Policy{Name: w.name, Regions: true, Windows: []limiter.Window{{Duration: time.Minute}},
		GlobalWindows: []limiter.Window{{Duration: w.ms(w.c.Win)}}, Timeout: dcTimeout, Fail: fail}
	var b limiter.Backend
	if s.srv != nil {
		c := redis.NewClient(&redis.Options{Addr: s.srv.Addr(), MaxRetries: -1})
		w.t.Cleanup(func() { c.Close() })
		c.AddHook(dcCheckHook{g: w.glog, dc: s.name})
		b = productionStack(w.t, c)
	} else {
		ms := limiter.NewMemoryStore()
		w.t.Cleanup(func() { ms.Close() })
		b = limiter.Backend{Store: ms, Source: limiter.SourceMemory}
	}
	b.Global = &limiter.Global{Ledger: s.lg, Datacenter: s.name, Length: 100 * time.Millisecond, Timeout: dcTimeout,
		Beat: 400 * time.Millisecond, Skew: w.ms(w.c.Skew), OnEvent: func(ev limiter.GlobalEvent) { w.globalEvent(s, ev) }}
	if s.off != 0 {
		off := s.off
		p.AppClock, p.Now = true, func() time.Time { return time.Now().Add(off) }
	}
	l, err := limiter.New(p, b)
	if err != nil {
		w.t.Fatal(err)
	}
	// Set before any traffic (the hook is read without a lock): armed by
	// the kill fault, the next renewal dies between the ledger's grant and
	// its deposit, holding the claim.
	limiter.SetGlobalHook(l, func(stage string) {
		if stage == "granted" && n.kill.CompareAndSwap(true, false) {
			w.event("kill")
			runtime.Goexit()
		}
	})
	return l
}

func (w *dcWorld) globalEvent(s *dcSite, ev limiter.GlobalEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch ev.Kind {
	case limiter.EventLedgerError:
		w.errsAt[s.i] = append(w.errsAt[s.i], time.Now())
	case limiter.EventGrant:
		if ev.Units > 0 && ev.Err == nil {
			// Usable until Length after a time the data centre read
			// before it asked: at the latest the ledger call's start.
			now := time.Now()
			w.grants[s.i] = append(w.grants[s.i], dcGrant{at: now, until: now.Add(-ev.Took + ev.Length), units: ev.Units})
		}
	case limiter.EventDropped:
		if ev.Err == nil {
			w.drops = append(w.drops, time.Now())
			w.seen["dropped"]++
		}
	case limiter.EventStatic:
		w.static[s.i]++
		w.seen["static_share"]++
		w.modes[s.i] = append(w.modes[s.i], dcMode{at: time.Now(), static: true})
	case limiter.EventNormal:
		w.modes[s.i] = append(w.modes[s.i], dcMode{at: time.Now()})
	}
}

// run runs the history: the traffic of every phase, the faults on their
// schedule; it returns when the run's time is over and every request in
// flight is done.
func (w *dcWorld) run() {
	ctx, cancel := context.WithCancel(context.Background())
	w.start = time.Now()
	var fw sync.WaitGroup
	for _, s := range w.sites {
		if s.srv != nil {
			fw.Add(1)
			go func() {
				defer fw.Done()
				w.watchClaims(ctx, s)
			}()
		}
	}
	for _, f := range w.c.Faults {
		fw.Add(1)
		go func() {
			defer fw.Done()
			w.fault(ctx, f)
		}()
	}
	for _, ph := range w.c.Phases {
		s := w.sites[ph.DC]
		for ni := range s.nodes {
			w.wg.Add(1)
			go w.send(ctx, s, ni, ph, 0)
		}
	}
	time.Sleep(time.Until(w.start.Add(w.ms(w.c.Run))))
	cancel()
	w.wg.Wait()
	fw.Wait()
}

// send is one node's share of a phase's traffic, paced on the wall clock
// from the phase's start (k: the requests sent before a node died).
func (w *dcWorld) send(ctx context.Context, s *dcSite, ni int, ph dcPhase, k int) {
	done := false
	defer func() {
		w.wg.Done()
		if !done && ctx.Err() == nil {
			// The node died in this request (a kill): the traffic goes
			// on through the node that takes its place.
			w.wg.Add(1)
			go w.send(ctx, s, ni, ph, k+1)
		}
	}()
	gap := time.Second * time.Duration(len(s.nodes)) / time.Duration(max(ph.Rate, 1))
	first := w.start.Add(w.ms(ph.From) + gap*time.Duration(ni)/time.Duration(len(s.nodes)))
	for ; ; k++ {
		next := first.Add(gap * time.Duration(k))
		if next.After(w.start.Add(w.ms(ph.To))) {
			done = true
			return
		}
		select {
		case <-ctx.Done():
			done = true
			return
		case <-time.After(time.Until(next)):
		}
		w.decide(ctx, s, ni, ph.ID)
	}
}

func (w *dcWorld) decide(ctx context.Context, s *dcSite, ni int, id string) {
	limit := w.limit.Load()
	in := &limiter.Input{Identity: id, Region: s.name, Limits: []int64{1 << 40}, GlobalLimits: []int64{limit}}
	// Not the run's context: a request the run's end would cut short is
	// not one a client cancelled. Bounded, for a node killed in a renewal
	// another request waits for.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	sent := time.Now()
	d, err := s.nodes[ni].l.Load().Decide(dctx, in)
	if err != nil {
		if dctx.Err() == nil {
			w.t.Error(err)
		}
		return
	}
	// A decision that straddles a reload is held to the higher of the two
	// limits (a reload is not atomic across nodes); every other to its own.
	at := d.At
	if at.IsZero() {
		// Not decided by a store (its fail mode): now, on the node's clock.
		at = time.Now().Add(s.off)
	}
	r := dcRec{dc: s.i, node: ni, id: id, at: at.Add(-s.off), pass: d.Pass, open: d.Pass && d.Source == limiter.SourceFailOpen, static: limiter.DecidedStatic(d),
		out: d.Outcome, src: d.Source, retry: d.RetryAfter, limit: max(limit, w.limit.Load()), err: d.Err != nil, done: time.Now()}
	r.took = r.done.Sub(sent)
	w.mu.Lock()
	w.recs = append(w.recs, r)
	w.mu.Unlock()
}

// fault runs one fault on its schedule.
func (w *dcWorld) fault(ctx context.Context, f dcFault) {
	wait := func(ms int64) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Until(w.start.Add(w.ms(ms)))):
			return true
		}
	}
	if !wait(f.At) {
		return
	}
	s := w.sites[f.DC]
	switch f.Kind {
	case "stall":
		lg := w.primary()
		lg.Pause()
		wait(f.At + f.For)
		lg.Resume()
	case "cut":
		s.proxy.Cut()
		wait(f.At + f.For)
		s.proxy.Heal()
	case "restart":
		w.restart(w.primary())
	case "failover":
		w.failover(f, wait)
	case "dcdown":
		s.srv.Kill()
		if os.Getenv("SIM_DEBUG") != "" {
			w.t.Logf("%v: dc%d's Redis %s killed", time.Since(w.start).Round(time.Millisecond), s.i, s.srv.Addr())
		}
		wait(f.At + f.For)
		w.restart(s.srv)
	case "kill":
		w.kill(s, f, wait)
	case "reload":
		w.limit.Store(f.Limit)
		if f.For > 0 && wait(f.At+f.For) {
			w.limit.Store(w.c.Limit)
		}
	case "reset":
		w.reset(s, "a")
	}
	w.event("fault:" + f.Kind)
}

// reset is an operator's reset of identity id through node 0 of data
// centre s, as the admin API's DELETE does it: the ledger first (which
// tells every other data centre that held a share of id to drop it), then
// s's store. Renewals run on meanwhile.
//
// A reset the ledger's replicas did not acknowledge (ErrResetNotDurable,
// a failover's cut replication) stands on the primary. Amid a fault of
// the ledger (a stall) its reset may fail, as the admin API then says
// (ledger_error), and still be carried out once the ledger wakes (the
// command was sent): the oracle holds no request answered between the
// reset's start and the fault's end (and half a second) to a window, and
// none decided before then to the window after it. A failure outside a
// fault of the ledger fails the history.
func (w *dcWorld) reset(s *dcSite, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	from := time.Now()
	l := s.nodes[0].l.Load()
	told, _, err := l.ResetGlobal(ctx, id)
	if errors.Is(err, limiter.ErrResetNotDurable) {
		// Carried out on the primary, its replicas slow or cut off (a
		// failover's): said, and a reset all the same.
		w.event("reset_not_durable")
		err = nil
	}
	var late time.Time
	if err != nil {
		if end, ok := w.ledgerFaultAt(from); ok {
			late = end.Add(500 * time.Millisecond)
			w.event("reset_ledger_failed")
			if os.Getenv("SIM_DEBUG") != "" {
				w.t.Logf("%v: the reset through dc%d failed amid a fault of the ledger: %v", time.Since(w.start).Round(time.Millisecond), s.i, err)
			}
		} else {
			w.t.Errorf("reset of the ledger through dc%d: %v", s.i, err)
		}
	}
	if _, err := l.Reset(ctx, id, s.name); err != nil {
		w.t.Errorf("reset of dc%d's store: %v", s.i, err)
	}
	to := time.Now()
	if late.After(to) {
		to = late
	}
	w.mu.Lock()
	w.resets = append(w.resets, dcReset{id: id, from: from, to: to})
	w.seen["reset_told"] += int(told)
	w.mu.Unlock()
}

// ledgerFaultAt reports whether t falls in a fault of the ledger (a stall,
// a failover's cut replication: its span and a second past it, for a
// call sent just before the end) and when that fault ends.
func (w *dcWorld) ledgerFaultAt(t time.Time) (time.Time, bool) {
	for _, f := range w.c.Faults {
		if f.Kind != "stall" && f.Kind != "failover" {
			continue
		}
		start, end := w.start.Add(w.ms(f.At)), w.start.Add(w.ms(f.At+f.For))
		if !t.Before(start) && t.Before(end.Add(time.Second)) {
			return end, true
		}
	}
	return time.Time{}, false
}

// epoch is when the reset of id that r was decided after ended (zero: no
// reset before it), and whether r straddles a reset (answered after one
// began, decided before it ended): the oracle holds it to no window, as
// the ledger's count before and after a reset are two. A reset ends when
// the last data centre it told dropped its share (within 5 s of its
// start; one that never does keeps spending what the ledger forgot, and
// the oracle sees it).
func (w *dcWorld) epoch(id string, at, done time.Time) (time.Time, bool) {
	var e time.Time
	for _, rs := range w.resets {
		if rs.id != id {
			continue
		}
		to := rs.to
		for _, d := range w.drops {
			if d.After(to) && d.Before(rs.from.Add(5*time.Second)) {
				to = d
			}
		}
		if done.After(rs.from) && !at.After(to) {
			return e, true
		}
		if at.After(to) && to.After(e) {
			e = to
		}
	}
	return e, false
}

// restart starts srv again, empty (off the test's goroutine: an error, not
// a fatal one).
func (w *dcWorld) restart(srv *redistest.Server) {
	if err := srv.Proc().Restart(); err != nil {
		w.t.Error(err)
	}
}

// failover: replication stops (the grants made since are not on the
// replica), then the replica is promoted and the ledger's address moves
// to it.
func (w *dcWorld) failover(f dcFault, wait func(int64) bool) {
	w.repl.Cut()
	if !wait(f.At + f.For) {
		return
	}
	if _, err := w.replica.Proc().RunCLI("REPLICAOF", "NO", "ONE"); err != nil {
		w.t.Error(err)
	}
	if w.c.LedgerOff != 0 {
		if _, err := w.replica.Proc().RunCLI("SET", "simclock", fmt.Sprint(w.c.LedgerOff*1000)); err != nil {
			w.t.Error(err)
		}
	}
	if err := w.vip.SetTarget(w.replica.Addr()); err != nil {
		w.t.Error(err)
	}
	w.vip.Reset()
	w.mu.Lock()
	w.ledger = w.replica // a later stall or restart is the new primary's
	w.mu.Unlock()
}

// primary is the ledger's primary now.
func (w *dcWorld) primary() *redistest.Server {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ledger
}

// kill: the next renewal of node 0 of s dies between the ledger's grant
// and its deposit, holding the claim; a new node takes its place For
// later (or once the run ends).
func (w *dcWorld) kill(s *dcSite, f dcFault, wait func(int64) bool) {
	n := s.nodes[0]
	n.kill.Store(true)
	wait(f.At + f.For)
	old := n.l.Load()
	n.l.Store(w.node(s, n))
	w.mu.Lock()
	w.closed = append(w.closed, old)
	w.mu.Unlock()
}

// close ends the history's nodes (a killed one in the background: its
// renewal in flight never ends).
func (w *dcWorld) close() {
	for _, s := range w.sites {
		for _, n := range s.nodes {
			n.l.Load().Close()
		}
	}
	for _, l := range w.closed {
		go l.Close()
	}
	if w.replica != nil && w.replica != w.ledger {
		w.replica.Kill()
	}
}

// overAdmission is the oracle's check of the global ceiling: every
// admission (fail open's passes aside) goes into its ledger (oLedger), and
// each is held to its limit over the window that ends with it. An
// operator's reset of the identity forgets what was admitted before it:
// an admission decided after the reset ended is held with those decided
// after it alone, and one that straddles it to no window. An
// admission took effect at some time between its decision's time (at: the
// store's, or the node's when it started) and its answer (done), so the
// window that ends with admission i holds for certain the admissions
// decided and answered within (done_i - W, at_i], and i: those only are
// counted, so that a slow decision (under load, or a first request that
// waits for the ledger) is never blamed for one that had left the window
// when it took effect. It returns the worst excess and its admission (a
// positive excess fails the history).
func (w *dcWorld) overAdmission() (int64, dcRec) {
	byID := map[string][]dcRec{}
	for _, r := range w.recs {
		if r.pass && !r.open {
			byID[r.id] = append(byID[r.id], r)
		}
	}
	worst, at := int64(math.MinInt64), dcRec{}
	W := w.ms(w.c.Win).Microseconds()
	for id, adm := range byID {
		// The ledger by answer; each admission's own start is checked
		// against the window's start.
		g := newLedger()
		slices.SortFunc(adm, func(a, b dcRec) int { return a.done.Compare(b.done) })
		for _, r := range adm {
			g.Admit(id, r.done.UnixMicro(), 1)
		}
		for _, r := range adm {
			e, straddles := w.epoch(id, r.at, r.done)
			if straddles {
				continue
			}
			from := r.done.UnixMicro() - W
			cut := from
			if !e.IsZero() {
				cut = max(cut, e.UnixMicro())
			}
			n := g.AdmittedWithin(id, from, r.at.UnixMicro())
			for _, s := range adm {
				if s.done.UnixMicro() > from && s.done.UnixMicro() <= r.at.UnixMicro() && s.at.UnixMicro() <= cut {
					n-- // answered within the window, but decided before it began (or before the reset ended)
				}
			}
			if r.done.After(r.at) {
				n++ // i itself (answered after its start: not counted above)
			}
			if o := n - r.limit; o > worst {
				worst, at = o, r
			}
		}
	}
	return worst, at
}

// uncovered is the oracle's check of the grants: a data centre admits a
// request under the ceiling only from a grant it holds, before the grant's
// deadline (or from its static share, fail local). A request is decided
// some time between its start (at) and its answer (done); a grant is
// usable from no earlier than when its node was told (at) to its latest
// deadline (until): a request may have used a grant when the two spans
// meet. Taking the requests by their answer, each the grant that ends
// first among those it meets with units left, assigns as many as any
// assignment can (a request answered first gives up no grant a later one
// could use that the grant it takes could not replace); it returns the
// first request none is left for.
func (w *dcWorld) uncovered() (dcRec, string, bool) {
	for dc := range w.sites {
		var adm []dcRec
		for _, r := range w.recs {
			if r.dc == dc && r.pass && !r.open && !r.static {
				adm = append(adm, r)
			}
		}
		slices.SortFunc(adm, func(a, b dcRec) int { return a.done.Compare(b.done) })
		gs := slices.Clone(w.grants[dc])
		slices.SortFunc(gs, func(a, b dcGrant) int { return a.at.Compare(b.at) })
		left := make([]int64, len(gs))
		for i, g := range gs {
			left[i] = g.units
		}
		for _, r := range adm {
			best := -1
			for i := 0; i < len(gs) && !gs[i].at.After(r.done); i++ {
				if left[i] > 0 && !gs[i].until.Before(r.at.Add(-dcSlack)) {
					if best < 0 || gs[i].until.Before(gs[best].until) {
						best = i
					}
				}
			}
			if best < 0 {
				return r, fmt.Sprintf("a request started %v after the start and answered at %v, when every grant it could have used was spent or past its deadline (%d grants)",
					r.at.Sub(w.start).Round(time.Millisecond), r.done.Sub(w.start).Round(time.Millisecond), len(gs)), true
			}
			left[best]--
		}
	}
	return dcRec{}, "", false
}

// dcSlack: the wall clock against the Redis clocks that keep the deadline
// (one machine's clock, read a moment apart).
const dcSlack = 2 * time.Millisecond

func (f dcFault) String() string {
	s := fmt.Sprintf("%s dc%d at %dms for %dms", f.Kind, f.DC, f.At, f.For)
	if !affects(f, -1) {
		s = fmt.Sprintf("%s at %dms for %dms", f.Kind, f.At, f.For)
	}
	if f.Kind == "reload" {
		s += fmt.Sprintf(" limit %d", f.Limit)
	}
	return s
}

// literal prints the history as a Go literal, ready for dcReplays.
func (c *dcCase) literal() string {
	s := fmt.Sprintf("%#v", *c)
	return strings.ReplaceAll(s, "limiter_test.", "")
}
