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
	phAllowed    = "http.sliding_ratelimit.allowed"
	phCount      = "http.sliding_ratelimit.count"
	phLimit      = "http.sliding_ratelimit.limit"
	phRemaining  = "http.sliding_ratelimit.remaining"
	phRetryAfter = "http.sliding_ratelimit.retry_after"
	phRegion     = "http.sliding_ratelimit.region"
	phSource     = "http.sliding_ratelimit.source"
)

// Values of {http.sliding_ratelimit.source} beside "redis" and "memory".
const (
	sourceFailOpen   = "fail_open"
	sourceFailClosed = "fail_closed"
)

// maxEchoedRegion bounds the region echoed in a 429 body.
const maxEchoedRegion = 128

var unavailableBody = []byte(`{"error":"rate_limiter_unavailable"}` + "\n")

// ServeHTTP decides the request: next handler, 429, or (store down and fail
// closed) 503.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)

	identity := repl.ReplaceAll(h.Key, "")
	var region string
	withRegion := h.Region != ""
	if withRegion {
		region = repl.ReplaceAll(h.Region, "")
	}
	req := limiter.Request{
		Algorithm: h.alg,
		Window:    time.Duration(h.Window),
		Cost:      1,
		Bucket:    limiter.Bucket{Key: h.keys.Bucket(identity, withRegion, region), Limit: h.Limit},
	}
	if h.clockApp {
		req.Now = h.now()
	}

	var (
		res limiter.Result
		err error
	)
	if h.timeout > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
		res, err = h.store.Allow(ctx, &req)
		cancel()
	} else {
		res, err = h.store.Allow(r.Context(), &req)
	}
	if err != nil {
		return h.storeFailed(w, r, next, repl, region, err)
	}

	h.setPlaceholders(repl, &res, region, h.source)
	h.writeHeaders(w.Header(), &res)
	if !res.Allowed {
		return h.deny(w, &res, withRegion, region)
	}
	return next.ServeHTTP(w, r)
}

// storeFailed applies the fail mode and logs the error once per burst.
func (h *Handler) storeFailed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, region string, err error) error {
	if ok, suppressed := h.errLog.allow(time.Now()); ok {
		h.logger.Error("rate limit store unavailable; applying fail mode",
			zap.String("limiter", h.Name),
			zap.String("fail", h.Fail),
			zap.Int64("suppressed_since_last_log", suppressed),
			zap.Error(err))
	}
	repl.Set(phLimit, h.Limit)
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
}

// writeHeaders sets the rate limit headers chosen by `headers`.
func (h *Handler) writeHeaders(hdr http.Header, res *limiter.Result) {
	if h.legacyHdr {
		hdr.Set("X-RateLimit-Limit", strconv.FormatInt(res.Bucket.Limit, 10))
		hdr.Set("X-RateLimit-Remaining", strconv.FormatInt(res.Bucket.Remaining, 10))
	}
	if h.ietfHdr {
		t := res.Bucket.ResetAfter
		if !res.Allowed {
			t = res.RetryAfter
		}
		hdr.Add("RateLimit-Policy", h.policy)
		hdr.Add("RateLimit", `"`+h.Name+`";r=`+strconv.FormatInt(res.Bucket.Remaining, 10)+
			";t="+strconv.FormatInt(ceilSeconds(t), 10))
	}
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
