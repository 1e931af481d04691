-- token_bucket.lua: token bucket as GCRA, one theoretical arrival time per budget.
--
-- Clock: ARGV[1] is now in microseconds from the caller (clock app); "0" makes
-- the script read Redis TIME (clock redis: one clock for every Caddy node).
-- Units: every time is in microseconds; every number is a whole number.
--
-- Per key: rate limit per window, capacity (burst) B = ARGV burst_i, or limit
-- when that is 0. The emission interval is T = floor(window / limit + 0.5)
-- whole microseconds (at least 1): rounding T once, instead of rounding the
-- arrival time on every write, keeps the state exact, so a full burst of B is
-- always admitted at once and the reported count never drifts. (The rate is
-- off by at most 0.5 µs per unit; above 1 unit per µs per key it is capped.)
--
-- State (STRING): tat, the theoretical arrival time in µs. The bucket is full
-- when tat <= now; d = max(tat - now, 0) is the time the bucket needs to be
-- full again. A stale key (tat in the past) reads exactly as a missing one; the
-- TTL (until tat, + 1 s, refreshed on write) only collects garbage.
--
-- A request of cost c is admitted when d + T * c - B * T <= 0 in every key;
-- it then sets tat = now + d + T * c in every key, or, when one key is full,
-- in none. Rejected requests are never recorded; peeks never write.
--
-- Reply: {allowed, count, retry_us, reset_us} per key, flattened after allowed:
--   count     units in use, B - floor((B * T - d) / T) clamped to [0, B], with
--             d after this request when recorded (peek: before it)
--   retry_us  when denied: d + T * c - B * T, the time until the bucket holds
--             c tokens; window when c > B
--   reset_us  d (after this request when recorded): time until the bucket is
--             full again; 0 when it is full

local now     = tonumber(ARGV[1])
local window  = tonumber(ARGV[2])
local cost    = tonumber(ARGV[3])
local peek    = ARGV[4] == "1"

if now == 0 then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function in_use(d, burst, interval)
  local remaining = math.floor((burst * interval - d) / interval)
  if remaining < 0 then
    remaining = 0
  elseif remaining > burst then
    remaining = burst
  end
  return burst - remaining
end

local allowed = 1
local bursts, intervals, dues = {}, {}, {}
local counts, retries, resets = {}, {}, {}

for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[4 + 2 * i])
  local burst = tonumber(ARGV[5 + 2 * i])
  if burst <= 0 then
    burst = limit
  end
  local interval = math.floor(window / limit + 0.5)
  if interval < 1 then
    interval = 1
  end
  local d = 0
  local tat = redis.call("GET", key)
  if tat then
    d = tonumber(tat) - now
    if d < 0 then
      d = 0
    end
  end
  local retry = 0
  if cost > burst then
    retry = window
  else
    local allow_at = d + interval * cost - burst * interval
    if allow_at > 0 then
      retry = allow_at
    end
  end
  if retry > 0 then
    allowed = 0
  end
  bursts[i], intervals[i], dues[i] = burst, interval, d
  counts[i], retries[i], resets[i] = in_use(d, burst, interval), retry, d
end

if allowed == 1 and not peek then
  for i, key in ipairs(KEYS) do
    local d = dues[i] + intervals[i] * cost
    counts[i] = in_use(d, bursts[i], intervals[i])
    resets[i] = d
    redis.call("SET", key, now + d, "PX", math.ceil(d / 1000) + 1000)
  end
end

local reply = {allowed}
for i = 1, #KEYS do
  reply[#reply + 1] = counts[i]
  reply[#reply + 1] = retries[i]
  reply[#reply + 1] = resets[i]
end
return reply
