-- sliding_counter.lua: sliding-window counter, one hash per budget.
--
-- Clock: ARGV[1] is now in microseconds from the caller (clock app); "0" makes
-- the script read Redis TIME (clock redis: one clock for every Caddy node).
-- Units: every time is in microseconds. Numbers are Lua doubles; every value
-- stored or returned is a whole number. The in-process store (limiter/memory.go)
-- repeats this arithmetic operation by operation, so both give the same answers.
--
-- State (HASH): w = index of the current fixed window, floor(t / window);
-- c = units admitted in window w; p = units admitted in window w - 1. The
-- state carries its own window index, so a stale key reads as empty whatever
-- its TTL; the TTL (2 windows + 1 s, refreshed on write) only collects garbage.
--
-- At time t in window idx, elapsed e = t - idx * window, the estimate of the
-- units in the sliding window (t - window, t] is
--     est = p * (window - e) / window + c
-- (the previous window weighted by the share of it still inside the sliding
-- window). A request is admitted when est <= limit - cost in every key; it is
-- then recorded (c = c + cost) in every key, or, when one key is full, in none.
-- Rejected requests are never recorded; peeks never write.
--
-- A timestamp older than the stored window (a caller with a slow clock) is
-- treated as the start of the stored window: the counter never goes back.
--
-- Reply: {allowed, count, retry_us, reset_us} per key, flattened after allowed:
--   count     ceil(est) clamped to [0, c + p], plus cost when recorded
--             (peek: before the request)
--   retry_us  when denied: the first whole microsecond at which est has decayed
--             to limit - cost (within the current window if the previous
--             window's share can decay that far, otherwise in the next window,
--             where c becomes the previous count); window when cost > limit
--   reset_us  the first whole microsecond at which the estimate (after this
--             request) has dropped by one unit, i.e. one more unit of quota is
--             back (to 0 when it is below 1); 0 when the estimate is 0

local now     = tonumber(ARGV[1])
local window  = tonumber(ARGV[2])
local cost    = tonumber(ARGV[3])
local peek    = ARGV[4] == "1"

if now == 0 then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local ttl_ms = math.ceil(2 * window / 1000) + 1000

-- The estimate at time t (t >= idx * window) of a key whose window idx holds
-- cur units and window idx - 1 prev units.
local function estimate_at(t, idx, cur, prev)
  local k = math.floor(t / window)
  if k == idx then
    return prev * (window - (t - idx * window)) / window + cur
  elseif k == idx + 1 then
    return cur * (window - (t - k * window)) / window
  end
  return 0
end

-- The smallest whole d >= 0 with estimate_at(base + d) <= target (target >= 0).
-- The estimate never grows with time, so the closed-form answer is only
-- nudged by a few microseconds to absorb floating-point rounding.
local function time_until(target, base, idx, cur, prev)
  if estimate_at(base, idx, cur, prev) <= target then
    return 0
  end
  local e = base - idx * window
  local d
  if target >= cur and prev > 0 then
    -- Within this window: prev * (window - x) / window + cur <= target.
    d = math.ceil(window - (target - cur) * window / prev - e)
  else
    -- In the next window, where cur is the previous count:
    -- cur * (window - x) / window <= target.
    local x = 0
    if cur > 0 then
      x = window - target * window / cur
      if x < 0 then
        x = 0
      end
    end
    d = math.ceil(window - e + x)
  end
  if d < 1 then
    d = 1
  end
  local n = 0
  while n < 4 and estimate_at(base + d, idx, cur, prev) > target do
    d = d + 1
    n = n + 1
  end
  n = 0
  while n < 4 and d > 1 and estimate_at(base + d - 1, idx, cur, prev) <= target do
    d = d - 1
    n = n + 1
  end
  return d
end

local allowed = 1
local idxs, bases, curs, prevs, ests = {}, {}, {}, {}, {}
local counts, retries, resets = {}, {}, {}

for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[4 + 2 * i])
  local idx = math.floor(now / window)
  local base = now
  local cur, prev = 0, 0
  local st = redis.call("HMGET", key, "w", "c", "p")
  if st[1] then
    local w = tonumber(st[1])
    if w == idx then
      cur, prev = tonumber(st[2]), tonumber(st[3])
    elseif w == idx - 1 then
      prev = tonumber(st[2])
    elseif w > idx then
      idx, base = w, w * window
      cur, prev = tonumber(st[2]), tonumber(st[3])
    end
  end
  local est = estimate_at(base, idx, cur, prev)
  local count = math.ceil(est)
  if count > cur + prev then
    count = cur + prev
  end
  if count < 0 then
    count = 0
  end
  local retry = 0
  if cost > limit then
    retry = window
  elseif est > limit - cost then
    retry = time_until(limit - cost, base, idx, cur, prev) + (base - now)
  end
  if retry > 0 then
    allowed = 0
  end
  idxs[i], bases[i], curs[i], prevs[i], ests[i] = idx, base, cur, prev, est
  counts[i], retries[i] = count, retry
end

if allowed == 1 and not peek then
  for i, key in ipairs(KEYS) do
    curs[i] = curs[i] + cost
    counts[i] = counts[i] + cost
    ests[i] = estimate_at(bases[i], idxs[i], curs[i], prevs[i])
    redis.call("HSET", key, "w", idxs[i], "c", curs[i], "p", prevs[i])
    redis.call("PEXPIRE", key, ttl_ms)
  end
end

for i = 1, #KEYS do
  local reset = 0
  if ests[i] > 0 then
    local target = ests[i] - 1
    if target < 0 then
      target = 0
    end
    reset = time_until(target, bases[i], idxs[i], curs[i], prevs[i]) + (bases[i] - now)
  end
  resets[i] = reset
end

local reply = {allowed}
for i = 1, #KEYS do
  reply[#reply + 1] = counts[i]
  reply[#reply + 1] = retries[i]
  reply[#reply + 1] = resets[i]
end
return reply
