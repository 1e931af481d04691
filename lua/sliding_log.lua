-- sliding_log.lua: exact sliding-window log, one sorted set per budget.
--
-- Clock: ARGV[1] is now in microseconds from the caller (clock app); "0" makes
-- the script read Redis TIME (clock redis: one clock for every Caddy node).
-- Units: every time is in microseconds. A member's score is the time it was
-- admitted; the member is a unique request id (":<n>" added per unit of cost).
-- A request is admitted when every key has room for its cost; it is then
-- recorded in every key, or, when one key is full, in none. Rejected requests
-- are never recorded. Every write refreshes the key's TTL (window + 1 s), so an
-- idle key vanishes on its own.
--
-- Reply: {allowed, count, retry_us, reset_us} per key, flattened after allowed:
--   count     units in the window after this request (peek: before it)
--   retry_us  when denied: time until this key has room for the cost
--   reset_us  time until the oldest unit in the window leaves it (0 if empty)

local now     = tonumber(ARGV[1])
local window  = tonumber(ARGV[2])
local cost    = tonumber(ARGV[3])
local peek    = ARGV[4] == "1"
local member  = ARGV[5]

if now == 0 then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local ttl_ms = math.ceil(window / 1000) + 1000

local allowed = 1
local counts, retries, resets = {}, {}, {}

for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[4 + 2 * i])
  -- The window is (now - window, now]: an entry exactly one window old is
  -- out. A check drops what left, then reads by rank; a peek never writes,
  -- so it reads the entries above the cut by score instead.
  local count, nth
  if peek then
    local cut = "(" .. string.format("%.0f", now - window)
    count = redis.call("ZCOUNT", key, cut, "+inf")
    nth = function(k)
      return redis.call("ZRANGEBYSCORE", key, cut, "+inf", "WITHSCORES", "LIMIT", k - 1, 1)
    end
  else
    redis.call("ZREMRANGEBYSCORE", key, "-inf", now - window)
    count = redis.call("ZCARD", key)
    nth = function(k)
      return redis.call("ZRANGE", key, k - 1, k - 1, "WITHSCORES")
    end
  end
  local retry, reset = 0, 0
  if count > 0 then
    reset = tonumber(nth(1)[2]) + window - now
  end
  if count + cost > limit then
    allowed = 0
    if cost > limit then
      retry = window
    else
      -- Room for the cost comes when the (count + cost - limit)-th oldest
      -- unit leaves the window.
      retry = tonumber(nth(count + cost - limit)[2]) + window - now
    end
  end
  counts[i], retries[i], resets[i] = count, retry, reset
end

if allowed == 1 and not peek then
  for i, key in ipairs(KEYS) do
    if counts[i] == 0 then
      resets[i] = window
    end
    counts[i] = counts[i] + cost
    if cost == 1 then
      redis.call("ZADD", key, now, member)
    else
      for n = 1, cost do
        redis.call("ZADD", key, now, member .. ":" .. n)
      end
    end
    redis.call("PEXPIRE", key, ttl_ms)
  end
end

local reply = {allowed}
for i = 1, #KEYS do
  reply[#reply + 1] = counts[i]
  reply[#reply + 1] = retries[i]
  reply[#reply + 1] = resets[i]
end
return reply
