-- share.lua: a data centre's share of an identity's global ceiling, when
-- the ceiling is kept in a ledger every data centre shares (global_redis).
-- Spliced into decide.lua (clock, window arrays, flags). The share is
-- checked in the same call as the region's own windows: a request is
-- admitted only when both have room, and then both record it.
--
-- State, one hash per identity in the data centre's Redis: up to four
-- grants from the ledger, slot i = 1..4:
--   "<i>n" units granted, "<i>u" units used, "<i>d" the deadline (Redis
--   TIME, µs) after which the grant is never used, "<i>s" its start (the
--   time read before the ledger was asked: the deadline is start + the
--   grant's length, so it falls before the ledger's end of the grant
--   whatever the two clocks say), "<i>l" the last use, "<i>g" the ledger's
--   id of the grant;
-- "L": the signature of the global limits the grants were made under
-- (grants under others are not used); "f": until when the ledger has no more room (its own estimate, as a
-- time here); "k": when a share the ledger had no room for asks again
-- anyway (a second at most: the ledger hears its demand, keeps its fair
-- part for it and recalls others' unspent grants); "c": until when a node
-- holds the claim to renew; "dw", "dc", "dp": the demand (units asked for
-- by requests that every other window admitted), per second, this second's
-- and the last one's.
--
-- The share always reads Redis TIME (a grant's deadline is on this Redis's
-- clock, one clock for every node of the data centre), whatever clock the
-- region's windows use.
--
-- "G": the units the ledger counted in each window of the ceiling (in the
-- part's order, space-separated) at the last renewal that reached it.
--
-- Per window of the global ceiling (they share the one pool): count = what
-- the ledger counted at the last renewal less what the share still holds
-- unspent (remaining = the ledger's room then, and this data centre's
-- share: never the share alone shown as the ceiling's remaining); without
-- "G" (a share an older release wrote), the limit less the share; retry = when the share is short, the
-- time until the ledger said it has room; else the lead (a renewal is on its
-- way); or 1 µs when the ledger never answered for these limits (the
-- identity's first request here: the caller asks it now); reset = the time
-- until the first grant ends. That first request waits for the ledger, and
-- so does one the share alone refuses while the ledger has not said it is
-- full (the caller joins or makes a renewal); every other short share is
-- renewed in the background.

local share_fields = {
  "1n", "1u", "1d", "1s", "1l", "1g", "2n", "2u", "2d", "2s", "2l", "2g",
  "3n", "3u", "3d", "3s", "3l", "3g", "4n", "4u", "4d", "4s", "4l", "4g",
  "f", "c", "dw", "dc", "dp", "L", "G", "k",
}

-- Per share part of the check being decided: the hash's values, what the
-- share holds and whether it fits, the renewal's lead and claim, and the
-- limits' signature.
local sh_v, sh_rem, sh_fit, sh_lead, sh_claim, sh_sig, sh_new = {}, {}, {}, {}, {}, {}, {}
local sh_g = {} -- per share part: the ledger's counts ("G"), by window from 1

-- share_count is window j's count (of part p's windows j0..): what the
-- ledger counted less rem, the share's unspent units; the limit less rem
-- without "G".
local function share_count(p, j, j0, rem)
  return math.max((sh_g[p][j - j0 + 1] or wlim[j]) - rem, 0)
end

-- share_check fills the share's windows j0..j1 and reports whether the
-- share holds cost.
local function share_check(p, key, j0, j1, cost)
  local t = clock()
  local v = redis.call("HMGET", key, unpack(share_fields))
  -- new: the ledger never answered this data centre for the identity
  -- under these limits: its first request may wait for the ledger.
  sh_new[p] = v[30] ~= sh_sig[p]
  if sh_new[p] then
    -- Grants made under other limits (a reload, another placeholder
    -- value) are not used under these, nor what the ledger said of them.
    for i = 1, 25 do
      v[i] = false
    end
    v[31], v[32] = false, false
  end
  local g = {}
  if v[31] then
    for x in string.gmatch(v[31], "%d+") do
      g[#g + 1] = tonumber(x)
    end
  end
  sh_g[p] = g
  local rem, soon = 0, 0
  for i = 0, 3 do
    local n, u, d = tonumber(v[i * 6 + 1]), tonumber(v[i * 6 + 2]), tonumber(v[i * 6 + 3])
    if n and d > t and u < n then
      rem = rem + n - u
      if soon == 0 or d < soon then
        soon = d
      end
    end
  end
  local f = tonumber(v[25]) or 0
  local fits = rem >= cost
  for j = j0, j1 do
    cnt[j], rty[j], rst[j] = share_count(p, j, j0, rem), 0, 0
    if soon > 0 then
      rst[j] = soon - t
    end
    if not fits then
      -- Until the ledger has room, as it said; else, a renewal is on its
      -- way (the lead), or, new, the caller asks now.
      if f > t then
        rty[j] = f - t
      elseif sh_new[p] then
        rty[j] = 1
      else
        rty[j] = math.max(sh_lead[p], 1000)
      end
    end
  end
  sh_v[p], sh_rem[p], sh_fit[p] = v, rem, fits
  return fits
end

-- share_rate is the demand in units per second as of the hash's values v
-- at time t: the most of the last second's and this one's so far (not
-- this one's at its pace: one request early in a second is one a second,
-- not four; a demand that rises is followed within the second); with the
-- second's index and the two counts.
local function share_rate(v, t)
  local idx = math.floor(t / 1000000)
  local w, c, pr = tonumber(v[27]), tonumber(v[28]) or 0, tonumber(v[29]) or 0
  if w == idx then
    return math.max(c, pr), idx, c, pr
  elseif w == idx - 1 then
    return c, idx, 0, c
  end
  return 0, idx, 0, 0
end

-- share_after writes a check's effect on the share of part p (never on a
-- peek): the demand, when every other window admitted the request (a
-- request the region refuses asks nothing of the ceiling); the units, when
-- recording, taken from the grants that end first; and the claim to renew,
-- when the share runs low, a grant ends soon or has ended, or the share is
-- empty. It returns the reply's flags: 2 the caller holds the claim (it
-- renews in the background), 4 the share is short and the ledger never
-- answered under these limits (the caller asks it now), 8 the share was
-- short, 16 it alone refused the request, 32 the ledger said it has no
-- room yet.
local function share_after(p, key, j0, j1, cost, demand, recording)
  local t = clock()
  local v = sh_v[p]
  local flags = 0
  local out, no = {}, 0
  local function put(field, value)
    out[no + 1], out[no + 2] = field, value
    no = no + 2
  end
  local rate, idx, dc, dp = share_rate(v, t)
  if demand then
    dc = dc + cost
    put("dw", idx)
    put("dc", dc)
    put("dp", dp)
  end
  local rem = sh_rem[p]
  if recording then
    local left = cost
    while left > 0 do
      local best, bd = false, 0
      for i = 0, 3 do
        local n, u, d = tonumber(v[i * 6 + 1]), tonumber(v[i * 6 + 2]), tonumber(v[i * 6 + 3])
        if n and d > t and u < n and (not best or d < bd) then
          best, bd = i, d
        end
      end
      local n, u = tonumber(v[best * 6 + 1]), tonumber(v[best * 6 + 2])
      local take = math.min(left, n - u)
      v[best * 6 + 2] = u + take
      put((best + 1) .. "u", u + take)
      put((best + 1) .. "l", t)
      left = left - take
    end
    rem = rem - cost
    for j = j0, j1 do
      cnt[j] = share_count(p, j, j0, rem)
    end
  end
  -- soon: when the first live grant ends, and its length.
  local soon, slen, closed, latest = 0, 0, false, t
  for i = 0, 3 do
    local n, u, d = tonumber(v[i * 6 + 1]), tonumber(v[i * 6 + 2]), tonumber(v[i * 6 + 3])
    if n then
      if d > t and u < n then
        if soon == 0 or d < soon then
          soon, slen = d, d - tonumber(v[i * 6 + 4])
        end
      else
        closed = true
      end
      latest = math.max(latest, d)
    end
  end
  local f, c, k = tonumber(v[25]) or 0, tonumber(v[26]) or 0, tonumber(v[32]) or 0
  if not sh_fit[p] then
    flags = 8
    if demand then
      -- Only the share refused: 16.
      flags = 24
      if sh_new[p] then
        flags = 28
      end
    end
  end
  -- Renew ahead of need: when what is left would not last the lead at the
  -- demand's rate, or the first grant is past half its life (or within the
  -- lead of its end); but not before the lead ahead of when the ledger said
  -- it has room, or its recheck ("k").
  local lead = sh_lead[p]
  local low = cost + math.ceil(rate * lead / 1000000)
  local more = demand and (rem < low or (soon > 0 and soon - t < math.max(lead, slen / 2))) and
    (f - t < lead or (k > 0 and k <= t))
  local want = flags == 28 or closed or more
  if f > t then
    flags = flags + 32 -- the ledger said it has no room yet
  end
  if want and c <= t then
    put("c", t + sh_claim[p])
    flags = flags + 2
    latest = math.max(latest, t + sh_claim[p])
  end
  if no > 0 then
    redis.call("HSET", key, unpack(out, 1, no))
    redis.call("PEXPIRE", key, math.ceil((math.max(latest, f) - t) / 1000) + 60000)
  end
  return flags
end
