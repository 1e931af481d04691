package httplimit

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/limitmetrics"
)

// Metrics are the collectors of the limiters given them (Config.Metrics):
// the Caddy handler's metrics, named <namespace>_sliding_ratelimit_<name>
// (requests_total by result, store_errors_total, window_denials_total,
// bans_total, circuit_state... docs/reference.md lists them), each
// labelled with the limiter's Name. Make one per process and register its
// Collectors on your registry.
type Metrics struct {
	set  *limitmetrics.Set
	mu   sync.Mutex
	live map[*Limiter]struct{}
}

// NewMetrics makes the collectors; namespace may be "" (names then start
// with sliding_ratelimit_), or "caddy" for the names of the Caddy handler's
// dashboards.
func NewMetrics(namespace string) *Metrics {
	m := &Metrics{live: map[*Limiter]struct{}{}}
	m.set = limitmetrics.NewSet(namespace, m.sources)
	return m
}

// Collectors are the collectors to register.
func (m *Metrics) Collectors() []prometheus.Collector { return m.set.Collectors() }

func (m *Metrics) sources() []limitmetrics.Source {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]limitmetrics.Source, 0, len(m.live))
	for l := range m.live {
		out = append(out, l.source)
	}
	return out
}

func (m *Metrics) add(l *Limiter) {
	m.mu.Lock()
	m.live[l] = struct{}{}
	m.mu.Unlock()
}

func (m *Metrics) remove(l *Limiter) {
	m.mu.Lock()
	delete(m.live, l)
	m.mu.Unlock()
}
