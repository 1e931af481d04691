-- fixed_window.lua: fixed-window counter, one hash per budget.
--
-- Clock: ARGV[1] is now in microseconds from the caller (clock app); "0" makes
-- the script read Redis TIME (clock redis: one clock for every Caddy node).
-- Units: every time is in microseconds; every number is a whole number.
--
-- State (HASH): w = index of the window, floor(t / window); n = units admitted
-- in window w. The state carries its own window index, so a stale key reads as
-- empty whatever its TTL; the TTL (until the window ends, + 1 s, refreshed on
-- write) only collects garbage.
--
-- A request is admitted when n + cost <= limit in every key; it is then
-- recorded (n = n + cost) in every key, or, when one key is full, in none.
-- Rejected requests are never recorded; peeks never write. By design a fixed
-- window lets up to 2 * limit through around a boundary (limit at its end,
-- limit again at the start of the next one).
--
-- A timestamp older than the stored window (a caller with a slow clock) is
-- counted in the stored window: the counter never goes back.
--
-- Reply: {allowed, count, retry_us, reset_us} per key, flattened after allowed:
--   count     units in the current window after this request (peek: before)
--   retry_us  when denied: time until the current window ends; window when
--             cost > limit
--   reset_us  time until the current window ends (0 if the window is empty)

local now     = tonumber(ARGV[1])
local window  = tonumber(ARGV[2])
local cost    = tonumber(ARGV[3])
local peek    = ARGV[4] == "1"

if now == 0 then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local allowed = 1
local idxs, ends = {}, {}
local counts, retries, resets = {}, {}, {}

for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[4 + 2 * i])
  local idx = math.floor(now / window)
  local count = 0
  local st = redis.call("HMGET", key, "w", "n")
  if st[1] then
    local w = tonumber(st[1])
    if w == idx then
      count = tonumber(st[2])
    elseif w > idx then
      idx, count = w, tonumber(st[2])
    end
  end
  local wend = (idx + 1) * window
  local retry, reset = 0, 0
  if count > 0 then
    reset = wend - now
  end
  if count + cost > limit then
    allowed = 0
    if cost > limit then
      retry = window
    else
      retry = wend - now
    end
  end
  idxs[i], ends[i] = idx, wend
  counts[i], retries[i], resets[i] = count, retry, reset
end

if allowed == 1 and not peek then
  for i, key in ipairs(KEYS) do
    counts[i] = counts[i] + cost
    resets[i] = ends[i] - now
    redis.call("HSET", key, "w", idxs[i], "n", counts[i])
    redis.call("PEXPIRE", key, math.ceil((ends[i] - now) / 1000) + 1000)
  end
end

local reply = {allowed}
for i = 1, #KEYS do
  reply[#reply + 1] = counts[i]
  reply[#reply + 1] = retries[i]
  reply[#reply + 1] = resets[i]
end
return reply
