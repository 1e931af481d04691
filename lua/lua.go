// Package lua holds the Redis script of sliding_ratelimit: decide.lua, the
// decision (clock, deadline, ban, lease, all-or-nothing over every bucket and
// window, replies, batches of checks), with one file per algorithm spliced in:
//
//	sliding_log.lua       the exact log on a sorted set
//	sliding_counter.lua   two counters per window, the previous weighted
//	fixed_window.lua      a counter per window, and calendar periods
//	token_bucket.lua      GCRA: one theoretical arrival time per window
//
// decide.lua's header documents the calling convention and the reply; each
// algorithm file documents its state, units and answers. override.lua keeps
// the temporary overrides decide.lua reads. One script serves
// every algorithm, so a batch of checks from limiters of different
// algorithms is still one EVALSHA.
package lua

import (
	_ "embed"
	"strings"
)

var (
	//go:embed decide.lua
	decide string
	//go:embed sliding_log.lua
	slidingLog string
	//go:embed sliding_counter.lua
	slidingCounter string
	//go:embed fixed_window.lua
	fixedWindow string
	//go:embed token_bucket.lua
	tokenBucket string
	// Override is override.lua: an identity's temporary overrides and a
	// limiter's index of them (not on the request path).
	//go:embed override.lua
	Override string
)

// algorithmsMarker is the line of decide.lua the algorithm files replace.
const algorithmsMarker = "-- @algorithms\n"

// Decide is the whole script: decide.lua with the algorithm files in place
// of its @algorithms line.
var Decide = func() string {
	if strings.Count(decide, algorithmsMarker) != 1 {
		panic("lua: decide.lua must hold the @algorithms line once")
	}
	algs := slidingLog + "\n" + slidingCounter + "\n" + fixedWindow + "\n" + tokenBucket + "\n"
	return strings.Replace(decide, algorithmsMarker, algs, 1)
}()

// Files are the script's source files, by name (for tests that read them).
var Files = map[string]string{
	"decide.lua":          decide,
	"sliding_log.lua":     slidingLog,
	"sliding_counter.lua": slidingCounter,
	"fixed_window.lua":    fixedWindow,
	"token_bucket.lua":    tokenBucket,
	"override.lua":        Override,
}
