package limiter_test

// The stacks a simulated history runs on, their faults, and the oracle's
// model of each node's deny cache (a documented promise: once a key is
// denied until R, its requests of the same shape are denied on that node
// without a store call until R, with the exact time left).

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/redistest"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// simEnv is what the histories of one test share: the redis-server.
type simEnv struct {
	t   testing.TB
	srv *redistest.Server
	// seeds, when above 0, bounds make test's budget: that many of the
	// fixed seeds, no fresh one, one focused history per seam (Redis 6's
	// run, beside Redis 7's full one).
	seeds int
	run   int
	pc    *redis.Client // publishes the probes
	// The nodes of histories that ended, being closed; wait for them
	// before the test ends.
	closing sync.WaitGroup
}

// pub is the client the probes are published with.
func (e *simEnv) pub() *redis.Client {
	if e.pc == nil {
		e.pc = e.srv.Client(e.t)
	}
	return e.pc
}

// nodeStack is a node's Redis stack. users counts the limiters built on
// it that have not given it back: each gives it back once its own requests
// in flight are done (retire, as each Caddy handler's Cleanup releases its
// hold on a shared store), and the client closes when none holds it.
type nodeStack struct {
	client  *redis.Client
	store   *limiter.RedisStore
	breaker *limiter.Breaker
	local   *limiter.MemoryStore
	users   atomic.Int32
	once    sync.Once
}

func (s *nodeStack) close() {
	s.closeClient()
	s.local.Close()
}

// closeClient closes the store and its client, once.
func (s *nodeStack) closeClient() {
	s.once.Do(func() {
		s.store.Close()
		s.client.Close()
	})
}

// retire gives back n's hold on its Redis stack once n's requests in
// flight are done; the stack's store and client close when no limiter
// holds them. (Until 2026-12-03 a reload that made a new client closed
// the old one once the limiter it replaced was done, not every limiter
// built on it: after two reloads, the first's requests still in flight
// lost their count_only records, "redis store closed", TestSimReplay's
// seed 1796308074035626193.)
func (r *simRun) retire(n *simNode) {
	st, l := n.stack, n.l
	if st == nil {
		return
	}
	l.AfterDone(func(deferred bool) {
		if st.users.Add(-1) != 0 {
			return
		}
		if !deferred {
			// At once: no request decided through this limiter may be in
			// flight (its release and count_only record go through it).
			for _, o := range r.open {
				if o.l == l && o.shared {
					r.closedUnder++
				}
			}
		}
		st.closeClient()
	})
}

// start builds the nodes of a history.
func (e *simEnv) start(c *simCase) (*simRun, error) {
	e.run++
	r := &simRun{c: c, clock: &testClock{t: c.Start}, env: e, store: newOStore(), seen: map[string]int{},
		keys: map[string]oReq{}, held: map[*limiter.Breaker][]simHeld{}, prefix: "sim" + strconv.Itoa(e.run) + ":"}
	if c.Stack == "memory" {
		r.mem = limiter.NewMemoryStore(limiter.WithClock(r.storeNow))
	} else {
		e.srv.CLI(e.t, "FLUSHALL")
	}
	for i := 0; i < c.Nodes; i++ {
		n, err := e.node(r, i, c.Cfg, true)
		if err != nil {
			r.close()
			return nil, err
		}
		r.nodes = append(r.nodes, n)
	}
	// A subscription's start makes a node forget every cached denial: wait
	// for each node's before the first request.
	if err := r.delivered(5 * time.Second); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// node builds node i's limiter for cfg; on Redis, a new client when asked
// (or when the node has none yet), else the node's own.
func (e *simEnv) node(r *simRun, i int, cfg simCfg, newClient bool) (*simNode, error) {
	n := &simNode{cfg: cfg, rule: cfg.rule(), cache: map[string]*oCached{}, deaf: new(atomic.Pointer[string])}
	if i < len(r.nodes) {
		n.local = r.nodes[i].local
		n.stack = r.nodes[i].stack
		n.retired = r.nodes[i].retired
	} else {
		n.local = newOStore()
	}
	name := "sim"
	var b limiter.Backend
	if r.c.Stack == "memory" {
		b = limiter.Backend{Store: r.mem, Source: limiter.SourceMemory, Notifier: r.mem}
		if r.c.Skew != 0 {
			// The store on its own clock: the limiter sends it no time
			// (as to Redis with clock redis), and reads the overrides'
			// index as it does Redis's. No deny cache: its entries are
			// the Redis stack's to model.
			b = limiter.Backend{Store: r.mem, Base: r.mem, Source: limiter.SourceMemory, Notifier: r.mem, Remote: true, DenyCacheSize: -1}
		}
	} else {
		if n.stack == nil || newClient {
			old := n.stack
			c := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), MaxRetries: -1, DialerRetries: 1, DialTimeout: 200 * time.Millisecond,
				ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
			// Odd nodes call the script by EVALSHA (ScriptsEval, where a
			// call of log checks alone goes by the log's own script),
			// even ones by FCALL of the library (on Redis 6, EVALSHA of
			// the cached body, lua.DecideCached): both on the same keys,
			// through every fault.
			opts := []limiter.RedisOption{limiter.WithBatching(2, 16)}
			if i%2 == 1 {
				opts = append(opts, limiter.WithScripts(limiter.ScriptsEval))
			}
			if cfg.Format != 0 {
				// A node switched to another state format (a reload with
				// a Format: 1, the previous release's, 2, 3 or 4): the keys
				// it writes go back and forth between the formats.
				opts = append(opts, limiter.WithStateFormat(cfg.Format))
			}
			s := limiter.NewRedisStore(c, opts...)
			var local *limiter.MemoryStore
			if old != nil {
				local = old.local
			} else if r.c.RedisClock {
				local = limiter.NewMemoryStore() // the wall clock, as the nodes'
			} else {
				// Its TTLs on the history's clock, as its decisions: real
				// time that passes while the clock stands still (a call
				// to a stalled Redis timing out) expires nothing.
				local = limiter.NewMemoryStore(limiter.WithClock(r.storeNow))
			}
			n.stack = &nodeStack{client: c, store: s, local: local,
				breaker: limiter.NewBreaker(s, limiter.BreakerConfig{IsFailure: limiter.IsUnavailable, Now: r.clock.Now})}
			if old != nil && i < len(r.nodes) {
				// The old stack closes once no limiter built on it holds
				// it (retire); the node keeps it until then, to close it
				// if it dies first.
				n.retired = append(n.retired, old)
			}
		}
		n.stack.users.Add(1)
		b = limiter.Backend{Store: n.stack.breaker, Base: n.stack.store, Source: limiter.SourceRedis, Remote: true,
			Notifier: &simNotifier{Notifier: n.stack.store, deaf: n.deaf}, Local: n.stack.local}
		if r.c.RedisClock {
			// A cached denial ends on the node's clock, which the
			// oracle cannot read at the instant the node did.
			b.DenyCacheSize = -1
		}
	}
	p := cfg.policy(name, r.prefix, r.clock.Now, r.c.Stack == "redis")
	if r.c.Skew != 0 {
		p.AppClock, p.Timeout = false, 0
	}
	if r.c.RedisClock {
		p.AppClock, p.Now = false, time.Now
	}
	l, err := limiter.New(p, b)
	if err != nil {
		return nil, err
	}
	limiter.SetSleep(l, r.sleep)
	n.l = l
	if r.c.Skew != 0 {
		// A remote limiter reads the overrides' index as it starts, on
		// its own goroutine: wait for it.
		for deadline := time.Now().Add(2 * time.Second); !r.knowsLiveOverrides(n); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("a new limiter did not read the overrides' index within 2 s")
			}
		}
	}
	return n, nil
}

// simNotifier is a node's notices, of which it misses those of one
// identity while deaf says so (a lost pub/sub message).
type simNotifier struct {
	limiter.Notifier
	deaf *atomic.Pointer[string]
}

func (s *simNotifier) Subscribe(channel string, f func(msg string)) func() {
	return s.Notifier.Subscribe(channel, func(msg string) {
		if tag := s.deaf.Load(); tag != nil {
			_, rest, _ := strings.Cut(msg, "\n")
			if strings.TrimSuffix(rest, "\noverride") == *tag {
				return
			}
		}
		f(msg)
	})
}

// close ends a history: every limiter, client and store it made.
func (r *simRun) close() {
	for _, o := range r.open {
		// The old configs' clients go once these are done.
		o.l.Done(context.Background(), &o.d, 200)
	}
	r.open = nil
	for _, n := range r.nodes {
		// In the background: a store's Close waits for its subscription's
		// reader, which may be in a backoff of up to 5 s after an outage.
		r.env.closing.Add(1)
		go func() {
			defer r.env.closing.Done()
			n.l.Close()
			if n.stack != nil {
				n.stack.close()
			}
			for _, st := range n.retired {
				st.closeClient()
			}
		}()
	}
	if r.mem != nil {
		r.mem.Close()
	}
	if r.env.srv != nil && r.down != "" {
		r.env.heal(r, false)
	}
}

// fault breaks or heals the Redis stack: a stall (SIGSTOP), a kill, a
// restart with no data, a SCRIPT FLUSH; heal ends a stall or a kill.
func (e *simEnv) fault(r *simRun, kind string) error {
	if kind == "stall" || kind == "kill" {
		// Through an outage a node keeps the denials its cache holds (the
		// README's promise): the oracle takes what each holds as the
		// outage starts (it may have forgotten some since: see expect).
		for _, n := range r.nodes {
			for b := range n.cache {
				if id, _, _ := cutBucket(b); !r.cacheHolds(n, id) {
					delete(n.cache, b)
				}
			}
		}
	}
	switch kind {
	case "stall":
		if r.down == "" {
			e.srv.Pause()
			r.down = "stall"
			r.event("fault:stall")
		}
	case "kill":
		if r.down == "stall" {
			e.srv.Resume()
		}
		if r.down != "kill" {
			e.srv.Kill()
			r.down = "kill"
			r.event("fault:kill")
		}
	case "restart":
		// Redis comes back with nothing: every budget, ban, lease and
		// override is gone; each node forgets its cached denials when its
		// subscription starts again.
		if r.down == "stall" {
			e.srv.Resume()
		}
		e.srv.Restart()
		r.down = ""
		r.store = newOStore()
		for _, n := range r.nodes {
			n.cache = map[string]*oCached{}
		}
		r.event("fault:restart")
		return r.subscribed()
	case "flush":
		if r.down == "" {
			e.srv.CLI(e.t, "SCRIPT", "FLUSH")
			r.event("fault:script_flush")
		}
	case "heal":
		e.heal(r, true)
	}
	return nil
}

// heal ends a stall or a kill (a killed Redis comes back with its data
// gone too: it has no persistence); then, when wait, until every node
// listens to notices again. After a stall too: a node whose subscription
// broke during it (a new client's, whose tries failed) starts it again
// after a backoff of up to 5 s, and the next step that waits for a notice
// (a reset, an override, a reload, a node's death) would wait that long in
// real time. The history's clock stands still meanwhile, but Redis's TTLs
// run on the wall clock: a lease of 2 s, its key kept 1 s longer, taken
// just before, was gone from Redis where the oracle held it (fresh seed
// 1796551517083550127: 0 requests in flight, the oracle has 1, after an
// override's notice waited 4.4 s). So the wait is here, before any state
// is written after the stall.
func (e *simEnv) heal(r *simRun, wait bool) {
	switch r.down {
	case "stall":
		e.srv.Resume()
		r.event("heal:stall")
		r.down = ""
		if wait {
			_ = r.delivered(8 * time.Second) // (as after a kill: a later step's wait reports a node that never came back)
		}
	case "kill":
		e.srv.Restart()
		r.store = newOStore()
		for _, n := range r.nodes {
			n.cache = map[string]*oCached{}
		}
		r.event("heal:kill")
		r.down = ""
		if wait {
			_ = r.subscribed()
		}
	}
	r.down = ""
}

// simProbe is an identity no history uses: a notice of an override of it
// tells whether a node's subscription is live.
const simProbe = "~probe"

// subscribed waits until every node listens to notices again after Redis
// came back (its subscription starts again with a backoff of up to 5 s),
// and has then forgotten every cached denial, as it does on a new
// subscription.
func (r *simRun) subscribed() error {
	if err := r.delivered(8 * time.Second); err != nil {
		return fmt.Errorf("a node did not subscribe to notices again within 8 s of Redis coming back: %w", err)
	}
	return r.settle(func(n *simNode) bool { return n.l.DenyCache().Len() == 0 })
}

// delivered waits until every node has taken every notice sent so far: it
// sends one more, of an override of a new probe identity (no history uses
// it), on the same channel, and waits until every node knows it (Redis
// delivers a channel's messages in order). A node that has not subscribed
// yet misses a probe, so the probe is sent again until every node knows it;
// then a last probe, sent once unless a node misses it too, so that no
// repeat of the first is still on its way when delivered returns: a notice
// a node takes drops the denials its store is deciding from its deny cache
// (any identity's: DenyCache.forget), and a late repeat arriving as a
// later step's request is denied would leave that denial uncached, at
// random.
func (r *simRun) delivered(within time.Duration) error {
	if r.c.Stack != "redis" {
		return nil
	}
	deadline := time.Now().Add(within)
	for _, every := range []time.Duration{5 * time.Millisecond, 500 * time.Millisecond} {
		if !r.probe(deadline, every) {
			return fmt.Errorf("a notice was not delivered to every node within %s", within)
		}
	}
	return nil
}

// probe sends a notice of a new probe identity every so often until every
// node knows it (true), or the deadline passes.
func (r *simRun) probe(deadline time.Time, every time.Duration) bool {
	pub := r.env.pub()
	r.probes++
	probe := simProbe + strconv.Itoa(r.probes)
	msg := r.nodes[0].l.Keys().Namespace() + "\n" + limiter.Tag(probe) + "\noverride"
	for {
		pub.Publish(context.Background(), r.prefix+"reset", msg)
		for sent := time.Now(); ; {
			all := true
			for _, n := range r.nodes {
				all = all && n.l.KnowsOverride(probe)
			}
			if all {
				return true
			}
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(time.Millisecond)
			if time.Since(sent) >= every {
				break
			}
		}
	}
}

// settle waits until every node satisfies ok: at once on the in-process
// store (notices are delivered as they are sent), within 6 s on Redis
// (pub/sub; a node that missed a notice reads the overrides' index within
// 5 s).
func (r *simRun) settle(ok func(n *simNode) bool) error {
	if err := r.delivered(6 * time.Second); err != nil {
		return err
	}
	deadline := time.Now().Add(6 * time.Second)
	for {
		all := true
		for _, n := range r.nodes {
			all = all && ok(n)
		}
		if all {
			return nil
		}
		if r.c.Stack == "memory" || time.Now().After(deadline) {
			return fmt.Errorf("a node did not take a notice (reset, override, new subscription)")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// oCached is a denial a node's deny cache holds, as the oracle has it: the
// decision made at start, valid until until (µs).
type oCached struct {
	start, until int64
	cost         int64
	d            oDecision
}

// cacheHolds reports whether node n's deny cache holds a denial of id.
func (r *simRun) cacheHolds(n *simNode, id string) bool {
	c := n.l.DenyCache()
	return c != nil && limiter.DenyCacheHolds(c, limiter.Tag(id))
}

// forget drops node n's cached denials of id (a notice).
func (r *simRun) forget(n *simNode, id string) {
	for k := range n.cache {
		if k == id || len(k) > len(id) && k[:len(id)+1] == id+"\x00" {
			delete(n.cache, k)
		}
	}
}

// remember updates node n's deny cache after a store answer: a denial with
// a retry time is cached (a refusal by the concurrency bound has none), an
// admission drops the bucket's.
func (r *simRun) remember(n *simNode, q *oReq, d *oDecision, now time.Time) {
	if r.c.Stack != "redis" || r.c.RedisClock {
		return
	}
	b := q.bucket(&n.rule)
	switch {
	case d.outcome == limiter.OutcomeAllowed:
		delete(n.cache, b)
	case d.outcome == limiter.OutcomeLimited || d.outcome == limiter.OutcomeBanned:
		if d.leaseDenied {
			return
		}
		t := now.UnixMicro()
		n.cache[b] = &oCached{start: t, until: t + d.retry, cost: max(q.cost, 1), d: *d}
	}
}

// cached is node n's cached answer to q at now, when it holds one: the
// windows that denied with their retry counted down, the others unknown.
// A cached limited denial is a client's denial like any other: it counts
// toward the ban in the store.
func (r *simRun) cached(n *simNode, q *oReq, now time.Time) (oDecision, bool) {
	c := n.servable(q, now, r.storeFails(n))
	if c == nil {
		return oDecision{}, false
	}
	t := now.UnixMicro()
	e := t - c.start
	d := c.d
	d.source, d.banStarted, d.leaseTaken, d.record = limiter.SourceDenyCache, false, false, false
	d.wins = append([]oWin(nil), c.d.wins...)
	for i := range d.wins {
		w := &d.wins[i]
		w.count, w.remaining, w.known = 0, 0, false
		w.denied = w.denied && w.retry > e
		if w.denied {
			w.retry -= e
		} else {
			w.retry = 0
		}
	}
	d.banLeft = max(d.banLeft-e, 0)
	d.banned = d.outcome == limiter.OutcomeBanned
	d.retry = d.retryOf()
	return d, true
}

// storeFails reports whether node n's calls to the store fail: Redis is
// down, or the node's circuit is open (after an outage, until its
// cool-down ends on the history's clock, which a heal does not move), so a
// call through it is refused unsent. Either way the deny cache serves the
// denials it holds (docs/decision.md: an error, a timeout, the circuit
// open). (Until 2026-12-06 only the first: a node whose circuit a stall
// had opened served its held denial under a ban rule after the heal, and
// the oracle said the store decides; fresh seed 1796555705763496099.)
func (r *simRun) storeFails(n *simNode) bool {
	return r.down != "" || n.stack != nil && limiter.BreakerRefuses(n.stack.breaker)
}

// servable is the cached denial node n answers q with at now, if any: a
// live one of the same shape. Under a ban rule a refusal by a window is a
// client's denial the store must count, so while the store answers only a
// ban is served from the cache (README: the penalty box); through an
// outage every denial it holds is, and is not counted.
func (n *simNode) servable(q *oReq, now time.Time, down bool) *oCached {
	b := q.bucket(&n.rule)
	c := n.cache[b]
	t := now.UnixMicro()
	switch {
	case c == nil:
		return nil
	case t >= c.until:
		delete(n.cache, b)
		return nil
	case c.cost != max(q.cost, 1):
		return nil
	case n.rule.ban != nil && c.d.outcome == limiter.OutcomeLimited && !down:
		return nil
	}
	return c
}

// cacheInvariant: what each node's deny cache holds is what the oracle says
// it holds, and no cached denial outlasts what the store would answer: the
// store (the oracle's, read without writing) still denies every window the
// cache says denies, at least as long.
func (r *simRun) cacheInvariant() error {
	if r.c.Stack != "redis" {
		return nil
	}
	t := r.now().UnixMicro()
	for i, n := range r.nodes {
		for b, c := range n.cache {
			if t >= c.until {
				continue
			}
			id, region, _ := cutBucket(b)
			if !r.cacheHolds(n, id) {
				// Forgotten (see expect): the store decides the next one.
				delete(n.cache, b)
				continue
			}
			if r.down != "" {
				continue
			}
			q := oReq{id: id, region: region, limits: n.cfg.Limits, glimit: n.cfg.GLimits, cost: c.cost, maxConc: n.cfg.Conc}
			peek := r.store.clone().Decide(&n.rule, &q, r.now(), true, -1, -1)
			if peek.outcome == limiter.OutcomeAllowed {
				return fmt.Errorf("node %d: a cached denial of %q (until %s) outlasts what the store would answer (allowed)", i, b,
					time.Duration(c.until-t)*time.Microsecond)
			}
		}
	}
	return nil
}

func cutBucket(b string) (id, region string, ok bool) {
	for i := 0; i < len(b); i++ {
		if b[i] == 0 {
			return b[:i], b[i+1:], true
		}
	}
	return b, "", false
}

// clone is a copy of the store for a read that writes nothing.
func (s *oStore) clone() *oStore {
	c := newOStore()
	for k, v := range s.buckets {
		c.buckets[k] = append([]oEntry(nil), v...)
	}
	for k, v := range s.ledger.logs {
		c.ledger.logs[k] = append([]oEntry(nil), v...)
	}
	for _, m := range [][2]map[string]*oBan{{s.bans, c.bans}, {s.drybans, c.drybans}} {
		for k, v := range m[0] {
			b := *v
			b.denials = append([]int64(nil), v.denials...)
			m[1][k] = &b
		}
	}
	for k, v := range s.leases {
		m := map[int]int64{}
		for a, e := range v {
			m[a] = e
		}
		c.leases[k] = m
	}
	for k, v := range s.ovs {
		m := map[string]*oOverride{}
		for a, o := range v {
			m[a] = o
		}
		c.ovs[k] = m
	}
	return c
}

var _ = context.Background
