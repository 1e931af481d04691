package slidingratelimit

import (
	"context"
	"errors"
	"net"
	"strings"
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
)

// metrics are the limiter's collectors, built once per process and
// registered on every config's registry (each reload brings a fresh one).
// Labels are the limiter name and fixed vocabularies: no label value comes
// from a client, so cardinality does not grow with traffic.
var metrics struct {
	once       sync.Once
	requests   *prometheus.CounterVec
	storeErrs  *prometheus.CounterVec
	checkTime  *prometheus.HistogramVec
	nearLimit  *prometheus.CounterVec
	circuit    *prometheus.GaugeVec
	collectors []prometheus.Collector
}

func initMetrics() {
	metrics.once.Do(func() {
		const ns, sub = "caddy", "sliding_ratelimit"
		metrics.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Requests seen by a limiter, by result: allowed, denied, cached_denial, dry_run_denial, fail_open, fail_closed, local_allowed, local_denied.",
		}, []string{"limiter", "result"})
		metrics.storeErrs = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_errors_total",
			Help: "Store calls that failed, by kind: timeout, circuit_open, connection, auth, script, other.",
		}, []string{"limiter", "kind"})
		metrics.checkTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "store_check_duration_seconds",
			Help:    "Time of one store decision (one Redis round trip, or the in-process store).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5},
		}, []string{"limiter", "store"})
		metrics.nearLimit = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "near_limit_total",
			Help: "Admitted requests that took a key's usage to or above warn_at of its limit.",
		}, []string{"limiter"})
		metrics.circuit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "circuit_state",
			Help: "Redis circuit breaker state as seen by a limiter: 0 closed, 1 open, 2 half open.",
		}, []string{"limiter"})
		metrics.collectors = []prometheus.Collector{metrics.requests, metrics.storeErrs, metrics.checkTime, metrics.nearLimit, metrics.circuit}
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
// Provision so the hot path does no label lookups.
type limiterMetrics struct {
	allowed, denied, cached, dryRunDenied prometheus.Counter
	failOpen, failClosed                  prometheus.Counter
	localAllowed, localDenied             prometheus.Counter
	nearLimit                             prometheus.Counter
	checkTime                             prometheus.Observer
	circuit                               prometheus.Gauge
	name                                  string
}

func newLimiterMetrics(name, store string) *limiterMetrics {
	initMetrics()
	r := metrics.requests
	m := &limiterMetrics{
		name:         name,
		allowed:      r.WithLabelValues(name, resultAllowed),
		denied:       r.WithLabelValues(name, resultDenied),
		cached:       r.WithLabelValues(name, resultCached),
		dryRunDenied: r.WithLabelValues(name, resultDryRunDenied),
		failOpen:     r.WithLabelValues(name, resultFailOpen),
		failClosed:   r.WithLabelValues(name, resultFailClosed),
		localAllowed: r.WithLabelValues(name, resultLocalAllowed),
		localDenied:  r.WithLabelValues(name, resultLocalDenied),
		nearLimit:    metrics.nearLimit.WithLabelValues(name),
		checkTime:    metrics.checkTime.WithLabelValues(name, store),
	}
	if store == "redis" {
		// Only limiters behind a circuit breaker have a circuit state.
		m.circuit = metrics.circuit.WithLabelValues(name)
	}
	return m
}

// storeError counts a failed store call by kind.
func (m *limiterMetrics) storeError(err error) {
	metrics.storeErrs.WithLabelValues(m.name, errorKind(err)).Inc()
}

// errorKind sorts a store error into a fixed vocabulary. "connection" is
// what limiter.IsUnavailable counts as an outage (the breaker's view);
// "script" is an error about one call (a reply Redis gave it, or a reply
// the engine could not read).
func errorKind(err error) string {
	var ne net.Error
	msg := err.Error()
	switch {
	case errors.Is(err, limiter.ErrCircuitOpen):
		return "circuit_open"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case strings.HasPrefix(msg, "WRONGPASS"), strings.HasPrefix(msg, "NOAUTH"), strings.HasPrefix(msg, "NOPERM"):
		return "auth"
	case errors.Is(err, limiter.ErrInvalidRequest):
		return "other"
	case limiter.IsUnavailable(err):
		return "connection"
	}
	return "script"
}
