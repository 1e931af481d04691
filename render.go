package slidingratelimit

import (
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

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

// maxEchoedRegion bounds the region echoed in a 429 body.
const maxEchoedRegion = 128

// Header names in canonical form, so setting them needs no canonicalising.
const (
	hdrLimit     = "X-Ratelimit-Limit"
	hdrRemaining = "X-Ratelimit-Remaining"
	hdrPolicy    = "Ratelimit-Policy"
	hdrRateLimit = "Ratelimit"
	hdrRetry     = "Retry-After"
)

// headerPlan is what the rate limit headers of a limiter need, worked out
// once: which ones, and RateLimit-Policy when it never changes.
type headerPlan struct {
	legacy, ietf bool
	policy       string // RateLimit-Policy when static, else ""
}

func planHeaders(h *Handler, p *limiter.Policy) headerPlan {
	// A dry run sends none: clients notice nothing.
	hp := headerPlan{
		legacy: !h.DryRun && (h.Headers == "both" || h.Headers == "legacy"),
		ietf:   !h.DryRun && (h.Headers == "both" || h.Headers == "ietf"),
	}
	static := !hasPeriod(p.Windows) && !hasPeriod(p.GlobalWindows) && h.rt.concurrent.tmpl == ""
	for _, a := range append(append([]amount(nil), h.rt.limits...), h.rt.globals...) {
		static = static && a.tmpl == ""
	}
	if static {
		if ws, err := h.rt.lim.Windows(staticInput(h)); err == nil {
			hp.policy = policyHeader(ws)
		}
	}
	return hp
}

// staticInput is an Input of the static limits.
func staticInput(h *Handler) *limiter.Input {
	in := &limiter.Input{Cost: 1, MaxConcurrent: max(h.rt.concurrent.static, 1)}
	for _, a := range h.rt.limits {
		in.Limits = append(in.Limits, a.static)
	}
	for _, a := range h.rt.globals {
		in.GlobalLimits = append(in.GlobalLimits, a.static)
	}
	return in
}

// policyHeader is RateLimit-Policy: one item per window.
func policyHeader(ws []limiter.WindowUsage) string {
	return string(appendPolicy(make([]byte, 0, 48*len(ws)), ws))
}

func appendPolicy(b []byte, ws []limiter.WindowUsage) []byte {
	for i := range ws {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, '"')
		b = append(b, ws[i].Policy...)
		b = append(b, `";q=`...)
		b = strconv.AppendInt(b, ws[i].Limit, 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, ws[i].Seconds, 10)
	}
	return b
}

// appendRateLimit appends RateLimit: one item per window the decision
// knows, r the units left (0 for a window that denied), t the seconds until
// more come back (until the window has room, when it denied). Nothing when
// it knows none.
func appendRateLimit(b []byte, ws []limiter.WindowUsage) []byte {
	start := len(b)
	for i := range ws {
		w := &ws[i]
		if !w.Known && !w.Denied {
			continue
		}
		if len(b) > start {
			b = append(b, ", "...)
		}
		b = append(b, '"')
		b = append(b, w.Policy...)
		b = append(b, `";r=`...)
		b = strconv.AppendInt(b, w.Remaining, 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, ceilSeconds(w.Reset), 10)
	}
	return b
}

// write sets the rate limit headers chosen by `headers`. IETF headers get
// one list member per window, and the members of several limiters in a
// route accumulate. Legacy headers describe the tightest window: of this
// limiter, and of several limiters. Every value is this response's own
// (later handlers may rewrite values in place).
//
// A response pays two allocations for them all: the values are built in
// one buffer and made one string, each value a substring of it (strings
// do not change), and one array backs the headers' value slices, each
// slice capped at its one value so that an append (by a later limiter or
// handler) copies instead of writing into its neighbour.
func (hp *headerPlan) write(hdr http.Header, d *limiter.Decision) { hp.writeInto(hdr, d, nil) }

// writeInto is write with the array that backs the value slices given
// (the request's, see valsBuf; its first 4); nil makes one.
func (hp *headerPlan) writeInto(hdr http.Header, d *limiter.Decision, arr *[6]string) {
	var t *limiter.WindowUsage
	if hp.legacy {
		if t = d.Tightest(); t != nil {
			if prev := hdr[hdrRemaining]; len(prev) > 0 && !remainingAtMost(t.Remaining, prev[0]) {
				t = nil
			}
		}
	}
	if t == nil && !hp.ietf {
		return
	}
	var bytes [160]byte
	b := bytes[:0]
	var ends [4]int // the ends in b of the limit, remaining, policy and RateLimit values
	if t != nil {
		b = strconv.AppendInt(b, t.Limit, 10)
		ends[0] = len(b)
		b = strconv.AppendInt(b, t.Remaining, 10)
		ends[1] = len(b)
	}
	policy := hp.policy
	if hp.ietf {
		if policy == "" || d.Overridden {
			b = appendPolicy(b, d.Windows)
		}
		ends[2] = len(b)
		b = appendRateLimit(b, d.Windows)
		ends[3] = len(b)
	}
	all := string(b)
	var vals []string
	if arr != nil {
		vals = arr[:0:4]
	} else {
		vals = new([4]string)[:0]
	}
	set := func(name, v string, add bool) {
		if prev := hdr[name]; add && len(prev) > 0 {
			hdr[name] = append(prev, v)
			return
		}
		vals = append(vals, v)
		hdr[name] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	if t != nil {
		set(hdrLimit, all[:ends[0]], false)
		set(hdrRemaining, all[ends[0]:ends[1]], false)
	}
	if hp.ietf {
		if policy == "" || d.Overridden {
			policy = all[ends[1]:ends[2]]
		}
		set(hdrPolicy, policy, true)
		if ends[3] > ends[2] {
			set(hdrRateLimit, all[ends[2]:ends[3]], true)
		}
	}
}

// remainingAtMost reports whether n is at most the (earlier limiter's)
// remaining count prev; a value that does not parse is replaced.
func remainingAtMost(n int64, prev string) bool {
	p, err := strconv.ParseInt(prev, 10, 64)
	return err != nil || n <= p
}

// retryAfterSeconds is Retry-After: whole seconds, rounded up, at least 1
// for a refusal; 0 when allowed.
func retryAfterSeconds(d *limiter.Decision) int64 {
	if d.Outcome == limiter.OutcomeAllowed {
		return 0
	}
	return max(ceilSeconds(d.RetryAfter), 1)
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// refuse answers a request the decision refused: 429 (over a limit,
// banned, too many in flight), 413 (a cost that can never fit) or 503
// (the store failed, fail closed); the gRPC way for gRPC requests; as a
// Caddy error for handle_errors with `on_limit error`.
//
// vals, when set, backs the value slices of the headers it sets (the
// request's, see valsBuf). A plain 429 (no region, no reason) takes its
// body and Retry-After from the handler's last one when the seconds are
// the same: under a hot key's denials they change once a second.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, d *limiter.Decision, vals *[6]string) error {
	var (
		status int
		body   []byte
		err    error
		retry  string
	)
	if plain := h.Region == "" && d.Outcome == limiter.OutcomeLimited; plain {
		status, err = http.StatusTooManyRequests, ErrRateLimited
		secs := retryAfterSeconds(d)
		t := h.rt.last429.Load()
		if t == nil || t.secs != secs {
			t = &refusalText{secs: secs, body: limitedBody(d, false), retry: strconv.FormatInt(secs, 10)}
			h.rt.last429.Store(t)
		}
		body, retry = t.body, t.retry
	} else {
		status, body, err = refusal(d, h.Region != "")
	}
	one := func(i int, v string) []string {
		if vals == nil {
			return []string{v}
		}
		vals[i] = v
		return vals[i : i+1 : i+1]
	}
	hdr := w.Header()
	switch status {
	case http.StatusTooManyRequests:
		h.rt.headers.writeInto(hdr, d, vals)
		if retry == "" {
			retry = strconv.FormatInt(retryAfterSeconds(d), 10)
		}
		hdr[hdrRetry] = one(4, retry)
	case http.StatusServiceUnavailable:
		hdr[hdrRetry] = one(4, "1")
	}
	if isGRPC(r) {
		return writeGRPC(w, status, d)
	}
	if h.OnLimit == "error" {
		return caddyhttp.Error(status, err)
	}
	hdr["Content-Type"] = one(5, "application/json")
	w.WriteHeader(status)
	_, werr := w.Write(body)
	return werr
}

// refusalText is a plain 429's body and Retry-After for a number of
// seconds; shared by the responses that send it (the body is only read:
// a Write must not modify nor keep what it is given).
type refusalText struct {
	secs  int64
	body  []byte
	retry string
}

// refusal maps a decision to its status, body and error.
func refusal(d *limiter.Decision, withRegion bool) (int, []byte, error) {
	switch d.Outcome {
	case limiter.OutcomeTooLarge:
		return http.StatusRequestEntityTooLarge, costBody(d), ErrCostTooHigh
	case limiter.OutcomeUnavailable:
		return http.StatusServiceUnavailable, []byte(`{"error":"rate_limiter_unavailable"}` + "\n"), ErrStoreUnavailable
	}
	return http.StatusTooManyRequests, limitedBody(d, withRegion), ErrRateLimited
}

// limitedBody is the 429 body:
// {"error":"rate_limited","retry_after":N[,"region":"..."][,"reason":"banned"|"concurrency"]}.
func limitedBody(d *limiter.Decision, withRegion bool) []byte {
	secs := retryAfterSeconds(d)
	body := make([]byte, 0, 96)
	body = append(body, `{"error":"rate_limited","retry_after":`...)
	body = strconv.AppendInt(body, secs, 10)
	if withRegion {
		region := d.Region
		if len(region) > maxEchoedRegion {
			region = region[:maxEchoedRegion]
		}
		q, _ := json.Marshal(region)
		body = append(body, `,"region":`...)
		body = append(body, q...)
	}
	switch d.Outcome {
	case limiter.OutcomeBanned:
		body = append(body, `,"reason":"banned"`...)
	case limiter.OutcomeConcurrency:
		body = append(body, `,"reason":"concurrency"`...)
	}
	return append(body, "}\n"...)
}

// costBody is the 413 body: {"error":"cost_exceeds_limit","cost":N,"limit":N}
// with the smallest capacity the cost is above.
func costBody(d *limiter.Decision) []byte {
	var limit int64
	for i := range d.Windows {
		if c := d.Windows[i].Limit; c < d.Cost && (limit == 0 || c < limit) {
			limit = c
		}
	}
	body := make([]byte, 0, 80)
	body = append(body, `{"error":"cost_exceeds_limit","cost":`...)
	body = strconv.AppendInt(body, d.Cost, 10)
	body = append(body, `,"limit":`...)
	body = strconv.AppendInt(body, limit, 10)
	return append(body, "}\n"...)
}

// isGRPC reports whether the request is gRPC (application/grpc, +proto,
// +json).
func isGRPC(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if !strings.HasPrefix(ct, "application/grpc") {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/grpc" || strings.HasPrefix(mt, "application/grpc+"))
}

// gRPC status codes.
const (
	grpcResourceExhausted = 8
	grpcUnavailable       = 14
)

// writeGRPC answers a gRPC request the gRPC way: HTTP 200, trailers only,
// grpc-status RESOURCE_EXHAUSTED (429, 413) or UNAVAILABLE (503), a
// grpc-message, and grpc-retry-pushback-ms for a client's retry policy.
func writeGRPC(w http.ResponseWriter, status int, d *limiter.Decision) error {
	hdr := w.Header()
	code, msg := grpcResourceExhausted, "rate limit exceeded, retry after "+strconv.FormatInt(retryAfterSeconds(d), 10)+"s"
	switch status {
	case http.StatusServiceUnavailable:
		code, msg = grpcUnavailable, "rate limiter unavailable"
	case http.StatusRequestEntityTooLarge:
		msg = "request cost exceeds the rate limit"
	}
	hdr["Content-Type"] = []string{"application/grpc"}
	hdr["Grpc-Status"] = []string{strconv.Itoa(code)}
	hdr["Grpc-Message"] = []string{msg}
	if status == http.StatusTooManyRequests {
		hdr["Grpc-Retry-Pushback-Ms"] = []string{strconv.FormatInt(retryAfterSeconds(d)*1000, 10)}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// observe renders the decision into metrics, the request's placeholders
// ph, logs and events.
func (h *Handler) observe(ph *phState, d *limiter.Decision) {
	h.rt.metrics.observe(d)
	ph.set(h, d)
	if d.Err != nil {
		h.logStoreError(d)
	}
	if d.Outcome == limiter.OutcomeAllowed {
		if near, crossed := h.nearLimit(d); near {
			ph.near = true
			if crossed {
				h.rt.metrics.nearLimit.Inc()
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
		h.rt.metrics.bans.Inc()
		h.emit(eventBanned, d, h.rt.logs.banEvent, now)
	}
	h.emit(eventExceeded, d, h.rt.logs.event, now)
	if d.DryRun {
		h.logDryRun(d)
	}
}

// nearLimit reports whether a window is at or above warn_at of its limit,
// and whether this request's cost took it there.
func (h *Handler) nearLimit(d *limiter.Decision) (near, crossed bool) {
	if h.WarnAt <= 0 {
		return false, false
	}
	for i := range d.Windows {
		u := &d.Windows[i]
		if !u.Known {
			continue
		}
		threshold := h.WarnAt * float64(u.Limit)
		if float64(u.Count) >= threshold {
			near = true
			crossed = crossed || float64(u.Count-d.Cost) < threshold
		}
	}
	return near, crossed
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
