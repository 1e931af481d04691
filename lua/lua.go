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
// the same code loaded as a function library (LibraryCode). On Redis 5 and
// 6 EVALSHA goes by DecideCached, whose first call in a Lua state builds
// the body and keeps it for the next calls. Elsewhere (Redis 7 without
// functions for the user, or ScriptsEval) EVALSHA runs the whole body on
// each call, so a call of sliding_log checks alone goes by DecideLog, the
// body with the log's file alone, and a call of one kind's checks of the
// common form by that kind's DecideFast script.
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

// DecideCached is the script for EVALSHA on Redis 5 and 6, whose scripts
// share one Lua state that lives until SCRIPT FLUSH or a restart and whose
// globals a script may set by rawset (Redis 7 refuses it: a read-only _G).
// Its first call in a Lua state runs the body once, as FUNCTION LOAD does,
// and keeps the entry, the same as LibraryCode's (KEYS and ARGV set for the
// call, then cleared), in the global named Library (so that two releases
// in one Redis never run each other's); each later call only looks the
// entry up and runs it on the call's KEYS and ARGV, on the helpers and
// tables built once, as an FCALL does. What lives from call to call is
// what lives in the library between FCALLs: the decoded shapes (SHAPE),
// the formats and the tables every check fills before it reads them; run
// resets what a call shares. Where rawset is refused, every call builds
// the body and runs it once (correct, at Decide's cost). SCRIPT FLUSH and a
// restart drop the Lua state, and the entry with it: the store's EVALSHA
// then meets NOSCRIPT and sends EVAL, whose call builds it again. On a
// cluster every node keeps its own.
var DecideCached = `local e = rawget(_G, "` + Library + `")
if not e then
  local function build()
    local KEYS, ARGV
` + body + `
    return function(keys, args)
      KEYS, ARGV = keys, args
      local out = run()
      KEYS, ARGV = nil, nil
      return out
    end
  end
  e = build()
  pcall(rawset, _G, "` + Library + `", e)
end
return e(KEYS, ARGV)
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

// fastMarker is the line of decide.lua above which lies all that the fast
// paths (FAST) need of it: the clock, the formats, num, fast_late and the
// shapes.
const fastMarker = "-- @fast"

// DecideFast holds, by kind (1 sliding_log, 2 sliding_counter, 3
// fixed_window, 4 token_bucket), the script for EVALSHA calls whose every
// check is of that kind in the form its fast path takes (mode 0, one part
// of one window, no ban, no lease, no override; sliding_log in format 2 or
// 3, sliding_counter in format 4). EVALSHA runs a
// script's whole chunk on each call: Decide's defines every function and
// table of decide.lua and the five algorithm files before its first check
// (about 230k instructions a call on Redis 7.0, DecideLog's about 90k). A
// fast script defines decide.lua down to its @fast line, the kind's file
// and a loop that hands each check to the kind's fast path; the whole body
// (Decide's, every algorithm) sits inside a function that a call runs only
// when a check needs decide: a check of another form, or one the fast path
// declines (a state to rewrite after a reload, a log in format 1). That
// call's later checks go on through the fast path; both sides share the
// call's reading of Redis TIME.
var DecideFast = map[int]string{1: fastScript(slidingLog), 2: fastScript(slidingCounter), 3: fastScript(fixedWindow), 4: fastScript(tokenBucket)}

// fastScript is a DecideFast script of the algorithm file alg.
func fastScript(alg string) string {
	if strings.Count(decide, fastMarker) != 1 {
		panic("lua: decide.lua must hold the @fast line once")
	}
	prelude := decide[:strings.Index(decide, fastMarker)]
	return "local KEYS, ARGV = KEYS, ARGV\n" + prelude + alg + `
-- The body, run when a check needs decide: its entry decides one check
-- (the fast path declined it), on the call's clock.
local function general()
  local function get_t()
    return now_redis
  end
  local function set_t(t)
    now_redis = t
  end
  local function get_base()
    return DBASE, NBASE, LATE
  end
` + body + `
  return function(a, k, s)
    now_redis = get_t()
    DBASE, NBASE, LATE = get_base()
    if not INT then
      formats()
    end
    hn = 0
    local V = SHAPE[s] or shape_of(s)
    V.fast = false
    local ok, r = pcall(decide, a, k, V)
    set_t(now_redis)
    if not ok then
      error(r, 0)
    end
    return r
  end
end
local slow = false
local function fast_one(a, k, V, s)
  local f = V.fast
  if f then
    local r = f(a, k, V)
    if r then
      return r
    end
  end
  if not slow then
    slow = general()
  end
  return slow(a, k, s)
end
-- As run: the checks in order, each its own reply (OUT: a table, or flat
-- from the fast path); with n > 1 an error is its check's reply; then the
-- call's reading of Redis TIME (0: none).
local function fast_run()
  now_redis = false
  if not INT then
    formats()
  end
  local n = ARGV[1] + 0
  bases()
  OUT, ON = {}, 0
  if n == 1 then
    local s = ARGV[4]
    local r = fast_one(4, 1, SHAPE[s] or shape_of(s), s)
    if r ~= true then
      OUT, ON = {8 * #r + r[1], unpack(r, 2)}, #r -- one table, flat (run's way)
    end
    OUT[ON + 1] = now_redis or 0 -- the call's reading of TIME, as run's
    return OUT
  end
  local a, k = 4, 1
  for _ = 1, n do
    local s = ARGV[a]
    local V = SHAPE[s] or shape_of(s)
    local ok, r = pcall(fast_one, a, k, V, s)
    if not ok then
      if type(r) ~= "table" or not r.err then
        r = {err = tostring(r)}
      end
      ON = ON + 1
      OUT[ON] = r
    elseif r ~= true then
      ON = ON + 1
      OUT[ON] = r
    end
    a, k = a + V.na, k + V.nk
  end
  OUT[ON + 1] = now_redis or 0
  return OUT
end
return fast_run()
`
}
