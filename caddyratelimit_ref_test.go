// A reference model of mholt/caddy-ratelimit's in-process limiter, for
// TestComingFromCaddyRatelimit.
//
// caddy-ratelimit (https://github.com/mholt/caddy-ratelimit, module
// http.handlers.rate_limit) is Copyright 2021 Matthew Holt and licensed
// under the Apache License, Version 2.0
// (http://www.apache.org/licenses/LICENSE-2.0). This file is not a copy of
// its code: it re-implements, with one injected clock, the behaviour of its
// ringbuffer.go (ringBufferRateLimiter: initialize, When, allowed, reserve,
// advance) and of the parts of handler.go that decide a request (zones
// sorted by permissiveness, the zone's matcher, the key, When, and the
// Retry-After it writes), as read in its source. The module cannot be
// fetched here (the Go module proxy answers 403), so the comparison runs
// against this model. Where upstream reads the wall clock (time.Since,
// time.Until) and its package variable now(), the model reads the one
// injected time of the request.
//
// Its semantics, as the source has them:
//
//   - A zone allows max_events events in a sliding window per key. Each key
//     has a ring of max_events timestamps (all zero at first) and a cursor
//     on the oldest one.
//   - A request is allowed when the oldest timestamp is MORE than window
//     old (now - oldest > window); it then takes the oldest slot (the
//     timestamp becomes now) and the cursor moves on. An event exactly
//     window old still counts.
//   - Otherwise When() returns oldest + window - now, and the handler
//     refuses the request when that is > 0. At the exact instant
//     now = oldest + window, When() returns 0: the handler lets the request
//     through, and nothing is recorded.
//   - Zones are checked tightest first (max_events/window ascending; the
//     sort is not stable, so equally permissive zones come in no defined
//     order). A zone whose matcher does not match is skipped. The first
//     zone that refuses ends the check: later zones record nothing, earlier
//     ones have recorded the request.
//   - A refusal is Caddy error 429 with Retry-After set to
//     strconv.FormatFloat(wait.Seconds()+0.5, 'f', 0, 64): the wait plus a
//     half, rounded to nearest with ties to even. That is ceil(wait) unless
//     wait is a whole number of seconds, where an odd one gets one second
//     more (5 s: "6"; 4 s: "4"). Jitter (off here) would add up to
//     jitter*wait first. {http.rate_limit.exceeded.name} is the zone.

package slidingratelimit

import (
	"sort"
	"strconv"
	"time"
)

// refRing is one key's ring of a zone.
type refRing struct {
	ring   []time.Time // len == max_events
	cursor int         // the oldest timestamp
}

// when answers a request at now: 0 and the request recorded when the oldest
// event is more than window old; otherwise the wait until it is window old,
// nothing recorded.
func (r *refRing) when(now time.Time, window time.Duration) time.Duration {
	// A zone has at least one event (its Caddyfile refuses events 0, which
	// upstream does not handle here either).
	if now.Sub(r.ring[r.cursor]) > window {
		r.ring[r.cursor] = now
		r.cursor = (r.cursor + 1) % len(r.ring)
		return 0
	}
	return r.ring[r.cursor].Add(window).Sub(now)
}

// refZone is one rate_limit zone.
type refZone struct {
	name      string
	maxEvents int
	window    time.Duration
	match     func(refRequest) bool // nil: every request
	key       func(refRequest) string
	limiters  map[string]*refRing
}

func (z *refZone) permissiveness() float64 {
	return float64(z.maxEvents) / float64(z.window)
}

// refRequest is what the zones of the comparison look at.
type refRequest struct {
	at         time.Time
	method     string
	remoteHost string
}

// refDecision is what caddy-ratelimit answers.
type refDecision struct {
	allowed    bool
	zone       string        // {http.rate_limit.exceeded.name} on a refusal
	wait       time.Duration // the exact wait of a refusal
	retryAfter string        // its Retry-After header
}

// refHandler is the rate_limit handler without distribution or jitter.
type refHandler struct {
	zones []*refZone // tightest first
}

func newRefHandler(zones ...*refZone) *refHandler {
	for _, z := range zones {
		z.limiters = map[string]*refRing{}
	}
	sorted := append([]*refZone(nil), zones...)
	sort.Slice(sorted, func(i, j int) bool {
		return sorted[i].permissiveness() < sorted[j].permissiveness()
	})
	return &refHandler{zones: sorted}
}

func (h *refHandler) decide(req refRequest) refDecision {
	for _, z := range h.zones {
		if z.match != nil && !z.match(req) {
			continue
		}
		key := z.key(req)
		rl, ok := z.limiters[key]
		if !ok {
			rl = &refRing{ring: make([]time.Time, z.maxEvents)}
			z.limiters[key] = rl
		}
		if wait := rl.when(req.at, z.window); wait > 0 {
			return refDecision{
				zone:       z.name,
				wait:       wait,
				retryAfter: strconv.FormatFloat(wait.Seconds()+0.5, 'f', 0, 64),
			}
		}
	}
	return refDecision{allowed: true}
}

// atBoundary reports whether req comes exactly window after the oldest
// event of a full ring it would be checked against: the one instant where
// caddy-ratelimit lets a request through without recording it.
func (h *refHandler) atBoundary(req refRequest) bool {
	for _, z := range h.zones {
		if z.match != nil && !z.match(req) {
			continue
		}
		if rl, ok := z.limiters[z.key(req)]; ok && len(rl.ring) > 0 {
			if oldest := rl.ring[rl.cursor]; !oldest.IsZero() && req.at.Sub(oldest) == z.window {
				return true
			}
		}
	}
	return false
}
