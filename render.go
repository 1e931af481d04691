package slidingratelimit

import (
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sliding-ratelimit/sliding_ratelimit/internal/reply"
	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// Errors returned with `on_limit error`, so Caddy's handle_errors routes
// can render the refusal ({err.status_code} tells which).
var (
	ErrRateLimited      = errors.New("rate limit exceeded")
	ErrCostTooHigh      = errors.New("request cost exceeds the rate limit: it can never pass")
	ErrStoreUnavailable = errors.New("rate limiter store unavailable")
)

// Event names.
const (
	eventExceeded = "sliding_ratelimit_exceeded"
	eventBanned   = "sliding_ratelimit_banned"
)

// Header names in canonical form (internal/reply writes them).
const (
	hdrLimit     = reply.HdrLimit
	hdrRemaining = reply.HdrRemaining
	hdrPolicy    = reply.HdrPolicy
	hdrRateLimit = reply.HdrRateLimit
	hdrRetry     = reply.HdrRetry
)

// planHeaders works out, once, the rate limit headers of the limiter:
// which ones, and RateLimit-Policy when it never changes (no calendar
// period, no limit from a placeholder).
func planHeaders(h *Handler, p *limiter.Policy) reply.Plan {
	static := !hasPeriod(p.Windows) && !hasPeriod(p.GlobalWindows) && h.rt.concurrent.tmpl == ""
	for _, a := range append(append([]amount(nil), h.rt.limits...), h.rt.globals...) {
		static = static && a.tmpl == ""
	}
	policy := ""
	if static {
		policy = reply.StaticPolicy(h.rt.lim, staticInput(h))
	}
	return reply.NewPlan(h.Headers, h.DryRun, policy)
}

// staticInput is an Input of the static limits.
func staticInput(h *Handler) *limiter.Input {
	var limits, globals []int64
	for _, a := range h.rt.limits {
		limits = append(limits, a.static)
	}
	for _, a := range h.rt.globals {
		globals = append(globals, a.static)
	}
	return reply.StaticInput(limits, globals, h.rt.concurrent.static)
}

// retryAfterSeconds is Retry-After: whole seconds, rounded up, at least 1
// for a refusal; 0 when allowed.
func retryAfterSeconds(d *limiter.Decision) int64 { return reply.RetryAfterSeconds(d) }

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 { return reply.CeilSeconds(d) }

// refuse answers a request the decision refused: 429 (over a limit,
// banned, too many in flight), 413 (a cost that can never fit) or 503
// (the store failed, fail closed); the gRPC way for gRPC requests; as a
// Caddy error for handle_errors with `on_limit error`. internal/reply
// renders all but the Caddy error.
//
// vals, when set, backs the value slices of the headers it sets (the
// request's, see valsBuf).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, d *limiter.Decision, vals *[6]string) error {
	status, body, retry := h.rt.refusals.Of(d)
	h.rt.headers.SetHeaders(w.Header(), d, status, retry, vals)
	if h.OnLimit == "error" && !reply.IsGRPC(r) {
		return caddyhttp.Error(status, refusalErr(status))
	}
	return reply.Respond(w, r, d, status, body, vals)
}

// refusalErr is the error of a refusal's status, for handle_errors.
func refusalErr(status int) error {
	switch status {
	case http.StatusRequestEntityTooLarge:
		return ErrCostTooHigh
	case http.StatusServiceUnavailable:
		return ErrStoreUnavailable
	}
	return ErrRateLimited
}

// observe renders the decision into metrics, the request's placeholders
// ph, logs and events.
func (h *Handler) observe(ph *phState, d *limiter.Decision) {
	near, crossed := h.rt.metrics.Count(d, h.WarnAt)
	ph.set(h, d)
	if d.Err != nil {
		h.logStoreError(d)
	}
	if d.Outcome == limiter.OutcomeAllowed {
		if near {
			ph.near = true
			if crossed {
				h.logNearLimit(d)
				h.rt.top.note(kindNear, d.Identity, d.Region, h.LogKey, 0, h.rt.now())
			}
		}
		return
	}
	if d.Outcome == limiter.OutcomeUnavailable {
		return
	}
	now := h.rt.now()
	h.rt.top.note(kindDenied, d.Identity, d.Region, h.LogKey, retryAfterSeconds(d), now)
	if h.rt.testClock {
		now = time.Now() // the events' gates count on the wall clock
	}
	if d.BanStarted {
		h.emit(eventBanned, d, h.rt.logs.banEvent, now)
	}
	h.emit(eventExceeded, d, h.rt.logs.event, now)
	if d.DryRun {
		h.logDryRun(d)
	}
}

func (h *Handler) logNearLimit(d *limiter.Decision) {
	ok, suppressed := h.rt.logs.near.allow(time.Now())
	if !ok {
		return
	}
	fields := []zap.Field{zap.String("limiter", h.Name), zap.Float64("warn_at", h.WarnAt),
		zap.Int64("suppressed_since_last_log", suppressed)}
	if t := d.Tightest(); t != nil {
		fields = append(fields, zap.String("window", t.Policy), zap.Int64("count", t.Count), zap.Int64("limit", t.Limit))
	}
	if h.LogKey {
		fields = append(fields, zap.String("key", d.Identity))
	}
	h.rt.logger.Warn("client near its rate limit", fields...)
}

func (h *Handler) logDryRun(d *limiter.Decision) {
	ok, suppressed := h.rt.logs.dryRun.allow(time.Now())
	if !ok {
		return
	}
	fields := []zap.Field{zap.String("limiter", h.Name), zap.String("region", d.Region),
		zap.String("outcome", d.Outcome.String()), zap.Int64("retry_after", retryAfterSeconds(d)),
		zap.Int64("suppressed_since_last_log", suppressed)}
	if h.LogKey {
		fields = append(fields, zap.String("key", d.Identity))
	}
	h.rt.logger.Info("dry run: request would have been rate limited", fields...)
}

// logStoreError logs a store failure once per burst, with the number of
// failures since the last line.
func (h *Handler) logStoreError(d *limiter.Decision) {
	if ok, suppressed := h.rt.logs.store.allow(time.Now()); ok {
		h.rt.logger.Error("rate limit store unavailable; applying fail mode",
			zap.String("limiter", h.Name),
			zap.String("fail", h.Fail),
			zap.String("source", string(d.Source)),
			zap.Int64("suppressed_since_last_log", suppressed),
			zap.Error(d.Err))
	}
}

// emit sends an event, at most once per period per limiter and kind (now:
// the wall clock).
func (h *Handler) emit(name string, d *limiter.Decision, gate *burstLogger, now time.Time) {
	if h.rt.events == nil {
		return
	}
	ok, suppressed := gate.allow(now)
	if !ok {
		return
	}
	data := map[string]any{
		"limiter":     h.Name,
		"region":      d.Region,
		"retry_after": retryAfterSeconds(d),
		"outcome":     d.Outcome.String(),
		"suppressed":  suppressed,
		"dry_run":     d.DryRun,
	}
	if t := d.Tightest(); t != nil {
		data["limit"] = t.Limit
		data["window"] = t.Policy
	}
	if d.Banned {
		data["ban_left"] = ceilSeconds(d.BanLeft)
	}
	if h.LogKey {
		data["key"] = d.Identity
	}
	h.rt.events.Emit(h.rt.ctx, name, data)
}

// burstLogger lets a line (or an event) through at most once per period,
// counting the rest.
type burstLogger struct {
	every      time.Duration
	last       atomic.Int64 // unix ns of the last line
	suppressed atomic.Int64
}

// allow reports whether a line may be written now, and how many were
// suppressed since the last one.
func (b *burstLogger) allow(now time.Time) (bool, int64) {
	last := b.last.Load()
	if now.UnixNano()-last < int64(b.every) || !b.last.CompareAndSwap(last, now.UnixNano()) {
		b.suppressed.Add(1)
		return false, 0
	}
	return true, b.suppressed.Swap(0)
}

// logGates are a limiter's rate-limited log lines and events: at most one
// of each per 10 s, never one per request.
type logGates struct {
	store, config, near, dryRun, event, banEvent *burstLogger
	emptyKey                                     *burstLogger // once a minute
}

func newLogGates() logGates {
	g := func() *burstLogger { return &burstLogger{every: 10 * time.Second} }
	return logGates{store: g(), config: g(), near: g(), dryRun: g(), event: g(), banEvent: g(),
		emptyKey: &burstLogger{every: emptyKeyLogEvery}}
}
