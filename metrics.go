package slidingratelimit

import (
	"context"
	"errors"
	"sync"

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
	scrape     collector
	collectors []prometheus.Collector
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
		metrics.collectors = []prometheus.Collector{metrics.requests, metrics.storeErrs, metrics.checkTime,
			metrics.nearLimit, metrics.windowDeny, metrics.bans, metrics.queued, metrics.queueWait, metrics.emptyKeys, &metrics.scrape}
	})
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
	windows   sync.Map // window label → prometheus.Counter
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
)

func (*collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- circuitDesc
	ch <- memKeysDesc
	ch <- memEvictDesc
	ch <- overridesDesc
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
	}
	if mem != nil {
		ch <- prometheus.MustNewConstMetric(memKeysDesc, prometheus.GaugeValue, float64(mem.Len()))
		ch <- prometheus.MustNewConstMetric(memEvictDesc, prometheus.CounterValue, float64(mem.Evictions()))
	}
}
