-- decide.lua: the decision, one script for every algorithm. The algorithm
-- files (sliding_log.lua, sliding_counter.lua, fixed_window.lua,
-- token_bucket.lua) are spliced in at the @algorithms line below; lua.go
-- builds the whole script once, in two forms around the same body:
--   the scripts   for EVALSHA: on Redis 5 and 6, lua.DecideCached, whose
--                 first call in a Lua state runs the body and keeps its
--                 entry in a global named after the library, so later calls
--                 run the checks on helpers built once, as FCALL does;
--                 where functions are unavailable on Redis 7 (or
--                 ScriptsEval), lua.Decide, DecideLog and DecideFast, whose
--                 body runs on every call and whose last line runs the checks;
--   the library   for FUNCTION LOAD (Redis 7, Valkey), named
--                 sliding_ratelimit_<hash> after its source: the body runs
--                 once, at load, and registers <library>_decide and, for
--                 calls that only peek, <library>_peek (no-writes, FCALL_RO);
--                 each call runs the checks on helpers built once.
-- Either way the checks see KEYS and ARGV as the chunk's locals of those
-- names (the library sets them on each call) and start from a clean
-- per-call state (run below).
--
-- Called as EVALSHA <sha> <numkeys> KEYS... ARGV... (or FCALL <function>
-- <numkeys> KEYS... ARGV...) with ARGV[1] = n, the number of checks, ARGV[2]
-- and ARGV[3] the bases of the call's deadlines and of its nows (below),
-- followed by n checks (each check's shape says how many values and keys it
-- has: V.na and V.nk below). The checks run in order, each
-- all-or-nothing over its own keys (it reads everything before it writes),
-- each with its own reply: with n > 1 an error in one check (a key of the
-- wrong type) is that check's reply, and the others go on. The call's reply
-- is an array of the checks' replies, in order, each an array or, from a
-- fast path, flat (OUT below): 8 × n + status, n its number of values, then
-- its values after the status; then, last, the call's reading of Redis TIME
-- in µs (0 when no check read it).
-- All keys of one call share a hash slot on a Redis Cluster: the caller
-- groups checks by slot.
--
-- Clock: a check's now is the caller's, in µs (clock app), sent as now -
-- base (ARGV[3]: at least 1; the caller makes base one below the call's
-- earliest now, or 0, which sends them whole, as it does for a call that
-- holds a check of sliding_log's fast form in format 3, whose score is the
-- now's digits as sent), or 0, which makes the script read Redis TIME, once
-- per call (clock redis: one clock for every Caddy node). A check's now is
-- therefore the caller's own, or else the call's TIME, which the reply
-- carries once, so no check's reply repeats either (the caller knows both;
-- until 2026-12-06 each reply began with them). Units: every time is in
-- µs, every number a whole number below 2^53 (the caller refuses larger
-- ones), so Lua's doubles hold them exactly. Numbers are written into keys
-- and replies with %.0f, never tostring (which would round them to 14
-- digits).
--
-- One check, in ARGV (from its first value) and KEYS (one per part, then the
-- ban key, then the lease key, then the override key):
--   shape now deadline, then what changes from request to
--   request, in this order: scope (when hasov is 1), per share part (kind 6)
--   lead claim sig, per calendar window b0 b1 b2 b3, the lease's id (when
--   haslease is 1).
-- shape is the rest, one JSON array (cjson, in every Redis's Lua):
--   mode cost nparts hasban haslease hasov         (numbers; flags 0 or 1)
--   per part:  kind nwin global, then per window
--                duration kinds: "len" len limit burst   (len, in µs, as the
--                                                   string that names the
--                                                   window's fields, then
--                                                   as a number)
--                calendar:       "period" limit
--   ban:       after within for wait              (when hasban is 1)
--   lease:     max timeout                        (when haslease is 1)
-- A shape repeats from check to check (a limiter's shape, a request's mode
-- and cost): it is decoded once per chunk (SHAPE below), so a check hands
-- Redis five arguments and its changing values, not one per number, and
-- where a call decodes its shapes again (the EVALSHA scripts but
-- DecideCached), one C call reads them all. (Until 2026-12-02 a check began with its numbers of
-- values and keys, nargs nkeys: its shape says them.)
-- mode:  0 check and record; 1 peek (nothing written); 2 check only
--        (count_only before the response: the lease is taken, the units are
--        not recorded); 3 record (count_only after the response: the units
--        are recorded, nothing checked); 4 release the lease.
-- kind:  1 sliding_log (its state in format 2; 7: in format 1, the format of
--        releases before the state format version; 11: in format 3, see
--        sliding_log.lua),
--        2 sliding_counter (format 4; 12: in format 3, 10: in format 2,
--        8: in format 1, see sliding_counter.lua), 3 fixed_window, 4 token_bucket,
--        5 calendar periods (fixed windows on the calendar), 6 a data
--        centre's share of the global ceiling (share.lua): its lead and
--        claim (µs) and the limits' signature come with the changing values,
--        and its windows are the global ceiling's, each as name limit 0.
-- deadline: Redis TIME in µs after which the check must not run: its caller
--        gave up and applied its fail mode, so a check delivered late (a
--        stalled network) is never charged; sent as deadline - base
--        (ARGV[2]: at least 1: the caller makes base one below the call's
--        earliest deadline, 0 when no check has one), so a check sends a
--        few digits, not 16 (which Lua's strtod reads by its slow path, a
--        string Redis's Lua makes anew for each; a now on the caller's
--        clock the same); 0 for none, -1 for none but read TIME (the caller
--        learns Redis's clock from the reply; base is -1 when no check of
--        the call has a deadline and one sends -1). A call whose base is not
--        0 reads TIME at its start (bases below), and its checks read their
--        deadlines only when TIME is past the earliest. (Until 2026-12-06 a
--        check sent its now and deadline whole, each read them, and ARGV[2]
--        was the first check's shape.)
-- ban:   after n refusals by a window (weighted over a sliding span of
--        within µs) the key is banned for `for` µs. A refusal by the
--        concurrency bound alone does not count, nor one whose every
--        refusing window has room within wait µs (the caller queues the
--        request and checks it again: only its last refusal counts). A banned
--        key is denied; its requests neither record nor lengthen the ban.
-- lease: at most max leases in flight, each expiring timeout µs after it
--        was taken (a node that died never releases its own).
-- override (hasov 1): the identity's temporary overrides, a hash of fields
--        "<scope>|u" (until, µs), "<scope>|f" (a factor on every limit),
--        "<scope>|l<window>" and "<scope>|g<window>" (a window's limit, of
--        the bucket and of the global ceiling). Scope "" is the identity in
--        every region, global ceiling included; scope <region> (the check's
--        scope argument) its bucket in that region alone, and it wins over
--        "" there. An override whose until has passed is ignored. A token
--        bucket's burst follows its limit in proportion. A cost above a
--        capacity the override lowered is status 4 (it can never fit). A
--        window's retry is at most the time until the first override that
--        changed a limit ends (the limits change again then).
--
-- Reply per check: {status, ban_left, ban_started, in_flight, flags, then
-- count, retry, reset per window, in order}; or, when ban_left, ban_started
-- and flags are 0, in_flight -1 and no override changed a limit, the short
-- form {status, then count, retry, reset per window}; or {3} (late), or
-- {1, 0, 0, -1, 0} (a lease released, mode 4). A flat reply is the same
-- values, its first 8 × n + status (n: its number of values, status
-- included; until 2026-12-06 n was a value of its own, before them). The
-- check's now and Redis TIME are not in it: the call's TIME ends the
-- call's reply (see above), and a check's now is the one it sent, or that
-- TIME when it sent 0.
--   status       1 allowed, 0 denied, 2 banned, 3 late (nothing was read or
--                written), 4 too large under an override (nothing written)
--   ban_left     µs the ban lasts (when banned)
--   in_flight    leases held after the check (-1: no lease)
--   flags        the sum of: 1 the concurrency bound denied the request;
--                and for a share of a global ceiling (kind 6, share.lua):
--                2 the caller holds the claim to renew it, 4 it is short
--                and the ledger never answered for it (ask it now), 8 it
--                is short, 16 it alone refused the request, 32 the ledger
--                said it has no room yet
-- When an override changed a limit, the reply goes on with limit and burst
-- per window, in order (burst 0: the limit).
-- A request is admitted when the key is not banned, every window of every
-- part has room for its cost and a lease is free; it is then recorded in
-- every window and takes a lease, or, when one of them says no, nothing is
-- recorded and no lease is taken. Rejected requests are never recorded.

-- The chunk's state (the tables below) lives as long as the chunk: from one
-- FUNCTION LOAD to the next under FCALL, from one SCRIPT FLUSH (or restart)
-- to the next under DecideCached, one call under the other EVALSHA scripts. Every
-- check fills what it reads (as the checks of one batch always have), and
-- run resets what a call shares (the clock read, the queued hash fields).

-- DBASE and NBASE are the call's bases of deadlines and of nows (ARGV[2],
-- ARGV[3]); LATE says whether a check of the call may be past its deadline.
local now_redis, DBASE, NBASE, LATE = false, 0, 0, false
local function clock()
  if not now_redis then
    local t = redis.call("TIME")
    now_redis = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now_redis
end

-- bases reads the call's bases and, when a check has a deadline (DBASE > 0:
-- one below the earliest) or asks for TIME (DBASE -1), reads TIME, which
-- every such check would: only when TIME is past the earliest deadline
-- (LATE) may a check be late, and only then does each check read its own
-- deadline (a number fewer for Lua's strtod a check).
local function bases()
  DBASE, NBASE, LATE = ARGV[2] + 0, ARGV[3] + 0, false
  if DBASE ~= 0 then
    LATE = clock() > DBASE + 1 and DBASE > 0
  end
end

-- num is x as redis.call's argument: an integer below 2^53 as its decimal
-- string ("%d", the digits Redis would write for it), anything else as is.
-- Redis turns a Lua number argument into a string with "%.17g" (7.0; a
-- float formatter on every call), so every number a check hands to Redis
-- goes through here. Constant arguments are written as strings.
-- INT and MEMBER are the formats of an integer and of a log's member (see
-- sliding_log.lua): "%d" where string.format takes it for a number, as
-- Redis's Lua 5.1 does; "%.0f" (the same digits for a whole number, but a
-- float formatter) where it does not (the Lua of miniredis, which the tests
-- use). A library's body cannot read the global string when it loads, so
-- they are found on a call's first use.
-- The fast paths (FAST below) call Redis, format and parse through the
-- locals rcall, sfmt and tonum, set on a call's first use with them (no
-- global lookups a command); ZEROS says whether s + 0 reads "010" as 10
-- (Redis's Lua; the Lua of miniredis reads it as octal).
local INT, MEMBER, MEMBER_COST = false, false, false
local rcall, sfmt, tonum, ZEROS = false, false, false, false
local function formats()
  if string.format("%d", 1) == "1" then
    INT, MEMBER, MEMBER_COST = "%d", "%016d", "%016d:%d"
  else
    INT, MEMBER, MEMBER_COST = "%.0f", "%016.0f", "%016.0f:%.0f"
  end
  rcall, sfmt, tonum, ZEROS = redis.call, string.format, tonumber, ("010" + 0) == 10
end
local function num(x)
  if x % 1 == 0 and x < 9007199254740992 and x > -9007199254740992 then
    if not INT then
      formats()
    end
    return string.format(INT, x)
  end
  return x
end

-- SHAPE holds the shapes of checks (see the header) decoded, by their
-- string. It lives as long as the chunk (see above) and starts again past
-- 4096 shapes.
-- A shape of the common form (mode 0, one part of one window, no ban, no
-- lease, no override) of a kind that has a fast path (FAST, filled by the
-- algorithm files: a function of the check's a, k and shape that decides it
-- as decide would, or returns nil for decide to take it from the start,
-- having written nothing decide would not write first) keeps that function
-- as its field fast.
local FAST = {}

-- OUT is the call's reply being built, ON its length: one element per
-- check, its reply (a table, which Redis turns into an array) or its error;
-- or, from a fast path that appends its own (tb_fast), flat: 8 × its
-- number of values + its status, then its other values, each an element,
-- with the fast path returning true (the number in the status's element:
-- an element fewer for Redis to read and write, 0.65k instructions a
-- check). Redis turns each table of a reply into RESP by looking
-- up seven field names in it (err, ok, double, ...) before it reads it as
-- an array: a check appended flat costs it no table. (Copying a returned
-- table into the call's costs the Lua VM what it saves: measured.) run
-- ends it with the call's reading of Redis TIME.
-- KEEP is the table run builds a call's reply in, kept from call to call
-- (as long as the chunk lives, see above): a reply
-- grown from empty rehashes its table at every power of two (seven times
-- for 16 checks of 4 values) and leaves it to the collector. Its values
-- always run from 1 without a gap (every write appends or overwrites), so
-- run clears what a longer call left past the end of this one's reply
-- until it meets a nil; past 4096 values it is not kept.
local OUT, ON = false, 0
local KEEP = {}

-- fast_late is the late reply of the check whose values start at ARGV[a]
-- when it is past its deadline, else nil; a fast path asks only when LATE.
-- Each reads its now in line, as decide does (a call fewer), a now of "0"
-- being Redis's clock (a string compared, no number read):
--   if LATE then
--     local late = fast_late(a)
--     if late then
--       return late
--     end
--   end
--   local now = ARGV[a + 1]
--   if now == "0" then
--     now = now_redis or clock()
--   else
--     now = now + NBASE
--   end
local function fast_late(a)
  local deadline = ARGV[a + 2] + 0
  if deadline > 0 and now_redis > deadline + DBASE then
    return {3}
  end
end
-- fast_reply appends a fast path's short reply to the call's, flat (see
-- OUT): 8 × 4 + status, then count, retry and reset; it
-- returns true, as a fast path that appended its own does. Flat, the reply
-- costs Redis no table to read (at 16 checks a call, 3.3k instructions a
-- check less than a table of the six: callgrind, 12-06).
local function fast_reply(status, count, retry, reset)
  local o = ON
  OUT[o + 1], OUT[o + 2], OUT[o + 3], OUT[o + 4] = 32 + status, count, retry, reset
  ON = o + 4
  return true
end
local SHAPE, SHAPEN = {}, 0
local function shape_of(s)
  local v = cjson.decode(s)
  -- na, nk: the check's values in ARGV (from its shape) and its keys.
  local na, nk, i = 3 + v[5] + v[6], v[3] + v[4] + v[5] + v[6], 7
  for _ = 1, v[3] do
    local kind, n = v[i], v[i + 1]
    if kind == 6 then
      na = na + 3
    end
    if kind == 5 then
      na, i = na + 4 * n, i + 3 + 2 * n
    else
      i = i + 3 + 4 * n
    end
  end
  v.na, v.nk = na, nk
  if v[1] == 0 and v[3] == 1 and v[4] == 0 and v[5] == 0 and v[6] == 0 and v[8] == 1 then
    v.fast = FAST[v[7]] or false
  end
  if SHAPEN >= 4096 then
    SHAPE, SHAPEN = {}, 0
  end
  SHAPE[s], SHAPEN = v, SHAPEN + 1
  return v
end
-- @fast (the fast paths need nothing below: lua.go's DecideFast)

-- The windows of the check being decided, numbered across its parts:
-- name (the length's decimal string, or the calendar period), length, limit,
-- burst, calendar bounds; filled by the algorithms: count, retry, reset, and
-- state s1..s4 that a record needs.
local wname, wlen, wlim, wburst, wkind = {}, {}, {}, {}, {}
local cb0, cb1, cb2, cb3 = {}, {}, {}, {}
local cnt, rty, rst = {}, {}, {}
local s1, s2, s3, s4 = {}, {}, {}, {}
local s1r = {} -- resets kept across a rewrite that records nothing

-- is_window reports whether name is one of windows j0..j1 (a field of
-- another name belongs to a window a reload removed or replaced).
local function is_window(name, j0, j1)
  for j = j0, j1 do
    if wname[j] == name then
      return true
    end
  end
  return false
end

-- hset queues a field for the hash write of the part being recorded (its
-- names come from hash_read's table of them).
local hf, hn = {}, 0
local function hset(field, value)
  hf[hn + 1], hf[hn + 2] = field, num(value)
  hn = hn + 2
end

-- The fields each hash kind keeps per window, by the window's name; the
-- names are built once per call.
local fieldsuffix = {[2] = {"w", "c", "p"}, [3] = {"w", "n"}, [4] = {"t", "i", "b"}, [5] = {"s", "e", "n"}}
local fieldnames = {}
local flist = {}

-- @algorithms

-- hash_read reads the fields of a hash part's windows (HMGET: the values
-- in order, the fields of each window in a row). When a window has none
-- (new, or its length changed) it also reads every field (HGETALL), as a
-- map, to carry over what the windows a reload replaced hold, and reports
-- whether the hash holds such fields. (Fields of a window merely removed
-- stay until the key goes idle.)
local function hash_read(key, kind, j0, j1)
  local names = fieldnames[kind]
  if not names then
    names = {}
    fieldnames[kind] = names
  end
  local suffix = fieldsuffix[kind]
  local n = 0
  for j = j0, j1 do
    local fs = names[wname[j]]
    if not fs then
      fs = {}
      for i = 1, #suffix do
        fs[i] = wname[j] .. suffix[i]
      end
      names[wname[j]] = fs
    end
    for i = 1, #fs do
      n = n + 1
      flist[n] = fs[i]
    end
  end
  local v = redis.call("HMGET", key, unpack(flist, 1, n))
  local complete = true
  for i = 1, n, #suffix do
    if not v[i] then
      complete = false
    end
  end
  if complete then
    return v, false, false
  end
  local raw = redis.call("HGETALL", key)
  local f, stale = {}, false
  for i = 1, #raw, 2 do
    local name = raw[i]
    f[name] = raw[i + 1]
    if not stale and not is_window(string.sub(name, 1, -2), j0, j1) then
      stale = true
    end
  end
  return v, f, stale
end

-- hash_write writes the queued fields with the TTL in ms (0: the TTL is
-- left as it is), dropping the fields of removed windows; keep: the key's
-- TTL is already that one (the algorithm says so), and stays unless the key
-- is dropped.
local function hash_write(key, ttl, stale, keep)
  if stale then
    redis.call("DEL", key)
  end
  redis.call("HSET", key, unpack(hf, 1, hn))
  if ttl > 0 and (stale or not keep) then
    redis.call("PEXPIRE", key, num(ttl))
  end
  hn = 0
end

-- ban_count adds n denials to the ban key's sliding count (fields w, c, p:
-- the window index and the counts of this and the previous span) and bans
-- the key (field u: until) when the count reaches after. It reports whether
-- it banned.
local function ban_count(key, b, n, now, after, within, bfor)
  local idx = math.floor(now / within)
  local cur, prev = 0, 0
  local sw = tonumber(b[2])
  if sw then
    if sw == idx then
      cur, prev = tonumber(b[3]), tonumber(b[4])
    elseif sw == idx - 1 then
      prev = tonumber(b[3])
    elseif sw > idx then
      idx, cur, prev = sw, tonumber(b[3]), tonumber(b[4])
    end
  end
  cur = cur + n
  local t = now
  if idx * within > t then
    t = idx * within
  end
  local span = math.ceil(2 * within / 1000) + 1000
  if ctr_est(within, t, idx, cur, prev) >= after then
    redis.call("HSET", key, "u", num(now + bfor), "w", num(idx), "c", "0", "p", "0")
    local ttl = math.ceil(bfor / 1000) + 1000
    if span > ttl then
      ttl = span
    end
    redis.call("PEXPIRE", key, num(ttl))
    return true
  end
  redis.call("HSET", key, "w", num(idx), "c", num(cur), "p", num(prev))
  redis.call("PEXPIRE", key, num(span))
  return false
end

-- Per part of the check being decided: key, kind, windows j0..j1, whether
-- its hash holds stale fields (of windows a reload removed or replaced),
-- whether it holds a token state written under another interval or burst,
-- and a log's T, newest time and longest window.
local pkey, pkind, pj0, pj1, pstale, ptb = {}, {}, {}, {}, {}, {}
local ptot, pnew, pmax, pread, pfmt, pwant = {}, {}, {}, {}, {}, {}

-- override applies the identity's active override, if any, to the limits
-- and bursts of the check's windows; it reports whether a limit changed,
-- and when the first override that changed one ends.
local pglobal = {}
local function override(key, scope, nparts, now)
  local raw = redis.call("HGETALL", key)
  if #raw == 0 then
    return false, 0
  end
  local f = {}
  for i = 1, #raw, 2 do
    f[raw[i]] = raw[i + 1]
  end
  local function active(sc)
    local u = tonumber(f[sc .. "|u"])
    return u ~= nil and u > now
  end
  local all = active("")
  local changed, ends = false, 0
  for p = 1, nparts do
    local sc = false
    if not pglobal[p] and scope ~= "" and active(scope) then
      sc = scope
    elseif all then
      sc = ""
    end
    if sc then
      local fac = tonumber(f[sc .. "|f"])
      local pre = sc .. "|l"
      if pglobal[p] then
        pre = sc .. "|g"
      end
      for j = pj0[p], pj1[p] do
        local old = wlim[j]
        local lim = tonumber(f[pre .. wname[j]])
        if not lim and fac then
          lim = math.floor(old * fac)
        end
        if lim then
          lim = math.min(math.max(lim, 1), 1125899906842624)
          if lim ~= old then
            if wkind[j] == 4 and wburst[j] > 0 then
              wburst[j] = math.min(math.max(math.floor(wburst[j] * lim / old), 1), 1125899906842624)
            end
            wlim[j] = lim
            changed = true
            local u = tonumber(f[sc .. "|u"])
            if ends == 0 or u < ends then
              ends = u
            end
          end
        end
      end
    end
  end
  return changed, ends
end

-- with_limits appends the windows' limits and bursts to a reply.
local function with_limits(reply, nw)
  local o = 5 + 3 * nw
  for j = 1, nw do
    reply[o + 2 * j - 1] = wlim[j]
    reply[o + 2 * j] = (wkind[j] == 4 and wburst[j]) or 0
  end
  return reply
end

-- decide decides one check; tried: its fast path has declined it (run
-- calls a shape's fast path itself, a call frame fewer a check).
local function decide(a, k, V, tried)
  local fast = V.fast
  if fast and not tried then
    local r = fast(a, k, V)
    if r then
      return r
    end
  end
  -- (s + 0 reads a number argument: one conversion, where tonumber makes
  -- two; the caller always sends numbers there.)
  local now = ARGV[a + 1]
  local mode, cost, nparts = V[1], V[2], V[3]
  local hasban, haslease, hasov = V[4] == 1, V[5] == 1, V[6] == 1
  local x = a + 3 -- the next changing value in ARGV
  local scope = ""
  if hasov then
    scope, x = ARGV[x], x + 1
  end
  if LATE then
    local deadline = ARGV[a + 2] + 0
    if deadline > 0 and now_redis > deadline + DBASE then
      return {3}
    end
  end
  if now == "0" then
    now = clock()
  else
    now = now + NBASE
  end
  local i = 7
  local nw = 0
  for p = 1, nparts do
    local kind, n = V[i], V[i + 1]
    pglobal[p] = V[i + 2] == 1
    i = i + 3
    if kind == 6 then
      sh_lead[p], sh_claim[p], sh_sig[p] = tonumber(ARGV[x]), tonumber(ARGV[x + 1]), ARGV[x + 2]
      x = x + 3
    end
    if kind == 11 then
      kind, pwant[p] = 1, 3 -- sliding_log in format 3 (sliding_log.lua)
    elseif kind == 7 then
      kind, pwant[p] = 1, 1 -- sliding_log in format 1 (sliding_log.lua)
    elseif kind == 8 then
      kind, pwant[p] = 2, 1 -- sliding_counter in format 1 (sliding_counter.lua)
    elseif kind == 10 then
      kind, pwant[p] = 2, 2 -- sliding_counter in format 2
    elseif kind == 12 then
      kind, pwant[p] = 2, 3 -- sliding_counter in format 3
    elseif kind == 2 then
      pwant[p] = 4 -- sliding_counter in format 4
    else
      pwant[p] = 2
    end
    pkey[p], pkind[p], pj0[p] = KEYS[k], kind, nw + 1
    k = k + 1
    for _ = 1, n do
      nw = nw + 1
      wname[nw], wlim[nw], wkind[nw] = V[i], V[i + 1], kind
      if kind == 5 then
        cb0[nw], cb1[nw], cb2[nw], cb3[nw] = tonumber(ARGV[x]), tonumber(ARGV[x + 1]), tonumber(ARGV[x + 2]), tonumber(ARGV[x + 3])
        i, x = i + 2, x + 4
      else
        wlim[nw], wlen[nw], wburst[nw] = V[i + 2], V[i + 1], V[i + 3]
        i = i + 4
      end
    end
    pj1[p] = nw
  end
  local bkey, after, within, bfor, wait
  if hasban then
    bkey, after, within, bfor, wait = KEYS[k], V[i], V[i + 1], V[i + 2], V[i + 3]
    k, i = k + 1, i + 4
  end
  local lkey, lmax, ltimeout, lid
  if haslease then
    lkey, lmax, ltimeout, lid = KEYS[k], V[i], V[i + 1], ARGV[x]
    k = k + 1
  end
  if mode == 4 then
    redis.call("ZREM", lkey, lid)
    return {1, 0, 0, -1, 0}
  end
  local overridden, ovend = false, 0
  if hasov then
    overridden, ovend = override(KEYS[k], scope, nparts, now)
  end
  if overridden and mode ~= 3 then
    for p = 1, nparts do
      for j = pj0[p], pj1[p] do
        local capacity = wlim[j]
        if wkind[j] == 4 and wburst[j] > 0 then
          capacity = wburst[j]
        end
        if cost > capacity then
          local reply = {4, 0, 0, -1, 0}
          for i = 1, nw do
            reply[3 * i + 3], reply[3 * i + 4], reply[3 * i + 5] = 0, 0, 0
          end
          return with_limits(reply, nw)
        end
      end
    end
  end
  local peek, record = mode == 1, mode == 3

  local ban, banleft = false, 0
  if hasban and not record then
    ban = redis.call("HMGET", bkey, "u", "w", "c", "p")
    local u = tonumber(ban[1])
    if u and u > now then
      banleft = u - now
    end
  end

  local fits, others = true, true
  for p = 1, nparts do
    local key, kind, j0, j1 = pkey[p], pkind[p], pj0[p], pj1[p]
    local ok
    if kind == 6 then
      ok = share_check(p, key, j0, j1, cost)
    elseif kind == 1 then
      ok, ptot[p], pnew[p], pmax[p], pread[p], pfmt[p] = log_check(key, j0, j1, now, cost, peek, pwant[p])
    elseif kind == 2 then
      ok, pstale[p] = ctr_part(key, j0, j1, now, cost, pwant[p])
    else
      local v, f
      v, f, pstale[p] = hash_read(key, kind, j0, j1)
      if kind == 3 then
        ok = fix_check(v, f, j0, j1, now, cost)
      elseif kind == 4 then
        ok, ptb[p] = tb_check(v, f, j0, j1, now, cost, pstale[p] and not peek)
      else
        ok = cal_check(v, j0, j1, now, cost)
      end
    end
    if not ok then
      fits = false
      if kind ~= 6 then
        others = false
      end
    end
  end

  local inflight, leasedenied = -1, 0
  if haslease and not record then
    if peek then
      inflight = redis.call("ZCOUNT", lkey, "(" .. num(now), "+inf")
    else
      redis.call("ZREMRANGEBYSCORE", lkey, "-inf", num(now))
      inflight = redis.call("ZCARD", lkey)
    end
    if inflight >= lmax then
      leasedenied = 1
    end
  end

  local allowed = record or (banleft == 0 and fits and leasedenied == 0)
  local recording = allowed and not peek and mode ~= 2
  -- shflags: the share's flags for the reply; asking: a share is short and
  -- the caller asks the ledger now (not a refusal yet: no ban counts it).
  local shflags, asking = 0, false
  for p = 1, nparts do
    local key, kind, j0, j1 = pkey[p], pkind[p], pj0[p], pj1[p]
    if kind == 6 then
      if not peek and not record then
        local demand = banleft == 0 and leasedenied == 0 and others
        local f = share_after(p, key, j0, j1, cost, demand, recording)
        shflags = shflags + f
        if f % 8 >= 4 then -- 4: the caller asks the ledger now
          asking = true
        end
      end
    elseif kind == 1 then
      if recording then
        log_record(key, j0, j1, now, cost, ptot[p], pnew[p], pmax[p], pread[p], pfmt[p], pwant[p])
      end
    elseif recording or (pstale[p] and not peek) then
      -- A hash with fields of windows a reload replaced is rewritten in the
      -- new windows even when nothing is recorded (cost 0): the budget it
      -- carried over then counts down as its own, and its TTL is the new
      -- policy's. A token state under another interval or burst alone
      -- (ptb) is rewritten only by a check that records: rewritten on a
      -- denial, capped at this node's full bucket, it would show a node of
      -- a larger bucket (limits apart during a reload) fewer units in use
      -- than when it denied, and its cached denial would outlast the
      -- store's answer. Left as written, it drains as written, and the
      -- check's retry and reset say so (tb_check).
      local c = cost
      if not recording then
        c = 0
        for j = j0, j1 do
          s1r[j] = rst[j]
        end
      end
      local ttl, keep
      if kind == 2 then
        ttl = ctr_record(j0, j1, c, pstale[p])
      elseif kind == 3 then
        ttl, keep = fix_record(j0, j1, now, c)
      elseif kind == 4 then
        ttl = tb_record(j0, j1, now, c)
      else
        ttl = cal_record(j0, j1, now, c)
      end
      hash_write(key, ttl, pstale[p] or (kind == 4 and ptb[p]), keep)
      if not recording then
        for j = j0, j1 do
          rst[j] = s1r[j]
        end
      end
    end
  end
  if allowed and not peek and haslease and not record then
    redis.call("ZADD", lkey, num(now + ltimeout), lid)
    redis.call("PEXPIRE", lkey, num(math.ceil(ltimeout / 1000) + 1000))
    inflight = inflight + 1
  end
  for p = 1, nparts do
    if pkind[p] == 2 then
      ctr_reset(pj0[p], pj1[p], now)
    end
  end
  if overridden then
    -- The limits come back when the override ends: no retry goes past it.
    for j = 1, nw do
      if rty[j] > ovend - now then
        rty[j] = ovend - now
      end
    end
  end

  local status = 0
  if banleft > 0 then
    status = 2
  elseif allowed then
    status = 1
  end
  local started = 0
  if hasban and banleft == 0 and (mode == 0 or mode == 2) and not fits then
    local retry = 0
    for j = 1, nw do
      if rty[j] > retry then
        retry = rty[j]
      end
    end
    if retry > wait and not (asking and others) and ban_count(bkey, ban, 1, now, after, within, bfor) then
      status, banleft, started = 2, bfor, 1
    end
  end

  local reply
  if banleft == 0 and inflight == -1 and leasedenied + shflags == 0 and not overridden then
    -- The short form: no ban, no lease, no flag (4 values fewer for Redis
    -- to turn into RESP). (One constructor sizes the table once; appending
    -- grows it.)
    if nw == 1 then
      return {status, cnt[1], rty[1], rst[1]}
    end
    reply = {status}
    for j = 1, nw do
      reply[3 * j - 1], reply[3 * j], reply[3 * j + 1] = cnt[j], rty[j], rst[j]
    end
    return reply
  end
  if nw == 1 then
    reply = {status, banleft, started, inflight, leasedenied + shflags, cnt[1], rty[1], rst[1]}
  else
    reply = {status, banleft, started, inflight, leasedenied + shflags}
    for j = 1, nw do
      reply[3 * j + 3], reply[3 * j + 4], reply[3 * j + 5] = cnt[j], rty[j], rst[j]
    end
  end
  if overridden then
    return with_limits(reply, nw)
  end
  return reply
end

-- checks decides the checks of a call of several from the RI-th (of n),
-- whose values start at ARGV[RA] and keys at KEYS[RK], appending their
-- replies to OUT. Before a check runs, RA, RK and RI say the next one's and
-- RV that its shape was read.
local RA, RK, RI, RV = 0, 0, 0, false
local function checks(n)
  local a, k = RA, RK
  local ls, V = false, false
  for i = RI, n do
    hn = 0
    RV = false
    local s = ARGV[a]
    if s ~= ls then
      V, ls = SHAPE[s] or shape_of(s), s
    end
    RA, RK, RI, RV = a + V.na, k + V.nk, i + 1, true
    local f, r = V.fast, nil
    if f then
      r = f(a, k, V)
    end
    if not r then
      r = decide(a, k, V, true)
    end
    if r ~= true then
      ON = ON + 1
      OUT[ON] = r
    end
    a, k = RA, RK
  end
end

-- run decides the call's checks, in order, and returns their replies. A
-- check that failed leaves nothing queued for the next one.
local function run()
  now_redis = false
  if not INT then
    formats()
  end
  hn = 0
  local n = tonumber(ARGV[1])
  bases()
  OUT, ON = KEEP, 0
  local a, k = 4, 1
  if n == 1 then
    local r = decide(a, k, SHAPE[ARGV[a]] or shape_of(ARGV[a]))
    if r ~= true then
      -- One table for Redis to turn into RESP, not two: flat, built in C.
      OUT, ON = {8 * #r + r[1], unpack(r, 2)}, #r
    end
  else
    -- One pcall for the checks, not one each: an error ends checks with
    -- RI past the check that raised it, which the error answers, and the
    -- next pcall goes on from there; an error reading a shape (RV false)
    -- fails the call, as it did outside the checks' pcalls.
    RA, RK, RI = a, k, 1
    while true do
      local ok, r = pcall(checks, n)
      if ok then
        break
      end
      if not RV then
        error(r, 0)
      end
      if type(r) ~= "table" or not r.err then
        r = {err = tostring(r)}
      end
      ON = ON + 1
      OUT[ON] = r
    end
  end
  -- The call's reading of Redis TIME (0: none), after the checks' replies.
  ON = ON + 1
  local out = OUT
  out[ON] = now_redis or 0
  OUT = false
  if out == KEEP then
    local i = ON + 1
    while out[i] ~= nil do
      out[i] = nil
      i = i + 1
    end
    if ON > 4096 then
      KEEP = {}
    end
  end
  return out
end

-- @entry
