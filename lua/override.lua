-- override.lua: an identity's temporary overrides (the hash decide.lua
-- reads), and a limiter's index of them. Not on the request path: an
-- operator sets, reads or ends an override through the admin API.
--
-- The hash holds, per scope ("" for the identity in every region, or a
-- region): "<scope>|u" (until, µs), and "<scope>|f" (a factor) or
-- "<scope>|l<window>" / "<scope>|g<window>" (a window's limit). A field's
-- scope is everything before its last '|' (window names hold none).
--
-- KEYS[1]: the hash (set, del, get) or the index (index).
-- ARGV: op, now (µs; 0 reads Redis TIME), then
--   set   scope ttl suffix value ...  → until (µs); the scope's old fields
--                                       go, the new ones stand until then
--   del   scope                       → 1 when the scope had a live override
--   get                               → {now, field, value, ...} of live scopes
--   index member until                → {now, member, until, ...} of live
--                                       entries, after adding member (until
--                                       > 0), removing it (0) or neither (-1)
-- Every write drops what has expired and sets the key's TTL to its last
-- live until (plus a second), so the hash and the index end by themselves.

local op, now = ARGV[1], tonumber(ARGV[2])
if now == 0 then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local key = KEYS[1]

local function ttl_to(last)
  if last > now then
    redis.call("PEXPIRE", key, math.ceil((last - now) / 1000) + 1000)
  else
    redis.call("DEL", key)
  end
end

if op == "index" then
  local member, untilv = ARGV[3], tonumber(ARGV[4])
  redis.call("ZREMRANGEBYSCORE", key, "-inf", string.format("%.0f", now))
  if untilv > 0 then
    redis.call("ZADD", key, string.format("%.0f", untilv), member)
  elseif untilv == 0 then
    redis.call("ZREM", key, member)
  end
  local r = redis.call("ZRANGE", key, 0, -1, "WITHSCORES")
  local last = 0
  local out = {now}
  for i = 1, #r, 2 do
    local u = tonumber(r[i + 1])
    if u > last then
      last = u
    end
    out[#out + 1] = r[i]
    out[#out + 1] = u
  end
  if untilv >= 0 then
    ttl_to(last)
  end
  return out
end

local raw = redis.call("HGETALL", key)
local until_of = {}
for i = 1, #raw, 2 do
  local sc, suffix = string.match(raw[i], "^(.*)|([^|]*)$")
  if sc and suffix == "u" then
    until_of[sc] = tonumber(raw[i + 1])
  end
end
local function live(sc)
  local u = until_of[sc]
  return u ~= nil and u > now
end

if op == "get" then
  local out = {now}
  for i = 1, #raw, 2 do
    local sc = string.match(raw[i], "^(.*)|[^|]*$")
    if sc and live(sc) then
      out[#out + 1] = raw[i]
      out[#out + 1] = raw[i + 1]
    end
  end
  return out
end

local scope = ARGV[3]
local had = live(scope)
local drop = {}
for i = 1, #raw, 2 do
  local sc = string.match(raw[i], "^(.*)|[^|]*$")
  if sc == nil or sc == scope or not live(sc) then
    drop[#drop + 1] = raw[i]
  end
end
if #drop > 0 then
  redis.call("HDEL", key, unpack(drop))
end
local last = 0
for sc, u in pairs(until_of) do
  if sc ~= scope and u > now and u > last then
    last = u
  end
end
if op == "set" then
  local u = now + tonumber(ARGV[4])
  local f = {scope .. "|u", string.format("%.0f", u)}
  for i = 5, #ARGV, 2 do
    f[#f + 1] = scope .. "|" .. ARGV[i]
    f[#f + 1] = ARGV[i + 1]
  end
  redis.call("HSET", key, unpack(f))
  if u > last then
    last = u
  end
  ttl_to(last)
  return u
end
ttl_to(last)
if had then
  return 1
end
return 0
