package slidingratelimit

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// Values of the `result` label of requests_total.
const (
	resultAllowed      = "allowed"
	resultDenied       = "denied"
	resultCached       = "cached_denial"
	resultDryRunDenied = "dry_run_denial"
	resultFailOpen     = "fail_open"
	resultFailClosed   = "fail_closed"
	resultLocalAllowed = "local_allowed"
	resultLocalDenied  = "local_denied"
	resultTooLarge     = "too_large"
)

var allResults = []string{resultAllowed, resultDenied, resultCached, resultDryRunDenied, resultFailOpen,
	resultFailClosed, resultLocalAllowed, resultLocalDenied, resultTooLarge}

// metrics are the limiter's collectors, built once per process and
// registered on every config's registry (each reload brings a fresh one).
// Labels are the limiter name, its window labels and fixed vocabularies: no
// label value comes from a client, so cardinality does not grow with
// traffic.
var metrics struct {
	once       sync.Once
	requests   *prometheus.CounterVec
	storeErrs  *prometheus.CounterVec
	checkTime  *prometheus.HistogramVec
	nearLimit  *prometheus.CounterVec
	windowDeny *prometheus.CounterVec
	bans       *prometheus.CounterVec
	queued     *prometheus.CounterVec
	queueWait  *prometheus.HistogramVec
	emptyKeys  *prometheus.CounterVec
	// The global ceiling across data centres (global_redis).
	grants, grantedUnits, returns, returnedUnits *prometheus.CounterVec
	renewals, starved, failOpenGlobal            *prometheus.CounterVec
	admittedGlobal                               *prometheus.CounterVec
	ledgerErrs                                   *prometheus.CounterVec
	ledgerTime                                   *prometheus.HistogramVec
	scrape                                       collector
	collectors                                   []prometheus.Collector
}

const ns, sub = "caddy", "sliding_ratelimit"

func initMetrics() {
	metrics.once.Do(func() {
		metrics.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Requests seen by a limiter, by result: allowed, denied, cached_denial, dry_run_denial, fail_open, fail_closed, local_allowed, local_denied, too_large.",
		}, []string{"limiter", "result"})
		metrics.storeErrs = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_errors_total",
			Help: "Store calls that failed, by kind: timeout, circuit_open, connection, auth, script, other.",
		}, []string{"limiter", "kind"})
		metrics.checkTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "store_check_duration_seconds",
			Help:    "Time of one decision in the store stack (one Redis round trip, a cached denial, or the in-process store).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5},
		}, []string{"limiter", "store"})
		metrics.nearLimit = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "near_limit_total",
			Help: "Admitted requests that took a key's usage of a window to or above warn_at of its limit.",
		}, []string{"limiter"})
		metrics.windowDeny = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "window_denials_total",
			Help: "Denials by the window that had no room (a request denied by two windows counts in both).",
		}, []string{"limiter", "window"})
		metrics.bans = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "bans_total",
			Help: "Keys put in the penalty box.",
		}, []string{"limiter"})
		metrics.queued = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "queued_total",
			Help: "Requests that waited for their turn instead of a 429, by how it ended: allowed or denied.",
		}, []string{"limiter", "result"})
		metrics.queueWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "queue_wait_seconds",
			Help:    "Time requests waited for their turn.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"limiter"})
		metrics.emptyKeys = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "empty_keys_total",
			Help: "Requests whose key resolved to nothing (every placeholder empty or unknown): they share one budget of the limiter.",
		}, []string{"limiter"})
		initGlobalMetrics()
		metrics.collectors = []prometheus.Collector{metrics.requests, metrics.storeErrs, metrics.checkTime,
			metrics.nearLimit, metrics.windowDeny, metrics.bans, metrics.queued, metrics.queueWait, metrics.emptyKeys,
			metrics.grants, metrics.grantedUnits, metrics.returns, metrics.returnedUnits, metrics.renewals, metrics.starved,
			metrics.failOpenGlobal, metrics.admittedGlobal, metrics.ledgerErrs, metrics.ledgerTime, &metrics.scrape}
	})
}

// initGlobalMetrics builds the collectors of the global ceiling across
// data centres (global_redis), labelled with the limiter and this node's
// data centre.
func initGlobalMetrics() {
	dc := []string{"limiter", "datacenter"}
	metrics.grants = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "global_grants_total",
		Help: "Grants of a share of an identity's global ceiling the ledger (global_redis) gave this node's data centre.",
	}, dc)
	metrics.grantedUnits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "global_granted_units_total",
		Help: "Units the ledger granted this node's data centre, over every grant.",
	}, dc)
	metrics.admittedGlobal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "global_admitted_units_total",
		Help: "Units this node admitted under the global ceiling, from its data centre's share (fail open's passes are in global_fail_open_total): summed by datacenter, what each data centre admitted; in all, what every one did.",
	}, dc)
	metrics.returns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "global_returns_total",
		Help: "Grants this node gave back to the ledger once they ended (spent or expired).",
	}, dc)
	metrics.returnedUnits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "global_returned_units_total",
		Help: "Units the grants given back had used, as reported to the ledger.",
	}, dc)
	metrics.renewals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "global_renewals_total",
		Help: "Renewals of a share started ahead of need, in the background.",
	}, dc)
	metrics.starved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "global_starved_total",
		Help: "Requests refused here by the data centre's share while the ledger had room for them.",
	}, dc)
	metrics.failOpenGlobal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "global_fail_open_total",
		Help: "Requests passed by fail open because the ledger could not renew the share they needed.",
	}, dc)
	metrics.ledgerErrs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "ledger_errors_total",
		Help: "Ledger (global_redis) calls that failed, by kind: timeout, connection, auth, script, other, not_durable (a grant its replicas did not acknowledge).",
	}, append(dc, "kind"))
	metrics.ledgerTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "ledger_round_trip_seconds",
		Help:    "Round trip of one ledger (global_redis) call: a grant, a renewal or a membership beat, failed ones included.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, dc)
}

// registerMetrics registers the collectors on reg, ignoring the error of a
// collector that is already there (several limiters, or a reload).
func registerMetrics(reg prometheus.Registerer) error {
	initMetrics()
	if reg == nil {
		return nil
	}
	for _, c := range metrics.collectors {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

// limiterMetrics holds one limiter's label-bound children, resolved once in
// Provision so the hot path does no label lookups. Every series a limiter
// has exists from its start, at zero, so rate() and alerts work at once.
type limiterMetrics struct {
	results   map[string]prometheus.Counter
	errs      map[limiter.ErrKind]prometheus.Counter
	nearLimit prometheus.Counter
	bans      prometheus.Counter
	checkTime prometheus.Observer
	queueWait prometheus.Observer
	queuedOK  prometheus.Counter
	queuedNo  prometheus.Counter
	emptyKeys prometheus.Counter
	name      string
	windows   sync.Map       // window label → prometheus.Counter
	global    *globalMetrics // with global_redis
}

func newLimiterMetrics(name, store string) *limiterMetrics {
	initMetrics()
	m := &limiterMetrics{
		name:      name,
		results:   make(map[string]prometheus.Counter, len(allResults)),
		errs:      make(map[limiter.ErrKind]prometheus.Counter, len(limiter.ErrKinds)),
		nearLimit: metrics.nearLimit.WithLabelValues(name),
		bans:      metrics.bans.WithLabelValues(name),
		checkTime: metrics.checkTime.WithLabelValues(name, store),
		queueWait: metrics.queueWait.WithLabelValues(name),
		queuedOK:  metrics.queued.WithLabelValues(name, "allowed"),
		queuedNo:  metrics.queued.WithLabelValues(name, "denied"),
		emptyKeys: metrics.emptyKeys.WithLabelValues(name),
	}
	for _, r := range allResults {
		m.results[r] = metrics.requests.WithLabelValues(name, r)
	}
	for _, k := range limiter.ErrKinds {
		m.errs[k] = metrics.storeErrs.WithLabelValues(name, string(k))
	}
	return m
}

// observe counts a decision.
func (m *limiterMetrics) observe(d *limiter.Decision) {
	m.results[result(d)].Inc()
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
	if m.global != nil && d.Outcome == limiter.OutcomeAllowed && d.Source != limiter.SourceFailOpen {
		m.global.admitted.Add(float64(d.Cost))
	}
}

func (m *limiterMetrics) window(w *limiter.WindowUsage) prometheus.Counter {
	if c, ok := m.windows.Load(w.Policy); ok {
		return c.(prometheus.Counter)
	}
	c := metrics.windowDeny.WithLabelValues(m.name, w.Policy)
	m.windows.Store(w.Policy, c)
	return c
}

// result is a decision's requests_total label.
func result(d *limiter.Decision) string {
	switch {
	case d.Outcome == limiter.OutcomeUnavailable && d.Pass:
		return resultFailOpen
	case d.Outcome == limiter.OutcomeUnavailable:
		return resultFailClosed
	case d.Outcome == limiter.OutcomeTooLarge:
		return resultTooLarge
	case d.DryRun:
		return resultDryRunDenied
	case d.Outcome == limiter.OutcomeAllowed && d.Source == limiter.SourceLocal:
		return resultLocalAllowed
	case d.Outcome == limiter.OutcomeAllowed:
		return resultAllowed
	case d.Source == limiter.SourceLocal:
		return resultLocalDenied
	case d.Source == limiter.SourceDenyCache:
		return resultCached
	}
	return resultDenied
}

// ledgerErrKinds are the kinds of ledger_errors_total: the store's (but
// circuit_open: no breaker guards the ledger) and not_durable.
var ledgerErrKinds = []string{string(limiter.ErrKindTimeout), string(limiter.ErrKindConnection), string(limiter.ErrKindAuth),
	string(limiter.ErrKindScript), string(limiter.ErrKindOther), "not_durable"}

// globalMetrics are one limiter's series of the global ceiling across
// data centres, labelled with the limiter and this node's data centre.
type globalMetrics struct {
	grants, grantedUnits, returns, returnedUnits prometheus.Counter
	renewals, starved, failOpen                  prometheus.Counter
	admitted                                     prometheus.Counter
	roundTrip                                    prometheus.Observer
	errs                                         map[string]prometheus.Counter
	held                                         *heldShare
	datacenter                                   string
}

func newGlobalMetrics(name, dc string, windows []limiter.Window) *globalMetrics {
	initMetrics()
	g := &globalMetrics{
		grants: metrics.grants.WithLabelValues(name, dc), grantedUnits: metrics.grantedUnits.WithLabelValues(name, dc),
		returns: metrics.returns.WithLabelValues(name, dc), returnedUnits: metrics.returnedUnits.WithLabelValues(name, dc),
		renewals: metrics.renewals.WithLabelValues(name, dc), starved: metrics.starved.WithLabelValues(name, dc),
		failOpen: metrics.failOpenGlobal.WithLabelValues(name, dc), roundTrip: metrics.ledgerTime.WithLabelValues(name, dc),
		admitted: metrics.admittedGlobal.WithLabelValues(name, dc),
		errs:     make(map[string]prometheus.Counter, len(ledgerErrKinds)), held: newHeldShare(grantLength(windows), time.Now),
		datacenter: dc,
	}
	for _, k := range ledgerErrKinds {
		g.errs[k] = metrics.ledgerErrs.WithLabelValues(name, dc, k)
	}
	return g
}

// globalEvent counts one thing the global ceiling did (Global.OnEvent).
func (m *limiterMetrics) globalEvent(ev limiter.GlobalEvent) {
	g := m.global
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
			g.held.add(ev.Units)
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
	}
}

// grantLength is a grant's base length as the engine sets it by default
// (Global.Length): the shortest global window / 60, within 50 ms and 1 s.
func grantLength(windows []limiter.Window) time.Duration {
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

// heldShare estimates the units granted to this node and not ended: the
// grant events give the units but neither a grant's length nor its end,
// so a grant counts for the base length from when it came (heldSlot
// buckets of 10 ms keep it bounded).
type heldShare struct {
	mu     sync.Mutex
	length time.Duration
	now    func() time.Time
	slots  []heldSlot // by until, oldest first
}

type heldSlot struct {
	until time.Time
	units int64
}

func newHeldShare(length time.Duration, now func() time.Time) *heldShare {
	return &heldShare{length: length, now: now}
}

func (s *heldShare) add(units int64) {
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

// units is the estimate now.
func (s *heldShare) units() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prune()
	var n int64
	for _, sl := range s.slots {
		n += sl.units
	}
	return n
}

func (s *heldShare) prune() {
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
type collector struct{}

var (
	circuitDesc = prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "circuit_state"),
		"Redis circuit breaker state of a limiter, read at scrape time: 0 closed, 1 open, 2 half open.", []string{"limiter"}, nil)
	memKeysDesc = prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "memory_keys"),
		"Keys held by the in-process store (every limiter without Redis, and fail local).", nil, nil)
	memEvictDesc = prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "memory_evictions_total"),
		"Live keys the in-process store dropped to stay under its bound.", nil, nil)
	overridesDesc = prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "overrides_active"),
		"Temporary overrides in force for a limiter, from its last read of the store's index (every 5 s; absent while the store does not answer).", []string{"limiter"}, nil)
	staticDesc = prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "global_static"),
		"1 while this node's data centre is on its static share of the global ceiling (fail local, cut off from the ledger), else 0; as this node last read it.", []string{"limiter", "datacenter"}, nil)
	heldDesc = prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "global_share_held_units"),
		"Units the ledger granted this node in the last base grant length (an estimate of the share it holds, over every identity; see the reference).", []string{"limiter", "datacenter"}, nil)
)

func (*collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- circuitDesc
	ch <- memKeysDesc
	ch <- memEvictDesc
	ch <- overridesDesc
	ch <- staticDesc
	ch <- heldDesc
}

func (*collector) Collect(ch chan<- prometheus.Metric) {
	var mem *limiter.MemoryStore
	for _, h := range liveHandlers() {
		if h.rt.breaker != nil {
			ch <- prometheus.MustNewConstMetric(circuitDesc, prometheus.GaugeValue, float64(h.rt.breaker.State()), h.Name)
		}
		if n, ok := h.rt.lim.OverridesActive(context.Background()); ok {
			ch <- prometheus.MustNewConstMetric(overridesDesc, prometheus.GaugeValue, float64(n), h.Name)
		}
		if h.rt.memory != nil {
			mem = h.rt.memory
		}
		if g := h.rt.metrics.global; g != nil {
			if st, ok := h.rt.lim.GlobalState(); ok {
				static := 0.0
				if st.Static {
					static = 1
				}
				ch <- prometheus.MustNewConstMetric(staticDesc, prometheus.GaugeValue, static, h.Name, g.datacenter)
			}
			ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, float64(g.held.units()), h.Name, g.datacenter)
		}
	}
	if mem != nil {
		ch <- prometheus.MustNewConstMetric(memKeysDesc, prometheus.GaugeValue, float64(mem.Len()))
		ch <- prometheus.MustNewConstMetric(memEvictDesc, prometheus.CounterValue, float64(mem.Evictions()))
	}
}
