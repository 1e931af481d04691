-- dcshare.lua: the data centre's side of a global ceiling kept in a ledger
-- (global_redis), off the request path: what a renewal reads before it asks
-- the ledger, what it writes after, and the data centre's standing with the
-- ledger. share.lua documents the share's hash; every time here is this
-- Redis's TIME in µs.
--
-- ARGV[1] is the operation:
--   begin    KEYS[1] the share; ARGV sig, the limits' signature, and
--            recall (1: the ledger recalled the share's unspent grants:
--            every live one ends now, before anything is read; a recall
--            under other limits than the share's is stale: reply {now, -1}
--            and nothing changes, as its grants were dropped). Reply
--            {now, rate, then per slot 1..4: n, u, d, s, l, g} (0 and ""
--            for an empty slot, and for a grant under other limits), then
--            the share's incarnation "r": now is read before the ledger is
--            asked, so a grant's deadline here (now + its length) falls
--            before the ledger's end of it. A share without "r" (new, or
--            deleted by a reset) is given one: this Redis's TIME.
--   deposit  KEYS[1] the share; ARGV t0 n len id retry sig recheck nret
--            ids... ncount counts... only inc: when the share's
--            incarnation is not inc, the one its renewal's begin read (a
--            reset deleted the share since: what the renewal learnt, its
--            grant and "the ledger is full", is of the state the reset
--            forgot), nothing changes, reply -1. With only 1 (a renewal of a
--            limiter closed since, by a reload), nothing changes when the
--            share is under other limits than sig (the new limits': their
--            grants stay), reply 0. Otherwise the counts (the ledger's, of each
--            window, after the grant) become "G" (none: "G" stays, or goes
--            with the grants of other limits); the slots of the grants the
--            ledger took back (ids) are emptied, the claim is released, a
--            grant of n units (n > 0) goes into a free slot (or one whose
--            grant has ended) with deadline t0 + len, "f" becomes now + retry
--            (0: none) and "k" now + the least of retry and recheck (0:
--            none). Reply: the slot, or 0 when every slot holds a live grant
--            (the grant is not kept: the ledger counts it, nothing uses it).
--   send     KEYS[1] the data centre's standing: before the ledger is asked
--            (beat or grant). Reply {1, now} and "sent" set to now, or {0,
--            now} when the data centre is in static mode (only a beat that
--            says so may go).
--   static   KEYS[1] the standing; ARGV wait: static mode starts when no
--            node of the data centre asked the ledger for wait µs. Reply
--            {mode, since, sent, n, now}.
--   normal   KEYS[1] the standing; ARGV n: the ledger heard the data centre
--            again (n data centres): static mode ends. Reply as static.
--   poll     KEYS[1] the standing; ARGV n (0: keep): reply as static.
--   mode 1 is static, 0 normal; n is the count of data centres the ledger
--   knows, for the static share. The standing lives a day after its last
--   write; lost (a Redis emptied), the last ask counts as just now.

local function now()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local fields = {
  "1n", "1u", "1d", "1s", "1l", "1g", "2n", "2u", "2d", "2s", "2l", "2g",
  "3n", "3u", "3d", "3s", "3l", "3g", "4n", "4u", "4d", "4s", "4l", "4g",
  "f", "c", "dw", "dc", "dp", "L", "G", "k", "r",
}

local function standing(key, t)
  local v = redis.call("HMGET", key, "m", "since", "sent", "n")
  return {tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0, tonumber(v[4]) or 0, t}
end

local op = ARGV[1]
local key = KEYS[1]
local t = now()

if op == "begin" then
  local v = redis.call("HMGET", key, unpack(fields))
  local inc = v[33]
  if not inc then
    -- The share's incarnation: a deposit into a share reset after this
    -- read changes nothing. A new hash lives until its renewal's deposit
    -- sets its TTL (a renewal that died: a minute).
    inc = string.format("%.0f", t)
    redis.call("HSET", key, "r", inc)
    local new = true
    for i = 1, 32 do
      new = new and not v[i]
    end
    if new then
      redis.call("PEXPIRE", key, 60000)
    end
  end
  -- Grants under other limits are not there: still usable under those
  -- until a deposit under these drops them, so never given back (the
  -- ledger counts them to their end; units used after a return would be
  -- counted nowhere).
  local other = v[30] ~= ARGV[2]
  if ARGV[3] == "1" and other then
    -- A stale recall: the share holds grants of other limits, which it
    -- uses; reading them as ended here would give back units in use.
    return {t, -1}
  end
  if ARGV[3] == "1" then
    -- Recalled: no live grant is used after now (each ends here; the
    -- renewal gives it back as used so far).
    for i = 0, 3 do
      local n, u, d = tonumber(v[i * 6 + 1]), tonumber(v[i * 6 + 2]), tonumber(v[i * 6 + 3])
      if n and d > t and u < n then
        redis.call("HSET", key, (i + 1) .. "d", t)
        v[i * 6 + 3] = t
      end
    end
  end
  local idx = math.floor(t / 1000000)
  local w, c, pr = tonumber(v[27]), tonumber(v[28]) or 0, tonumber(v[29]) or 0
  local rate = 0
  if w == idx then
    -- As share.lua's share_rate.
    rate = math.max(c, pr)
  elseif w == idx - 1 then
    rate = c
  end
  local out = {t, rate}
  for i = 0, 3 do
    for j = 1, 5 do
      local x = tonumber(v[i * 6 + j]) or 0
      if other then
        x = 0
      end
      out[#out + 1] = x
    end
    out[#out + 1] = (not other and v[i * 6 + 6]) or ""
  end
  out[#out + 1] = inc
  return out
end

if op == "deposit" then
  local t0, n, len, id, retry, sig = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), ARGV[7]
  local recheck = tonumber(ARGV[8])
  local nret = tonumber(ARGV[9])
  local back = {}
  for i = 1, nret do
    back[ARGV[9 + i]] = true
  end
  local v = redis.call("HMGET", key, unpack(fields))
  local nc = tonumber(ARGV[10 + nret]) or 0
  if v[33] ~= ARGV[12 + nret + nc] then
    return -1
  end
  if ARGV[11 + nret + nc] == "1" and v[30] and v[30] ~= sig then
    return 0
  end
  if v[30] ~= sig then
    -- The grants of other limits go (those returned, and the rest: the
    -- ledger counts them to their end).
    for i = 1, 4 do
      redis.call("HDEL", key, i .. "n", i .. "u", i .. "d", i .. "s", i .. "l", i .. "g")
      v[i * 6 - 5] = false
    end
    redis.call("HDEL", key, "G")
    redis.call("HSET", key, "L", sig)
  end
  if nc > 0 then
    redis.call("HSET", key, "G", table.concat(ARGV, " ", 11 + nret, 10 + nret + nc))
  end
  local free, ended = 0, 0
  local latest = t
  for i = 0, 3 do
    local sn, su, sd, sg = tonumber(v[i * 6 + 1]), tonumber(v[i * 6 + 2]), tonumber(v[i * 6 + 3]), v[i * 6 + 6]
    local slot = i + 1
    if sn and back[sg] and (sd <= t or su >= sn) then
      redis.call("HDEL", key, slot .. "n", slot .. "u", slot .. "d", slot .. "s", slot .. "l", slot .. "g")
      sn = nil
    end
    if not sn then
      if free == 0 then
        free = slot
      end
    else
      if (sd <= t or su >= sn) and ended == 0 then
        ended = slot
      end
      latest = math.max(latest, sd)
    end
  end
  -- Full until: the ledger's retry from its clock, which read it after
  -- t0, as late as this call's (a renewal asked too soon after it was
  -- refused would only be refused again).
  local f, k = 0, 0
  if retry > 0 then
    f, k = t + retry, t + math.min(retry, recheck)
  end
  redis.call("HSET", key, "c", 0, "f", f, "k", k)
  local slot = 0
  if n > 0 then
    slot = free
    if slot == 0 then
      slot = ended
    end
    if slot > 0 then
      redis.call("HSET", key, slot .. "n", n, slot .. "u", 0, slot .. "d", t0 + len, slot .. "s", t0,
        slot .. "l", 0, slot .. "g", id)
      latest = math.max(latest, t0 + len)
    end
  end
  redis.call("PEXPIRE", key, math.ceil((math.max(latest, f) - t) / 1000) + 60000)
  return slot
end

if op == "send" then
  local v = standing(key, t)
  if v[1] == 1 then
    return {0, t}
  end
  redis.call("HSET", key, "sent", t)
  redis.call("PEXPIRE", key, 86400000)
  return {1, t}
end

if op == "static" then
  local wait = tonumber(ARGV[2])
  local v = standing(key, t)
  if v[3] == 0 then
    -- No record of the last ask (a new or emptied Redis): it may have been
    -- just now.
    redis.call("HSET", key, "sent", t)
    redis.call("PEXPIRE", key, 86400000)
    v[3] = t
  end
  if v[1] == 0 and t >= v[3] + wait then
    redis.call("HSET", key, "m", 1, "since", t)
    redis.call("PEXPIRE", key, 86400000)
    v[1], v[2] = 1, t
  end
  return v
end

if op == "normal" then
  redis.call("HSET", key, "m", 0, "sent", t, "n", tonumber(ARGV[2]))
  redis.call("PEXPIRE", key, 86400000)
  return standing(key, t)
end

if op == "poll" then
  local n = tonumber(ARGV[2])
  if n > 0 then
    redis.call("HSET", key, "n", n)
    redis.call("PEXPIRE", key, 86400000)
  end
  return standing(key, t)
end

return redis.error_reply("dcshare: unknown operation " .. tostring(op))
