-- ledger.lua: the ledger of global ceilings every data centre shares
-- (global_redis). A data centre never admits a request under an identity's
-- ceiling without a grant from here; a grant is units it may admit until a
-- deadline, and the ledger counts them, in every window, as admitted at the
-- grant's end: a unit granted at t and usable until e is counted in a
-- window of length W until e + W. So for every window of a global_limit's
-- length, the grants counted in it (and the static shares reserved, below)
-- never exceed the limit, and neither do the requests the data centres
-- admit under them, whatever the delays and the clocks of the data centres:
-- a data centre measures a grant's deadline from a time it read before it
-- asked (its own clock, a duration later), which is before the grant here.
-- A grant that ends unused, or partly used, comes back: its count shrinks
-- to the units used and its end to their last use.
--
-- Keys (one hash tag, {ledger}: on a Cluster, one slot): KEYS[1] the data
-- centres (members), KEYS[2] the ledger's epoch, and
-- for grant and show KEYS[3] an identity's grants (a sorted set: grant id
-- by its end, µs) and KEYS[4] its hash: "g<id>" = "<start> <units>" per
-- grant ("<start> <units> r" once given back: final), "<window>s",
-- "<window>e", "<window>n" per calendar period (start, end, units granted
-- in it), "r<dc>" and "a<dc>" (a data centre's demand, units per second,
-- and when it said so), "k<dc>" (its ticket: what its nodes need to renew
-- the identity's share, opaque here), "q<dc>" (when it was last recalled),
-- "seq" (the ids: "<dc>.<seq>", from the ledger's clock in ms when the
-- hash was new; a reset keeps it). Recalls: per data centre a hash, the
-- members key's name with "recall:<dc>" for "members" (on the one slot): identity's grants
-- key = the data centre's ticket, for each identity whose unspent grants it
-- is asked to give back (a ticket that begins '{"x":1,': to drop, after an
-- operator's reset); KEYS[3] of the recalls operation is this data
-- centre's.
--
-- ARGV, every operation: op dc deadline seen qwait skew beat static wasstatic
-- wmax tail heard; then for grant: want len rate least ticket nret [id used
-- last]... nwin [name kind len limit b0 b1 b2 b3]... nuse [id used]...; show,
-- recalls and reset take nothing more.
--   deadline  ledger TIME (µs) after which nothing runs (0: none): the
--             caller gave up by then
--   seen      the epoch the caller last saw here ("" never)
--   qwait     how long a ledger that lost its grants waits before granting
--             again (the longest window, the longest grant, the clock skew)
--   skew      the clocks' skew: after a failover (a new server with the
--             data), grants wait that long (its clock may be ahead)
--   beat      how long a data centre's membership lasts after it was heard
--   static    1 when the data centre goes to a static share when cut off
--             (fail local); wasstatic 1 when it was in static mode
--   wmax      the longest global window (µs)
--   tail      how long after the data centre is heard again one of its
--             nodes may still use its static share (µs)
--   heard     the least time from the last call heard here until the data
--             centre may be on its static share (µs): its static wait less
--             how much earlier than that call its last ask may have been
--             recorded (the call's deadline) and the clocks' error; heard
--             again sooner, it never was, and nothing stays reserved
--   want      units asked for; len the grant's length (µs); rate the data
--             centre's demand (units per second); least the fewest units
--             worth granting (a request's cost, less what the share holds:
--             fewer would sit in a slot, of no use); ticket what its nodes
--             need to renew the share (a recall gives it back)
--   id used last  a returned grant: the units used and the last use, µs
--             after the grant's start (0: unused)
--   id used   (nuse) a grant not ended: the units used so far. "u<id>" in
--             the hash keeps a grant's units used as last told (returns
--             too), for show's admitted; it changes nothing granted
--   kind      0 a duration window of len µs, 1 a calendar period: b0 < b1 <
--             b2 < b3 the starts of three periods in a row and the end of
--             the third, around the caller's clock (the one holding the
--             ledger's clock is used)
--
-- The epoch: a ledger that lost its grants (restarted empty) cannot know
-- what the data centres still hold, so when a caller has seen an earlier
-- epoch it grants nothing for qwait; the first caller of a new ledger that
-- never saw one starts it at once. A new server holding the data (a
-- failover: its run_id changed) waits skew, and the ledger's clock never
-- goes back (the most it read is kept).
--
-- Static shares: a data centre with static 1 that is not heard for beat µs
-- may, after one more window and grant (it waits that long, on its side),
-- admit floor(limit / n) per window on its own (n: the data centres known
-- when it was last heard). From the moment its membership lapses until
-- wmax + tail after it is heard again, every grant here leaves that room.
--
-- Reply (grant): {status, now, units, len, retry, n, replicas, epoch, id,
-- then per window the units counted in it after the grant}. status 1 granted
-- (units may be 0: no room, retry µs until there may be; fewer than want:
-- retry µs until more may be granted, for want of room, or of the fair
-- rate's bucket of a data centre asking more than that rate), 0 waiting (a
-- new epoch or a failover: retry until it ends), 3 late (nothing ran).
-- Reply (beat): {status, now, 0, 0, retry, n, replicas, epoch}.
-- Reply (reset): {5, now, n}: the identity's grants forgotten, and the n
-- other data centres that held a share of it recalled with their ticket
-- marked as a reset's (they drop the share).
-- Reply (recalls): {4, now, ticket...}: the identities this data centre is
-- asked to give back its unspent grants of (each once: they are removed).
-- Reply (show): {now, then per data centre: name, units held (grants not
-- ended), units counted (in the longest window), demand, units admitted
-- (of the grants counted, as the data centre last told)}.

local function fmt(x)
  return string.format("%.0f", x)
end

local t0 = redis.call("TIME")
local t = tonumber(t0[1]) * 1000000 + tonumber(t0[2])
local op, dc, deadline, seen = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local qwait, skew, beat = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local static, wasstatic, wmax, tail = ARGV[8] == "1", ARGV[9] == "1", tonumber(ARGV[10]), tonumber(ARGV[11])
local heard = tonumber(ARGV[12])
if deadline > 0 and t > deadline then
  return {3, t}
end
local mkey, ekey = KEYS[1], KEYS[2]

if op == "recalls" then
  -- Recalls change nothing else here (no membership: the static share's
  -- wait counts asks that could renew it, and this is none).
  local all = redis.call("HGETALL", KEYS[3])
  local out, del = {4, t}, {}
  for i = 1, #all, 2 do
    if #del < 64 then
      del[#del + 1] = all[i]
      out[#out + 1] = all[i + 1]
    end
  end
  if #del > 0 then
    redis.call("HDEL", KEYS[3], unpack(del))
  end
  return out
end

-- The epoch.
local run = string.match(redis.call("INFO", "server"), "run_id:(%w+)") or ""
local ev = redis.call("HMGET", ekey, "id", "run", "q", "max")
local epoch, q, most = ev[1], tonumber(ev[3]) or 0, tonumber(ev[4]) or 0
if not epoch then
  epoch = string.sub(run, 1, 12) .. string.format("%x", t)
  if seen ~= "" then
    q = t + qwait
    redis.call("HSET", ekey, "o" .. seen, 1)
  end
  redis.call("HSET", ekey, "id", epoch, "run", run, "q", q)
elseif ev[2] ~= run then
  q = math.max(q, t + skew)
  redis.call("HSET", ekey, "run", run, "q", q)
end
if seen ~= "" and seen ~= epoch and redis.call("HEXISTS", ekey, "o" .. seen) == 0 then
  -- This caller held grants of an epoch the ledger lost, and another one
  -- started this epoch without waiting: wait from now.
  q = math.max(q, t + qwait)
  redis.call("HSET", ekey, "q", q, "o" .. seen, 1)
end
local now = math.max(t, most)
if now > most then
  redis.call("HSET", ekey, "max", now)
end
redis.call("PEXPIRE", ekey, 30 * 86400000)

-- The data centre's membership (an operator's show or reset changes
-- nothing).
if op ~= "show" and op ~= "reset" then
  local mv = redis.call("HMGET", mkey, "l" .. dc, "e" .. dc)
  if static then
    local ends = tonumber(mv[2]) or 0
    local l = tonumber(mv[1])
    if wasstatic or (l and l < now and now >= l - beat + heard) then
      -- It may have been on its static share: its room stays reserved one
      -- window (and a beat) after it is heard again. A membership that
      -- lapsed for less than the static wait (a stall of seconds) leaves
      -- nothing reserved: no node of it can have been on its static share.
      ends = math.max(ends, now + wmax + tail)
    end
    redis.call("HSET", mkey, "l" .. dc, now + beat, "s" .. dc, 1, "e" .. dc, ends)
  else
    redis.call("HSET", mkey, "l" .. dc, now + beat, "s" .. dc, 0)
  end
end
local all = redis.call("HGETALL", mkey)
local mem = {}
local ndc = 0
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  local kind, name = string.sub(f, 1, 1), string.sub(f, 2)
  if not mem[name] then
    mem[name] = {}
    ndc = ndc + 1
  end
  mem[name][kind] = tonumber(v)
end
if op ~= "show" and op ~= "reset" then
  redis.call("HSET", mkey, "n" .. dc, ndc)
  redis.call("PEXPIRE", mkey, 30 * 86400000)
end

local replicas = tonumber(string.match(redis.call("INFO", "replication"), "connected_slaves:(%d+)")) or 0

if op == "beat" then
  local retry = 0
  if now < q then
    retry = q - now
  end
  return {1, now, 0, 0, retry, ndc, replicas, epoch}
end

local z, h = KEYS[3], KEYS[4]

if op == "reset" then
  -- An operator's reset of the identity, through a node of data centre
  -- dc (which drops its own share): every other data centre that asked
  -- for a share of it (its ticket) is recalled with the ticket marked as a
  -- reset's ('{"x":1,' first): its nodes drop the share (what it holds
  -- was granted by the state forgotten here: spent after, it would be
  -- counted nowhere), then
  -- the grants are forgotten. Reply {5, now, data centres told}.
  local all = redis.call("HGETALL", h)
  local rk = string.gsub(mkey, "members$", "recall:")
  local ttl = math.ceil(3 * wmax / 1000) + 60000
  local told = 0
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    local name = string.sub(f, 2)
    if string.sub(f, 1, 1) == "k" and string.sub(v, 1, 1) == "{" and name ~= dc then
      redis.call("HSET", rk .. name, z, '{"x":1,' .. string.sub(v, 2))
      redis.call("PEXPIRE", rk .. name, ttl)
      told = told + 1
    end
  end
  -- The ids go on from where they were: a grant asked the moment after
  -- (the same ms) would start a new sequence at the same number, and a
  -- late return of the grant it replaced would be taken for its.
  local seq = redis.call("HGET", h, "seq")
  redis.call("DEL", z, h)
  if seq then
    redis.call("HSET", h, "seq", seq)
    redis.call("PEXPIRE", h, ttl)
  end
  return {5, now, told}
end

if op == "show" then
  local ids = redis.call("ZRANGEBYSCORE", z, "(" .. fmt(now - wmax), "+inf", "WITHSCORES")
  local held, counted, used = {}, {}, {}
  for i = 1, #ids, 2 do
    local id, e = ids[i], tonumber(ids[i + 1])
    local g = redis.call("HGET", h, "g" .. id)
    if g then
      local n = tonumber(string.match(g, "^%d+ (%d+)"))
      local d = string.match(id, "^(.*)%.")
      counted[d] = (counted[d] or 0) + n
      used[d] = (used[d] or 0) + math.min(tonumber(redis.call("HGET", h, "u" .. id)) or 0, n)
      if e > now then
        held[d] = (held[d] or 0) + n
      end
    end
  end
  local out = {now}
  for name, _ in pairs(mem) do
    local r = tonumber(redis.call("HGET", h, "r" .. name)) or 0
    out[#out + 1] = name
    out[#out + 1] = held[name] or 0
    out[#out + 1] = counted[name] or 0
    out[#out + 1] = r
    out[#out + 1] = used[name] or 0
  end
  return out
end

if op ~= "grant" then
  return redis.error_reply("ledger: unknown operation " .. tostring(op))
end

local want, len, rate, least = tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])
local ticket = ARGV[17]
local nret = tonumber(ARGV[18])
local a = 19
local rets = {}
for i = 1, nret do
  rets[i] = {ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])}
  a = a + 3
end
local nwin = tonumber(ARGV[a])
a = a + 1
local wn, wk, wl, wlim, ws, we = {}, {}, {}, {}, {}, {}
for j = 1, nwin do
  wn[j], wk[j], wl[j], wlim[j] = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  if wk[j] == 1 then
    local b0, b1, b2, b3 = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7])
    ws[j], we[j] = b1, b2
    if now < b1 then
      ws[j], we[j] = b0, b1
    elseif now >= b2 then
      ws[j], we[j] = b2, b3
    end
    wl[j] = we[j] - ws[j]
  end
  a = a + 8
end
-- The use so far of grants not ended (for show).
local nuse = tonumber(ARGV[a]) or 0
for i = 1, nuse do
  local uid = ARGV[a + 2 * i - 1]
  if redis.call("HEXISTS", h, "g" .. uid) == 1 then
    redis.call("HSET", h, "u" .. uid, ARGV[a + 2 * i])
  end
end

-- Forget grants no window counts any more.
local old = redis.call("ZRANGEBYSCORE", z, "-inf", fmt(now - wmax))
for i = 1, #old do
  redis.call("HDEL", h, "g" .. old[i], "u" .. old[i])
end
if #old > 0 then
  redis.call("ZREMRANGEBYSCORE", z, "-inf", fmt(now - wmax))
end

-- The calendar periods' counts.
local cn = {}
for j = 1, nwin do
  if wk[j] == 1 then
    local v = redis.call("HMGET", h, wn[j] .. "s", wn[j] .. "e", wn[j] .. "n")
    cn[j] = 0
    if tonumber(v[1]) == ws[j] then
      cn[j] = tonumber(v[3]) or 0
    end
  end
end

-- Returns: a grant shrinks to what was used, and ends at its last use.
for i = 1, nret do
  local id, used, last = rets[i][1], rets[i][2], rets[i][3]
  local g = redis.call("HGET", h, "g" .. id)
  if g then
    local gs, gn = string.match(g, "^(%d+) (%d+)")
    gs, gn = tonumber(gs), tonumber(gn)
    if used < gn then
      for j = 1, nwin do
        if wk[j] == 1 and gs >= ws[j] and gs < we[j] then
          cn[j] = math.max(cn[j] - (gn - used), 0)
        end
      end
    end
    if used <= 0 then
      redis.call("ZREM", z, id)
      redis.call("HDEL", h, "g" .. id, "u" .. id)
    else
      redis.call("HSET", h, "u" .. id, used)
      local e = tonumber(redis.call("ZSCORE", z, id))
      if e and gs + last < e then
        redis.call("ZADD", z, gs + last, id)
      end
      -- Final: given back, it is no one's unspent grant (a recall skips it).
      redis.call("HSET", h, "g" .. id, fmt(gs) .. " " .. fmt(math.min(used, gn)) .. " r")
    end
  end
end

-- What each window counts: grants, and the static shares reserved.
local ids = redis.call("ZRANGEBYSCORE", z, "(" .. fmt(now - wmax), "+inf", "WITHSCORES")
local weights, final = {}, {}
if #ids > 0 then
  local f = {}
  for i = 1, #ids, 2 do
    f[#f + 1] = "g" .. ids[i]
  end
  local gv = redis.call("HMGET", h, unpack(f))
  for i = 1, #gv do
    weights[i] = tonumber(string.match(gv[i] or "", "^%d+ (%d+)")) or 0
    final[i] = string.sub(gv[i] or "", -2) == " r"

  end
end
-- jf: the tightest duration window (the least limit per µs), where each
-- data centre's part (bydc) is counted for fairness.
local jf, jr = false, false
for j = 1, nwin do
  if wk[j] == 0 and (not jr or wlim[j] / wl[j] < jr) then
    jf, jr = j, wlim[j] / wl[j]
  end
end
-- per data centre: counted in jf, not ended, and ended but not given back
local bydc, live, pend = {}, {}, {}
local count, first, room = {}, {}, {}
local roomall, occ = false, 0
for j = 1, nwin do
  local c = 0
  if wk[j] == 1 then
    c = cn[j]
  else
    for i = 1, #ids, 2 do
      local e = tonumber(ids[i + 1])
      if e > now - wl[j] then
        local wt = weights[(i + 1) / 2]
        c = c + wt
        if not first[j] then
          first[j] = e
        end
        if j == jf then
          local d = string.match(ids[i], "^(.*)%.") or ""
          bydc[d] = (bydc[d] or 0) + wt
          -- A grant given back is no one's to spend (its end, shrunk to its
          -- last use as measured from before it was asked, may lie ahead).
          if final[(i + 1) / 2] then
          elseif e > now then
            live[d] = (live[d] or 0) + wt
          else
            pend[d] = (pend[d] or 0) + wt
          end
        end
      end
    end
  end
  local res = 0
  for name, m in pairs(mem) do
    if m.s == 1 and ((m.l or 0) < now or (m.e or 0) > now) then
      res = res + math.floor(wlim[j] / math.max(m.n or ndc, 1))
    end
  end
  count[j] = c
  room[j] = math.max(wlim[j] - c - res, 0)
  if not roomall or room[j] < roomall then
    roomall = room[j]
  end
  occ = math.max(occ, (c + res) / wlim[j])
end

-- Max-min fair rates over the data centres asking now (units per second):
-- capacity is the tightest window's limit per second.
local cap = false
for j = 1, nwin do
  local c = wlim[j] * 1000000 / wl[j]
  if not cap or c < cap then
    cap = c
  end
end
redis.call("HSET", h, "r" .. dc, rate, "a" .. dc, now)
if ticket ~= "" then
  redis.call("HSET", h, "k" .. dc, ticket)
end
local recent = math.max(2 * len, 2000000)
local dem = {}
for name, _ in pairs(mem) do
  local rv = redis.call("HMGET", h, "r" .. name, "a" .. name)
  local r, at = tonumber(rv[1]), tonumber(rv[2])
  if r and at and at > now - recent and r > 0 then
    dem[#dem + 1] = {name, r}
  end
end
table.sort(dem, function(x, y) return x[2] < y[2] end)
local left, k, fair = cap, #dem, cap
local fairof = {}
for i = 1, #dem do
  local s = left / k
  local alloc = math.min(dem[i][2], s)
  fairof[dem[i][1]] = alloc
  if dem[i][1] == dc then
    fair = s
  end
  left, k = left - alloc, k - 1
end
-- Max-min fair in the window: a data centre's allowance is its fair part
-- of the tightest window less what it holds there; room others are
-- allowed is kept for them (while they ask), the rest is anyone's. Its
-- part is its fair rate over the window and two grant lengths, and two
-- requests: what it holds there includes a request's worth unspent, and each
-- unit is counted until a window after its grant's end, a grant's length
-- (a trickle's: the time to its next request) after its use.
local allow, others, lower = false, 0, 0
local slack = 2 * math.max(least, 1) -- two requests (as this one costs)
if jf then
  for name, fr in pairs(fairof) do
    local a = math.max(math.min(math.floor(fr * (wl[jf] + 2 * len) / 1000000) + slack, wlim[jf]) - (bydc[name] or 0), 0)
    if name == dc then
      allow = a
    else
      others = others + a
      if fr < (fairof[dc] or 0) then
        -- Owed to a data centre asking less: served first (max-min).
        lower = lower + a
      end
    end
  end
end

-- fr: this data centre's max-min fair rate (the water level: at least its
-- demand when that is less); tol: its bucket, two grant lengths' worth, or
-- its fair part of the window up to 10 units (a small ceiling's burst, as
-- a sliding window admits it), or two units; tat: when the bucket is full
-- again (a data centre new here starts it full).
local fr = math.max(fair, 1e-9)
local burst = 2
if jf then
  burst = math.max(burst, math.min(10, math.floor(fr * wl[jf] / 1000000)))
end
local tol = math.max(2 * len, math.floor(math.max(burst, least) * 1000000 / fr))
local tat = tonumber(redis.call("HGET", h, "v" .. dc)) or now
-- Capped: the ceiling in demand (half full or more), or this data
-- centre's demand above its max-min fair rate (a viral one: uncapped, it
-- would fill the ceiling in seconds, then wait for those units to leave
-- the window, and the windows between would stand nearly empty).
local capped = occ >= 0.5 or rate > fair

local glen = len
local lowest, shortest = false, false
for j = 1, nwin do
  if not lowest or wlim[j] < lowest then
    lowest = wlim[j]
  end
  if not shortest or wl[j] < shortest then
    shortest = wl[j]
  end
end
-- The longest grant: 16 lengths, or half the shortest window.
local longest = math.max(len, math.min(len * 16, math.floor(shortest / 2)))
if occ < 0.5 and want * 100 <= lowest then
  -- Room to spare and a small want (a quiet identity): a longer grant
  -- spares renewals. A large one stays short: what it leaves unused
  -- counts until a window after its end.
  glen = longest
end
if rate > 0 then
  -- A grant lasts until it would be spent at the demand's rate (and a
  -- length more: its renewal), or a trickle's units would die unused
  -- before its next request; at most the longest grant. One spent sooner
  -- is given back sooner, at its last use.
  glen = math.max(glen, math.min(math.floor(want * 1000000 / rate) + len, longest))
end
if capped and allow and fr * len < 1000000 then
  -- A unit per bucket's step: it lasts until the next may be granted.
  glen = math.max(glen, math.min(math.floor(1000000 / fr), len * 16))
end
for j = 1, nwin do
  if wk[j] == 1 then
    glen = math.min(glen, we[j] - now)
  end
end

local ttl = math.ceil((2 * wmax + glen) / 1000) + 60000
local units, retry, status, gid = 0, 0, 1, ""
-- bcap: the grant was capped by the bucket (its fair rate).
local bcap = false
if now < q then
  status, retry = 0, q - now
elseif want > 0 then
  local bound = math.max(math.ceil(fair * glen / 1000000 * 2), math.floor(roomall * fair / cap))
  if allow then
    -- What others are owed in the window is kept for them; when the room
    -- is less than what is owed, those asking less are served first: their
    -- parts are small and steady (a unit or two split in proportion rounds
    -- to nothing for each).
    local part = roomall - others
    if allow + others > roomall then
      part = math.min(allow, roomall - lower)
    end
    bound = math.max(part, 0)
    if capped then
      -- At most its max-min fair rate (the bucket, "v<dc>"): its grants
      -- spread over the window at that rate, its units leave the window as
      -- steadily, and each window holds the ceiling.
      local b = math.max(math.floor((now + tol - math.max(tat, now)) * fr / 1000000), 0)
      if b < bound then
        bound, bcap = b, true
      end
    end
  end
  units = math.max(math.min(want, roomall, bound), 0)
  if units < least then
    units = 0
  end
  if units > 0 then
    redis.call("HSET", h, "v" .. dc, fmt(math.max(tat, now) + units * 1000000 / fr))
  end
  if units > 0 then
    -- An identity's ids never repeat: a hash that is new (the ledger
    -- restarted empty, its TTL; a reset keeps the sequence) starts it at
    -- this clock in ms, past every id an earlier one gave (its own start and a count
    -- of grants) while an identity gets fewer than a thousand grants a
    -- second on average (a data centre renews a share once a grant
    -- length, 50 ms at least: 8 of them, 160 a second). A late return of
    -- an earlier grant (a share that held it across the reset) is then
    -- never taken for a new one's. In ms, not µs: the previous release
    -- writes the id with Lua's "%.14g", exact below 10^14 only.
    if redis.call("HEXISTS", h, "seq") == 0 then
      redis.call("HSET", h, "seq", fmt(math.floor(now / 1000)))
    end
    local id = dc .. "." .. fmt(redis.call("HINCRBY", h, "seq", 1))
    redis.call("ZADD", z, now + glen, id)
    redis.call("HSET", h, "g" .. id, fmt(now) .. " " .. fmt(units))
    for j = 1, nwin do
      count[j] = count[j] + units
      if wk[j] == 1 then
        cn[j] = cn[j] + units
      end
    end
    gid = id
  end
  if units < want then
    -- Short for want of room: until the first unit counted leaves the
    -- window that has none left. Short by a cap (its fair rate, what others
    -- are owed), the share asks again when it runs low.
    for j = 1, nwin do
      if room[j] <= units then
        local r
        if wk[j] == 1 then
          r = we[j] - now
        elseif first[j] then
          r = first[j] + wl[j] - now
        else
          r = 1000
        end
        retry = math.max(retry, r)
      end
    end
    if retry == 0 and bcap and rate > fair then
      -- Short by its fair rate, with room, asking more than that rate (a
      -- viral one): until the bucket holds a grant's worth again (the
      -- share says so: its short requests are refused at once with this
      -- Retry-After, not made to wait for a renewal that could not bring
      -- more). One asking less (a flat one, capped by its part or a
      -- bucket a burst emptied) asks again when it runs low.
      -- A grant's length at that rate, a request at least: a renewal
      -- then brings what the next length spends, not one unit a round
      -- trip.
      local need = math.max(least, 1, math.floor(fr * len / 1000000))
      retry = math.ceil(math.max(tat, now) + units * 1000000 / fr - tol + need * 1000000 / fr - now)
    end
    retry = math.max(retry, 1000)
  end
  if units < want and units >= roomall and jf then
    -- Refused for want of room: recall the unspent grants of the data
    -- centres that hold more than their fair rate needs (an idle one: any),
    -- or grants that ended and were not given back (their nodes give them
    -- back at their next renewal, which an idle one never makes); once per
    -- grant length each. Room may come back in a second.
    local rk = string.gsub(mkey, "members$", "recall:")
    for name, _ in pairs(mem) do
      local need = math.ceil((fairof[name] or 0) * 2 * len / 1000000)
      if name ~= dc and ((pend[name] or 0) > 0 or (live[name] or 0) > need) then
        local rv = redis.call("HMGET", h, "q" .. name, "k" .. name)
        if rv[2] then
          retry = math.min(retry, 1000000)
          local pending = redis.call("HGET", rk .. name, z)
          if (tonumber(rv[1]) or 0) < now - len and not (pending and string.sub(pending, 1, 7) == '{"x":1,') then
            -- (A reset's recall not yet taken stays one.)
            redis.call("HSET", rk .. name, z, rv[2])
            redis.call("PEXPIRE", rk .. name, ttl)
            redis.call("HSET", h, "q" .. name, now)
          end
        end
      end
    end
  end
end
for j = 1, nwin do
  if wk[j] == 1 then
    redis.call("HSET", h, wn[j] .. "s", ws[j], wn[j] .. "e", we[j], wn[j] .. "n", cn[j])
  end
end
redis.call("PEXPIRE", z, ttl)
redis.call("PEXPIRE", h, ttl)
local out = {status, now, units, glen, retry, ndc, replicas, epoch, gid}
for j = 1, nwin do
  out[#out + 1] = count[j]
end
return out
