package slidingratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// eventExceeded is the Caddy event emitted when a limiter starts denying.
const eventExceeded = "sliding_ratelimit_exceeded"

// ErrRateLimited is the error returned with `on_limit error`, so Caddy's
// handle_errors routes can render the 429.
var ErrRateLimited = errors.New("rate limit exceeded")

// Values of {http.sliding_ratelimit.source} beside "redis" and "memory".
const (
	sourceFailOpen   = "fail_open"
	sourceFailClosed = "fail_closed"
	sourceLocal      = "local"
	sourceDenyCache  = "deny_cache"
)

// maxEchoedRegion bounds the region echoed in a 429 body.
const maxEchoedRegion = 128

var (
	unavailableBody = []byte(`{"error":"rate_limiter_unavailable"}` + "\n")
	jsonContentType = []string{"application/json"}
)

// ServeHTTP decides the request: next handler, 429, 413 (a cost that can
// never fit), 500 (a dynamic limit that does not resolve) or, store down and
// fail closed, 503.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)

	limit, err := h.limit.resolve(repl, "limit")
	if err != nil {
		return h.badAmount(err)
	}
	cost, err := h.cost.resolve(repl, "cost")
	if err != nil {
		return h.badAmount(err)
	}
	var globalLimit int64
	if h.hasGlobal {
		if globalLimit, err = h.global.resolve(repl, "global_limit"); err != nil {
			return h.badAmount(err)
		}
	}

	identity := h.keyTmpl.expand(repl)
	var region string
	withRegion := h.Region != ""
	if withRegion {
		region = h.regionTmpl.expand(repl)
	}
	if cost > limit || (h.hasGlobal && cost > globalLimit) {
		return h.costTooHigh(w, repl, region, cost, limit, globalLimit)
	}

	req := h.request(identity, region, limit, globalLimit, cost)
	began := time.Now()
	res, err := h.check(r.Context(), &req)
	h.metrics.checkTime.Observe(time.Since(began).Seconds())
	if h.breaker != nil {
		// Write the gauge only when the state moved: a read of a shared
		// word per request, not a write.
		if st := int32(h.breaker.State()); atomic.LoadInt32(&h.circuitSeen) != st {
			atomic.StoreInt32(&h.circuitSeen, st)
			h.metrics.circuit.Set(float64(st))
		}
	}
	source := h.source
	if err != nil {
		h.metrics.storeError(err)
		h.logStoreError(err)
		if h.local == nil {
			return h.storeFailed(w, r, next, repl, region, limit)
		}
		// fail local: the same request, decided by this instance alone.
		if res, err = h.local.Allow(r.Context(), &req); err != nil {
			return h.storeFailed(w, r, next, repl, region, limit)
		}
		source = sourceLocal
	} else if res.Cached {
		source = sourceDenyCache
	}

	ph := placeholders(repl)
	ph.fromResult(&res, region, source)
	if h.hasGlobal {
		ph.withGlobal(&res.Global)
	}
	if res.Allowed {
		if source == sourceLocal {
			h.metrics.localAllowed.Inc()
		} else {
			h.metrics.allowed.Inc()
		}
		h.checkNearLimit(ph, &res, cost, identity)
		if !h.DryRun {
			h.writeHeaders(w.Header(), &res)
		}
		return next.ServeHTTP(w, r)
	}

	h.exceeded(identity, region, &res)
	if h.DryRun {
		h.metrics.dryRunDenied.Inc()
		ph.dryRun = true
		if ok, suppressed := h.dryLog.allow(time.Now()); ok {
			fields := []zap.Field{zap.String("limiter", h.Name), zap.String("region", region),
				zap.Int64("retry_after", retryAfterSeconds(&res)), zap.Int64("suppressed_since_last_log", suppressed)}
			if h.LogKey {
				fields = append(fields, zap.String("key", identity))
			}
			h.logger.Info("dry run: request would have been rate limited", fields...)
		}
		return next.ServeHTTP(w, r)
	}
	switch source {
	case sourceLocal:
		h.metrics.localDenied.Inc()
	case sourceDenyCache:
		h.metrics.cached.Inc()
	default:
		h.metrics.denied.Inc()
	}
	h.writeHeaders(w.Header(), &res)
	if h.OnLimit == "error" {
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(&res), 10))
		return caddyhttp.Error(http.StatusTooManyRequests, ErrRateLimited)
	}
	return h.deny(w, &res, withRegion, region)
}

// request builds the store request for identity in region (region is
// ignored without a region template; global without a global ceiling).
func (h *Handler) request(identity, region string, limit, global, cost int64) limiter.Request {
	req := limiter.Request{
		Algorithm: h.alg,
		Window:    time.Duration(h.Window),
		Cost:      cost,
		Bucket:    limiter.Bucket{Key: h.keys.Bucket(identity, h.Region != "", region), Limit: limit, Burst: h.Burst},
	}
	if h.hasGlobal {
		req.Global = limiter.Bucket{Key: h.keys.Global(identity), Limit: global}
	}
	if h.clockApp {
		req.Now = h.now()
	}
	return req
}

// check asks the store, with the Redis timeout when there is one.
func (h *Handler) check(ctx context.Context, req *limiter.Request) (limiter.Result, error) {
	if h.timeout <= 0 {
		return h.store.Allow(ctx, req)
	}
	// The timeout bounds the Redis call whatever the client does; a client
	// that goes away does not abort (and so not fail) it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.timeout)
	defer cancel()
	return h.store.Allow(ctx, req)
}

// checkNearLimit flags a request at or above warn_at of a budget: the
// placeholder on every such request; the counter and a (rate-limited) warn
// line on the request that crosses the threshold.
func (h *Handler) checkNearLimit(ph *phState, res *limiter.Result, cost int64, identity string) {
	if h.WarnAt <= 0 {
		return
	}
	near, crossed := nearLimit(&res.Bucket, cost, h.WarnAt)
	if h.hasGlobal {
		gNear, gCrossed := nearLimit(&res.Global, cost, h.WarnAt)
		near, crossed = near || gNear, crossed || gCrossed
	}
	if !near {
		return
	}
	ph.near = true
	if !crossed {
		return
	}
	h.metrics.nearLimit.Inc()
	if ok, suppressed := h.warnLog.allow(time.Now()); ok {
		fields := []zap.Field{zap.String("limiter", h.Name), zap.Int64("count", res.Bucket.Count),
			zap.Int64("limit", res.Bucket.Limit), zap.Float64("warn_at", h.WarnAt),
			zap.Int64("suppressed_since_last_log", suppressed)}
		if h.LogKey {
			fields = append(fields, zap.String("key", identity))
		}
		h.logger.Warn("client near its rate limit", fields...)
	}
}

// nearLimit reports whether usage is at or above ratio of the limit, and
// whether this request's cost took it there.
func nearLimit(u *limiter.Usage, cost int64, ratio float64) (near, crossed bool) {
	threshold := ratio * float64(u.Limit)
	near = float64(u.Count) >= threshold
	return near, near && float64(u.Count-cost) < threshold
}

// exceeded emits the sliding_ratelimit_exceeded event, at most once per
// period per limiter (one per burst of denials).
func (h *Handler) exceeded(identity, region string, res *limiter.Result) {
	if h.events == nil {
		return
	}
	ok, suppressed := h.eventGate.allow(time.Now())
	if !ok {
		return
	}
	data := map[string]any{
		"limiter":     h.Name,
		"region":      region,
		"retry_after": retryAfterSeconds(res),
		"limit":       res.Bucket.Limit,
		"suppressed":  suppressed,
		"dry_run":     h.DryRun,
	}
	if h.LogKey {
		data["key"] = identity
	}
	h.events.Emit(h.ctx, eventExceeded, data)
}

// badAmount answers 500 for a limit, global_limit or cost placeholder that
// did not resolve to a positive integer, and logs which one (once per burst).
func (h *Handler) badAmount(err error) error {
	if ok, suppressed := h.cfgLog.allow(time.Now()); ok {
		h.logger.Error("dynamic rate limit value is not a positive integer; answering 500",
			zap.String("limiter", h.Name),
			zap.Int64("suppressed_since_last_log", suppressed),
			zap.Error(err))
	}
	return caddyhttp.Error(http.StatusInternalServerError, err)
}

// costTooHigh answers 413 for a request that could never fit its limit:
// retrying cannot help, so it is not a 429.
func (h *Handler) costTooHigh(w http.ResponseWriter, repl *caddy.Replacer, region string, cost, limit, global int64) error {
	if h.hasGlobal && global < limit {
		limit = global
	}
	placeholders(repl).undecided(false, limit, region, "")
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusRequestEntityTooLarge)
	body := make([]byte, 0, 80)
	body = append(body, `{"error":"cost_exceeds_limit","cost":`...)
	body = strconv.AppendInt(body, cost, 10)
	body = append(body, `,"limit":`...)
	body = strconv.AppendInt(body, limit, 10)
	body = append(body, "}\n"...)
	_, err := w.Write(body)
	return err
}

// logStoreError logs a store failure once per burst, with the number of
// failures since the last line.
func (h *Handler) logStoreError(err error) {
	if ok, suppressed := h.errLog.allow(time.Now()); ok {
		h.logger.Error("rate limit store unavailable; applying fail mode",
			zap.String("limiter", h.Name),
			zap.String("fail", h.Fail),
			zap.Int64("suppressed_since_last_log", suppressed),
			zap.Error(err))
	}
}

// storeFailed applies fail open or fail closed.
func (h *Handler) storeFailed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, region string, limit int64) error {
	ph := placeholders(repl)
	if h.failOpen {
		h.metrics.failOpen.Inc()
		ph.undecided(true, limit, region, sourceFailOpen)
		return next.ServeHTTP(w, r)
	}
	h.metrics.failClosed.Inc()
	ph.undecided(false, limit, region, sourceFailClosed)
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, werr := w.Write(unavailableBody)
	return werr
}

// writeHeaders sets the rate limit headers chosen by `headers`. IETF headers
// get one list member per policy (the bucket, then the global ceiling), and
// members of several limiters in a route accumulate. Legacy headers describe
// the tightest budget: of the two policies, and of several limiters.
func (h *Handler) writeHeaders(hdr http.Header, res *limiter.Result) {
	if h.legacyHdr {
		tight := &res.Bucket
		if h.hasGlobal && res.Global.Remaining < tight.Remaining {
			tight = &res.Global
		}
		prev := hdr[hdrRemaining]
		if len(prev) == 0 || remainingAtMost(tight.Remaining, prev[0]) {
			if tight.Limit == h.limitVal.n && h.limitVal.s != "" {
				hdr[hdrLimit] = []string{h.limitVal.s}
			} else {
				hdr[hdrLimit] = []string{strconv.FormatInt(tight.Limit, 10)}
			}
			hdr[hdrRemaining] = []string{strconv.FormatInt(tight.Remaining, 10)}
		}
	}
	if h.ietfHdr {
		policy := h.policy
		if policy == "" {
			policy = h.policyHeader(res.Bucket.Limit, res.Global.Limit)
		}
		hdr[hdrPolicy] = append(hdr[hdrPolicy], policy)
		hdr[hdrRateLimit] = append(hdr[hdrRateLimit], h.rateLimitHeader(res))
	}
}

// headerValue is a header value formatted once, for a static limit. (Only
// the string is shared: each response gets its own slice, since later
// handlers such as Caddy's header replace may rewrite a value in place.)
type headerValue struct {
	n int64
	s string
}

// Header names in canonical form, so setting them needs no canonicalising.
const (
	hdrLimit     = "X-Ratelimit-Limit"
	hdrRemaining = "X-Ratelimit-Remaining"
	hdrPolicy    = "Ratelimit-Policy"
	hdrRateLimit = "Ratelimit"
	hdrRetry     = "Retry-After"
)

// remainingAtMost reports whether n is at most the (earlier limiter's)
// remaining count prev; a value that does not parse is replaced.
func remainingAtMost(n int64, prev string) bool {
	p, err := strconv.ParseInt(prev, 10, 64)
	return err != nil || n <= p
}

// policyHeader is the RateLimit-Policy value for the given limits.
func (h *Handler) policyHeader(limit, global int64) string {
	w := strconv.FormatInt(ceilSeconds(time.Duration(h.Window)), 10)
	s := `"` + h.Name + `";q=` + strconv.FormatInt(limit, 10) + ";w=" + w
	if h.hasGlobal {
		s += `, "` + h.Name + `-global";q=` + strconv.FormatInt(global, 10) + ";w=" + w
	}
	return s
}

// rateLimitHeader is the RateLimit value: remaining quota and the seconds
// until more comes back (on a denial, until the request would fit).
func (h *Handler) rateLimitHeader(res *limiter.Result) string {
	b := make([]byte, 0, 2*len(h.Name)+64)
	b = appendMember(b, h.Name, &res.Bucket)
	if h.hasGlobal {
		b = append(b, ", "...)
		b = appendMember(b, h.Name+"-global", &res.Global)
	}
	return unsafe.String(unsafe.SliceData(b), len(b)) // b is not used again

}

// appendMember appends one `"<name>";r=<remaining>;t=<seconds>` member.
func appendMember(b []byte, name string, u *limiter.Usage) []byte {
	t := u.ResetAfter
	if u.Denied {
		t = u.RetryAfter
	}
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, `";r=`...)
	b = strconv.AppendInt(b, u.Remaining, 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, ceilSeconds(t), 10)
}

// deny writes the 429 answer.
func (h *Handler) deny(w http.ResponseWriter, res *limiter.Result, withRegion bool, region string) error {
	secs := retryAfterSeconds(res)
	hdr := w.Header()
	hdr[hdrRetry] = []string{strconv.FormatInt(secs, 10)}
	hdr["Content-Type"] = jsonContentType
	body := make([]byte, 0, 96)
	body = append(body, `{"error":"rate_limited","retry_after":`...)
	body = strconv.AppendInt(body, secs, 10)
	if withRegion {
		if len(region) > maxEchoedRegion {
			region = region[:maxEchoedRegion]
		}
		q, _ := json.Marshal(region)
		body = append(body, `,"region":`...)
		body = append(body, q...)
	}
	body = append(body, "}\n"...)
	w.WriteHeader(http.StatusTooManyRequests)
	_, err := w.Write(body)
	return err
}

// retryAfterSeconds is Retry-After: whole seconds, rounded up, at least 1
// when denied; 0 when allowed.
func retryAfterSeconds(res *limiter.Result) int64 {
	if res.Allowed {
		return 0
	}
	return max(ceilSeconds(res.RetryAfter), 1)
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// peek reports the usage of identity's bucket in region (and its global
// ceiling) without recording anything. limit overrides a dynamic limit
// (0: the static limit, or 1 when it is dynamic; counts are exact whatever
// the limit).
func (h *Handler) peek(identity, region string, limit int64) (limiter.Result, error) {
	if limit <= 0 {
		limit = max(h.limit.static, 1)
	}
	req := h.request(identity, region, limit, max(h.global.static, 1), 1)
	ctx := context.Background()
	if h.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.timeout)
		defer cancel()
	}
	return h.store.Peek(ctx, &req)
}
