package slidingratelimit

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestTracingSpanCarriesTheDecision: with a recording span on the request
// (what Caddy's tracing directive gives), the span carries the limiter, the
// outcome, the limit and what is left, the source and the retry time, and a
// denial adds an event; a request without a span is served as before.
func TestTracingSpanCarriesTheDecision(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h := &Handler{Name: uniqueName(), Key: "{http.request.header.X-API-Key}", Limit: "2", Window: caddy.Duration(time.Minute)}
	provision(t, h, newTestClock())

	send := func() int {
		w, r, _ := newRequest(map[string]string{"X-API-Key": "K"})
		ctx, span := tp.Tracer("test").Start(r.Context(), "request")
		if err := h.ServeHTTP(w, r.WithContext(ctx), nextOK); err != nil {
			t.Fatal(err)
		}
		span.End()
		return w.Code
	}
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if got := send(); got != want {
			t.Fatalf("request %d: %d, want %d", i, got, want)
		}
	}
	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans ended, want 3", len(spans))
	}
	attrs := func(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range kvs {
			m[kv.Key] = kv.Value
		}
		return m
	}
	first, last := attrs(spans[0].Attributes()), attrs(spans[2].Attributes())
	for _, c := range []struct {
		got  attribute.Value
		want any
	}{
		{first[attrLimiter], h.Name}, {first[attrAllowed], true}, {first[attrOutcome], "allowed"},
		{first[attrLimit], int64(2)}, {first[attrRemaining], int64(1)}, {first[attrSource], "memory"}, {first[attrRetryAfter], int64(0)},
		{last[attrAllowed], false}, {last[attrOutcome], "limited"}, {last[attrRemaining], int64(0)}, {last[attrRetryAfter], int64(60)},
	} {
		if c.got.AsInterface() != c.want {
			t.Errorf("span attribute %v, want %v (first: %v, last: %v)", c.got.AsInterface(), c.want, first, last)
		}
	}
	if n := len(spans[0].Events()); n != 0 {
		t.Errorf("an admitted request's span has %d events, want none", n)
	}
	ev := spans[2].Events()
	if len(ev) != 1 || ev[0].Name != eventDenied || attrs(ev[0].Attributes)[attrRetryAfter].AsInt64() != 60 {
		t.Errorf("the denied request's span events: %+v, want one %q with its retry_after", ev, eventDenied)
	}

	// No span (no tracing directive): the same answers, nothing recorded.
	w := serve(t, h, map[string]string{"X-API-Key": "other"})
	if w.Code != http.StatusOK || len(rec.Ended()) != 3 {
		t.Errorf("without a span: %d, %d spans", w.Code, len(rec.Ended()))
	}
}
