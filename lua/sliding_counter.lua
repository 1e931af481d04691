-- sliding_counter.lua: the sliding-window counter, one hash per bucket holding
-- every duration window of the bucket. Spliced into decide.lua (clock, units,
-- the window arrays and hash_read/hash_write are there). Numbers are Lua
-- doubles; every value stored or returned is a whole number. The in-process
-- store (limiter/algorithms.go) repeats this arithmetic operation by
-- operation, so both stores give the same answers to the microsecond.
--
-- State per window of length L (fields named by L, so a window's state is
-- never read under another length): "<L>w" = index of the current fixed
-- window, floor(t / L); "<L>c" = units admitted in it; "<L>p" = units
-- admitted in the one before. At time t, elapsed e = t - idx * L, the estimate
-- of the units in (t - L, t] is est = p * (L - e) / L + c: the previous window
-- weighted by the share of it still inside the sliding window. A request fits
-- when est <= limit - cost. The state carries its own window index, so a stale
-- state reads as empty whatever its TTL (2 L + 1 s, refreshed on write).
--
-- A window whose length changed (a reload) has no fields of its own; its
-- budget carries over from the fields of the length it replaced: the old
-- estimate, rounded up, counted in the new current window.
--
-- A timestamp older than the stored window (a caller with a slow clock) is
-- taken as the start of the stored window: the counter never goes back.
--
-- Per window: count = ceil(est) clamped to [0, c + p] (+ cost when recorded);
-- retry = when denied, the first whole µs at which est has decayed to
-- limit - cost; reset = the first whole µs at which the estimate (after the
-- request) has dropped by one unit (to 0 when below 1), 0 when it is 0.

-- ctr_est is the estimate at t (t >= idx * w) of a window whose index idx
-- holds cur units and idx - 1 prev units.
local function ctr_est(w, t, idx, cur, prev)
  local k = math.floor(t / w)
  if k == idx then
    return prev * (w - (t - idx * w)) / w + cur
  elseif k == idx + 1 then
    return cur * (w - (t - k * w)) / w
  end
  return 0
end

-- ctr_until is the smallest whole d >= 0 with ctr_est(base + d) <= target
-- (target >= 0). The estimate never grows with time, so the closed-form
-- answer is only nudged by a few µs to absorb floating-point rounding.
local function ctr_until(w, target, base, idx, cur, prev)
  if ctr_est(w, base, idx, cur, prev) <= target then
    return 0
  end
  local e = base - idx * w
  local d
  if target >= cur and prev > 0 then
    -- Within this window: prev * (w - x) / w + cur <= target.
    d = math.ceil(w - (target - cur) * w / prev - e)
  else
    -- In the next window, where cur is the previous count:
    -- cur * (w - x) / w <= target.
    local x = 0
    if cur > 0 then
      x = w - target * w / cur
      if x < 0 then
        x = 0
      end
    end
    d = math.ceil(w - e + x)
  end
  if d < 1 then
    d = 1
  end
  local n = 0
  while n < 4 and ctr_est(w, base + d, idx, cur, prev) > target do
    d = d + 1
    n = n + 1
  end
  n = 0
  while n < 4 and d > 1 and ctr_est(w, base + d - 1, idx, cur, prev) <= target do
    d = d - 1
    n = n + 1
  end
  return d
end

-- ctr_carry is the estimate, rounded up, that the fields of other lengths
-- (windows that a reload replaced) still hold at now: the most of them.
local function ctr_carry(f, now, j0, j1)
  local most = 0
  for name, v in pairs(f) do
    if string.sub(name, -1) == "w" and not is_window(string.sub(name, 1, -2), j0, j1) then
      local ls = string.sub(name, 1, -2)
      local l = tonumber(ls)
      local idx = tonumber(v)
      if l and l > 0 and idx then
        local cur, prev = tonumber(f[ls .. "c"]) or 0, tonumber(f[ls .. "p"]) or 0
        local t = now
        if idx * l > t then
          t = idx * l
        end
        local est = math.ceil(ctr_est(l, t, idx, cur, prev))
        if est > most then
          most = est
        end
      end
    end
  end
  return most
end

-- ctr_check fills windows j0..j1 from their fields v (w, c, p in a row
-- per window; f, the whole hash, when a window has none); the per-window
-- state record needs goes to s1..s4 (idx, base, cur, prev).
local function ctr_check(v, f, j0, j1, now, cost)
  local fits = true
  local carried = false
  for j = j0, j1 do
    local w, ls, limit = wlen[j], wname[j], wlim[j]
    local idx = math.floor(now / w)
    local base, cur, prev = now, 0, 0
    local o = (j - j0) * 3
    local sw = tonumber(v[o + 1])
    if sw then
      if sw == idx then
        cur, prev = tonumber(v[o + 2]), tonumber(v[o + 3])
      elseif sw == idx - 1 then
        prev = tonumber(v[o + 2])
      elseif sw > idx then
        idx, base = sw, sw * w
        cur, prev = tonumber(v[o + 2]), tonumber(v[o + 3])
      end
    else
      if carried == false then
        carried = ctr_carry(f, now, j0, j1)
      end
      cur = carried
    end
    local est = ctr_est(w, base, idx, cur, prev)
    local count = math.ceil(est)
    if count > cur + prev then
      count = cur + prev
    end
    if count < 0 then
      count = 0
    end
    local retry = 0
    if cost > limit then
      retry = w
    elseif est > limit - cost then
      retry = ctr_until(w, limit - cost, base, idx, cur, prev) + (base - now)
    end
    if retry > 0 then
      fits = false
    end
    cnt[j], rty[j] = count, retry
    s1[j], s2[j], s3[j], s4[j] = idx, base, cur, prev
  end
  return fits
end

-- ctr_record adds cost to windows j0..j1 and queues their fields.
local function ctr_record(j0, j1, cost)
  local ttl = 0
  for j = j0, j1 do
    local w, fs = wlen[j], fieldnames[2][wname[j]]
    s3[j] = s3[j] + cost
    cnt[j] = cnt[j] + cost
    hset(fs[1], s1[j])
    hset(fs[2], s3[j])
    hset(fs[3], s4[j])
    local t = math.ceil(2 * w / 1000) + 1000
    if t > ttl then
      ttl = t
    end
  end
  return ttl
end

-- ctr_reset fills the windows' resets from their state (after any write).
local function ctr_reset(j0, j1, now)
  for j = j0, j1 do
    local w = wlen[j]
    local est = ctr_est(w, s2[j], s1[j], s3[j], s4[j])
    local reset = 0
    if est > 0 then
      local target = est - 1
      if target < 0 then
        target = 0
      end
      reset = ctr_until(w, target, s2[j], s1[j], s3[j], s4[j]) + (s2[j] - now)
    end
    rst[j] = reset
  end
end
