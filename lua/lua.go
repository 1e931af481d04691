// Package lua holds the Redis scripts of sliding_ratelimit, one per algorithm.
//
// Every script shares one calling convention so the engine drives them the
// same way:
//
//	KEYS[1]   the bucket's key (identity × region)
//	KEYS[2]   optional: the identity's global ceiling, same hash tag as KEYS[1]
//	ARGV[1]   now in microseconds since the Unix epoch; "0" reads Redis TIME
//	ARGV[2]   window in microseconds
//	ARGV[3]   cost in units (>= 1), or 0 to only look
//	ARGV[4]   mode: "0" check and record, "1" check only (peek; nothing written)
//	ARGV[5]   a request id unique across all callers (sliding_log members)
//	ARGV[4+2i], ARGV[5+2i]   limit and burst of KEYS[i]
//
// and one reply: {allowed, count_1, retry_us_1, reset_us_1, count_2, ...},
// all integers. A request is recorded in every key or in none.
package lua

import _ "embed"

// SlidingLog is the exact sliding-window log on a sorted set.
//
//go:embed sliding_log.lua
var SlidingLog string

// SlidingCounter is the sliding-window counter: the current and the previous
// fixed window's counts in one hash, the previous weighted by its overlap.
//
//go:embed sliding_counter.lua
var SlidingCounter string

// FixedWindow counts units per fixed window in one hash.
//
//go:embed fixed_window.lua
var FixedWindow string

// TokenBucket is GCRA: one theoretical arrival time per key.
//
//go:embed token_bucket.lua
var TokenBucket string
