package limiter_test

// The simulation: seeded random histories over several nodes sharing one
// store, run through the in-process store and through the production stack
// on a real redis-server (deny cache → breaker → batched RedisStore), every
// decision held against the oracle (oracle_test.go) and invariants checked
// after every step. A failing history is shrunk (delta debugging over its
// steps) and printed as a Go literal for TestSimReplay.
//
// Budget: SIM_SEEDS histories of SIM_STEPS steps per stack (make test's
// defaults below); SIM_SEED runs one seed; SIM_TIME runs seeds until that
// much time has passed (make simulate).

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// simCfg is a limiter's configuration in a history.
type simCfg struct {
	Alg       string
	Windows   []string // "2s", "day", ...
	Limits    []int64
	GWindows  []string
	GLimits   []int64
	Burst     int64
	Zone      string
	BanAfter  int64
	BanWithin string
	BanFor    string
	Conc      int64
	Lease     string
	CountOnly bool
	Queue     string
	DryRun    bool
	Fail      string
	Format    int // redis: the state format sliding_log and sliding_counter keys are written in (1, 2, 3, 4; 0: 4)
}

// simStep is one step of a history.
type simStep struct {
	Op     string // req, done, tick, reset, ovset, ovdel, reload, fault
	Node   int
	Key    string
	Region string
	Cost   int64
	N      int     // done: which request in flight (mod their number)
	Status int     // done: the response status; 0: the handler panicked
	Dt     int64   // tick: µs
	Factor float64 // ovset
	Limits []int64 // ovset: the windows' limits; reload: new limits
	GLimit []int64 // ovset of every region: the global ceiling's windows' limits
	TTL    int64   // ovset: seconds
	Wins   []string
	DryRun bool   // reload
	Fault  string // stall, kill, restart, flush, heal
	Client bool   // reload: a new Redis client
	Cancel bool   // req: the client goes away while queued
	QFault string // req: a fault (kill, stall) that starts while the request waits in the queue
	Deaf   int    // ovset, ovdel: node Deaf-1 misses the notice, then reads the overrides' index
	Format int    // reload (redis): the node's store writes this state format from now on (1, 2, 3, 4), on a new client
	Alg    string // reload: the algorithm from now on ("": unchanged); its duration windows start again
	Conc   int64  // reload: max_concurrent from now on (-1: none; 0: unchanged)
}

// simCase is a whole history: the stack, the start, the config, the steps.
type simCase struct {
	Name  string
	Stack string // memory, redis
	Start time.Time
	Nodes int
	Cfg   simCfg
	Steps []simStep
	// RedisClock (Redis stack only): the nodes run clock redis on the wall
	// clock (the script reads TIME; no deny cache, whose entries the
	// nodes' clock ends), and the oracle judges each decision at the time
	// the store decided at; ticks let real time pass (a few ms).
	RedisClock bool
	// Skew (µs, in-process store only): the store decides on its own
	// clock, this far from the nodes' (clock redis, as it were: the
	// limiter sends no time).
	Skew int64
}

func parseWin(s string) limiter.Window {
	if p, ok := limiter.ParsePeriod(s); ok {
		return limiter.Window{Period: p}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return limiter.Window{Duration: d}
}

func parseWins(ss []string) []limiter.Window {
	var ws []limiter.Window
	for _, s := range ss {
		ws = append(ws, parseWin(s))
	}
	return ws
}

func dur(s string) time.Duration {
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return d
}

// rule is the oracle's reading of the config.
func (c *simCfg) rule() oRule {
	alg, _ := limiter.ParseAlgorithm(c.Alg)
	r := oRule{alg: alg, wins: parseWins(c.Windows), gwins: parseWins(c.GWindows), burst: c.Burst,
		regions: len(c.GWindows) > 0, conc: c.Conc > 0, countOnly: c.CountOnly, dryRun: c.DryRun,
		banCountsConcurrency: false}
	r.loc = time.UTC
	if c.Zone != "" {
		r.loc, _ = time.LoadLocation(c.Zone)
	}
	if c.BanAfter > 0 {
		r.ban = &limiter.Ban{After: c.BanAfter, Within: dur(c.BanWithin), For: dur(c.BanFor)}
	}
	if r.conc {
		r.leaseTimeout = limiter.DefaultLeaseTimeout.Microseconds()
		if c.Lease != "" {
			r.leaseTimeout = dur(c.Lease).Microseconds()
		}
	}
	r.queue = limiter.Queue{MaxWait: dur(c.Queue)}
	r.fail, _ = limiter.ParseFailMode(c.Fail)
	if c.Fail == "" {
		r.fail = limiter.FailOpen
	}
	return r
}

// policy is the engine's.
func (c *simCfg) policy(name, prefix string, now func() time.Time, remote bool) limiter.Policy {
	r := c.rule()
	p := limiter.Policy{Name: name, KeyPrefix: prefix, Algorithm: r.alg, Windows: r.wins, GlobalWindows: r.gwins,
		Burst: c.Burst, Regions: r.regions, Location: r.loc, Ban: r.ban, Concurrency: r.conc,
		LeaseTimeout: time.Duration(r.leaseTimeout) * time.Microsecond, Queue: r.queue, Fail: r.fail,
		DryRun: c.DryRun, AppClock: remote, Now: now}
	if c.CountOnly {
		p.CountOnly = func(status int) bool { return status == 401 }
	}
	if remote {
		p.Timeout = simTimeout
	}
	return p
}

// simTimeout bounds a Redis call in the simulation: long enough that a
// healthy Redis on a busy machine answers (a call that times out anyway
// follows the fail mode, which the oracle checks as such).
const simTimeout = 150 * time.Millisecond

// simNode is one Caddy node: its limiter and what the oracle knows of its
// own state (its fail local store, its deny cache).
type simNode struct {
	cfg   simCfg
	rule  oRule
	l     *limiter.Limiter
	local *oStore
	cache map[string]*oCached
	stack *nodeStack // the Redis stack's pieces, nil in memory
	// retired are the node's stacks before a reload's new client, each
	// closed once no limiter holds it (retire), or when the node dies.
	retired []*nodeStack
	deaf    *atomic.Pointer[string] // the identity's tag whose notices the node misses
}

// simOpen is a request in flight: decided, its response not yet done.
type simOpen struct {
	node   int
	l      *limiter.Limiter
	d      limiter.Decision
	od     oDecision
	q      oReq
	rule   oRule
	reqNo  int
	shared bool // decided by the shared store (else the node's fail local store)
	br     *limiter.Breaker
}

// simHeld is a release or a record a node's breaker holds for the store.
type simHeld struct {
	o      *simOpen
	record bool
	at     time.Time // the response's end
	until  int64     // µs: worth sending until then
}

// simRun is one history being run.
type simRun struct {
	c      *simCase
	clock  *testClock
	env    *simEnv
	prefix string
	nodes  []*simNode
	store  *oStore // the shared store, as the oracle has it
	open   []*simOpen
	reqNo  int
	down   string // the fault in force on the Redis stack: "", stall, kill
	seen   map[string]int
	keys   map[string]oReq // every identity and region asked, for the invariants
	mem    *limiter.MemoryStore
	step   int
	probes int
	held   map[*limiter.Breaker][]simHeld
	// The queue's waits of the request being decided.
	sleeps                 []time.Duration
	cancelQueue, cancelled bool
	// A fault to start in the queue's next wait, and the fault in force
	// before it and the wait it started in (-1: none).
	qfault     string
	downBefore string
	faultAt    int
	downAfter  string
	// Requests in flight whose Redis client a reload closed under them.
	closedUnder int
}

func (r *simRun) now() time.Time { return r.clock.Now() }

// storeNow is the store's clock: the nodes' but for the history's skew.
func (r *simRun) storeNow() time.Time { return r.storeTime(r.now()) }

func (r *simRun) storeTime(t time.Time) time.Time {
	return t.Add(time.Duration(r.c.Skew) * time.Microsecond)
}

func (r *simRun) event(kind string) { r.seen[kind]++ }

// input is the engine's Input of a request step at node n.
func (r *simRun) input(n *simNode, s *simStep) (*limiter.Input, oReq) {
	in := &limiter.Input{Identity: s.Key, Limits: n.cfg.Limits, GlobalLimits: n.cfg.GLimits, Cost: s.Cost, MaxConcurrent: n.cfg.Conc}
	if n.rule.regions {
		in.Region = s.Region
	}
	q := oReq{id: s.Key, region: in.Region, limits: n.cfg.Limits, glimit: n.cfg.GLimits, cost: s.Cost, maxConc: n.cfg.Conc}
	return in, q
}

// run runs every step; it returns the first discrepancy.
func (r *simRun) run() (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("step %d: panic: %v", r.step, p)
		}
	}()
	for i := range r.c.Steps {
		r.step = i
		s := &r.c.Steps[i]
		t0 := time.Now()
		if err := r.do(s); err != nil {
			return fmt.Errorf("step %d %s: %w", i, s, err)
		}
		if d := time.Since(t0); d > 300*time.Millisecond && os.Getenv("SIM_DEBUG") != "" {
			r.env.t.Logf("%s step %d %s (down %q): %s", r.c.Name, i, s, r.down, d)
		}
		if err := r.invariants(); err != nil {
			return fmt.Errorf("after step %d %s: %w", i, s, err)
		}
	}
	return nil
}

func (r *simRun) do(s *simStep) error {
	node := func() *simNode { return r.nodes[s.Node%len(r.nodes)] }
	switch s.Op {
	case "tick":
		if r.c.RedisClock {
			// Redis's clock cannot be moved: real time passes instead,
			// a few ms at the most.
			time.Sleep(min(time.Duration(s.Dt)*time.Microsecond, 5*time.Millisecond))
		} else {
			r.clock.Set(r.now().Add(time.Duration(s.Dt) * time.Microsecond))
		}
		r.event("tick")
	case "req":
		return r.request(s.Node%len(r.nodes), s)
	case "done":
		return r.done(s)
	case "reset":
		return r.reset(node(), s)
	case "ovset":
		return r.overrideSet(node(), s)
	case "ovdel":
		return r.overrideDel(node(), s)
	case "reload":
		return r.reload(s.Node%len(r.nodes), s)
	case "fault":
		return r.fault(s)
	case "die":
		return r.die(s.Node % len(r.nodes))
	default:
		return fmt.Errorf("unknown step %q", s.Op)
	}
	return nil
}

// request decides one request at a node and holds it against the oracle.
func (r *simRun) request(ni int, s *simStep) error {
	n := r.nodes[ni]
	in, q := r.input(n, s)
	r.keys[q.id+"\x00"+q.region] = q
	r.reqNo++
	no := r.reqNo
	r.sleeps, r.cancelQueue, r.cancelled = nil, s.Cancel, false
	r.qfault, r.downBefore, r.faultAt = s.QFault, r.down, -1
	if r.c.Stack != "redis" || r.down != "" {
		r.qfault = ""
	}
	start := r.now()
	wallBefore := time.Now()
	got, err := n.l.Decide(context.Background(), in)
	if err != nil {
		return fmt.Errorf("Decide: %v", err)
	}
	if r.c.RedisClock && !got.At.IsZero() {
		// Decided on Redis's clock: at the time the store gives, which
		// lies within the call (one host: Redis's TIME and ours agree
		// to its µs; 10 ms for the clocks' reads).
		if wallAfter := time.Now(); got.At.Before(wallBefore.Add(-10*time.Millisecond)) || got.At.After(wallAfter.Add(10*time.Millisecond)) {
			return fmt.Errorf("clock redis: the store decided at %s, outside the call (%s to %s)",
				got.At.Format(time.RFC3339Nano), wallBefore.Format(time.RFC3339Nano), wallAfter.Format(time.RFC3339Nano))
		}
		start = got.At
		r.event("redis_clock")
	}
	if r.faultAt >= 0 {
		// The fault started while the request waited: its checks before
		// then met the store as it was.
		r.event("fault:queued")
	}
	after := r.down
	want, shared, queued, err := r.expectQueued(n, &q, &got, no, start)
	r.down = after
	if err != nil {
		return err
	}
	r.event("req:" + string(got.Source))
	r.event("outcome:" + got.Outcome.String())
	if got.DryRun {
		r.event("dry_run_denial")
	}
	if got.BanStarted {
		r.event("ban_started")
	}
	if os.Getenv("SIM_TRACE") != "" {
		// Each request's answer, to read a failing history step by step.
		r.env.t.Logf("TRACE step %d node %d: %v source %s dry %v windows %+v", r.step, ni, got.Outcome, got.Source, got.DryRun, got.Windows)
	}
	if err := compareDecision(&got, &want); err != nil {
		return err
	}
	if got.Queued != queued {
		return fmt.Errorf("queued: got %v, the oracle says %v", got.Queued, queued)
	}
	if want.leaseTaken || want.record {
		o := &simOpen{node: ni, l: n.l, d: got, od: want, q: q, rule: n.rule, reqNo: no, shared: shared}
		if n.stack != nil {
			o.br = n.stack.breaker
		}
		r.open = append(r.open, o)
	}
	if n.stack != nil && got.Err == nil && got.Source == limiter.SourceRedis {
		return r.deliverHeld(n.stack.breaker)
	}
	return nil
}

// deliverHeld: once a call through a breaker succeeds, it sends what it
// holds in the background, each release and record while it still means
// something; the oracle applies them once sent.
func (r *simRun) deliverHeld(b *limiter.Breaker) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		if n, sending := limiter.BreakerHeld(b); n == 0 && !sending {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the breaker still holds releases or records 3 s after a call succeeded")
		}
		time.Sleep(time.Millisecond)
	}
	t := r.now().UnixMicro()
	for _, h := range r.held[b] {
		if t >= h.until {
			continue
		}
		if h.record {
			r.store.Record(&h.o.rule, &h.o.q, h.at)
			r.event("held_record_delivered")
		} else {
			r.store.Release(h.o.q.bucket(&h.o.rule), h.o.reqNo)
			r.event("held_release_delivered")
		}
	}
	delete(r.held, b)
	return nil
}

// expectQueued is the oracle's answer to a request decided from start,
// with the queue: a refusal whose retry fits in what is left of max_wait
// waits until then (the stack's sleeps moved the clock) and is decided
// again; a client that goes away stops waiting.
func (r *simRun) expectQueued(n *simNode, q *oReq, got *limiter.Decision, no int, start time.Time) (oDecision, bool, bool, error) {
	t, waited := start, time.Duration(0)
	queued := false
	for i := 0; ; i++ {
		waitLeft := int64(-1)
		mw := n.rule.queue.MaxWait
		if mw > 0 && !n.rule.dryRun {
			waitLeft = (mw - waited).Microseconds()
		}
		last := i == len(r.sleeps)
		if r.faultAt >= 0 && i <= r.faultAt {
			r.down = r.downBefore
		} else if r.faultAt >= 0 {
			r.down = r.downAfter
		}
		want, shared := r.expect(n, q, got, no, t, waitLeft, last)
		waits := want.outcome == limiter.OutcomeLimited && waitLeft >= 0 && want.retry <= waitLeft
		switch {
		case waits && !last:
			if ceilSec(r.sleeps[i]) != want.RetrySeconds() {
				return want, shared, queued, fmt.Errorf("the queue waited %s, the oracle says %s", r.sleeps[i], time.Duration(want.retry)*time.Microsecond)
			}
			queued = true
			t = t.Add(r.sleeps[i])
			waited += r.sleeps[i]
			r.event("queue_wait")
			continue
		case waits && r.cancelled:
			// The client went away while queued.
			r.event("queue_cancel")
			return want, shared, true, nil
		case waits:
			return want, shared, queued, fmt.Errorf("the oracle says the request waits %s in the queue; it did not (%s)", time.Duration(want.retry)*time.Microsecond, describe(got))
		case !last:
			return want, shared, queued, fmt.Errorf("the request waited %s in the queue; the oracle says %s", r.sleeps[i], want)
		}
		return want, shared, queued, nil
	}
}

// sleep is the queue's wait: the clock moves on by d, unless the client
// goes away.
func (r *simRun) sleep(_ context.Context, d time.Duration) bool {
	if r.cancelQueue {
		r.cancelQueue, r.cancelled = false, true
		return false
	}
	r.sleeps = append(r.sleeps, d)
	r.clock.Set(r.now().Add(d))
	if r.qfault != "" {
		// The store fails while the request waits: its re-check meets it.
		r.faultAt = len(r.sleeps) - 1
		if err := r.env.fault(r, r.qfault); err != nil {
			r.env.t.Logf("fault in the queue: %v", err)
		}
		r.downAfter, r.qfault = r.down, ""
	}
	return true
}

// expect is the oracle's answer to a request at now, which the stack
// answered with got (when last: the final check of a queued request): the
// store's, unless the store could not decide (got carries the error), then
// the fail mode's rule; a deny cache's answer on the Redis stack.
func (r *simRun) expect(n *simNode, q *oReq, got *limiter.Decision, no int, now time.Time, waitLeft int64, last bool) (oDecision, bool) {
	checkOnly := n.rule.countOnly
	if n.rule.tooLarge(q) {
		// Decided before any store: no source.
		return n.rule.Finish(oDecision{outcome: limiter.OutcomeTooLarge, wins: r.staticWins(n, q)}), false
	}
	if last && got.Source != limiter.SourceDenyCache && got.Err == nil && n.servable(q, now, r.storeFails(n)) != nil {
		// A node may forget a cached denial whenever the store answers (a
		// notice, a subscription that starts again): the store then
		// decides. It never remembers one it was not given.
		delete(n.cache, q.bucket(&n.rule))
	}
	if d, ok := r.cached(n, q, now); ok {
		return n.rule.Finish(d), false
	}
	if (last && got.Err != nil || !last && r.down != "") && r.c.Stack == "redis" {
		// The store failed the check (a queued request's earlier checks
		// too, while Redis was down: under fail local the local store's
		// refusal is what it waited on).
		r.event("fail:" + n.rule.fail.String())
		return n.rule.Finish(FailRule(&n.rule, n.local, q, now, checkOnly, no, waitLeft)), false
	}
	if n.stack != nil {
		r.releaseFirst(n.stack.breaker, q.bucket(&n.rule), now)
	}
	d := r.store.Decide(&n.rule, q, r.storeTime(now), checkOnly, no, waitLeft)
	d.source = r.source()
	r.remember(n, q, &d, now)
	return n.rule.Finish(d), true
}

// releaseFirst: a check that reaches the store through a node's breaker
// sends the releases of its key the breaker holds first (those still
// worth sending): a request is never refused for leases its node knows
// are given back.
func (r *simRun) releaseFirst(b *limiter.Breaker, bucket string, now time.Time) {
	t, kept := now.UnixMicro(), r.held[b][:0]
	for _, h := range r.held[b] {
		if h.record || h.o.q.bucket(&h.o.rule) != bucket {
			kept = append(kept, h)
			continue
		}
		if t < h.until {
			r.store.Release(bucket, h.o.reqNo)
			r.event("held_release_first")
		}
	}
	r.held[b] = kept
}

func (r *simRun) source() limiter.Source {
	if r.c.Stack == "redis" {
		return limiter.SourceRedis
	}
	return limiter.SourceMemory
}

// staticWins are the windows of a request whose cost never fits: their
// capacity and length only.
func (r *simRun) staticWins(n *simNode, q *oReq) []oWin {
	var ws []oWin
	for i, w := range n.rule.wins {
		ws = append(ws, n.rule.evalWindow(w, false, q.limits[i], q.limits[i], nil, r.now(), 0))
	}
	for i, w := range n.rule.gwins {
		ws = append(ws, n.rule.evalWindow(w, true, q.glimit[i], q.glimit[i], nil, r.now(), 0))
	}
	for i := range ws {
		ws[i] = oWin{global: ws[i].global, limit: ws[i].limit, seconds: ws[i].seconds}
	}
	return ws
}

// done finishes a request in flight: its lease is released, count_only
// records it when its status matches (401); a handler that panicked is a
// 500.
func (r *simRun) done(s *simStep) error {
	if len(r.open) == 0 {
		return nil
	}
	i := s.N % len(r.open)
	o := r.open[i]
	r.open = append(r.open[:i], r.open[i+1:]...)
	status := s.Status
	if status == 0 {
		status = 500
		r.event("panic")
	}
	if o.shared && r.down == "stall" && (o.br == nil || !limiter.BreakerRefuses(o.br)) {
		// A call after the response that reaches a stalled Redis may run
		// when it resumes, or not: the response ends later. (Through an
		// open circuit it reaches nothing: the breaker holds it.)
		r.open = append(r.open, o)
		return nil
	}
	var before int
	if o.br != nil {
		before, _ = limiter.BreakerHeld(o.br)
	}
	func() {
		defer func() { _ = recover() }()
		defer o.l.Done(context.Background(), &o.d, status)
		if s.Status == 0 {
			panic("handler")
		}
	}()
	st := r.store
	if !o.shared {
		st = r.nodes[o.node].local
	}
	record := o.od.record && status == 401
	if o.br != nil && o.shared {
		if after, _ := limiter.BreakerHeld(o.br); after > before {
			// The breaker holds them (the circuit is open, or the store
			// failed): they reach the store after its next success.
			r.event("release_undeliverable")
			leases := 0
			if o.od.leaseTaken {
				leases = 1
			}
			r.hold(o, record, after-before > leases)
			return nil
		}
		if r.down != "" {
			r.event("record_lost")
			return nil // a record sent to a Redis that refused it is lost
		}
	}
	if record {
		st.Record(&o.rule, &o.q, r.storeNow())
		r.event("count_only_record")
	}
	if o.od.leaseTaken {
		st.Release(o.q.bucket(&o.rule), o.reqNo)
		r.event("release")
	}
	return nil
}

// hold keeps a request's release (and its record, when heldRecord: one
// the breaker never sent) as its breaker does.
func (r *simRun) hold(o *simOpen, record, heldRecord bool) {
	t := r.now()
	if o.od.leaseTaken {
		r.held[o.br] = append(r.held[o.br], simHeld{o: o, at: t, until: t.UnixMicro() + o.rule.leaseTimeout})
	}
	if record && heldRecord {
		shortest := int64(0)
		for _, w := range o.rule.wins {
			l := w.Duration.Microseconds()
			if w.Period != limiter.PeriodNone {
				s, e := periodBounds(w.Period, t, o.rule.loc)
				l = e - s
			}
			if shortest == 0 || l < shortest {
				shortest = l
			}
		}
		for _, w := range o.rule.gwins {
			l := w.Duration.Microseconds()
			if w.Period != limiter.PeriodNone {
				s, e := periodBounds(w.Period, t, o.rule.loc)
				l = e - s
			}
			shortest = min(shortest, l)
		}
		r.held[o.br] = append(r.held[o.br], simHeld{o: o, record: true, at: t, until: t.UnixMicro() + shortest})
	}
}

// reset is the admin DELETE of a key (lifting its ban): the store forgets
// the bucket, the fail local stores too, every node's cached denials of
// the identity go.
func (r *simRun) reset(n *simNode, s *simStep) error {
	q := oReq{id: s.Key}
	if n.rule.regions {
		q.region = s.Region
	}
	if r.down != "" {
		return nil
	}
	if b := r.store.bans[q.bucket(&n.rule)]; b != nil && b.until > r.storeNow().UnixMicro() {
		r.event("ban_lift")
	}
	if _, err := n.l.Reset(context.Background(), q.id, q.region); err != nil {
		return fmt.Errorf("Reset: %v", err)
	}
	r.event("reset")
	r.store.Reset(&n.rule, &q)
	n.local.Reset(&n.rule, &q)
	for _, m := range r.nodes {
		r.forget(m, q.id)
	}
	return r.settle(func(m *simNode) bool { return !r.cacheHolds(m, q.id) })
}

// overrideSet is the admin PUT of an override.
func (r *simRun) overrideSet(n *simNode, s *simStep) error {
	if r.down != "" {
		return nil
	}
	o := limiter.Override{Factor: s.Factor, TTL: time.Duration(s.TTL) * time.Second}
	oo := oOverride{factor: s.Factor, end: r.storeNow().UnixMicro() + o.TTL.Microseconds()}
	scope := ""
	if s.Region != "" && n.rule.regions {
		o.Region, scope = s.Region, "r:"+s.Region
	}
	if s.Factor == 0 {
		o.Limits = s.Limits[:len(n.rule.wins)]
		oo.limits = map[limiter.Window]int64{}
		for i, w := range n.rule.wins {
			oo.limits[w] = o.Limits[i]
		}
		if scope == "" && len(s.GLimit) >= len(n.rule.gwins) && len(n.rule.gwins) > 0 {
			o.GlobalLimits = s.GLimit[:len(n.rule.gwins)]
			oo.glimits = map[limiter.Window]int64{}
			for i, w := range n.rule.gwins {
				oo.glimits[w] = o.GlobalLimits[i]
			}
		}
	}
	prev := r.store.ovs[s.Key][scope]
	deaf := r.deafen(n, s, prev == nil || prev.end != oo.end)
	if _, err := n.l.SetOverride(context.Background(), s.Key, o); err != nil {
		return fmt.Errorf("SetOverride: %v", err)
	}
	r.event("override_set")
	r.store.SetOverride(s.Key, scope, oo)
	if err := r.missed(deaf, s.Key); err != nil {
		return err
	}
	for _, m := range r.nodes {
		r.forget(m, s.Key)
	}
	return r.settle(func(m *simNode) bool { return m.l.KnowsOverride(s.Key) && !r.cacheHolds(m, s.Key) })
}

// overrideDel is the admin DELETE of an override.
func (r *simRun) overrideDel(n *simNode, s *simStep) error {
	if r.down != "" {
		return nil
	}
	region, scope := "", ""
	if s.Region != "" && n.rule.regions {
		region, scope = s.Region, "r:"+s.Region
	}
	prev := r.store.ovs[s.Key][scope]
	deaf := r.deafen(n, s, prev != nil && prev.end > r.storeNow().UnixMicro())
	if _, err := n.l.DeleteOverride(context.Background(), s.Key, region); err != nil {
		return fmt.Errorf("DeleteOverride: %v", err)
	}
	r.event("override_delete")
	r.store.DeleteOverride(s.Key, scope)
	if err := r.missed(deaf, s.Key); err != nil {
		return err
	}
	for _, m := range r.nodes {
		r.forget(m, s.Key)
	}
	return r.settle(func(m *simNode) bool { return !r.cacheHolds(m, s.Key) })
}

// deafen makes the node s.Deaf names miss the notice of the override
// change s makes at n (when it changes the overrides' index: a read of the
// index tells only what changed there), and returns it.
func (r *simRun) deafen(n *simNode, s *simStep, changes bool) *simNode {
	if s.Deaf == 0 || !changes || r.c.Stack != "redis" {
		return nil
	}
	m := r.nodes[(s.Deaf-1)%len(r.nodes)]
	if m == n {
		return nil
	}
	tag := limiter.Tag(s.Key)
	m.deaf.Store(&tag)
	return m
}

// missed: once every node has taken the notices sent so far (m missed the
// last one), m reads the overrides' index, as its watcher does every 5 s:
// it learns the change there, and drops the identity's cached denials
// decided before it.
func (r *simRun) missed(m *simNode, id string) error {
	if m == nil {
		return nil
	}
	err := r.delivered(6 * time.Second)
	m.deaf.Store(nil)
	if err != nil {
		return err
	}
	held := r.cacheHolds(m, id)
	limiter.ReadOverrideIndex(m.l)
	r.event("notice_missed")
	if held && r.cacheHolds(m, id) {
		return fmt.Errorf("a node that missed the notice read the overrides' index and still holds the denials of %q decided before", id)
	}
	return nil
}

// reload replaces a node's limiter by one of a changed config: limits,
// windows (sliding_log), dry_run, a new Redis client. Requests in flight
// finish on the old one.
func (r *simRun) reload(ni int, s *simStep) error {
	n := r.nodes[ni]
	cfg := n.cfg
	cfg.DryRun = s.DryRun
	if len(s.Limits) > 0 {
		// (token_bucket too since 2026-12-03: its buckets keep the T and
		// B they were written under, i and b and, from this release, p,
		// which its fast path reads; a reload rescales them, as the
		// oracle's evalToken does.)
		cfg.Limits = append([]int64(nil), s.Limits[:len(cfg.Limits)]...)
	}
	if len(s.Wins) > 0 && cfg.Alg == "sliding_log" {
		cfg.Windows = append([]string(nil), s.Wins...)
		cfg.Limits = append([]int64(nil), s.Limits[:len(s.Wins)]...)
	}
	if s.Format != 0 {
		cfg.Format = s.Format
	}
	if s.Conc < 0 {
		// The places held stay held until their requests end (or their
		// lease times out), and are given back then.
		cfg.Conc = 0
	} else if s.Conc > 0 {
		cfg.Conc = s.Conc
		if cfg.Lease == "" {
			cfg.Lease = "2s"
		}
	}
	if s.Alg != "" {
		// Another algorithm is another state key: the duration windows
		// start again (or from what that algorithm left), the calendar
		// periods, bans, leases and overrides stay.
		cfg.Alg = s.Alg
		if cfg.Alg != "token_bucket" {
			cfg.Burst = 0
		}
	}
	newClient := s.Client || s.Format != 0
	if cfg.Alg == "sliding_counter" && (cfg.Format == limiter.LogFormat1 || cfg.Format == limiter.LogFormat2) {
		// The oracle models the counter in its own model only (formats 3
		// and 4, one model in two encodings): in the previous release's
		// (two counters) and in format 2 (10 buckets, no arrival times) it
		// is an estimate of another shape, which TestMixedVersions holds
		// across the upgrade. A node that writes the counter writes its
		// newest format (a new client). (Until 2026-12-02 format 2 was
		// let through here: a reset of 1.1 s where the oracle said 1 s,
		// TestSimReplay's seed 1796230887945231843.)
		cfg.Format, newClient = limiter.CounterFormat4, true
	}
	old := n.l
	nn, err := r.env.node(r, ni, cfg, newClient)
	if err != nil {
		return fmt.Errorf("reload: %v", err)
	}
	r.nodes[ni] = nn
	old.Close()
	r.retire(n)
	if r.closedUnder > 0 {
		return fmt.Errorf("the old config's Redis client was given back while %d requests decided through it were in flight", r.closedUnder)
	}
	r.event("reload")
	if r.c.Stack == "redis" && r.down == "" {
		// A new limiter reads the overrides' index at start.
		if err := r.settle(func(m *simNode) bool { return m != nn || r.knowsLiveOverrides(m) }); err != nil {
			return fmt.Errorf("after a reload: %w", err)
		}
	}
	if s.Client {
		r.event("reload_client")
	}
	if s.Format != 0 {
		r.event("reload_format")
	}
	if s.Alg != "" && s.Alg != n.cfg.Alg {
		r.event("reload_algorithm")
	}
	if s.Conc != 0 && cfg.Conc != n.cfg.Conc {
		r.event("reload_max_concurrent")
	}
	return nil
}

// knowsLiveOverrides reports whether n knows every identity with a live
// override.
func (r *simRun) knowsLiveOverrides(n *simNode) bool {
	t := r.storeNow().UnixMicro()
	for id, m := range r.store.ovs {
		for _, o := range m {
			if o.end > t && !n.l.KnowsOverride(id) {
				return false
			}
		}
	}
	return true
}

// die is a node that dies and starts again: its requests in flight never
// end (their leases expire after lease_timeout, their count_only units are
// never recorded), its deny cache, queue, breaker and fail local store are
// gone.
func (r *simRun) die(ni int) error {
	old := r.nodes[ni]
	keep := r.open[:0]
	for _, o := range r.open {
		if o.node != ni {
			keep = append(keep, o)
		}
	}
	r.open = keep
	old.l.Close()
	if old.stack != nil {
		old.stack.close()
	}
	for _, st := range old.retired {
		st.closeClient() // its requests in flight never end
	}
	nn, err := r.env.node(r, len(r.nodes), old.cfg, true) // as a node of its own: nothing kept
	if err != nil {
		return err
	}
	r.nodes[ni] = nn
	r.event("node_death")
	if r.c.Stack == "redis" && r.down == "" {
		return r.settle(func(m *simNode) bool { return m != nn || r.knowsLiveOverrides(m) })
	}
	return nil
}

// fault breaks or heals the Redis stack.
func (r *simRun) fault(s *simStep) error {
	if r.c.Stack != "redis" {
		return nil
	}
	return r.env.fault(r, s.Fault)
}

// invariants hold after every step.
func (r *simRun) invariants() error {
	if err := r.leaseInvariant(); err != nil {
		return err
	}
	for i, n := range r.nodes {
		if w := limiter.QueueWaiters(n.l); w != 0 {
			return fmt.Errorf("node %d: %d queue places held with no request waiting", i, w)
		}
	}
	return r.cacheInvariant()
}

// leaseInvariant: every key's requests in flight in the store are the
// oracle's: the leases of requests still in flight, and of those whose
// release could not be delivered until lease_timeout after they were
// taken.
func (r *simRun) leaseInvariant() error {
	if r.down != "" {
		return nil
	}
	n := r.nodes[0]
	if !n.rule.conc {
		return nil
	}
	for _, q := range r.keys {
		in := &limiter.Input{Identity: q.id, Region: q.region, Limits: n.cfg.Limits, GlobalLimits: n.cfg.GLimits, MaxConcurrent: n.cfg.Conc}
		d, err := n.l.Peek(context.Background(), in)
		if err != nil {
			continue // the store does not answer (a fault the breaker has not seen yet)
		}
		want := r.store.liveLeases(q.bucket(&n.rule), r.storeNow().UnixMicro())
		if d.InFlight != want {
			return fmt.Errorf("key %q region %q: %d requests in flight in the store, the oracle has %d", q.id, q.region, d.InFlight, want)
		}
	}
	return nil
}

// compareDecision holds the stack's decision to the oracle's.
// Retry-After and the reset are compared to the µs, as the stores give them
// (the headers round them up to whole seconds, so a µs across a second
// changes what the client sees).
func compareDecision(got *limiter.Decision, want *oDecision) error {
	bad := func(what string, g, w any) error {
		return fmt.Errorf("%s: got %v, the oracle says %v\n  stack:  %s\n  oracle: %s", what, g, w, describe(got), want)
	}
	switch {
	case got.Outcome != want.outcome:
		return bad("outcome", got.Outcome, want.outcome)
	case got.Pass != want.pass:
		return bad("pass", got.Pass, want.pass)
	case got.DryRun != want.dryRun:
		return bad("dry run", got.DryRun, want.dryRun)
	case got.Source != want.source:
		return bad("source", got.Source, want.source)
	case retrySeconds(got) != want.RetrySeconds():
		return bad("Retry-After", retrySeconds(got), want.RetrySeconds())
	case got.Banned != want.banned:
		return bad("banned", got.Banned, want.banned)
	case got.BanStarted != want.banStarted:
		return bad("ban started", got.BanStarted, want.banStarted)
	}
	if got.Outcome == limiter.OutcomeUnavailable {
		for i, w := range got.Windows {
			if w.Known || w.Denied {
				return bad(fmt.Sprintf("window %d known during an outage", i), w.Known, false)
			}
		}
		return nil
	}
	if len(got.Windows) != len(want.wins) {
		return bad("windows", len(got.Windows), len(want.wins))
	}
	for i := range got.Windows {
		g, w := &got.Windows[i], &want.wins[i]
		where := fmt.Sprintf("window %d (%s)", i, g.Policy)
		switch {
		case g.Limit != w.limit:
			return bad(where+" limit", g.Limit, w.limit)
		case g.Seconds != w.seconds:
			return bad(where+" w (seconds)", g.Seconds, w.seconds)
		case g.Known != w.known:
			return bad(where+" known", g.Known, w.known)
		case g.Denied != w.denied:
			return bad(where+" denied", g.Denied, w.denied)
		case g.Denied && g.Retry != time.Duration(w.retry)*time.Microsecond:
			return bad(where+" retry", g.Retry, time.Duration(w.retry)*time.Microsecond)
		case g.Known && g.Reset != time.Duration(w.reset)*time.Microsecond:
			return bad(where+" reset", g.Reset, time.Duration(w.reset)*time.Microsecond)
		case g.Known && !g.Denied && got.Outcome != limiter.OutcomeBanned && g.Remaining != w.remaining:
			return bad(where+" remaining", g.Remaining, w.remaining)
		}
	}
	return nil
}

func ceilSec(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

func retrySeconds(d *limiter.Decision) int64 {
	switch d.Outcome {
	case limiter.OutcomeAllowed, limiter.OutcomeUnavailable, limiter.OutcomeTooLarge:
		return 0
	}
	return max(ceilSec(d.RetryAfter), 1)
}

func describe(d *limiter.Decision) string {
	s := fmt.Sprintf("%s pass=%v dry=%v source=%s retry=%s banned=%v started=%v err=%v", d.Outcome, d.Pass, d.DryRun,
		d.Source, d.RetryAfter, d.Banned, d.BanStarted, d.Err)
	for _, w := range d.Windows {
		s += fmt.Sprintf(" [%s limit %d w %d known %v count %d denied %v remaining %d retry %s]", w.Policy, w.Limit, w.Seconds, w.Known, w.Count, w.Denied, w.Remaining, w.Retry)
	}
	return s
}

// String prints a step as a Go literal (only the fields it sets).
func (s simStep) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "{Op: %q", s.Op)
	if s.Node != 0 {
		fmt.Fprintf(&b, ", Node: %d", s.Node)
	}
	if s.Key != "" {
		fmt.Fprintf(&b, ", Key: %q", s.Key)
	}
	if s.Region != "" {
		fmt.Fprintf(&b, ", Region: %q", s.Region)
	}
	if s.Cost != 0 {
		fmt.Fprintf(&b, ", Cost: %d", s.Cost)
	}
	if s.N != 0 {
		fmt.Fprintf(&b, ", N: %d", s.N)
	}
	if s.Status != 0 {
		fmt.Fprintf(&b, ", Status: %d", s.Status)
	}
	if s.Dt != 0 {
		fmt.Fprintf(&b, ", Dt: %d", s.Dt)
	}
	if s.Factor != 0 {
		fmt.Fprintf(&b, ", Factor: %g", s.Factor)
	}
	if s.Limits != nil {
		fmt.Fprintf(&b, ", Limits: %#v", s.Limits)
	}
	if s.TTL != 0 {
		fmt.Fprintf(&b, ", TTL: %d", s.TTL)
	}
	if s.GLimit != nil {
		fmt.Fprintf(&b, ", GLimit: %#v", s.GLimit)
	}
	if s.Wins != nil {
		fmt.Fprintf(&b, ", Wins: %#v", s.Wins)
	}
	if s.DryRun {
		b.WriteString(", DryRun: true")
	}
	if s.Fault != "" {
		fmt.Fprintf(&b, ", Fault: %q", s.Fault)
	}
	if s.Client {
		b.WriteString(", Client: true")
	}
	if s.Cancel {
		b.WriteString(", Cancel: true")
	}
	if s.QFault != "" {
		fmt.Fprintf(&b, ", QFault: %q", s.QFault)
	}
	if s.Deaf != 0 {
		fmt.Fprintf(&b, ", Deaf: %d", s.Deaf)
	}
	if s.Format != 0 {
		fmt.Fprintf(&b, ", Format: %d", s.Format)
	}
	if s.Alg != "" {
		fmt.Fprintf(&b, ", Alg: %q", s.Alg)
	}
	if s.Conc != 0 {
		fmt.Fprintf(&b, ", Conc: %d", s.Conc)
	}
	b.WriteString("}")
	return b.String()
}

// literal prints a history as a Go literal for TestSimReplay's table.
func (c *simCase) literal() string {
	var b strings.Builder
	fmt.Fprintf(&b, "{Name: %q, Stack: %q, Start: time.Date(%d, %d, %d, %d, %d, %d, %d, time.UTC), Nodes: %d,\n",
		c.Name, c.Stack, c.Start.Year(), c.Start.Month(), c.Start.Day(), c.Start.Hour(), c.Start.Minute(), c.Start.Second(), c.Start.Nanosecond(), c.Nodes)
	if c.RedisClock {
		b.WriteString("\tRedisClock: true,\n")
	}
	if c.Skew != 0 {
		fmt.Fprintf(&b, "\tSkew: %d,\n", c.Skew)
	}
	fmt.Fprintf(&b, "\tCfg: %s,\n\tSteps: []simStep{\n", strings.Replace(fmt.Sprintf("%#v", c.Cfg), "limiter_test.simCfg", "simCfg", 1))
	for _, s := range c.Steps {
		fmt.Fprintf(&b, "\t\t%s,\n", s)
	}
	b.WriteString("\t}},")
	return b.String()
}

// envInt reads a budget from the environment.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
