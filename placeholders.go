package slidingratelimit

import (
	"context"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// phPrefix starts every placeholder this handler sets:
//
//	{http.sliding_ratelimit.name}             the limiter that decided
//	{http.sliding_ratelimit.allowed}          true when the request passes (fail open too); in a dry run, what would have been decided
//	{http.sliding_ratelimit.count}            units counted in the tightest window ("" when unknown)
//	{http.sliding_ratelimit.limit}            the tightest window's limit (a token bucket's capacity)
//	{http.sliding_ratelimit.remaining}        units left in it ("" when unknown; 0 on a denial)
//	{http.sliding_ratelimit.retry_after}      seconds until admitted (0 when allowed)
//	{http.sliding_ratelimit.region}           the region counted in
//	{http.sliding_ratelimit.source}           redis, memory, deny_cache, local, fail_open, fail_closed
//	{http.sliding_ratelimit.outcome}          allowed, limited, banned, concurrency, too_large, unavailable
//	{http.sliding_ratelimit.near_limit}       true at or above warn_at
//	{http.sliding_ratelimit.dry_run}          true when a dry run let a refusal through
//	{http.sliding_ratelimit.banned}           true while the key is in the penalty box
//	{http.sliding_ratelimit.in_flight}        the key's requests in flight, with max_concurrent
//	{http.sliding_ratelimit.global_count}     the tightest global window's count (and _limit, _remaining)
//	{http.sliding_ratelimit.window.<w>.count} every window by its label (1s, 1h, day), with .limit,
//	                                          .remaining and .reset; global windows under global.<w>
const phPrefix = "http.sliding_ratelimit."

// phStateKey holds the request's placeholder state in the replacer, so the
// limiters of one route share it and the last one to run is what the
// placeholders show.
const phStateKey = phPrefix + "_state"

// phState is what the placeholders show: the decision, formatted only when
// a placeholder is used (a log line, handle_errors), so a request pays a
// few field writes, not a dozen map insertions.
//
// It is also the request's scratch, so that a request allocates it once
// and not each piece: the first limiter of the request to run resolves its
// limits into it, has the engine build its Op in it (limiter.Scratch), and
// makes its rate limit headers' value slices from it. A later limiter of
// the same request allocates its own.
type phState struct {
	repl *caddy.Replacer // the replacer it is registered on
	h    *Handler
	d    limiter.Decision

	limits [3]int64 // a limiter with more appends past it (1,272 bytes in all: a 1,280 size class with its malloc header)
	op     limiter.Scratch
	vals   [6]string // the rate limit headers' 4, then Retry-After and Content-Type of a refusal

	// (the flags together, so that the state fits its size class)
	near bool
	// inServer: the request has vars, so Caddy's server prepared it (its
	// replacer's HTTP placeholders read this request's header map).
	inServer bool
	used     bool // limits and op
	valsUsed bool
}

// placeholders returns the request's state, registering it on first use:
// one provider function on the replacer, which also answers phStateKey, so
// that the limiters of a route find it.
//
// In Caddy the request's vars (the map behind {http.vars.*}, made with the
// replacer for each request) also hold it, under phVarKey: a map lookup,
// where asking the replacer walks every provider before ours (Caddy's
// global one, the file one, the static map under its lock, the HTTP one).
// A state found there counts only when it is registered on this replacer;
// without vars (a request Caddy's server did not prepare), the replacer is
// asked as before.
func placeholders(ctx context.Context, repl *caddy.Replacer) *phState {
	vars, _ := ctx.Value(caddyhttp.VarsCtxKey).(map[string]any)
	if vars != nil {
		if s, ok := vars[phVarKey].(*phState); ok && s.repl == repl {
			return s
		}
	} else if v, ok := repl.Get(phStateKey); ok {
		if s, ok := v.(*phState); ok {
			return s
		}
	}
	s := &phState{repl: repl, inServer: vars != nil}
	repl.Map(s.get)
	if vars != nil {
		vars[phVarKey] = s
	}
	return s
}

// phVarKey names the state in the request's vars. It starts with a byte no
// configuration writes, so that no vars matcher or {http.vars.*} of a
// config meets it by accident.
const phVarKey = "\x00sliding_ratelimit_state"

// scratch is an empty buffer for a limiter's limits and the room for its
// decision's Op: the state's own the first time, new ones after (the first
// may still be in use).
func (s *phState) scratch() ([]int64, *limiter.Scratch) {
	if s.used {
		return make([]int64, 0, len(s.limits)), nil
	}
	s.used = true
	return s.limits[:0], &s.op
}

// valsBuf backs a response's header value slices (the rate limit headers',
// and a refusal's Retry-After and Content-Type): the state's own the first
// time, nil after (write and refuse then make their own).
func (s *phState) valsBuf() *[6]string {
	if s.valsUsed {
		return nil
	}
	s.valsUsed = true
	return &s.vals
}

// set shows a decision of h.
func (s *phState) set(h *Handler, d *limiter.Decision) {
	s.h, s.d, s.near = h, *d, false
}

// get answers the placeholders.
func (s *phState) get(key string) (any, bool) {
	if key == phStateKey {
		return s, true
	}
	name, ok := strings.CutPrefix(key, phPrefix)
	if !ok || s.h == nil {
		return nil, false
	}
	d := &s.d
	switch name {
	case "name":
		return s.h.Name, true
	case "allowed":
		return d.Pass && !d.DryRun, true
	case "count", "limit", "remaining":
		return windowValue(shown(d), name), true
	case "retry_after":
		return retryAfterSeconds(d), true
	case "region":
		return d.Region, true
	case "source":
		return string(d.Source), true
	case "outcome":
		return d.Outcome.String(), true
	case "near_limit":
		return s.near, true
	case "dry_run":
		return d.DryRun, true
	case "banned":
		return d.Banned, true
	case "in_flight":
		if d.InFlight < 0 {
			return "", true
		}
		return d.InFlight, true
	case "global_count", "global_limit", "global_remaining":
		return windowValue(tightestGlobal(d), strings.TrimPrefix(name, "global_")), true
	}
	scope, rest, ok := strings.Cut(name, ".")
	if !ok || scope != "window" && scope != "global" {
		return nil, false
	}
	label, field, ok := strings.Cut(rest, ".")
	if !ok {
		return nil, false
	}
	for i := range d.Windows {
		w := &d.Windows[i]
		if w.Global == (scope == "global") && w.Window.Label() == label {
			return windowValue(w, field), true
		}
	}
	return nil, false
}

// windowValue is one field of a window: count, limit, remaining or reset
// (seconds); "" when the window or its usage is unknown.
func windowValue(w *limiter.WindowUsage, field string) any {
	if w == nil {
		return ""
	}
	switch field {
	case "limit":
		return w.Limit
	case "reset":
		return ceilSeconds(w.Reset)
	case "remaining":
		if w.Denied {
			return int64(0)
		}
	}
	if !w.Known {
		return ""
	}
	switch field {
	case "count":
		return w.Count
	case "remaining":
		return w.Remaining
	}
	return ""
}

// shown is the window count, limit and remaining show: the tightest, or,
// when no usage is known (the store failed), the first (its limit).
func shown(d *limiter.Decision) *limiter.WindowUsage {
	if t := d.Tightest(); t != nil {
		return t
	}
	if len(d.Windows) > 0 {
		return &d.Windows[0]
	}
	return nil
}

// tightestGlobal is the global window with the least left.
func tightestGlobal(d *limiter.Decision) *limiter.WindowUsage {
	g := limiter.Decision{Windows: nil}
	for i := range d.Windows {
		if d.Windows[i].Global {
			g.Windows = append(g.Windows, d.Windows[i])
		}
	}
	return g.Tightest()
}
