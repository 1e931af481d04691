-- sliding_log.lua: the exact sliding-window log, one sorted set per bucket
-- serving every duration window of the bucket. Spliced into decide.lua, whose
-- header gives the clock, the units and the window arrays (wlen, wlim, cnt,
-- rty, rst) these functions read and fill.
--
-- Entries (ZSET), one member per admitted request whatever its cost, the
-- same in both formats below:
--   "<B>[:<cost>]" score t          t: when it was admitted; B: the units admitted
--                                   to the key before it (cumulative), in 16
--                                   digits so requests admitted at the same µs
--                                   sort by B; ":<cost>" when the cost is not 1
-- Admission times never go back (a request stamped before the newest entry's
-- time tn, from a caller whose clock lags, is recorded at tn), so B grows with
-- t and the units in a window (now - w, now] are exactly T - B(its first
-- entry), T being the units admitted so far (the next B), whatever the costs.
-- One request writes one member: a cost of a million costs Redis what a cost
-- of one does.
--
-- The key says its format by the members that score below zero (sorted
-- first, never pruned: ZREMRANGEBYSCORE 0 <cut> leaves them):
--   format 1 (releases before the format version; kind 7 writes it):
--     "#n" score -(T + 1) and "#t" score -(tn + 1), rewritten on every
--     admission; ZRANGE 0 2 reads T, tn and the oldest entry.
--   format 2 (kind 1 writes it): "#2" score -inf, written once; T and tn
--     come from the newest entry (T = its B + its cost, tn = its score);
--     ZRANGE 0 1 reads the format and the oldest entry, ZRANGE -1 -1 the
--     newest. A format-2 key whose entries are all pruned holds "#2" alone
--     (T and tn start again from nothing: no entry is left to order after).
--   format 3 (kind 11 writes it; the default): the entries newest first
--     and carrying their time, so that a check's reads format no score and
--     its ZADD lands at the head of a listpack instead of walking it:
--       <D, 7 bytes><t, 7 bytes>[<cost>] score -t
--     D = 2^53 - 1 - B and t big-endian (D's first byte is 0x10-0x1f, never
--     "#"; members of one score sort by D, so newest first too), the cost
--     in decimal digits when not 1; "#3" score +inf, written once, says the
--     format and sorts last. ZRANGE 0 0 reads the newest entry (or "#3": no
--     entry); ZREVRANGE ranks are format 2's ZRANGE ranks (0: "#3", 1: the
--     oldest entry). Its fast path (log3_fast) prunes lazily: the entries
--     out of the window go on the first admission in each span of the TTL
--     (below) and on every check decide takes, so a check finds the
--     window's first entry by ZREVRANGEBYSCORE from the tail.
-- Every format is read by every check; a check that writes (not a peek)
-- first turns a key of another format into the one it writes (1 and 2:
-- ZREM of the other's members, ZADD of its own, the entries as they are;
-- to or from 3: every entry rewritten, log_convert3), so nodes of this
-- release writing any of them stay exact on one key. A release before the
-- format version reads a format-2 or format-3 key's first members as its
-- oldest entry and fails on it (its B is not a number): that check errors
-- and the node's fail mode answers, rather than reading the key as empty.
-- See docs/redis.md, "Upgrading".
--
-- TTL: format 1 refreshes it on every write (the longest window + 1 s).
-- Formats 2 and 3 set it to the longest window + S + 1 s (S = an eighth of the
-- longest window, at least 1 µs) on the first admission in each span of S µs
-- (floor(at / S) differs from the newest entry's) and leaves it on the
-- others: an entry admitted at at lies within S after the one whose write
-- set the TTL, so it still has its window and a second. (A key turned from
-- another format into 2 or 3 gets that TTL then.) Format 3's lazy prune
-- leaves at most the entries of one span past the window (and the check
-- that finds the log near its cap goes to decide, which prunes).
--
-- The log holds at most LOG_MAX_ENTRIES requests (one entry each) in its
-- longest window: a request beyond them is denied until the oldest leaves,
-- whatever units are left, so no key grows past 10,000 members and no check
-- (nor the key's expiry) touches more (about 1.4 ms of Redis at the most).
-- A limit of at most 10,000 units never meets it.
--
-- Per window: count = units in the window (after the request when recorded);
-- retry = when denied, the time until the window has room for the cost (the
-- last entry p with B(p) < T + cost - limit must leave: t(p) + w - now);
-- reset = the time until the oldest unit in the window leaves it (0 if empty).
-- An entry exactly w old is out of the window.

-- What decide.lua calls; the file's other locals live in the block below,
-- which ends with the file (a function's locals are at most 200, and
-- decide.lua's body is one function).
local log_check, log_record
do
local LOG_MAX_T = 4503599627370496 -- 2^52: rebase B before doubles lose units
local LOG_MAX_ENTRIES = 10000

-- log_member names a request's member: B zero-padded, so that members of
-- one score (one µs) sort as they were admitted, and its cost unless 1.
local function log_member(b, cost)
  if not MEMBER then
    formats()
  end
  if cost == 1 then
    return string.format(MEMBER, b)
  end
  return string.format(MEMBER_COST, b, cost)
end

-- log_b is B of a member: its first 16 digits.
local function log_b(m)
  -- (not + 0: the Lua of miniredis reads leading zeros as octal there)
  if #m == 16 then
    return tonumber(m)
  end
  return tonumber(string.sub(m, 1, 16))
end

-- Format 3's members (see the header): log3_member writes one, log3_read
-- reads B, t and the cost of one. D and t are below 2^53, so the bytes are
-- exact in Lua's numbers.
local LOG3_D = 9007199254740991 -- 2^53 - 1
local function log3_bytes(x)
  local x7 = x % 256
  x = (x - x7) / 256
  local x6 = x % 256
  x = (x - x6) / 256
  local x5 = x % 256
  x = (x - x5) / 256
  local x4 = x % 256
  x = (x - x4) / 256
  local x3 = x % 256
  x = (x - x3) / 256
  local x2 = x % 256
  return (x - x2) / 256, x2, x3, x4, x5, x6, x7
end
local function log3_member(b, cost, t)
  local d1, d2, d3, d4, d5, d6, d7 = log3_bytes(LOG3_D - b)
  local t1, t2, t3, t4, t5, t6, t7 = log3_bytes(t)
  local m = string.char(d1, d2, d3, d4, d5, d6, d7, t1, t2, t3, t4, t5, t6, t7)
  if cost ~= 1 then
    return m .. num(cost)
  end
  return m
end
local function log3_read(m)
  local d1, d2, d3, d4, d5, d6, d7, t1, t2, t3, t4, t5, t6, t7 = string.byte(m, 1, 14)
  local b = LOG3_D - ((((((d1 * 256 + d2) * 256 + d3) * 256 + d4) * 256 + d5) * 256 + d6) * 256 + d7)
  local t = (((((t1 * 256 + t2) * 256 + t3) * 256 + t4) * 256 + t5) * 256 + t6) * 256 + t7
  if #m > 14 then
    return b, t, tonumber(string.sub(m, 15))
  end
  return b, t, 1
end

-- log_at and log3_at read a log by rank, log_at a format-1 or format-2 one
-- (ranks by ZRANGE), log3_at a format-3 one (by ZREVRANGE: the same ranks):
-- the B of the entry of rank r, its time when t (log3_at: always) and, when
-- r1 = r + 1, the next entry's B (false past the last); false: no entry.
local function log_at(key, r, r1, t)
  if not t then
    return log_b(redis.call("ZRANGE", key, num(r), num(r1))[1])
  end
  local e = redis.call("ZRANGE", key, num(r), num(r1), "WITHSCORES")
  if not e[1] then
    return false
  end
  return log_b(e[1]), e[2] + 0, e[3] and log_b(e[3])
end
local function log3_at(key, r, r1)
  local e = redis.call("ZREVRANGE", key, num(r), num(r1))
  if not e[1] then
    return false
  end
  local b, t = log3_read(e[1])
  return b, t, e[2] and log3_read(e[2])
end

-- log_retry is the time until the window whose first entry has rank r0 and
-- B = b0 has room: the last entry with B < x (x = T + cost - limit > b0)
-- must leave it. at reads the log (log_at, log3_at: its format's).
local function log_retry(key, r0, b0, x, w, now, at)
  -- With unit costs that entry has rank r0 + x - 1 - b0; with larger costs
  -- it comes at or before it.
  local g = r0 + x - 1 - b0
  local b, t, bn = at(key, g, g + 1, true)
  if b and b < x and (not bn or bn >= x) then
    return t + w - now
  end
  local lo, hi = r0, g
  if not b then
    hi = redis.call("ZCARD", key)
  end
  while hi - lo > 1 do
    local mid = math.floor((lo + hi) / 2)
    if at(key, mid, mid) < x then
      lo = mid
    else
      hi = mid
    end
  end
  local _, tl = at(key, lo, lo, true)
  return tl + w - now
end

-- log_first and log3_first find the first entry of the window w of a log
-- (log_first: format 1 or 2; log3_first: format 3, past the entries a lazy
-- prune left): its member, B, time and rank; false when the window is empty.
local function log_first(key, w, now)
  local f = redis.call("ZRANGEBYSCORE", key, "(" .. num(now - w), "+inf", "WITHSCORES", "LIMIT", "0", "1")
  local m = f[1]
  if not m then
    return false
  end
  return m, log_b(m), f[2] + 0, redis.call("ZRANK", key, m)
end
local function log3_first(key, w, now)
  local m = redis.call("ZREVRANGEBYSCORE", key, "(" .. num(w - now), "-inf", "LIMIT", "0", "1")[1]
  if not m then
    return false
  end
  local b, t = log3_read(m)
  return m, b, t, redis.call("ZREVRANK", key, m)
end

-- log3_head is log_head of a format-3 key whose first member (ZRANGE 0 1)
-- is m: the entries out of the longest window pruned first unless peek. A
-- peek, which writes nothing, reads the longest window's first entry past
-- those a lazy prune left, and counts ranks from it (the "first entry").
local function log3_head(key, m, now, maxw, peek)
  if m == "#3" then
    return 3, 0, false, false, false, 1
  end
  local nb, nt, nc = log3_read(m)
  if peek then
    local om, _, ot, r = log3_first(key, maxw, now)
    if not om then
      return 3, nb + nc, nt, false, false, 1
    end
    return 3, nb + nc, nt, om, ot, r
  end
  redis.call("ZREMRANGEBYSCORE", key, num(maxw - now), "0")
  if nt <= now - maxw then
    return 3, 0, false, false, false, 1 -- every entry went
  end
  local om = redis.call("ZREVRANGE", key, "1", "1")[1]
  local _, ot = log3_read(om)
  return 3, nb + nc, nt, om, ot, 1
end

-- log_cost is the cost of a member: after its 16 digits and ':', else 1.
local function log_cost(m)
  if #m > 16 then
    return tonumber(string.sub(m, 18))
  end
  return 1
end

-- log_head reads a log's format (0: no key), T, tn (false when it holds no
-- entry), its oldest entry and that entry's score, and the rank of the
-- first entry (the members before it are the format's; in format 3 by
-- ZREVRANGE). A format-3 key is pruned here (log3_head), the others by
-- log_check before.
local function log_head(key, now, maxw, peek)
  local h = redis.call("ZRANGE", key, "0", "1", "WITHSCORES")
  local m = h[1]
  if not m then
    return 0, 0, false, false, false, 0
  end
  if m == "#3" or string.byte(m) < 32 then
    return log3_head(key, m, now, maxw, peek)
  end
  if m == "#2" then
    local om = h[3]
    if not om then
      return 2, 0, false, false, false, 1
    end
    local e = redis.call("ZRANGE", key, "-1", "-1", "WITHSCORES")
    local nm = e[1]
    local nc = 1
    if #nm > 16 then
      nc = log_cost(nm)
    end
    return 2, log_b(nm) + nc, e[2] + 0, om, h[4] + 0, 1
  end
  local total, newest = false, false
  for i = 1, #h, 2 do
    if h[i] == "#n" then
      total = -(h[i + 1] + 0) - 1
    elseif h[i] == "#t" then
      newest = -(h[i + 1] + 0) - 1
    end
  end
  if not total or not newest then
    return error("sliding_log: " .. key .. " is in no known format")
  end
  local e = redis.call("ZRANGE", key, "2", "2", "WITHSCORES")
  if e[1] then
    return 1, total, newest, e[1], e[2] + 0, 2
  end
  return 1, total, newest, false, false, 2
end

-- log_span is format 2's span of TTL for a longest window maxw:
-- math.floor(maxw / 8), at least 1; log_ttl2 its TTL in ms.
local function log_span(maxw)
  local span = maxw - maxw % 8
  if span < 8 then
    return 1
  end
  return span / 8
end
local function log_ttl2(maxw)
  return math.ceil((maxw + log_span(maxw)) / 1000) + 1000
end

-- log_entries reads every entry of a log of format fmt (1, 2 or 3),
-- oldest first: their B, time and cost in three arrays, and how many.
local function log_entries(key, fmt)
  local eb, et, ec, n = {}, {}, {}, 0
  if fmt == 3 then
    local all = redis.call("ZREVRANGE", key, "1", "-1")
    for i = 1, #all do
      n = n + 1
      eb[n], et[n], ec[n] = log3_read(all[i])
    end
  else
    local all = redis.call("ZRANGE", key, (fmt == 2 and "1") or "2", "-1", "WITHSCORES")
    for i = 1, #all, 2 do
      n = n + 1
      eb[n], et[n], ec[n] = log_b(all[i]), all[i + 1] + 0, log_cost(all[i])
    end
  end
  return eb, et, ec, n
end

-- log_convert3 turns a log of format fmt into format want, one of them 3:
-- every entry rewritten (its B, cost and time as they were), the other
-- format's members gone, the TTL set as want's. It returns the key's format
-- and the rank of its first entry after.
local function log_convert3(key, fmt, want, total, newest, maxw)
  local eb, et, ec, n = log_entries(key, fmt)
  redis.call("DEL", key)
  local args, na = {}, 0
  if want == 3 then
    args[1], args[2], na = "+inf", "#3", 2
  elseif want == 2 then
    args[1], args[2], na = "-inf", "#2", 2
  elseif n > 0 then
    args[1], args[2], args[3], args[4], na = num(-total - 1), "#n", num(-newest - 1), "#t", 4
  else
    return 0, 0 -- nothing was left: the key is gone
  end
  for i = 1, n do
    if want == 3 then
      args[na + 1], args[na + 2] = num(-et[i]), log3_member(eb[i], ec[i], et[i])
    else
      args[na + 1], args[na + 2] = num(et[i]), log_member(eb[i], ec[i])
    end
    na = na + 2
    if na >= 1000 or i == n then
      redis.call("ZADD", key, unpack(args, 1, na))
      na = 0
    end
  end
  if na > 0 then
    redis.call("ZADD", key, unpack(args, 1, na))
  end
  if want == 1 then
    redis.call("PEXPIRE", key, num(math.ceil(maxw / 1000) + 1000))
    return 1, 2
  end
  redis.call("PEXPIRE", key, num(log_ttl2(maxw)))
  return want, 1
end

-- log_convert turns a log of format fmt into format want (both 1 or 2), in
-- place: the entries stay, the members of the format go. It returns the
-- key's format and the rank of its first entry after.
local function log_convert(key, fmt, want, total, newest)
  if want == 2 then
    redis.call("ZREM", key, "#n", "#t")
    redis.call("ZADD", key, "-inf", "#2")
    return 2, 1
  end
  redis.call("ZREM", key, "#2")
  if not newest then
    return 0, 0 -- nothing was left: the key is gone
  end
  redis.call("ZADD", key, num(-total - 1), "#n", num(-newest - 1), "#t")
  return 1, 2
end

-- log_check fills windows j0..j1 of one log and reports whether the cost
-- fits all of them, with what log_record needs: T, tn, the longest window
-- and the key's format (as read, and after a conversion to want).
function log_check(key, j0, j1, now, cost, peek, want)
  local maxw = 0
  for j = j0, j1 do
    if wlen[j] > maxw then
      maxw = wlen[j]
    end
  end
  if not peek then
    redis.call("ZREMRANGEBYSCORE", key, "0", num(now - maxw))
  end
  local read, total, newest, om, ot, base = log_head(key, now, maxw, peek)
  local fmt = read
  if read ~= 0 and read ~= want and not peek then
    if read == 3 or want == 3 then
      fmt, base = log_convert3(key, read, want, total, newest, maxw)
    else
      fmt, base = log_convert(key, read, want, total, newest)
    end
    if fmt == 2 and read == 1 then
      -- Format 1's TTL has no span: format 2's admissions in the newest
      -- entry's span would leave it (log_record).
      redis.call("PEXPIRE", key, num(log_ttl2(maxw)))
    end
  end
  local fits = true
  local full = 0
  local ob = om and ((read == 3 and log3_read(om)) or log_b(om))
  if om and total - ob >= LOG_MAX_ENTRIES then
    -- Enough units for the entry cap to matter: count the entries.
    if redis.call("ZCARD", key) - base >= LOG_MAX_ENTRIES then
      full = ot + maxw - now
    end
  end
  for j = j0, j1 do
    local w, limit = wlen[j], wlim[j]
    local m, t, r0, b0 = om, ot, base, ob
    if m and t <= now - w then
      -- The oldest entry is older than this window: find the window's first.
      m, b0, t, r0 = ((fmt == 3 and log3_first) or log_first)(key, w, now)
    end
    local count, retry, reset = 0, 0, 0
    if m then
      count = total - b0
      reset = t + w - now
    else
      b0 = 0
    end
    if count + cost > limit then
      fits = false
      if cost > limit then
        retry = w
      else
        retry = log_retry(key, r0, b0, total + cost - limit, w, now, (fmt == 3 and log3_at) or log_at)
      end
    end
    if full > 0 and w == maxw then
      fits = false
      if full > retry then
        retry = full
      end
    end
    cnt[j], rty[j], rst[j] = count, retry, reset
  end
  return fits, total, newest, maxw, read, fmt
end

-- log_rebase takes b0, the oldest entry's B, from every entry of a log of
-- format fmt (once per 2^52 units of one key) and returns T after.
local function log_rebase(key, total, fmt)
  local eb, et, ec, n = log_entries(key, fmt)
  local b0 = total
  if n > 0 then
    b0 = eb[1]
  end
  if fmt == 3 then
    redis.call("ZREMRANGEBYRANK", key, "0", "-2")
  else
    redis.call("ZREMRANGEBYRANK", key, (fmt == 2 and "1") or "2", "-1")
  end
  for i = 1, n do
    if fmt == 3 then
      redis.call("ZADD", key, num(-et[i]), log3_member(eb[i] - b0, ec[i], et[i]))
    else
      redis.call("ZADD", key, num(et[i]), log_member(eb[i] - b0, ec[i]))
    end
  end
  return total - b0
end

-- log_record adds the request's member in format want (read: the key's
-- format as log_check read it, fmt: after), sets the TTL as that format
-- does and brings the windows' counts and resets to after the request.
function log_record(key, j0, j1, now, cost, total, newest, maxw, read, fmt, want)
  local at = now
  if newest and newest > at then
    at = newest
  end
  if total + cost >= LOG_MAX_T then
    total = log_rebase(key, total, (want == 3 and 3) or (fmt == 2 and 2) or 1)
  end
  if want == 3 then
    if fmt == 3 then
      redis.call("ZADD", key, num(-at), log3_member(total, cost, at))
    else
      redis.call("ZADD", key, "+inf", "#3", num(-at), log3_member(total, cost, at))
    end
    local span = log_span(maxw)
    if not (read == 3 and newest and at - at % span == newest - newest % span) then
      redis.call("PEXPIRE", key, num(log_ttl2(maxw)))
    end
  elseif want == 1 then
    redis.call("ZADD", key, num(at), log_member(total, cost), num(-(total + cost) - 1), "#n", num(-at - 1), "#t")
    redis.call("PEXPIRE", key, num(math.ceil(maxw / 1000) + 1000))
  else
    if fmt == 2 then
      redis.call("ZADD", key, num(at), log_member(total, cost))
    else
      redis.call("ZADD", key, "-inf", "#2", num(at), log_member(total, cost))
    end
    local span = log_span(maxw)
    if not (read == 2 and newest and at - at % span == newest - newest % span) then
      redis.call("PEXPIRE", key, num(log_ttl2(maxw)))
    end
  end
  for j = j0, j1 do
    if cnt[j] == 0 then
      rst[j] = at + wlen[j] - now
    end
    cnt[j] = cnt[j] + cost
  end
end

-- log_fast is the fast path (decide.lua's FAST) of a check of one log of
-- one window, in format 2, mode 0: log_check and log_record for that case,
-- in a row, with the reply's short form. A key in format 1, or a window
-- whose oldest entry is older than it (it cannot be after the prune), goes
-- to decide, whose prune is this one again.
local function log_fast(a, k, V)
  if LATE then
    local late = fast_late(a)
    if late then
      return late
    end
  end
  local now = ARGV[a + 1]
  if now == "0" then
    now = now_redis or clock()
  else
    now = now + NBASE
  end
  local key, cost, w, limit = KEYS[k], V[2], V[11], V[12]
  rcall("ZREMRANGEBYSCORE", key, "0", sfmt(INT, now - w))
  local h = rcall("ZRANGE", key, "0", "1", "WITHSCORES")
  local m = h[1]
  if not m or (m == "#2" and not h[3]) then
    -- No entry: the check's cost alone.
    if cost > limit then
      return fast_reply(0, 0, w, 0)
    end
    if m then
      rcall("ZADD", key, sfmt(INT, now), log_member(0, cost))
    else
      rcall("ZADD", key, "-inf", "#2", sfmt(INT, now), log_member(0, cost))
    end
    rcall("PEXPIRE", key, sfmt(INT, log_ttl2(w)))
    return fast_reply(1, cost, 0, w)
  end
  if m ~= "#2" then
    return nil
  end
  local ot = h[4] + 0
  if ot <= now - w then
    return nil
  end
  local e = rcall("ZRANGE", key, "-1", "-1", "WITHSCORES")
  local nm, om = e[1], h[3]
  local total, ob
  if #nm > 16 then
    total = log_b(nm) + log_cost(nm)
  elseif ZEROS then
    total = nm + 1
  else
    total = tonum(nm) + 1
  end
  if #om == 16 and ZEROS then
    ob = om + 0
  else
    ob = log_b(om)
  end
  local newest = e[2] + 0
  local count = total - ob
  local retry, full = 0, 0
  if total - ob >= LOG_MAX_ENTRIES and rcall("ZCARD", key) - 1 >= LOG_MAX_ENTRIES then
    full = ot + w - now
  end
  if count + cost > limit or full > 0 then
    if count + cost > limit then
      if cost > limit then
        retry = w
      else
        retry = log_retry(key, 1, ob, total + cost - limit, w, now, log_at)
      end
    end
    if full > retry then
      retry = full
    end
    return fast_reply(0, count, retry, ot + w - now)
  end
  local at = now
  if newest > at then
    at = newest
  end
  if total + cost >= LOG_MAX_T then
    total = log_rebase(key, total, 2)
  end
  rcall("ZADD", key, sfmt(INT, at), log_member(total, cost))
  local span = log_span(w)
  if at - at % span ~= newest - newest % span then
    rcall("PEXPIRE", key, sfmt(INT, log_ttl2(w)))
  end
  return fast_reply(1, count + cost, 0, ot + w - now)
end
FAST[1] = log_fast

-- log3_fast is the fast path of a check of one log of one window, in format
-- 3, mode 0, as log_fast is format 2's. Its reads format no score: the
-- newest entry (ZRANGE 0 0), then the window's first (ZREVRANGEBYSCORE from
-- the tail, past the entries a lazy prune left); it prunes on the first
-- admission of a span, with the TTL. A key of another format, a log near
-- its entry cap or near the rebase of B go to decide. What repeats from
-- check to check (the span, the TTL, the bound's format) is kept in the
-- shape V; a score at now is the argument's digits after "-".
local sbyte, schar = false, false
local function log3_fast(a, k, V)
  if LATE then
    local late = fast_late(a)
    if late then
      return late
    end
  end
  local now = ARGV[a + 1]
  if now == "0" then
    now = now_redis or clock()
  else
    now = now + NBASE
  end
  local key, cost, w, limit = KEYS[k], V[2], V[11], V[12]
  local span, ttl = V.span3, V.ttl3
  if not span then
    span, ttl = log_span(w), sfmt(INT, log_ttl2(w))
    V.span3, V.ttl3, V.excl3 = span, ttl, "(" .. INT
    sbyte, schar = string.byte, string.char
  end
  local nm = rcall("ZRANGE", key, "0", "0")[1]
  -- nowarg: the check's now as sent, when sent whole (no base: NBASE 0;
  -- the caller sends a call's nows so when it holds a check of this form).
  local nowarg = "0"
  if NBASE == 0 then
    nowarg = ARGV[a + 1]
  end
  if not nm or nm == "#3" then
    -- No entry: the check's cost alone.
    if cost > limit then
      return fast_reply(0, 0, w, 0)
    end
    local sc = (nowarg ~= "0" and "-" .. nowarg) or sfmt(INT, -now)
    if nm then
      rcall("ZADD", key, sc, log3_member(0, cost, now))
    else
      rcall("ZADD", key, "+inf", "#3", sc, log3_member(0, cost, now))
    end
    rcall("PEXPIRE", key, ttl)
    return fast_reply(1, cost, 0, w)
  end
  if sbyte(nm) >= 32 then
    return nil
  end
  local d1, d2, d3, d4, d5, d6, d7, t1, t2, t3, t4, t5, t6, t7 = sbyte(nm, 1, 14)
  local total = LOG3_D + 1 - ((((((d1 * 256 + d2) * 256 + d3) * 256 + d4) * 256 + d5) * 256 + d6) * 256 + d7)
  local newest = (((((t1 * 256 + t2) * 256 + t3) * 256 + t4) * 256 + t5) * 256 + t6) * 256 + t7
  if #nm > 14 then
    total = total - 1 + tonum(string.sub(nm, 15))
  end
  local count, ot = 0, false
  if newest > now - w then
    local om = rcall("ZREVRANGEBYSCORE", key, sfmt(V.excl3, w - now), "-inf", "LIMIT", "0", "1")[1]
    d1, d2, d3, d4, d5, d6, d7, t1, t2, t3, t4, t5, t6, t7 = sbyte(om, 1, 14)
    local ob = LOG3_D - ((((((d1 * 256 + d2) * 256 + d3) * 256 + d4) * 256 + d5) * 256 + d6) * 256 + d7)
    ot = (((((t1 * 256 + t2) * 256 + t3) * 256 + t4) * 256 + t5) * 256 + t6) * 256 + t7
    count = total - ob
    if count >= LOG_MAX_ENTRIES then
      return nil
    end
    if count + cost > limit then
      local retry = w
      if cost <= limit then
        retry = log_retry(key, rcall("ZREVRANK", key, om), ob, total + cost - limit, w, now, log3_at)
      end
      return fast_reply(0, count, retry, ot + w - now)
    end
  elseif cost > limit then
    return fast_reply(0, 0, w, 0)
  end
  if total + cost >= LOG_MAX_T then
    return nil
  end
  local at, sc = now, nil
  if newest > now then
    at, sc = newest, sfmt(INT, -newest)
  elseif nowarg ~= "0" then
    sc = "-" .. nowarg
  else
    sc = sfmt(INT, -now)
  end
  -- log3_member(total, cost, at), its bytes in line.
  local x = LOG3_D - total
  d7 = x % 256
  x = (x - d7) / 256
  d6 = x % 256
  x = (x - d6) / 256
  d5 = x % 256
  x = (x - d5) / 256
  d4 = x % 256
  x = (x - d4) / 256
  d3 = x % 256
  x = (x - d3) / 256
  d2 = x % 256
  d1 = (x - d2) / 256
  x = at
  t7 = x % 256
  x = (x - t7) / 256
  t6 = x % 256
  x = (x - t6) / 256
  t5 = x % 256
  x = (x - t5) / 256
  t4 = x % 256
  x = (x - t4) / 256
  t3 = x % 256
  x = (x - t3) / 256
  t2 = x % 256
  t1 = (x - t2) / 256
  local m = schar(d1, d2, d3, d4, d5, d6, d7, t1, t2, t3, t4, t5, t6, t7)
  if cost ~= 1 then
    m = m .. sfmt(INT, cost)
  end
  rcall("ZADD", key, sc, m)
  if at - at % span ~= newest - newest % span then
    rcall("ZREMRANGEBYSCORE", key, sfmt(INT, w - now), "0")
    rcall("PEXPIRE", key, ttl)
  end
  if ot then
    return fast_reply(1, count + cost, 0, ot + w - now)
  end
  return fast_reply(1, cost, 0, at + w - now)
end
FAST[11] = log3_fast
end -- of sliding_log.lua's block
