-- sliding_log.lua: the exact sliding-window log, one sorted set per bucket
-- serving every duration window of the bucket. Spliced into decide.lua, whose
-- header gives the clock, the units and the window arrays (wlen, wlim, cnt,
-- rty, rst) these functions read and fill.
--
-- State (ZSET), one member per admitted request whatever its cost:
--   "<B>[:<cost>]" score t          t: when it was admitted; B: the units admitted
--                                   to the key before it (cumulative), in 16
--                                   digits so requests admitted at the same µs
--                                   sort by B; ":<cost>" when the cost is not 1
--   "#n"          score -(T + 1)    T: units admitted to the key so far (the next B)
--   "#t"          score -(tn + 1)   tn: the newest admission time
-- The two bookkeeping members score below zero, so they sort first:
-- ZRANGE 0 2 reads T, tn and the oldest entry in one call, and
-- ZREMRANGEBYSCORE 0 <cut> never removes them. Admission times never go back
-- (a request stamped before tn, from a caller whose clock lags, is recorded at
-- tn), so B grows with t and the units in a window (now - w, now] are exactly
-- T - B(its first entry), whatever the costs. One request writes one member:
-- a cost of a million costs Redis what a cost of one does.
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
-- An entry exactly w old is out of the window. Every write refreshes the TTL
-- (the longest window + 1 s).

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
  return tonumber(string.sub(m, 1, 16)) -- not + 0: the Lua of miniredis reads leading zeros as octal there
end

-- log_retry is the time until the window whose first entry has rank r0 and
-- B = b0 has room: the last entry with B < x (x = T + cost - limit > b0)
-- must leave it.
local function log_retry(key, r0, b0, x, w, now)
  -- With unit costs that entry has rank r0 + x - 1 - b0; with larger costs
  -- it comes at or before it.
  local g = r0 + x - 1 - b0
  local e = redis.call("ZRANGE", key, num(g), num(g + 1), "WITHSCORES")
  if #e >= 2 and log_b(e[1]) < x and (#e < 4 or log_b(e[3]) >= x) then
    return e[2] + w - now
  end
  local lo, hi = r0, g
  if #e < 2 then
    hi = redis.call("ZCARD", key)
  end
  while hi - lo > 1 do
    local mid = math.floor((lo + hi) / 2)
    if log_b(redis.call("ZRANGE", key, num(mid), num(mid))[1]) < x then
      lo = mid
    else
      hi = mid
    end
  end
  return tonumber(redis.call("ZRANGE", key, num(lo), num(lo), "WITHSCORES")[2]) + w - now
end

-- log_check fills windows j0..j1 of one log and reports whether the cost
-- fits all of them, with what log_record needs: T, tn and the longest window.
local function log_check(key, j0, j1, now, cost, peek)
  local maxw = 0
  for j = j0, j1 do
    if wlen[j] > maxw then
      maxw = wlen[j]
    end
  end
  if not peek then
    redis.call("ZREMRANGEBYSCORE", key, "0", num(now - maxw))
  end
  local h = redis.call("ZRANGE", key, "0", "2", "WITHSCORES")
  local total, newest, om, ot = 0, false, false, false
  for i = 1, #h, 2 do
    local m, s = h[i], h[i + 1] + 0
    if m == "#n" then
      total = -s - 1
    elseif m == "#t" then
      newest = -s - 1
    elseif not om then
      om, ot = m, s
    end
  end
  local fits = true
  local full = 0
  local ob = om and log_b(om)
  if om and total - ob >= LOG_MAX_ENTRIES then
    -- Enough units for the entry cap to matter: count the entries.
    if redis.call("ZCARD", key) - 2 >= LOG_MAX_ENTRIES then
      full = ot + maxw - now
    end
  end
  for j = j0, j1 do
    local w, limit = wlen[j], wlim[j]
    local m, t, r0, b0 = om, ot, 2, ob
    if m and t <= now - w then
      -- The oldest entry is older than this window: find the window's first.
      local f = redis.call("ZRANGEBYSCORE", key, "(" .. num(now - w), "+inf", "WITHSCORES", "LIMIT", "0", "1")
      m, t = f[1] or false, tonumber(f[2])
      if m then
        r0 = redis.call("ZRANK", key, m)
        b0 = log_b(m)
      end
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
        retry = log_retry(key, r0, b0, total + cost - limit, w, now)
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
  return fits, total, newest, maxw
end

-- log_record adds the request's member, refreshes the TTL and brings the
-- windows' counts and resets to after the request.
local function log_record(key, j0, j1, now, cost, total, newest, maxw)
  local at = now
  if newest and newest > at then
    at = newest
  end
  if total + cost >= LOG_MAX_T then
    -- Rebase B so counts stay exact: once per 2^52 units of one key.
    local all = redis.call("ZRANGE", key, "2", "-1", "WITHSCORES")
    local b0 = total
    if all[1] then
      b0 = log_b(all[1])
    end
    redis.call("ZREMRANGEBYRANK", key, "2", "-1")
    for i = 1, #all, 2 do
      local m = all[i]
      local c = 1
      if #m > 16 then
        c = tonumber(string.sub(m, 18))
      end
      redis.call("ZADD", key, all[i + 1], log_member(log_b(m) - b0, c))
    end
    total = total - b0
  end
  redis.call("ZADD", key, num(at), log_member(total, cost), num(-(total + cost) - 1), "#n", num(-at - 1), "#t")
  redis.call("PEXPIRE", key, num(math.ceil(maxw / 1000) + 1000))
  for j = j0, j1 do
    if cnt[j] == 0 then
      rst[j] = at + wlen[j] - now
    end
    cnt[j] = cnt[j] + cost
  end
end
