// Package httplimit is the engine's rate limiting as net/http middleware:
// the same policy as the Caddy handler (an exact sliding log and three
// other algorithms, several windows, regions under a global ceiling, cost,
// bans, concurrency, fail modes, on Redis or in this process), the same 429
// body and headers, the same metrics. It imports nothing of Caddy.
//
//	lim, err := httplimit.New(httplimit.Config{
//		Limits: []httplimit.Limit{{Limit: 100, Window: time.Minute}},
//	})
//	if err != nil { ... }
//	defer lim.Close()
//	http.ListenAndServe(":8080", lim.Middleware(mux))
//
// Per request it maps the request to the engine's Input (key, region,
// cost) and the Decision to the reply, with the renderer the Caddy handler
// uses (internal/reply): nothing of the decision is its own.
package httplimit

import (
	"errors"
	"net/http"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/limitmetrics"
	"github.com/sliding-ratelimit/sliding_ratelimit/internal/reply"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// Limiter is a configured limiter. Middleware wraps handlers with it;
// Close releases its store when no handler uses it any more.
type Limiter struct {
	cfg      Config
	lim      *limiter.Limiter
	limits   []int64
	globals  []int64
	headers  reply.Plan
	refusals reply.Refusals
	metrics  *limitmetrics.Limiter
	set      *Metrics
	source   limitmetrics.Source
	closers  []func() error
}

// New checks cfg and builds its limiter; a bad configuration is an error
// naming the field at fault. It does not wait for Redis: until it answers,
// requests follow Fail.
func New(cfg Config) (*Limiter, error) {
	cfg.defaults()
	p, limits, globals, err := cfg.policy()
	if err != nil {
		return nil, err
	}
	l := &Limiter{cfg: cfg, limits: limits, globals: globals, set: cfg.Metrics}
	if l.set == nil {
		l.set = NewMetrics("") // counted, registered nowhere
	}
	store := "memory"
	if cfg.Redis != nil {
		store = "redis"
	}
	l.metrics = l.set.set.Limiter(cfg.Name, store)
	b, err := l.backend(&p)
	if err != nil {
		l.close()
		return nil, err
	}
	if l.lim, err = limiter.New(p, b); err != nil {
		l.close()
		return nil, policyError(err)
	}
	l.refusals.WithRegion = cfg.Region != nil
	policy := reply.StaticPolicy(l.lim, reply.StaticInput(limits, globals, cfg.MaxConcurrent))
	l.headers = reply.NewPlan(cfg.Headers, cfg.DryRun, policy)
	l.source.Name, l.source.Lim = cfg.Name, l.lim
	l.set.add(l)
	return l, nil
}

// backend opens the limiter's store stack (and the ledger of GlobalRedis).
func (l *Limiter) backend(p *limiter.Policy) (limiter.Backend, error) {
	cfg := &l.cfg
	var b limiter.Backend
	if cfg.Redis == nil {
		mem := limiter.NewMemoryStore()
		l.closers = append(l.closers, mem.Close)
		l.source.Memory = mem
		b = limiter.Backend{Store: mem, Source: limiter.SourceMemory, Notifier: mem}
	} else {
		st, err := cfg.Redis.OpenStore(nil)
		if err != nil {
			return b, configErr("Redis", "%v", err)
		}
		l.closers = append(l.closers, st.Close)
		l.source.Breaker = st.Breaker
		b = limiter.Backend{Store: st.Breaker, Base: st.Store, Source: limiter.SourceRedis, Remote: true,
			DenyCacheSize: cfg.DenyCacheSize, Notifier: st.Store}
		if cfg.Fail == "local" {
			mem := limiter.NewMemoryStore()
			l.closers = append(l.closers, mem.Close)
			l.source.Memory, b.Local = mem, mem
		}
	}
	if cfg.GlobalRedis != nil {
		client, _, ledger, err := cfg.GlobalRedis.OpenLedger()
		if err != nil {
			return b, configErr("GlobalRedis", "%v", err)
		}
		l.closers = append(l.closers, client.Close)
		l.metrics.Global = l.set.set.Global(cfg.Name, cfg.Datacenter, p.GlobalWindows)
		l.source.Global = l.metrics.Global
		b.Global = &limiter.Global{Ledger: ledger, Datacenter: cfg.Datacenter, Timeout: cfg.GlobalRedis.LedgerTimeout(),
			OnEvent: l.metrics.GlobalEvent}
	}
	return b, nil
}

// Close stops the limiter and closes its stores (and Redis clients).
func (l *Limiter) Close() error {
	l.set.remove(l)
	if l.lim != nil {
		l.lim.Close()
	}
	return l.close()
}

func (l *Limiter) close() error {
	var errs []error
	for i := len(l.closers) - 1; i >= 0; i-- {
		errs = append(errs, l.closers[i]())
	}
	l.closers = nil
	return errors.Join(errs...)
}

// Middleware wraps next: a request the limiter admits goes on with the
// rate limit headers; one it refuses is answered 429 (over a limit,
// banned, too many in flight: Retry-After and the JSON body), 413 (a cost
// that can never fit) or 503 (Redis down, Fail "closed"); gRPC requests
// get their gRPC status.
func (l *Limiter) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.serve(w, r, next)
	})
}

// serve is one request: its Input, the decision, its reply.
func (l *Limiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	in := limiter.Input{Identity: l.cfg.Key(r), Limits: l.limits, GlobalLimits: l.globals,
		Cost: l.cfg.Cost, MaxConcurrent: l.cfg.MaxConcurrent}
	if in.Identity == "" {
		l.metrics.EmptyKeys.Inc()
	}
	if l.cfg.Region != nil {
		in.Region = l.cfg.Region(r)
	}
	if l.cfg.CostFunc != nil {
		if in.Cost = l.cfg.CostFunc(r); in.Cost < 1 {
			http.Error(w, "rate limit cost is not a positive integer", http.StatusInternalServerError)
			return
		}
	}
	d, err := l.lim.Decide(r.Context(), &in)
	if err != nil {
		http.Error(w, "rate limit: "+err.Error(), http.StatusInternalServerError)
		return
	}
	l.metrics.Count(&d, l.cfg.WarnAt)
	if !d.Pass {
		status, body, retry := l.refusals.Of(&d)
		l.headers.SetHeaders(w.Header(), &d, status, retry, nil)
		_ = reply.Respond(w, r, &d, status, body, nil)
		return
	}
	if d.Outcome != limiter.OutcomeUnavailable {
		// Headers say what a store decided: none when none did (fail open).
		l.headers.Write(w.Header(), &d)
	}
	if l.cfg.MaxConcurrent > 0 {
		// The lease goes back when the handler returns, whatever happens.
		defer l.lim.Done(r.Context(), &d, 0)
	}
	next.ServeHTTP(w, r)
}
