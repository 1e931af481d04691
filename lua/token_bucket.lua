-- token_bucket.lua: the token bucket as GCRA, one hash per bucket holding a
-- theoretical arrival time per duration window. Spliced into decide.lua
-- (clock, units, window arrays, hset).
--
-- Per window: rate limit per window L, capacity (burst) B = the window's
-- burst, or its limit when that is 0. The emission interval is
-- T = floor(L / limit + 0.5) whole microseconds (at least 1): rounding T once,
-- instead of rounding the arrival time on every write, keeps the state exact,
-- so a full burst of B is always admitted at once and the reported count never
-- drifts. (The rate is off by at most 0.5 µs per unit; above 1 unit per µs per
-- key it is capped.)
--
-- State per window of length L: "<L>t" = tat, the theoretical arrival time;
-- "<L>i" and "<L>b" = the T and B it was written with (the fast path
-- writes tat with ".0" after its digits: tb_fast); "<L>p" = "T:B", the
-- two in one string (tb_record; since 2026-12-03), which the fast path
-- reads in their place. Every write of this release writes p with i and
-- b. The previous release writes i and b alone, and it drops the key's
-- fields (DEL) before it writes a T or B other than the stored ones, so a
-- p that is there says what i and b say; a key without it goes to decide,
-- which reads i and b and writes p. The bucket is full
-- when tat <= now; d = max(tat - now, 0) is the time it needs to be full
-- again. A state written under another T or B (a reload changed the limit,
-- the burst or the window; a window whose length changed takes the state of
-- the one it replaced) keeps its units in use, d * T_new / T_old, at most a
-- full bucket. A check that records rewrites it under the new T and B
-- (d + T * c), so the budget outlives neither; a check that records
-- nothing leaves it as written (but where the hash holds fields of a
-- replaced window: decide), and its retry and reset are the state's as
-- written (tb_check). The TTL (past tat + 1 s; tb_fast's span
-- below) only collects garbage.
--
-- A request of cost c fits when d + T * c - B * T <= 0; it then sets
-- tat = now + d + T * c.
--
-- Per window: count = units in use, B - floor((B * T - d) / T) clamped to
-- [0, B], with d after the request when recorded; retry = when denied,
-- d + T * c - B * T, the time until the bucket holds c tokens (the window
-- when c > B); reset = d (after the request when recorded): the time until
-- the bucket is full again, 0 when it is full.

local function tb_in_use(d, burst, interval)
  local remaining = math.floor((burst * interval - d) / interval)
  if remaining < 0 then
    remaining = 0
  elseif remaining > burst then
    remaining = burst
  end
  return burst - remaining
end

-- tb_due is d of a stored state: its time to full. A state written with
-- another interval or burst is rescaled to this interval, at most a full
-- bucket (burst * interval). (Under its own policy a state may hold more
-- than a full bucket: units recorded after the response, count_only.)
local function tb_due(tat, wi, wb, now, burst, interval)
  local d = tat - now
  if d < 0 then
    d = 0
  end
  if wi ~= interval or wb ~= burst then
    if wi and wi > 0 then
      d = math.ceil(d * interval / wi)
    end
    if d > burst * interval then
      d = burst * interval
    end
  end
  return d
end

-- tb_retry is a check's retry in a window of length w whose bucket is due
-- in d: 0 when cost fits, the time until it does, or the window when cost
-- is more than the bucket holds (tb_check and tb_fast).
local function tb_retry(d, cost, burst, interval, w)
  if cost > burst then
    return w
  end
  local allow_at = d + interval * cost - burst * interval
  if allow_at > 0 then
    return allow_at
  end
  return 0
end

-- tb_check fills windows j0..j1 from their fields v (t, i, b in a row per
-- window; f, the whole hash, when a window has none); record needs s1 (B),
-- s2 (T) and s3 (d). It also reports whether a state was written under
-- another T or B (to be rewritten under the new ones by a check that
-- records: decide). rewrite: the check rewrites the hash even when it
-- records nothing (decide: fields of windows a reload replaced). A state
-- under another T or B that a check leaves as written goes on draining as
-- written: its time to full is x = max(tat - now, 0), and it has room for
-- c when x <= (B - c) * T_old (then ceil(x * T / T_old) + T * c <= B * T),
-- so such a check's retry is x - (B - c) * T_old and its reset x.
local function tb_check(v, f, j0, j1, now, cost, rewrite)
  local fits = true
  local stale = false
  for j = j0, j1 do
    local w, ls, limit = wlen[j], wname[j], wlim[j]
    local burst = wburst[j]
    if burst <= 0 then
      burst = limit
    end
    local interval = math.floor(w / limit + 0.5)
    if interval < 1 then
      interval = 1
    end
    local d = 0
    local o = (j - j0) * 3
    local tat = tonumber(v[o + 1])
    local x, wo = false, interval -- (a state left as written: its x and T_old)
    if tat then
      local wi, wb = tonumber(v[o + 2]), tonumber(v[o + 3])
      d = tb_due(tat, wi, wb, now, burst, interval)
      if wi ~= interval or wb ~= burst then
        stale = true
        if not rewrite then
          x = tat - now
          if x < 0 then
            x = 0
          end
          if wi and wi > 0 then
            wo = wi
          end
        end
      end
    else
      -- A window whose length changed: the units in use of the one it
      -- replaced (the most of them).
      for name, v in pairs(f) do
        local ols = string.sub(name, 1, -2)
        if string.sub(name, -1) == "t" and not is_window(ols, j0, j1) then
          local od = tb_due(tonumber(v), tonumber(f[ols .. "i"]), false, now, burst, interval)
          if od > d then
            d = od
          end
        end
      end
    end
    local retry = tb_retry(d, cost, burst, interval, w)
    local reset = d
    if x then
      reset = x
      if retry > 0 and cost <= burst then
        retry = x - (burst - cost) * wo
      end
    end
    if retry > 0 then
      fits = false
    end
    cnt[j], rty[j], rst[j] = tb_in_use(d, burst, interval), retry, reset
    s1[j], s2[j], s3[j] = burst, interval, d
  end
  return fits, stale
end

-- tb_record takes cost tokens from windows j0..j1 and queues their fields
-- (p by its name kept as .p in the window's field names, made once per
-- window name; its value, T and B as num writes them in one string, is
-- what tb_fast makes from its own). (Neither is a local of its own, as
-- when the body's main chunk stood at Lua's limit of 200 locals: since
-- 922dd99 the log's and the counter's own locals live in a block each.)
local function tb_record(j0, j1, now, cost)
  local ttl = 0
  for j = j0, j1 do
    local ls = wname[j]
    local fs = fieldnames[4][ls]
    local fp = fs.p
    if not fp then
      fp = ls .. "p"
      fs.p = fp
    end
    local d = s3[j] + s2[j] * cost
    cnt[j] = tb_in_use(d, s1[j], s2[j])
    rst[j] = d
    hset(fs[1], now + d)
    hset(fs[2], s2[j])
    hset(fs[3], s1[j])
    hf[hn + 1], hf[hn + 2] = fp, num(s2[j]) .. ":" .. num(s1[j])
    hn = hn + 2
    local t = math.ceil(d / 1000) + 1000
    if t > ttl then
      ttl = t
    end
  end
  return ttl
end

-- tb_fast is the fast path (decide.lua's FAST) of a check of one window,
-- mode 0: tb_check and tb_record for that case, in a row, with the reply's
-- short form appended flat to the call's (decide.lua's OUT). It reads the
-- window's t and p (HMGET of two fields: reading i and b instead, three
-- fields, cost 2.8k a check more, most of it in Redis's reply into a Lua
-- table). A state written under another T or B, or without p (the
-- previous release wrote it), or a key that holds other fields while this
-- window has none (a reload), goes to decide. A state of this T and B
-- keeps its fields i, b and p: the write is t alone.
-- What a check of a full bucket (d = 0, the common case) answers but its
-- tat, d after it and its units in use, is worked out once per shape
-- (V.tb).
--
-- The TTL (since 2026-12-02): the fast path sets the key's expiry to the
-- end of the span of S = an eighth of the window (whole ms, at least 1 s)
-- that holds tat + 1 s, so past tat + 1 s and at most S later, and writes
-- tat as its digits and ".0" (the same number to every reader: tonumber,
-- s + 0). A later fast check moves the TTL (PEXPIRE) only when its new
-- tat + 1 s falls in another span, or when the stored tat is not so
-- marked: another writer wrote it last (the previous release, or decide,
-- each of which sets the TTL to its own tat + 1 s), and its TTL may be
-- shorter. The mark is read by the string's length: no tat below 2^53
-- has more than 16 digits, and a marked one of 10^14 µs or more (1973
-- on) has 17 or more characters (a marked tat below that moves the TTL on
-- every write). A key's expiry is therefore always past its tat + 1 s (in
-- the clock of the node that wrote it, as before).
local function tb_fast(a, k, V)
  -- now and the deadline as decide reads them (decide.lua's fast_late).
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
  local key, cost, w = KEYS[k], V[2], V[11]
  -- What the shape alone says, worked out on its first check: field
  -- names, B, T, the span, the formats, and a full bucket's d and units.
  local C = V.tb
  if not C then
    local burst = V[13]
    if burst <= 0 then
      burst = V[12]
    end
    local interval = math.floor(w / V[12] + 0.5)
    if interval < 1 then
      interval = 1
    end
    local span = math.floor(w / 8000) * 1000
    if span < 1000000 then
      span = 1000000
    end
    local d1 = interval * cost
    local si, sb = num(interval), num(burst) -- (T and B as written)
    C = {V[10] .. "t", V[10] .. "p", si .. ":" .. sb, burst, interval, span, INT .. ".0",
      d1, tb_in_use(d1, burst, interval), V[10] .. "i", V[10] .. "b", si, sb}
    V.tb = C
  end
  local ft, fp, burst, interval, span = C[1], C[2], C[4], C[5], C[6]
  local v = rcall("HMGET", key, ft, fp)
  local tat = v[1]
  local d = 0
  -- at: the start of the span of the stored tat + 1 s when its mark says
  -- the key's expiry is that span's end (false: the TTL moves).
  local at = false
  if tat then
    if v[2] ~= C[3] then
      return nil
    end
    local marked = #tat > 16
    tat = tat + 0
    if marked then
      at = tat + 1000000
      at = at - at % span
    end
    d = tat - now
    if d < 0 then
      d = 0
    end
  elseif #rcall("HGETALL", key) > 0 then
    return nil
  end
  local count
  if d == 0 and cost <= burst then
    -- A full bucket: admitted.
    d, count = C[8], C[9]
  else
    local retry = tb_retry(d, cost, burst, interval, w)
    if retry > 0 then
      local o = ON
      OUT[o + 1] = 32 -- 8 × 4 values + status 0
      OUT[o + 2] = tb_in_use(d, burst, interval)
      OUT[o + 3] = retry
      OUT[o + 4] = d
      ON = o + 4
      return true
    end
    d = d + interval * cost
    count = tb_in_use(d, burst, interval)
  end
  local t = now + d
  local ts = sfmt(C[7], t)
  local e = t + 1000000
  e = e - e % span
  if tat then
    rcall("HSET", key, ft, ts)
  else
    rcall("HSET", key, ft, ts, C[10], C[12], C[11], C[13], fp, C[3])
  end
  if e ~= at then
    rcall("PEXPIRE", key, sfmt(INT, math.ceil((e + span - now) / 1000)))
  end
  local o = ON
  if o == 0 and OUT ~= KEEP then
    -- The call's first reply in a table of its own (EVALSHA's fast
    -- script): made to size (no growing). run's KEEP is sized already.
    OUT = {33, count, 0, d} -- 8 × 4 values + status 1
  else
    OUT[o + 1] = 33
    OUT[o + 2] = count
    OUT[o + 3] = 0
    OUT[o + 4] = d
  end
  ON = o + 4
  return true
end
FAST[4] = tb_fast
