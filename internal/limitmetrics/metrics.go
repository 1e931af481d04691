// Package limitmetrics is the limiters' Prometheus collectors and how a
// decision (and an event of the global ceiling) is counted in them. It
// imports nothing of Caddy: the Caddy handler (namespace "caddy") and the
// net/http middleware (httplimit) both count with it.
package limitmetrics

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/reply"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// Values of the `result` label of requests_total.
const (
	ResultAllowed      = "allowed"
	ResultDenied       = "denied"
	ResultCached       = "cached_denial"
	ResultDryRunDenied = "dry_run_denial"
	ResultFailOpen     = "fail_open"
	ResultFailClosed   = "fail_closed"
	ResultLocalAllowed = "local_allowed"
	ResultLocalDenied  = "local_denied"
	ResultTooLarge     = "too_large"
)

var allResults = []string{ResultAllowed, ResultDenied, ResultCached, ResultDryRunDenied, ResultFailOpen,
	ResultFailClosed, ResultLocalAllowed, ResultLocalDenied, ResultTooLarge}

// sub is every metric's subsystem: <namespace>_sliding_ratelimit_<name>.
const sub = "sliding_ratelimit"

// Source is what a limiter shows when Prometheus scrapes: its circuit
// state, its overrides, the in-process store's keys, its share of the
// global ceiling.
type Source struct {
	Name    string
	Breaker *limiter.Breaker // nil without Redis
	Lim     *limiter.Limiter
	Memory  *limiter.MemoryStore // the in-process store, when it has one
	Global  *Global              // with global_redis
}

// Set is a process's collectors of every limiter. Labels are the limiter
// name, its window labels and fixed vocabularies: no label value comes
// from a client, so cardinality does not grow with traffic.
type Set struct {
	Requests   *prometheus.CounterVec
	StoreErrs  *prometheus.CounterVec
	CheckTime  *prometheus.HistogramVec
	NearLimit  *prometheus.CounterVec
	WindowDeny *prometheus.CounterVec
	Bans       *prometheus.CounterVec
	Queued     *prometheus.CounterVec
	QueueWait  *prometheus.HistogramVec
	EmptyKeys  *prometheus.CounterVec
	// The global ceiling across data centres (global_redis).
	Grants, GrantedUnits, Returns, ReturnedUnits *prometheus.CounterVec
	Renewals, Starved, FailOpenGlobal            *prometheus.CounterVec
	ResetDrops                                   *prometheus.CounterVec
	AdmittedGlobal                               *prometheus.CounterVec
	LedgerErrs                                   *prometheus.CounterVec
	LedgerTime                                   *prometheus.HistogramVec

	scrape     *collector
	collectors []prometheus.Collector
}

// NewSet builds the collectors, named <ns>_sliding_ratelimit_<name> (ns
// may be ""); sources lists the live limiters at scrape time.
func NewSet(ns string, sources func() []Source) *Set {
	s := &Set{}
	s.Requests = counterVec(ns, "requests_total", []string{"limiter", "result"},
		"Requests seen by a limiter, by result: allowed, denied, cached_denial, dry_run_denial, fail_open, fail_closed, local_allowed, local_denied, too_large.")
	s.StoreErrs = counterVec(ns, "store_errors_total", []string{"limiter", "kind"},
		"Store calls that failed, by kind: timeout, circuit_open, connection, auth, script, other.")
	s.CheckTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "store_check_duration_seconds",
		Help:    "Time of one decision in the store stack (one Redis round trip, a cached denial, or the in-process store).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5},
	}, []string{"limiter", "store"})
	s.NearLimit = counterVec(ns, "near_limit_total", []string{"limiter"},
		"Admitted requests that took a key's usage of a window to or above warn_at of its limit.")
	s.WindowDeny = counterVec(ns, "window_denials_total", []string{"limiter", "window"},
		"Denials by the window that had no room (a request denied by two windows counts in both).")
	s.Bans = counterVec(ns, "bans_total", []string{"limiter"},
		"Keys put in the penalty box.")
	s.Queued = counterVec(ns, "queued_total", []string{"limiter", "result"},
		"Requests that waited for their turn instead of a 429, by how it ended: allowed or denied.")
	s.QueueWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "queue_wait_seconds",
		Help:    "Time requests waited for their turn.",
		Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"limiter"})
	s.EmptyKeys = counterVec(ns, "empty_keys_total", []string{"limiter"},
		"Requests whose key resolved to nothing (every placeholder empty or unknown): they share one budget of the limiter.")
	s.initGlobal(ns)
	s.scrape = newCollector(ns, sources)
	s.collectors = []prometheus.Collector{s.Requests, s.StoreErrs, s.CheckTime,
		s.NearLimit, s.WindowDeny, s.Bans, s.Queued, s.QueueWait, s.EmptyKeys,
		s.Grants, s.GrantedUnits, s.Returns, s.ReturnedUnits, s.Renewals, s.Starved,
		s.FailOpenGlobal, s.AdmittedGlobal, s.ResetDrops, s.LedgerErrs, s.LedgerTime, s.scrape}
	return s
}

// counterVec is a counter of this package's subsystem, by labels.
func counterVec(ns, name string, labels []string, help string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels)
}

// initGlobal builds the collectors of the global ceiling across data
// centres (global_redis), labelled with the limiter and this node's data
// centre.
func (s *Set) initGlobal(ns string) {
	dc := []string{"limiter", "datacenter"}
	s.Grants = counterVec(ns, "global_grants_total", dc,
		"Grants of a share of an identity's global ceiling the ledger (global_redis) gave this node's data centre.")
	s.GrantedUnits = counterVec(ns, "global_granted_units_total", dc,
		"Units the ledger granted this node's data centre, over every grant.")
	s.AdmittedGlobal = counterVec(ns, "global_admitted_units_total", dc,
		"Units this node admitted under the global ceiling, from its data centre's share (fail open's passes are in global_fail_open_total): summed by datacenter, what each data centre admitted; in all, what every one did.")
	s.Returns = counterVec(ns, "global_returns_total", dc,
		"Grants this node gave back to the ledger once they ended (spent or expired).")
	s.ReturnedUnits = counterVec(ns, "global_returned_units_total", dc,
		"Units the grants given back had used, as reported to the ledger.")
	s.Renewals = counterVec(ns, "global_renewals_total", dc,
		"Renewals of a share started ahead of need, in the background.")
	s.Starved = counterVec(ns, "global_starved_total", dc,
		"Requests refused here by the data centre's share while the ledger had room for them.")
	s.FailOpenGlobal = counterVec(ns, "global_fail_open_total", dc,
		"Requests passed by fail open because the ledger could not renew the share they needed.")
	s.ResetDrops = counterVec(ns, "global_reset_drops_total", append(dc, "result"),
		"Shares this node dropped because an operator reset their identity through another data centre, by result: dropped, or failed (the data centre may spend what that share held until its grants end).")
	s.LedgerErrs = counterVec(ns, "ledger_errors_total", append(dc, "kind"),
		"Ledger (global_redis) calls that failed, by kind: timeout, connection, auth, script, other, not_durable (a grant its replicas did not acknowledge).")
	s.LedgerTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "ledger_round_trip_seconds",
		Help:    "Round trip of one ledger (global_redis) call: a grant, a renewal or a membership beat, failed ones included.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, dc)
}

// Collectors are the set's collectors, to register.
func (s *Set) Collectors() []prometheus.Collector { return s.collectors }

// Register registers the collectors on reg, ignoring the error of a
// collector that is already there (several limiters, or a reload).
func (s *Set) Register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range s.collectors {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

// Limiter holds one limiter's label-bound children, resolved once when it
// starts so the hot path does no label lookups. Every series a limiter has
// exists from its start, at zero, so rate() and alerts work at once.
type Limiter struct {
	results   map[string]prometheus.Counter
	errs      map[limiter.ErrKind]prometheus.Counter
	NearLimit prometheus.Counter
	Bans      prometheus.Counter
	checkTime prometheus.Observer
	queueWait prometheus.Observer
	queuedOK  prometheus.Counter
	queuedNo  prometheus.Counter
	EmptyKeys prometheus.Counter
	name      string
	set       *Set
	windows   sync.Map // window label → prometheus.Counter
	Global    *Global  // with global_redis
}

// Limiter binds the series of limiter name on store ("memory" or "redis").
func (s *Set) Limiter(name, store string) *Limiter {
	m := &Limiter{
		name:      name,
		set:       s,
		results:   make(map[string]prometheus.Counter, len(allResults)),
		errs:      make(map[limiter.ErrKind]prometheus.Counter, len(limiter.ErrKinds)),
		NearLimit: s.NearLimit.WithLabelValues(name),
		Bans:      s.Bans.WithLabelValues(name),
		checkTime: s.CheckTime.WithLabelValues(name, store),
		queueWait: s.QueueWait.WithLabelValues(name),
		queuedOK:  s.Queued.WithLabelValues(name, "allowed"),
		queuedNo:  s.Queued.WithLabelValues(name, "denied"),
		EmptyKeys: s.EmptyKeys.WithLabelValues(name),
	}
	for _, r := range allResults {
		m.results[r] = s.Requests.WithLabelValues(name, r)
	}
	for _, k := range limiter.ErrKinds {
		m.errs[k] = s.StoreErrs.WithLabelValues(name, string(k))
	}
	return m
}

// Observe counts a decision.
func (m *Limiter) Observe(d *limiter.Decision) {
	m.results[Result(d)].Inc()
	if d.Took > 0 {
		m.checkTime.Observe(d.Took.Seconds())
	}
	if d.ErrKind != limiter.ErrKindNone {
		if c := m.errs[d.ErrKind]; c != nil {
			c.Inc()
		}
	}
	if d.Queued {
		m.queueWait.Observe(d.Waited.Seconds())
		if d.Outcome == limiter.OutcomeAllowed {
			m.queuedOK.Inc()
		} else {
			m.queuedNo.Inc()
		}
	}
	for i := range d.Windows {
		if w := &d.Windows[i]; w.Denied {
			m.window(w).Inc()
		}
	}
	if m.Global != nil && d.Outcome == limiter.OutcomeAllowed && d.Source != limiter.SourceFailOpen {
		m.Global.admitted.Add(float64(d.Cost))
	}
}

func (m *Limiter) window(w *limiter.WindowUsage) prometheus.Counter {
	if c, ok := m.windows.Load(w.Policy); ok {
		return c.(prometheus.Counter)
	}
	c := m.set.WindowDeny.WithLabelValues(m.name, w.Policy)
	m.windows.Store(w.Policy, c)
	return c
}

// Result is a decision's requests_total label.
func Result(d *limiter.Decision) string {
	switch {
	case d.Outcome == limiter.OutcomeUnavailable && d.Pass:
		return ResultFailOpen
	case d.Outcome == limiter.OutcomeUnavailable:
		return ResultFailClosed
	case d.Outcome == limiter.OutcomeTooLarge:
		return ResultTooLarge
	case d.DryRun:
		return ResultDryRunDenied
	case d.Outcome == limiter.OutcomeAllowed && d.Source == limiter.SourceLocal:
		return ResultLocalAllowed
	case d.Outcome == limiter.OutcomeAllowed:
		return ResultAllowed
	case d.Source == limiter.SourceLocal:
		return ResultLocalDenied
	case d.Source == limiter.SourceDenyCache:
		return ResultCached
	}
	return ResultDenied
}

// ledgerErrKinds are the kinds of ledger_errors_total: the store's (but
// circuit_open: no breaker guards the ledger) and not_durable.
var ledgerErrKinds = []string{string(limiter.ErrKindTimeout), string(limiter.ErrKindConnection), string(limiter.ErrKindAuth),
	string(limiter.ErrKindScript), string(limiter.ErrKindOther), "not_durable"}

// Global is one limiter's series of the global ceiling across data
// centres, labelled with the limiter and this node's data centre.
type Global struct {
	grants, grantedUnits, returns, returnedUnits prometheus.Counter
	renewals, starved, failOpen                  prometheus.Counter
	dropped, dropFailed                          prometheus.Counter
	admitted                                     prometheus.Counter
	roundTrip                                    prometheus.Observer
	errs                                         map[string]prometheus.Counter
	Held                                         *HeldShare
	Datacenter                                   string
}

// Global binds the global ceiling's series of limiter name in data centre
// dc, whose global windows are windows.
func (s *Set) Global(name, dc string, windows []limiter.Window) *Global {
	g := &Global{
		grants: s.Grants.WithLabelValues(name, dc), grantedUnits: s.GrantedUnits.WithLabelValues(name, dc),
		returns: s.Returns.WithLabelValues(name, dc), returnedUnits: s.ReturnedUnits.WithLabelValues(name, dc),
		renewals: s.Renewals.WithLabelValues(name, dc), starved: s.Starved.WithLabelValues(name, dc),
		failOpen: s.FailOpenGlobal.WithLabelValues(name, dc), roundTrip: s.LedgerTime.WithLabelValues(name, dc),
		admitted: s.AdmittedGlobal.WithLabelValues(name, dc),
		dropped:  s.ResetDrops.WithLabelValues(name, dc, "dropped"), dropFailed: s.ResetDrops.WithLabelValues(name, dc, "failed"),
		errs: make(map[string]prometheus.Counter, len(ledgerErrKinds)), Held: NewHeldShare(GrantLength(windows), time.Now),
		Datacenter: dc,
	}
	for _, k := range ledgerErrKinds {
		g.errs[k] = s.LedgerErrs.WithLabelValues(name, dc, k)
	}
	return g
}

// GlobalEvent counts one thing the global ceiling did (Global.OnEvent).
func (m *Limiter) GlobalEvent(ev limiter.GlobalEvent) {
	g := m.Global
	if g == nil {
		return
	}
	switch ev.Kind {
	case limiter.EventGrant:
		g.roundTrip.Observe(ev.Took.Seconds())
		if ev.Err != nil { // answered, but not durable: not used
			g.errs["not_durable"].Inc()
		}
		if ev.Units > 0 {
			g.grants.Inc()
			g.grantedUnits.Add(float64(ev.Units))
			g.Held.Add(ev.Units)
		}
	case limiter.EventLedgerError:
		g.roundTrip.Observe(ev.Took.Seconds())
		c := g.errs[string(limiter.KindOf(ev.Err))]
		if c == nil {
			c = g.errs[string(limiter.ErrKindOther)]
		}
		c.Inc()
	case limiter.EventBeat:
		g.roundTrip.Observe(ev.Took.Seconds())
	case limiter.EventReturn:
		g.returns.Inc()
		g.returnedUnits.Add(float64(ev.Units))
	case limiter.EventRenewal:
		g.renewals.Inc()
	case limiter.EventStarved:
		g.starved.Inc()
	case limiter.EventFailOpen:
		g.failOpen.Inc()
	case limiter.EventDropped:
		if ev.Err != nil {
			g.dropFailed.Inc()
		} else {
			g.dropped.Inc()
		}
	}
}

// GrantLength is a grant's base length as the engine sets it by default
// (Global.Length): the shortest global window / 60, within 50 ms and 1 s.
func GrantLength(windows []limiter.Window) time.Duration {
	var shortest time.Duration
	for _, w := range windows {
		d := w.Duration
		if w.Period != limiter.PeriodNone {
			d = w.Period.Longest()
		}
		if shortest == 0 || d < shortest {
			shortest = d
		}
	}
	return min(max(shortest/60, 50*time.Millisecond), time.Second)
}

// HeldShare estimates the units granted to this node and not ended: the
// grant events give the units but neither a grant's length nor its end,
// so a grant counts for the base length from when it came (heldSlot
// buckets of 10 ms keep it bounded).
type HeldShare struct {
	mu     sync.Mutex
	length time.Duration
	now    func() time.Time
	slots  []heldSlot // by until, oldest first
}

type heldSlot struct {
	until time.Time
	units int64
}

// NewHeldShare is an estimate of grants of length, on clock now.
func NewHeldShare(length time.Duration, now func() time.Time) *HeldShare {
	return &HeldShare{length: length, now: now}
}

// Add counts a grant of units, now.
func (s *HeldShare) Add(units int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	until := s.now().Add(s.length)
	s.prune()
	if n := len(s.slots); n > 0 && until.Sub(s.slots[n-1].until) < 10*time.Millisecond {
		s.slots[n-1].units += units
		return
	}
	s.slots = append(s.slots, heldSlot{until: until, units: units})
}

// Units is the estimate now.
func (s *HeldShare) Units() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prune()
	var n int64
	for _, sl := range s.slots {
		n += sl.units
	}
	return n
}

func (s *HeldShare) prune() {
	now := s.now()
	i := 0
	for i < len(s.slots) && !s.slots[i].until.After(now) {
		i++
	}
	s.slots = append(s.slots[:0], s.slots[i:]...)
}

// collector reports what is read when Prometheus scrapes, not when a
// request passes: each limiter's circuit state (a limiter that serves no
// request still shows Redis's recovery), and the in-process store's keys
// and evictions.
type collector struct {
	sources                                             func() []Source
	circuit, memKeys, memEvict, overrides, static, held *prometheus.Desc
}

func newCollector(ns string, sources func() []Source) *collector {
	return &collector{
		sources: sources,
		circuit: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "circuit_state"),
			"Redis circuit breaker state of a limiter, read at scrape time: 0 closed, 1 open, 2 half open.", []string{"limiter"}, nil),
		memKeys: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "memory_keys"),
			"Keys held by the in-process store (every limiter without Redis, and fail local).", nil, nil),
		memEvict: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "memory_evictions_total"),
			"Live keys the in-process store dropped to stay under its bound.", nil, nil),
		overrides: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "overrides_active"),
			"Temporary overrides in force for a limiter, from its last read of the store's index (every 5 s; absent while the store does not answer).", []string{"limiter"}, nil),
		static: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "global_static"),
			"1 while this node's data centre is on its static share of the global ceiling (fail local, cut off from the ledger), else 0; as this node last read it.", []string{"limiter", "datacenter"}, nil),
		held: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "global_share_held_units"),
			"Units the ledger granted this node in the last base grant length (an estimate of the share it holds, over every identity; see the reference).", []string{"limiter", "datacenter"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.circuit
	ch <- c.memKeys
	ch <- c.memEvict
	ch <- c.overrides
	ch <- c.static
	ch <- c.held
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	if c.sources == nil {
		return
	}
	var mem *limiter.MemoryStore
	for _, s := range c.sources() {
		if s.Breaker != nil {
			ch <- prometheus.MustNewConstMetric(c.circuit, prometheus.GaugeValue, float64(s.Breaker.State()), s.Name)
		}
		if n, ok := s.Lim.OverridesActive(context.Background()); ok {
			ch <- prometheus.MustNewConstMetric(c.overrides, prometheus.GaugeValue, float64(n), s.Name)
		}
		if s.Memory != nil {
			mem = s.Memory
		}
		if g := s.Global; g != nil {
			if st, ok := s.Lim.GlobalState(); ok {
				static := 0.0
				if st.Static {
					static = 1
				}
				ch <- prometheus.MustNewConstMetric(c.static, prometheus.GaugeValue, static, s.Name, g.Datacenter)
			}
			ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(g.Held.Units()), s.Name, g.Datacenter)
		}
	}
	if mem != nil {
		ch <- prometheus.MustNewConstMetric(c.memKeys, prometheus.GaugeValue, float64(mem.Len()))
		ch <- prometheus.MustNewConstMetric(c.memEvict, prometheus.CounterValue, float64(mem.Evictions()))
	}
}

// Count counts a decision as every front door does: Observe, then
// near_limit_total when an admitted request took a window to warnAt of its
// limit (near: a window is there; crossed: this request took it there),
// and bans_total when the decision started a ban.
func (m *Limiter) Count(d *limiter.Decision, warnAt float64) (near, crossed bool) {
	m.Observe(d)
	if d.Outcome == limiter.OutcomeAllowed {
		if near, crossed = reply.NearLimit(d, warnAt); crossed {
			m.NearLimit.Inc()
		}
		return near, crossed
	}
	if d.BanStarted && d.Outcome != limiter.OutcomeUnavailable {
		m.Bans.Inc()
	}
	return false, false
}
