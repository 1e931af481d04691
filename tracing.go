package slidingratelimit

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// The span attributes of a decision (Caddy's tracing directive makes the
// request's span; without it, or when the span is not sampled, nothing is
// done).
const (
	attrLimiter    = attribute.Key("ratelimit.limiter")
	attrAllowed    = attribute.Key("ratelimit.allowed")
	attrOutcome    = attribute.Key("ratelimit.outcome")
	attrLimit      = attribute.Key("ratelimit.limit")
	attrRemaining  = attribute.Key("ratelimit.remaining")
	attrSource     = attribute.Key("ratelimit.source")
	attrRetryAfter = attribute.Key("ratelimit.retry_after")
	attrDryRun     = attribute.Key("ratelimit.dry_run")
	attrOverridden = attribute.Key("ratelimit.overridden")
	attrRegion     = attribute.Key("ratelimit.region")
)

// eventDenied is the span event of a refusal (a 429, 413, or fail closed's
// 503), or in a dry run of what would have been one.
const eventDenied = "ratelimit.denied"

// trace puts the decision on the request's span: attributes of the
// tightest window (several limiters in a route: the last one to decide,
// which is the one that refused when one did), and an event on a refusal.
func (h *Handler) trace(ctx context.Context, d *limiter.Decision) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	allowed := d.Outcome == limiter.OutcomeAllowed
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs,
		attrLimiter.String(h.Name),
		attrAllowed.Bool(allowed),
		attrOutcome.String(d.Outcome.String()),
		attrSource.String(string(d.Source)),
		attrRetryAfter.Int64(retryAfterSeconds(d)),
	)
	if t := d.Tightest(); t != nil {
		attrs = append(attrs, attrLimit.Int64(t.Limit), attrRemaining.Int64(t.Remaining))
	}
	if d.Region != "" {
		attrs = append(attrs, attrRegion.String(d.Region))
	}
	if d.DryRun {
		attrs = append(attrs, attrDryRun.Bool(true))
	}
	if d.Overridden {
		attrs = append(attrs, attrOverridden.Bool(true))
	}
	span.SetAttributes(attrs...)
	if !allowed && (!d.Pass || d.DryRun) {
		span.AddEvent(eventDenied, trace.WithAttributes(attrs...))
	}
}
