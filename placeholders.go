package slidingratelimit

import (
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// phPrefix starts every placeholder this handler sets:
//
//	{http.sliding_ratelimit.allowed}          true / false
//	{http.sliding_ratelimit.count}            units counted after the request ("" if the store failed)
//	{http.sliding_ratelimit.limit}            the limit applied
//	{http.sliding_ratelimit.remaining}        units left ("" if the store failed)
//	{http.sliding_ratelimit.retry_after}      seconds until admitted (0 when allowed)
//	{http.sliding_ratelimit.region}           the region counted in
//	{http.sliding_ratelimit.source}           redis, memory, deny_cache, local, fail_open, fail_closed
//	{http.sliding_ratelimit.near_limit}       true at or above warn_at
//	{http.sliding_ratelimit.dry_run}          true when a dry run let a denial through
//	{http.sliding_ratelimit.global_count}     the global ceiling's count (and _limit, _remaining)
const phPrefix = "http.sliding_ratelimit."

// phStateKey holds the request's placeholder state in the replacer, so the
// limiters of one route share it and the last one to run is what the
// placeholders show.
const phStateKey = phPrefix + "_state"

// phState is what the placeholders show. Values are formatted only when a
// placeholder is used (a log line, handle_errors), so a request pays a few
// field writes, not a dozen map insertions.
type phState struct {
	allowed, near, dryRun, known, hasGlobal bool
	count, limit, remaining, retryAfter     int64
	gCount, gLimit, gRemaining              int64
	region, source                          string
}

// placeholders returns the request's state, registering it on first use.
func placeholders(repl *caddy.Replacer) *phState {
	if v, ok := repl.Get(phStateKey); ok {
		if s, ok := v.(*phState); ok {
			return s
		}
	}
	s := new(phState)
	repl.Set(phStateKey, s)
	repl.Map(s.get)
	return s
}

// fromResult fills the state from a decision.
func (s *phState) fromResult(res *limiter.Result, region, source string) {
	*s = phState{
		allowed: res.Allowed, known: true,
		count: res.Bucket.Count, limit: res.Bucket.Limit, remaining: res.Bucket.Remaining,
		retryAfter: retryAfterSeconds(res), region: region, source: source,
	}
}

// withGlobal adds the global ceiling's usage.
func (s *phState) withGlobal(u *limiter.Usage) {
	s.hasGlobal = true
	s.gCount, s.gLimit, s.gRemaining = u.Count, u.Limit, u.Remaining
}

// undecided fills the state for a request no store decided.
func (s *phState) undecided(allowed bool, limit int64, region, source string) {
	*s = phState{allowed: allowed, limit: limit, region: region, source: source}
}

// get answers the placeholders.
func (s *phState) get(key string) (any, bool) {
	if !strings.HasPrefix(key, phPrefix) {
		return nil, false
	}
	switch key {
	case phAllowed:
		return s.allowed, true
	case phCount:
		return s.ifKnown(s.count), true
	case phLimit:
		return s.limit, true
	case phRemaining:
		return s.ifKnown(s.remaining), true
	case phRetryAfter:
		return s.retryAfter, true
	case phRegion:
		return s.region, true
	case phSource:
		return s.source, true
	case phNearLimit:
		return s.near, true
	case phDryRun:
		return s.dryRun, true
	case phGlobalCount:
		return s.ifGlobal(s.gCount), true
	case phGlobalLimit:
		return s.ifGlobal(s.gLimit), true
	case phGlobalRemaining:
		return s.ifGlobal(s.gRemaining), true
	}
	return nil, false
}

// ifKnown is v, or "" when no store decided the request.
func (s *phState) ifKnown(v int64) any {
	if !s.known {
		return ""
	}
	return v
}

// ifGlobal is v, or "" when the limiter has no global ceiling.
func (s *phState) ifGlobal(v int64) any {
	if !s.hasGlobal {
		return ""
	}
	return v
}

// The placeholders' full names.
const (
	phAllowed         = phPrefix + "allowed"
	phCount           = phPrefix + "count"
	phLimit           = phPrefix + "limit"
	phRemaining       = phPrefix + "remaining"
	phRetryAfter      = phPrefix + "retry_after"
	phRegion          = phPrefix + "region"
	phSource          = phPrefix + "source"
	phNearLimit       = phPrefix + "near_limit"
	phDryRun          = phPrefix + "dry_run"
	phGlobalCount     = phPrefix + "global_count"
	phGlobalLimit     = phPrefix + "global_limit"
	phGlobalRemaining = phPrefix + "global_remaining"
)
