// Package lua holds the Redis script of sliding_ratelimit: decide.lua, the
// decision (clock, deadline, ban, lease, all-or-nothing over every bucket and
// window, replies, batches of checks), with one file per algorithm spliced in:
//
//	sliding_log.lua       the exact log on a sorted set
//	sliding_counter.lua   20 buckets per window, each with its first and last arrival
//	fixed_window.lua      a counter per window, and calendar periods
//	token_bucket.lua      GCRA: one theoretical arrival time per window
//	share.lua             a data centre's share of a global ceiling kept in
//	                      a ledger (global_redis)
//
// decide.lua's header documents the calling convention and the reply; each
// algorithm file documents its state, units and answers. override.lua keeps
// the temporary overrides decide.lua reads. One script serves
// every algorithm, so a batch of checks from limiters of different
// algorithms is still one EVALSHA, or, on Redis 7 and Valkey, one FCALL of
// the same code loaded as a function library (LibraryCode). EVALSHA runs
// the whole body on each call, so a call of sliding_log checks alone goes
// by DecideLog, the body with the log's file alone.
package lua

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
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
	//go:embed share.lua
	share string
	// Override is override.lua: an identity's temporary overrides and a
	// limiter's index of them (not on the request path).
	//go:embed override.lua
	Override string
	// DCShare is dcshare.lua: a data centre's side of a global ceiling kept
	// in a ledger (global_redis), off the request path.
	//go:embed dcshare.lua
	DCShare string
	// Ledger is ledger.lua: the ledger of global ceilings every data centre
	// shares (global_redis).
	//go:embed ledger.lua
	Ledger string
)

// The lines of decide.lua the algorithm files and the entry point replace.
const (
	algorithmsMarker = "-- @algorithms\n"
	entryMarker      = "-- @entry"
)

// body is decide.lua with the algorithm files in place of its @algorithms
// line, up to its @entry line: the helpers and run, defined, not run.
var body = bodyOf(slidingLog, slidingCounter, fixedWindow, tokenBucket, share)

// bodyOf is decide.lua with the given algorithm files spliced in.
func bodyOf(algorithms ...string) string {
	if strings.Count(decide, algorithmsMarker) != 1 || strings.Count(decide, entryMarker) != 1 {
		panic("lua: decide.lua must hold the @algorithms and @entry lines once each")
	}
	b := strings.Replace(decide, algorithmsMarker, strings.Join(algorithms, "\n")+"\n", 1)
	return b[:strings.Index(b, entryMarker)]
}

// Decide is the script for EVALSHA: the body, then a call of run on the
// call's KEYS and ARGV. Redis runs all of it, defining every helper, on
// each call.
var Decide = "local KEYS, ARGV = KEYS, ARGV\n" + body + "return run()\n"

// DecideLog is Decide for calls whose every check is of sliding_log buckets
// alone, without a ban rule (leases, overrides and every mode included):
// the body without the other algorithm files, which EVALSHA would define
// again on each call for nothing. decide.lua reaches their functions only
// for the kinds they serve (and the ban's count, which uses
// sliding_counter's estimate), so none of its paths for such checks needs
// them. Under FCALL the library, built once, serves every check.
var DecideLog = "local KEYS, ARGV = KEYS, ARGV\n" + bodyOf(slidingLog) + "return run()\n"

// Library is the name of the function library: sliding_ratelimit_ and the
// first 8 hex digits of the SHA-1 of the body, so that two releases of the
// script, loaded side by side on one Redis, never replace each other's.
var Library = func() string {
	sum := sha1.Sum([]byte(body))
	return "sliding_ratelimit_" + hex.EncodeToString(sum[:4])
}()

// Function names in the library: DecideFunction runs any check (FCALL),
// PeekFunction only checks that write nothing (mode peek; no-writes, so
// FCALL_RO, on a replica too).
var (
	DecideFunction = Library + "_decide"
	PeekFunction   = Library + "_peek"
)

// LibraryCode is the library for FUNCTION LOAD: the body, run once when
// Redis loads it, and two functions that set KEYS and ARGV and call run.
var LibraryCode = "#!lua name=" + Library + "\nlocal KEYS, ARGV\n" + body + `
local function entry(keys, args)
  KEYS, ARGV = keys, args
  local out = run()
  KEYS, ARGV = nil, nil
  return out
end
redis.register_function{function_name = "` + DecideFunction + `", callback = entry}
redis.register_function{function_name = "` + PeekFunction + `", callback = entry, flags = {"no-writes"}}
`

// Files are the script's source files, by name (for tests that read them).
var Files = map[string]string{
	"decide.lua":          decide,
	"sliding_log.lua":     slidingLog,
	"sliding_counter.lua": slidingCounter,
	"fixed_window.lua":    fixedWindow,
	"token_bucket.lua":    tokenBucket,
	"share.lua":           share,
	"override.lua":        Override,
	"dcshare.lua":         DCShare,
	"ledger.lua":          Ledger,
}
