package slidingratelimit

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// Placeholder names set on every request.
const (
	phAllowed         = "http.sliding_ratelimit.allowed"
	phCount           = "http.sliding_ratelimit.count"
	phLimit           = "http.sliding_ratelimit.limit"
	phRemaining       = "http.sliding_ratelimit.remaining"
	phRetryAfter      = "http.sliding_ratelimit.retry_after"
	phRegion          = "http.sliding_ratelimit.region"
	phSource          = "http.sliding_ratelimit.source"
	phGlobalCount     = "http.sliding_ratelimit.global_count"
	phGlobalLimit     = "http.sliding_ratelimit.global_limit"
	phGlobalRemaining = "http.sliding_ratelimit.global_remaining"
)

// Values of {http.sliding_ratelimit.source} beside "redis" and "memory".
const (
	sourceFailOpen   = "fail_open"
	sourceFailClosed = "fail_closed"
	sourceLocal      = "local"
)

// maxEchoedRegion bounds the region echoed in a 429 body.
const maxEchoedRegion = 128

var unavailableBody = []byte(`{"error":"rate_limiter_unavailable"}` + "\n")

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

	identity := repl.ReplaceAll(h.Key, "")
	var region string
	withRegion := h.Region != ""
	if withRegion {
		region = repl.ReplaceAll(h.Region, "")
	}
	if cost > limit || (h.hasGlobal && cost > globalLimit) {
		return h.costTooHigh(w, repl, region, cost, limit, globalLimit)
	}

	req := limiter.Request{
		Algorithm: h.alg,
		Window:    time.Duration(h.Window),
		Cost:      cost,
		Bucket:    limiter.Bucket{Key: h.keys.Bucket(identity, withRegion, region), Limit: limit},
	}
	if h.hasGlobal {
		req.Global = limiter.Bucket{Key: h.keys.Global(identity), Limit: globalLimit}
	}
	if h.clockApp {
		req.Now = h.now()
	}

	var res limiter.Result
	source := h.source
	if h.timeout > 0 {
		// The timeout bounds the Redis call whatever the client does; a
		// client that goes away does not abort (and so not fail) it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.timeout)
		res, err = h.store.Allow(ctx, &req)
		cancel()
	} else {
		res, err = h.store.Allow(r.Context(), &req)
	}
	if err != nil {
		h.logStoreError(err)
		if h.local == nil {
			return h.storeFailed(w, r, next, repl, region, limit)
		}
		// fail local: the same request, decided by this instance alone.
		if res, err = h.local.Allow(r.Context(), &req); err != nil {
			return h.storeFailed(w, r, next, repl, region, limit)
		}
		source = sourceLocal
	}

	h.setPlaceholders(repl, &res, region, source)
	h.writeHeaders(w.Header(), &res)
	if !res.Allowed {
		return h.deny(w, &res, withRegion, region)
	}
	return next.ServeHTTP(w, r)
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
	repl.Set(phAllowed, false)
	repl.Set(phLimit, limit)
	repl.Set(phRegion, region)
	repl.Set(phRetryAfter, 0)
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
	repl.Set(phLimit, limit)
	repl.Set(phRegion, region)
	repl.Set(phCount, "")
	repl.Set(phRemaining, "")
	repl.Set(phRetryAfter, 0)
	if h.failOpen {
		repl.Set(phAllowed, true)
		repl.Set(phSource, sourceFailOpen)
		return next.ServeHTTP(w, r)
	}
	repl.Set(phAllowed, false)
	repl.Set(phSource, sourceFailClosed)
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, werr := w.Write(unavailableBody)
	return werr
}

func (h *Handler) setPlaceholders(repl *caddy.Replacer, res *limiter.Result, region, source string) {
	repl.Set(phAllowed, res.Allowed)
	repl.Set(phCount, res.Bucket.Count)
	repl.Set(phLimit, res.Bucket.Limit)
	repl.Set(phRemaining, res.Bucket.Remaining)
	repl.Set(phRetryAfter, retryAfterSeconds(res))
	repl.Set(phRegion, region)
	repl.Set(phSource, source)
	if h.hasGlobal {
		repl.Set(phGlobalCount, res.Global.Count)
		repl.Set(phGlobalLimit, res.Global.Limit)
		repl.Set(phGlobalRemaining, res.Global.Remaining)
	}
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
		prev := hdr.Get("X-RateLimit-Remaining")
		if n, err := strconv.ParseInt(prev, 10, 64); prev == "" || err != nil || tight.Remaining <= n {
			hdr.Set("X-RateLimit-Limit", strconv.FormatInt(tight.Limit, 10))
			hdr.Set("X-RateLimit-Remaining", strconv.FormatInt(tight.Remaining, 10))
		}
	}
	if h.ietfHdr {
		policy := h.policy
		if policy == "" {
			policy = h.policyHeader(res.Bucket.Limit, res.Global.Limit)
		}
		hdr.Add("RateLimit-Policy", policy)
		hdr.Add("RateLimit", h.rateLimitHeader(res))
	}
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
	member := func(name string, u *limiter.Usage) string {
		t := u.ResetAfter
		if u.Denied {
			t = u.RetryAfter
		}
		return `"` + name + `";r=` + strconv.FormatInt(u.Remaining, 10) + ";t=" + strconv.FormatInt(ceilSeconds(t), 10)
	}
	s := member(h.Name, &res.Bucket)
	if h.hasGlobal {
		s += ", " + member(h.Name+"-global", &res.Global)
	}
	return s
}

// deny writes the 429 answer.
func (h *Handler) deny(w http.ResponseWriter, res *limiter.Result, withRegion bool, region string) error {
	secs := retryAfterSeconds(res)
	hdr := w.Header()
	hdr.Set("Retry-After", strconv.FormatInt(secs, 10))
	hdr.Set("Content-Type", "application/json")
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
// ceiling) without recording anything. A dynamic limit is peeked at as 1:
// counts are exact whatever the limit.
func (h *Handler) peek(identity, region string) (limiter.Result, error) {
	req := limiter.Request{
		Algorithm: h.alg,
		Window:    time.Duration(h.Window),
		Cost:      1,
		Bucket:    limiter.Bucket{Key: h.keys.Bucket(identity, h.Region != "", region), Limit: max(h.limit.static, 1)},
	}
	if h.hasGlobal {
		req.Global = limiter.Bucket{Key: h.keys.Global(identity), Limit: max(h.global.static, 1)}
	}
	if h.clockApp {
		req.Now = h.now()
	}
	ctx := context.Background()
	if h.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.timeout)
		defer cancel()
	}
	return h.store.Peek(ctx, &req)
}
