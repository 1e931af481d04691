// Package reply turns the engine's Decision into an HTTP reply: the rate
// limit headers (X-RateLimit-*, IETF RateLimit and RateLimit-Policy), the
// Retry-After rounding, and the 429, 413 and 503 bodies (or the gRPC
// status). It imports nothing of Caddy: the Caddy handler and the net/http
// middleware (httplimit) both render with it, so neither repeats any of it.
package reply

import (
	"encoding/json"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// MaxEchoedRegion bounds the region echoed in a 429 body.
const MaxEchoedRegion = 128

// Header names in canonical form, so setting them needs no canonicalising.
const (
	HdrLimit     = "X-Ratelimit-Limit"
	HdrRemaining = "X-Ratelimit-Remaining"
	HdrPolicy    = "Ratelimit-Policy"
	HdrRateLimit = "Ratelimit"
	HdrRetry     = "Retry-After"
)

// HeaderModes are the values of `headers`.
var HeaderModes = []string{"both", "ietf", "legacy", "off"}

// Plan is what the rate limit headers of a limiter need, worked out once:
// which ones, and RateLimit-Policy when it never changes.
type Plan struct {
	Legacy, IETF bool
	Policy       string // RateLimit-Policy when static, else ""
}

// NewPlan is the plan of headers mode mode ("both", "ietf", "legacy",
// "off"); a dry run sends none: clients notice nothing. policy is the
// static RateLimit-Policy, "" when the limits change per request.
func NewPlan(mode string, dryRun bool, policy string) Plan {
	return Plan{
		Legacy: !dryRun && (mode == "both" || mode == "legacy"),
		IETF:   !dryRun && (mode == "both" || mode == "ietf"),
		Policy: policy,
	}
}

// PolicyHeader is RateLimit-Policy: one item per window.
func PolicyHeader(ws []limiter.WindowUsage) string {
	return string(AppendPolicy(make([]byte, 0, 48*len(ws)), ws))
}

// AppendPolicy appends RateLimit-Policy's items.
func AppendPolicy(b []byte, ws []limiter.WindowUsage) []byte {
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

// AppendRateLimit appends RateLimit: one item per window the decision
// knows, r the units left (0 for a window that denied), t the seconds until
// more come back (until the window has room, when it denied). Nothing when
// it knows none.
func AppendRateLimit(b []byte, ws []limiter.WindowUsage) []byte {
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
		b = strconv.AppendInt(b, CeilSeconds(w.Reset), 10)
	}
	return b
}

// Write sets the rate limit headers chosen by `headers`. IETF headers get
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
func (hp *Plan) Write(hdr http.Header, d *limiter.Decision) { hp.WriteInto(hdr, d, nil) }

// WriteInto is Write with the array that backs the value slices given
// (the request's; its first 4); nil makes one.
func (hp *Plan) WriteInto(hdr http.Header, d *limiter.Decision, arr *[6]string) {
	var t *limiter.WindowUsage
	if hp.Legacy {
		if t = d.Tightest(); t != nil {
			if prev := hdr[HdrRemaining]; len(prev) > 0 && !remainingAtMost(t.Remaining, prev[0]) {
				t = nil
			}
		}
	}
	if t == nil && !hp.IETF {
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
	policy := hp.Policy
	if hp.IETF {
		if policy == "" || d.Overridden {
			b = AppendPolicy(b, d.Windows)
		}
		ends[2] = len(b)
		b = AppendRateLimit(b, d.Windows)
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
		set(HdrLimit, all[:ends[0]], false)
		set(HdrRemaining, all[ends[0]:ends[1]], false)
	}
	if hp.IETF {
		if policy == "" || d.Overridden {
			policy = all[ends[1]:ends[2]]
		}
		set(HdrPolicy, policy, true)
		if ends[3] > ends[2] {
			set(HdrRateLimit, all[ends[2]:ends[3]], true)
		}
	}
}

// remainingAtMost reports whether n is at most the (earlier limiter's)
// remaining count prev; a value that does not parse is replaced.
func remainingAtMost(n int64, prev string) bool {
	p, err := strconv.ParseInt(prev, 10, 64)
	return err != nil || n <= p
}

// RetryAfterSeconds is Retry-After: whole seconds, rounded up, at least 1
// for a refusal; 0 when allowed.
func RetryAfterSeconds(d *limiter.Decision) int64 {
	if d.Outcome == limiter.OutcomeAllowed {
		return 0
	}
	return max(CeilSeconds(d.RetryAfter), 1)
}

// CeilSeconds rounds d up to whole seconds.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// Refusals renders a limiter's refusals. A plain 429 (no region, no
// reason) takes its body and Retry-After from the last one when the
// seconds are the same: under a hot key's denials they change once a
// second.
type Refusals struct {
	// WithRegion echoes the request's region in 429 bodies.
	WithRegion bool
	last       atomic.Pointer[refusalText]
}

// refusalText is a plain 429's body and Retry-After for a number of
// seconds; shared by the responses that send it (the body is only read:
// a Write must not modify nor keep what it is given).
type refusalText struct {
	secs  int64
	body  []byte
	retry string
}

// Of maps a refused decision to its status (429 over a limit, banned, too
// many in flight; 413 a cost that can never fit; 503 the store failed,
// fail closed), its JSON body and, for a 429, its Retry-After value.
func (rs *Refusals) Of(d *limiter.Decision) (status int, body []byte, retry string) {
	if !rs.WithRegion && d.Outcome == limiter.OutcomeLimited {
		secs := RetryAfterSeconds(d)
		t := rs.last.Load()
		if t == nil || t.secs != secs {
			t = &refusalText{secs: secs, body: LimitedBody(d, false), retry: strconv.FormatInt(secs, 10)}
			rs.last.Store(t)
		}
		return http.StatusTooManyRequests, t.body, t.retry
	}
	status, body = Refusal(d, rs.WithRegion)
	if status == http.StatusTooManyRequests {
		retry = strconv.FormatInt(RetryAfterSeconds(d), 10)
	}
	return status, body, retry
}

// SetHeaders sets a refusal's headers: the rate limit headers and
// Retry-After on a 429, Retry-After 1 on a 503. vals, when set, backs the
// value slices of the headers it sets (the request's).
func (hp *Plan) SetHeaders(hdr http.Header, d *limiter.Decision, status int, retry string, vals *[6]string) {
	switch status {
	case http.StatusTooManyRequests:
		hp.WriteInto(hdr, d, vals)
		hdr[HdrRetry] = one(vals, 4, retry)
	case http.StatusServiceUnavailable:
		hdr[HdrRetry] = one(vals, 4, "1")
	}
}

// Respond writes a refusal whose headers SetHeaders set: the gRPC way for
// gRPC requests, else the JSON body.
func Respond(w http.ResponseWriter, r *http.Request, d *limiter.Decision, status int, body []byte, vals *[6]string) error {
	if IsGRPC(r) {
		return WriteGRPC(w, status, d)
	}
	hdr := w.Header()
	hdr["Content-Type"] = one(vals, 5, "application/json")
	w.WriteHeader(status)
	_, err := w.Write(body)
	return err
}

// one is a header value v as a slice of its own, backed by vals[i] when
// vals is set.
func one(vals *[6]string, i int, v string) []string {
	if vals == nil {
		return []string{v}
	}
	vals[i] = v
	return vals[i : i+1 : i+1]
}

// unavailableBody is the 503 body.
const unavailableBody = `{"error":"rate_limiter_unavailable"}` + "\n"

// Refusal maps a decision to its status and body.
func Refusal(d *limiter.Decision, withRegion bool) (int, []byte) {
	switch d.Outcome {
	case limiter.OutcomeTooLarge:
		return http.StatusRequestEntityTooLarge, CostBody(d)
	case limiter.OutcomeUnavailable:
		return http.StatusServiceUnavailable, []byte(unavailableBody)
	}
	return http.StatusTooManyRequests, LimitedBody(d, withRegion)
}

// LimitedBody is the 429 body:
// {"error":"rate_limited","retry_after":N[,"region":"..."][,"reason":"banned"|"concurrency"]}.
func LimitedBody(d *limiter.Decision, withRegion bool) []byte {
	secs := RetryAfterSeconds(d)
	body := make([]byte, 0, 96)
	body = append(body, `{"error":"rate_limited","retry_after":`...)
	body = strconv.AppendInt(body, secs, 10)
	if withRegion {
		region := d.Region
		if len(region) > MaxEchoedRegion {
			region = region[:MaxEchoedRegion]
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

// CostBody is the 413 body: {"error":"cost_exceeds_limit","cost":N,"limit":N}
// with the smallest capacity the cost is above.
func CostBody(d *limiter.Decision) []byte {
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

// IsGRPC reports whether the request is gRPC (application/grpc, +proto,
// +json).
func IsGRPC(r *http.Request) bool {
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

// WriteGRPC answers a gRPC request the gRPC way: HTTP 200, trailers only,
// grpc-status RESOURCE_EXHAUSTED (429, 413) or UNAVAILABLE (503), a
// grpc-message, and grpc-retry-pushback-ms for a client's retry policy.
func WriteGRPC(w http.ResponseWriter, status int, d *limiter.Decision) error {
	hdr := w.Header()
	code, msg := grpcResourceExhausted, "rate limit exceeded, retry after "+strconv.FormatInt(RetryAfterSeconds(d), 10)+"s"
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
		hdr["Grpc-Retry-Pushback-Ms"] = []string{strconv.FormatInt(RetryAfterSeconds(d)*1000, 10)}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// NearLimit reports whether a window is at or above warnAt of its limit,
// and whether this request's cost took it there; never with warnAt <= 0.
func NearLimit(d *limiter.Decision, warnAt float64) (near, crossed bool) {
	if warnAt <= 0 {
		return false, false
	}
	for i := range d.Windows {
		u := &d.Windows[i]
		if !u.Known {
			continue
		}
		threshold := warnAt * float64(u.Limit)
		if float64(u.Count) >= threshold {
			near = true
			crossed = crossed || float64(u.Count-d.Cost) < threshold
		}
	}
	return near, crossed
}

// StaticInput is an Input of static limits (and max_concurrent, at least
// 1): what Limiter.Windows needs to work out a static RateLimit-Policy.
func StaticInput(limits, globals []int64, concurrent int64) *limiter.Input {
	return &limiter.Input{Cost: 1, MaxConcurrent: max(concurrent, 1), Limits: limits, GlobalLimits: globals}
}

// StaticPolicy is RateLimit-Policy of lim for static limits, "" when the
// limiter has calendar periods (their length changes) or Windows fails.
func StaticPolicy(lim *limiter.Limiter, in *limiter.Input) string {
	p := lim.Policy()
	if HasPeriod(p.Windows) || HasPeriod(p.GlobalWindows) {
		return ""
	}
	ws, err := lim.Windows(in)
	if err != nil {
		return ""
	}
	return PolicyHeader(ws)
}

// HasPeriod reports whether a window is a calendar period.
func HasPeriod(ws []limiter.Window) bool {
	for _, w := range ws {
		if w.Period != limiter.PeriodNone {
			return true
		}
	}
	return false
}

// HeaderKey is a request header's value as Caddy's
// {http.request.header.*} placeholder gives it: the field's values joined
// by ",", "" when absent. name is canonical.
func HeaderKey(hdr http.Header, name string) string {
	switch vals := hdr[name]; len(vals) {
	case 0:
		return ""
	case 1:
		return vals[0]
	default:
		return strings.Join(vals, ",")
	}
}
