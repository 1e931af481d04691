package slidingratelimit

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/limitmetrics"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// metricsNamespace starts the name of every metric of the Caddy handler:
// caddy_sliding_ratelimit_<name> (internal/limitmetrics defines them).
const metricsNamespace = "caddy"

// Values of the `result` label of requests_total.
const (
	resultAllowed      = limitmetrics.ResultAllowed
	resultDryRunDenied = limitmetrics.ResultDryRunDenied
)

// metrics are the limiters' collectors, built once per process and
// registered on every config's registry (each reload brings a fresh one).
// At scrape time they read the live handlers.
var metrics = limitmetrics.NewSet(metricsNamespace, liveSources)

// liveSources are the live handlers as the scrape-time metrics read them.
func liveSources() []limitmetrics.Source {
	hs := liveHandlers()
	out := make([]limitmetrics.Source, 0, len(hs))
	for _, h := range hs {
		out = append(out, limitmetrics.Source{Name: h.Name, Breaker: h.rt.breaker, Lim: h.rt.lim,
			Memory: h.rt.memory, Global: h.rt.metrics.Global})
	}
	return out
}

// registerMetrics registers the collectors on reg, ignoring the error of a
// collector that is already there (several limiters, or a reload).
func registerMetrics(reg prometheus.Registerer) error { return metrics.Register(reg) }

// newLimiterMetrics binds one limiter's series, at its start.
func newLimiterMetrics(name, store string) *limitmetrics.Limiter { return metrics.Limiter(name, store) }

// newGlobalMetrics binds one limiter's series of the global ceiling.
func newGlobalMetrics(name, dc string, windows []limiter.Window) *limitmetrics.Global {
	return metrics.Global(name, dc, windows)
}

// newHeldShare estimates the share of the global ceiling this node holds.
var newHeldShare = limitmetrics.NewHeldShare
