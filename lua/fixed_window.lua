-- fixed_window.lua: fixed-window counters, one hash per bucket holding every
-- duration window of the bucket, and the calendar periods (hour, day, week,
-- month in the limiter's time zone), which are fixed windows by nature.
-- Spliced into decide.lua (clock, units, window arrays, hset).
--
-- State per duration window of length L: "<L>w" = index of the window,
-- floor(t / L); "<L>n" = units admitted in it. Per calendar period P (its
-- name: hour, day, week, month): "<P>s" and "<P>e" = the period's start and
-- end, "<P>n" = units admitted in it. A state carries its own window, so a
-- stale one reads as empty whatever its TTL (until the window ends + 1 s,
-- set by the first write in each window: the later ones of that window
-- would set the same).
--
-- A request fits when n + cost <= limit; by design a fixed window lets up to
-- 2 * limit through around a boundary (limit at its end, limit again at the
-- start of the next one). A timestamp older than the stored window (a caller
-- with a slow clock) is counted in the stored window: the counter never goes
-- back. A duration window whose length changed (a reload) carries the count
-- of the window it replaced while that window lasts; a calendar period whose
-- bounds moved (a new time zone) carries its count while the stored period
-- still holds now.
--
-- Per window: count = units in the current window (+ cost when recorded);
-- retry = when denied, the time until the window ends (the window when
-- cost > limit); reset = the time until the window ends (0 if it is empty).

-- fix_carry is the count the fields of other lengths (windows a reload
-- replaced) hold in windows that still contain now: the most of them.
local function fix_carry(f, now, j0, j1)
  local most = 0
  for name, v in pairs(f) do
    if string.sub(name, -1) == "w" and not is_window(string.sub(name, 1, -2), j0, j1) then
      local ls = string.sub(name, 1, -2)
      local l, idx, n = tonumber(ls), tonumber(v), tonumber(f[ls .. "n"]) or 0
      if l and idx and (idx + 1) * l > now and n > most then
        most = n
      end
    end
  end
  return most
end

-- span_eval fills window j, whose count holds over the span [s, e) around
-- now (a fixed window, a calendar period), and reports whether cost fits;
-- record needs s2 (the end).
local function span_eval(j, count, cost, s, e, now)
  local retry, reset = 0, 0
  if count > 0 then
    reset = e - now
  end
  local fits = count + cost <= wlim[j]
  if not fits then
    if cost > wlim[j] then
      retry = e - s
    else
      retry = e - now
    end
  end
  cnt[j], rty[j], rst[j], s2[j] = count, retry, reset, e
  return fits
end

-- fix_check fills duration windows j0..j1 from their fields v (w, n in a
-- row per window; f, the whole hash, when a window has none); record needs
-- s1 (the window index), s2 (its end) and s3 (whether the key held it).
local function fix_check(v, f, j0, j1, now, cost)
  local fits = true
  local carried = false
  for j = j0, j1 do
    local w = wlen[j]
    local idx = math.floor(now / w)
    local count = 0
    local o = (j - j0) * 2
    local sw = tonumber(v[o + 1])
    if sw then
      if sw == idx then
        count = tonumber(v[o + 2])
      elseif sw > idx then
        idx, count = sw, tonumber(v[o + 2])
      end
    else
      if carried == false then
        carried = fix_carry(f, now, j0, j1)
      end
      count = carried
    end
    if not span_eval(j, count, cost, idx * w, (idx + 1) * w, now) then
      fits = false
    end
    s1[j], s3[j] = idx, sw == idx
  end
  return fits
end

-- span_add adds cost to window j (filled by span_eval) and returns the
-- TTL (ms) its state needs: until the span ends, and a second.
local function span_add(j, now, cost)
  cnt[j] = cnt[j] + cost
  rst[j] = s2[j] - now
  return math.ceil((s2[j] - now) / 1000) + 1000
end

-- fix_record adds cost to windows j0..j1 and queues their fields. It
-- returns the TTL, and whether the key's may be kept: every window was
-- the key's already, so the write that began the newest of them set the
-- TTL to the same end (the windows' ends do not move within a window).
local function fix_record(j0, j1, now, cost)
  local ttl, keep = 0, true
  for j = j0, j1 do
    local fs = fieldnames[3][wname[j]]
    ttl = math.max(ttl, span_add(j, now, cost))
    hset(fs[1], s1[j])
    hset(fs[2], cnt[j])
    if not s3[j] then
      keep = false
    end
  end
  return ttl, keep
end

-- cal_check fills calendar windows j0..j1 from their fields v (s, e, n in
-- a row per period). The caller sends each period's bounds around its own
-- clock: b0 < b1 < b2 < b3, three periods in a row; the one holding now is
-- used (the first or last when now is outside them, a clock skew of more
-- than a period).
local function cal_check(v, j0, j1, now, cost)
  local fits = true
  for j = j0, j1 do
    local s, e = cb1[j], cb2[j]
    if now < cb1[j] then
      s, e = cb0[j], cb1[j]
    elseif now >= cb2[j] then
      s, e = cb2[j], cb3[j]
    end
    local count = 0
    local o = (j - j0) * 3
    local ss, se = tonumber(v[o + 1]), tonumber(v[o + 2])
    if ss and (ss == s or (ss <= now and now < se)) then
      count = tonumber(v[o + 3]) or 0
    end
    if not span_eval(j, count, cost, s, e, now) then
      fits = false
    end
    s1[j] = s
  end
  return fits
end

-- cal_record adds cost to calendar windows j0..j1 and queues their fields.
local function cal_record(j0, j1, now, cost)
  local ttl = 0
  for j = j0, j1 do
    local fs = fieldnames[5][wname[j]]
    ttl = math.max(ttl, span_add(j, now, cost))
    hset(fs[1], s1[j])
    hset(fs[2], s2[j])
    hset(fs[3], cnt[j])
  end
  return ttl
end

-- fix_fast is the fast path (decide.lua's FAST) of a check of one fixed
-- window, mode 0: fix_check and fix_record for that case, in a row, with
-- the reply's short form. A key that holds other fields while this
-- window has none (a reload replaced the window) goes to decide, which
-- carries their count over.
local function fix_fast(a, k, V)
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
  local fw, fn = V.fw, V.fn
  if not fw then
    fw, fn = V[10] .. "w", V[10] .. "n"
    V.fw, V.fn = fw, fn
  end
  local v = rcall("HMGET", key, fw, fn)
  local idx = (now - now % w) / w -- math.floor(now / w)
  local ids = sfmt(INT, idx)
  local count, cur = 0, v[1] == ids -- (the window's index as written)
  if cur then
    count = v[2] + 0
  elseif v[1] then
    local sw = v[1] + 0
    if sw >= idx then
      idx, ids, count, cur = sw, v[1], v[2] + 0, true
    end
  elseif #rcall("HGETALL", key) > 0 then
    return nil
  end
  local e = (idx + 1) * w
  if count + cost > limit then
    local retry, reset = e - now, 0
    if cost > limit then
      retry = w
    end
    if count > 0 then
      reset = e - now
    end
    return fast_reply(0, count, retry, reset)
  end
  rcall("HSET", key, fw, ids, fn, sfmt(INT, count + cost))
  if not cur then
    rcall("PEXPIRE", key, sfmt(INT, math.ceil((e - now) / 1000) + 1000))
  end
  return fast_reply(1, count + cost, 0, e - now)
end
FAST[3] = fix_fast
