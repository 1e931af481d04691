-- sliding_counter.lua: the sliding-window counter, one hash per key holding
-- every duration window of the key. Spliced into decide.lua (clock, units,
-- the window arrays and hset are there). Numbers are Lua doubles; every
-- value stored or returned is a whole number. The in-process store
-- (limiter/algorithms.go) repeats format 3's arithmetic operation by
-- operation, so both stores give the same answers to the microsecond.
--
-- Format 3 (kind 2 writes it). A window of length L is split in buckets of
-- bw = ceil(L / N) µs (N = CTR3_N = 20); bucket m is [m bw, (m + 1) bw). A
-- window's one field, "<L>w", is a JSON array (cjson.decode reads it; it
-- begins "[3,", which says the format, and makes the releases before the
-- format version fail on the key rather than read it as empty):
--   [3, P, then for the N + 1 buckets m = K - N .. K, oldest first:
--    c, f - m bw, l - m bw; then T, K]
-- K the newest bucket, T the units of all of them, c a bucket's units, f
-- <= l the first and last µs one of them was admitted at (a bucket not
-- written reads c = 0), P (6 characters wide) the byte where bucket K's c
-- begins: a write that changes bucket K alone keeps the field as read up
-- to there and formats the last five numbers. At time t the window is
-- (t - L, t], starting at s = t - L in bucket m0 = floor(s / bw): the
-- buckets m0 + 1 .. K count whole (F), m0's c units by its two ends, never
-- below c - B, B = ceil(limit / N):
--   p = c while f > s (all in), 0 once l <= s (all out), else
--   1 + (c - 2) (l - s) / (l - f) (the last in, the first out, the others
--   spread evenly between them); est = F + max(p, c - B).
-- A request fits when est <= limit - cost, compared in whole numbers
-- (ctr3_le). Once m0's first arrival has left the window at least its
-- units have, so the window holds at most F + c - 1 <= est + B - 1 units:
-- the counter never admits more than limit + ceil(limit / N) - 1 in any
-- window. count = ceil(est); retry = when denied, the first whole µs at
-- which est <= limit - cost; reset = the first whole µs at which the count
-- (after the request) has dropped by one, 0 when it is 0. est never grows
-- with time. The check and the record work on the decoded array itself,
-- which is written back (its tail, or whole); the TTL, L + bw + 1 s,
-- is set when a write starts a bucket, as in format 2. A window with no
-- field of its own carries over the most that the fields of the lengths it
-- replaced hold (their oldest bucket counted whole), as both the first and
-- the last arrival of the bucket of now; a key in format 1 or 2 is turned
-- into format 3 (ctr3_from) and back (ctr3_to1, ctr3_to2) as below.
--
-- Format 2 (kind 10 writes it, `state_format 2`). A window of length L is split in buckets of
-- bw = ceil(L / N) µs (N = CTR_N = 10); bucket m is [m bw, (m + 1) bw). Its
-- fields (named by L, so a window's state is never read under another
-- length): "<L>k" = K, the newest bucket written; "<L>.<i>" = the units of
-- bucket m in slot i = m % (N + 1), for the N + 1 buckets (K - N - 1, K] (a
-- slot not written reads 0); "<L>w" = "#2", written with the state, which
-- says the format (and makes a release before the format version fail on
-- the key rather than read it as empty: its index is not a number).
-- At time t the window is (t - L, t]; m0 = floor((t - L) / bw) is the
-- bucket it starts in. The buckets m0 + 1 .. K are wholly inside and count
-- whole (F); the oldest, m0, holding c units, overlaps it by x = (m0 + 1) bw
-- - (t - L) µs and counts max(c x / bw, c - B), B = ceil(limit / N):
--   est = F + max(c x / bw, c - B).
-- A request fits when est <= limit - cost. The true units in the window are
-- at most F + c <= est + B, so at every admission the window (t - L, t]
-- holds at most limit + B units, whatever the timing of the bursts: the
-- counter never admits more than limit + ceil(limit / N) in any window.
--
-- A window whose length changed (a reload) has no fields of its own; its
-- budget carries over from the fields of the lengths it replaced: their
-- units still in their window (oldest bucket counted whole; in format 1
-- the old estimate), rounded up, the most of them, counted in the current
-- bucket.
--
-- A timestamp older than the newest bucket (a caller with a slow clock) is
-- taken as that bucket's start: the counter never goes back.
--
-- Per window: count = ceil(est) (at most the units held); retry = when
-- denied, the first whole µs at which est has decayed to limit - cost;
-- reset = the first whole µs at which est (after the request) has dropped by
-- one unit (to 0 when below 1), 0 when it is 0. est never grows with time.
--
-- TTL: L + bw + 1 s, set when a write starts a bucket (K moves, or the state
-- is written whole) and left on the other writes: a write in bucket K comes
-- within bw of the one that started it, so K's units keep their window.
--
-- Format 1 (the releases before the state format version; kind 8 writes it,
-- `state_format 1`): "<L>w" = index of the current fixed window, floor(t /
-- L); "<L>c" = units admitted in it; "<L>p" = units admitted in the one
-- before; est = p (L - e) / L + c at elapsed e = t - idx L; TTL 2 L + 1 s,
-- refreshed on every write. (A ban's weighted count is this estimate too.)
--
-- Every format is read by every check; a check that writes (not a peek)
-- rewrites a key holding another format in its own (DEL, then the whole
-- state), never admitting more than either reading allows:
--   format 1 or 2 -> 3: each fixed window's or bucket's units go to the
--     latest µs they can have (its last, or now), as both ends of the
--     format-3 bucket holding it;
--   format 3 -> 2 or 1: each bucket's units go to the bucket or fixed
--     window of its last arrival;
--   format 1 -> 2: the units of window idx go to the bucket of the latest
--     time they can have (now, within the window), those of idx - 1 to the
--     window's last bucket: each counts at least as long as it can be in
--     the window;
--   format 2 -> 1: each bucket's units go to the fixed window holding the
--     bucket's last µs (the buckets of a length that N divides tile its
--     windows: the old counts exactly, but for buckets already out of the
--     sliding window).
-- See docs/redis.md, "Upgrading".

-- What decide.lua calls; the file's other locals live in the block below,
-- which ends with the file (a function's locals are at most 200, and
-- decide.lua's body is one function).
local ctr_est, ctr_part, ctr_record, ctr_reset
do
local CTR_N = 10
local CTR_R = CTR_N + 1

-- Format 3: CTR3_N buckets a window, CTR3_R kept. A window's state is its
-- field decoded (ctr3_decode), ca[j] while it is checked: {3, P, then for
-- buckets K - 20 .. K, at 63 + 3 (m - K): units, first, last (µs after the
-- bucket's start), then T, K}, T the units of all of them, P where bucket
-- K's units begin in the field (cv[j], the field as read; cnew[j]: K's
-- bucket is all that changed since). FMT3 are the formats of a window's
-- field (set on the first write).
local CTR3_N, CTR3_R = 20, 21
local ca, cv, cnew = {}, {}, {}
local FMT3 = false
-- cwl: window j's length (the format-3 arithmetic's, so that the fast path
-- needs none of decide.lua's tables); cenc: the format (3 or 4) window j is
-- written in.
local cwl, cenc = {}, {}
local ctr4_decode, ctr4_encode

-- Per window of the check: its format (cfmt), bucket length and B, the
-- buckets (cring[j][slot], for (s1 - CTR_R, s1]), their prefix sums
-- (cpre[j][i]: the units of buckets s1 - CTR_R + 1 .. s1 - CTR_R + i) and
-- total (ctot), and the newest bucket stored (cK, false when the state is
-- written whole).
local cfmt, cbw, cb, cK, cring, cpre, ctot = {}, {}, {}, {}, {}, {}, {}
local ctrnames = {}

-- ctr_fields is window name's field names: k, w, the slots, c, p.
local function ctr_fields(name)
  local fs = ctrnames[name]
  if not fs then
    fs = {name .. "k", name .. "w"}
    for i = 0, CTR_R - 1 do
      fs[i + 3] = name .. "." .. i
    end
    fs[CTR_R + 3], fs[CTR_R + 4] = name .. "c", name .. "p"
    ctrnames[name] = fs
  end
  return fs
end

-- ctr_sums fills window j's prefix sums and total.
local function ctr_sums(j)
  local c, s = cring[j], cpre[j]
  local slot, acc = (s1[j] + 1) % CTR_R, 0
  s[0] = 0
  for i = 1, CTR_R do
    acc = acc + c[slot]
    s[i] = acc
    slot = slot + 1
    if slot == CTR_R then
      slot = 0
    end
  end
  ctot[j] = acc
end

-- ctr_best is window j's estimate at t >= s1[j] * bw.
local function ctr_best(j, t)
  local w, bw, k = wlen[j], cbw[j], s1[j]
  local m0 = math.floor((t - w) / bw)
  if m0 > k then
    return 0
  end
  local c = cring[j][m0 % CTR_R]
  local x = (m0 + 1) * bw - (t - w)
  local part = c * x / bw
  if c - cb[j] > part then
    part = c - cb[j]
  end
  return (ctot[j] - cpre[j][m0 - k + CTR_R]) + part
end

-- ctr_bestb is ctr_best times the bucket's length, in whole numbers (exact
-- in doubles below 2^53): the searches below compare in it, so that a
-- target one unit below an estimate is exact (est - 1, in doubles, was
-- rounded, and the reset came a µs late: 60.000001 s where 60 s is right,
-- a header's reset a second late).
local function ctr_bestb(j, t)
  local w, bw, k = wlen[j], cbw[j], s1[j]
  local m0 = math.floor((t - w) / bw)
  if m0 > k then
    return 0
  end
  local c = cring[j][m0 % CTR_R]
  local part = c * ((m0 + 1) * bw - (t - w))
  local floor = (c - cb[j]) * bw
  if floor > part then
    part = floor
  end
  return (ctot[j] - cpre[j][m0 - k + CTR_R]) * bw + part
end

-- ctr_buntil is the smallest whole d >= 0 with ctr_bestb(j, base + d) <=
-- target (target >= 0, times the bucket's length), estb being
-- ctr_bestb(j, base): segment by segment (m0 constant in each; at its last
-- µs, x = 1), the closed form nudged by a few µs.
local function ctr_buntil(j, target, base, estb)
  if estb <= target then
    return 0
  end
  local w, bw, k, b = wlen[j], cbw[j], s1[j], cb[j]
  local ring, pre, tot = cring[j], cpre[j], ctot[j]
  local m = math.floor((base - w) / bw)
  while m <= k do
    local c = ring[m % CTR_R]
    local sf = (tot - pre[m - k + CTR_R]) * bw
    local part = c
    if (c - b) * bw > part then
      part = (c - b) * bw
    end
    if sf + part <= target then
      local tend = (m + 1) * bw + w - 1
      local start = m * bw + w
      if start < base then
        start = base
      end
      local t = start
      if c > 0 then
        t = (m + 1) * bw + w - math.floor((target - sf) / c)
      end
      if t < start then
        t = start
      end
      if t > tend then
        t = tend
      end
      local n = 0
      while n < 4 and t < tend and ctr_bestb(j, t) > target do
        t = t + 1
        n = n + 1
      end
      n = 0
      while n < 4 and t > start and ctr_bestb(j, t - 1) <= target do
        t = t - 1
        n = n + 1
      end
      return t - base
    end
    m = m + 1
  end
  local t = (k + 1) * bw + w
  if t < base then
    t = base
  end
  return t - base
end

-- Format 1.

-- ctr_est is the estimate at t (t >= idx * w) of a window whose index idx
-- holds cur units and idx - 1 prev units.
function ctr_est(w, t, idx, cur, prev)
  local k = math.floor(t / w)
  if k == idx then
    return prev * (w - (t - idx * w)) / w + cur
  elseif k == idx + 1 then
    return cur * (w - (t - k * w)) / w
  end
  return 0
end

-- ctr1_until is the smallest whole d >= 0 with ctr_est(base + d) <= target
-- (target >= 0). The estimate never grows with time, so the closed-form
-- answer is only nudged by a few µs to absorb floating-point rounding.
local function ctr1_until(w, target, base, idx, cur, prev)
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

-- ctr3_decode is a window's field in format 3 (it begins "[3,"), decoded:
-- {3, K, then units, first, last (µs after the bucket's start) per slot},
-- or nil.
local function ctr3_decode(v)
  if v and string.sub(v, 1, 3) == "[3," then
    if string.sub(v, 4, 5) == "#4" then
      return ctr4_decode(v), 4
    end
    return cjson.decode(v), 3
  end
  return nil
end

-- ctr3_each calls fn(units, first, last) for each bucket of a decoded
-- window of length l holding units, from the oldest.
local function ctr3_each(a, l, fn)
  local bw, k = math.ceil(l / CTR3_N), a[67]
  for m = k - CTR3_R + 1, k do
    local o = 63 + 3 * (m - k)
    if a[o] > 0 then
      fn(a[o], m * bw + a[o + 1], m * bw + a[o + 2])
    end
  end
end

-- ctr3_carry is ctr_carry's reading of a window of length l in format 3
-- (decoded a): its units in the window at now, the oldest bucket whole.
local function ctr3_carry(a, l, now)
  local bw, k = math.ceil(l / CTR3_N), a[67]
  local t = now
  if k * bw > t then
    t = k * bw
  end
  local m0 = math.floor((t - l) / bw)
  if m0 > k then
    return 0
  end
  local est = a[66]
  for m = k - CTR3_R + 1, m0 - 1 do
    est = est - a[63 + 3 * (m - k)]
  end
  return est
end

-- ctr_carry is the units, rounded up, that the fields of other lengths
-- (windows that a reload replaced) still hold at now, in either format:
-- the most of them.
local function ctr_carry(f, now, j0, j1)
  local most = 0
  for name, v in pairs(f) do
    if string.sub(name, -1) == "w" and not is_window(string.sub(name, 1, -2), j0, j1) then
      local ls = string.sub(name, 1, -2)
      local l = tonumber(ls)
      local est = 0
      local a = l and l > 0 and ctr3_decode(v)
      if a then
        est = ctr3_carry(a, l, now)
      elseif l and l > 0 and v == "#2" then
        local k = tonumber(f[ls .. "k"])
        if k then
          local bw = math.ceil(l / CTR_N)
          local t = now
          if k * bw > t then
            t = k * bw
          end
          for m = math.floor((t - l) / bw), k do
            est = est + (tonumber(f[ls .. "." .. (m % CTR_R)]) or 0)
          end
        end
      elseif l and l > 0 then
        local idx = tonumber(v)
        if idx then
          local cur, prev = tonumber(f[ls .. "c"]) or 0, tonumber(f[ls .. "p"]) or 0
          local t = now
          if idx * l > t then
            t = idx * l
          end
          est = math.ceil(ctr_est(l, t, idx, cur, prev))
        end
      end
      if est > most then
        most = est
      end
    end
  end
  return most
end

-- ctr1_check fills windows j0..j1 from their fields v (w, c, p in a row
-- per window; f, the whole hash, when a window has none); the per-window
-- state record needs goes to s1..s4 (idx, base, cur, prev).
local function ctr1_check(v, f, j0, j1, now, cost)
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
      retry = ctr1_until(w, limit - cost, base, idx, cur, prev) + (base - now)
    end
    if retry > 0 then
      fits = false
    end
    cnt[j], rty[j] = count, retry
    s1[j], s2[j], s3[j], s4[j] = idx, base, cur, prev
  end
  return fits
end

-- ctr1_record adds cost to windows j0..j1 and queues their fields.
local function ctr1_record(j0, j1, cost)
  local ttl = 0
  for j = j0, j1 do
    local w, fs = wlen[j], ctr_fields(wname[j])
    s3[j] = s3[j] + cost
    cnt[j] = cnt[j] + cost
    hset(fs[2], s1[j])
    hset(fs[CTR_R + 3], s3[j])
    hset(fs[CTR_R + 4], s4[j])
    local t = math.ceil(2 * w / 1000) + 1000
    if t > ttl then
      ttl = t
    end
  end
  return ttl
end

-- ctr1_reset fills the windows' resets from their state (after any write).
local function ctr1_reset(j0, j1, now)
  for j = j0, j1 do
    local w = wlen[j]
    local est = ctr_est(w, s2[j], s1[j], s3[j], s4[j])
    local reset = 0
    if est > 0 then
      local target = est - 1
      if target < 0 then
        target = 0
      end
      reset = ctr1_until(w, target, s2[j], s1[j], s3[j], s4[j]) + (s2[j] - now)
    end
    rst[j] = reset
  end
end

-- Format 2.

-- ctr3_to2 puts window j's format-3 buckets (decoded a) in its format-2
-- ring of newest k (the bucket of now, or later: it returns it), each
-- bucket's units in the bucket of its last arrival.
local function ctr3_to2(j, a, k)
  local bw, ring = cbw[j], cring[j]
  ctr3_each(a, wlen[j], function(_, _, last)
    if math.floor(last / bw) > k then
      k = math.floor(last / bw)
    end
  end)
  ctr3_each(a, wlen[j], function(c, _, last)
    local m = math.floor(last / bw)
    if m > k - CTR_R then
      ring[m % CTR_R] = ring[m % CTR_R] + c
    end
  end)
  return k
end

-- ctr3_to1 is window j's format-3 buckets (decoded a) as format 1's at
-- now: window index, cur, prev, each bucket's units in the fixed window of
-- its last arrival.
local function ctr3_to1(j, a, now)
  local l = wlen[j]
  local t = now
  if a[67] * math.ceil(l / CTR3_N) > t then
    t = a[67] * math.ceil(l / CTR3_N)
  end
  local sw = math.floor(t / l)
  local cur, prev = 0, 0
  ctr3_each(a, l, function(c, _, last)
    local wi = math.floor(last / l)
    if wi >= sw then
      cur = cur + c
    elseif wi == sw - 1 then
      prev = prev + c
    end
  end)
  return sw, cur, prev
end

-- ctr_map is the hash as a map.
local function ctr_map(key)
  local raw = redis.call("HGETALL", key)
  local f = {}
  for i = 1, #raw, 2 do
    f[raw[i]] = raw[i + 1]
  end
  return f
end

-- ctr_stale reports whether f holds a field that is not of windows j0..j1
-- in format want: a window a reload replaced, or the other format.
local function ctr_stale(f, j0, j1, want)
  for name, v in pairs(f) do
    local ls, sfx = string.match(name, "^(%d+)(.*)$")
    local ok = false
    if ls and is_window(ls, j0, j1) then
      if want == 3 then
        ok = sfx == "w" and string.sub(v, 1, 3) == "[3,"
      elseif want == 2 then
        ok = sfx == "k" or (sfx == "w" and v == "#2") or string.sub(sfx, 1, 1) == "."
      else
        ok = (sfx == "w" and v ~= "#2" and string.sub(v, 1, 1) ~= "[") or sfx == "c" or sfx == "p"
      end
    end
    if not ok then
      return true
    end
  end
  return false
end

-- ctr_from1 turns window j's format-1 fields in f (window index sw, cur,
-- prev) into buckets of newest k (bucket of now kn, or later).
local function ctr_from1(j, f, now, kn)
  local l, bw, ring = wlen[j], cbw[j], cring[j]
  local ls = wname[j]
  local sw = tonumber(f[ls .. "w"])
  local k = kn
  if sw and sw >= math.floor(now / l) - 1 then
    local cur, prev = tonumber(f[ls .. "c"]) or 0, tonumber(f[ls .. "p"]) or 0
    local tc = now
    if tc < sw * l then
      tc = sw * l
    end
    if tc > (sw + 1) * l - 1 then
      tc = (sw + 1) * l - 1
    end
    local mc, mp = math.floor(tc / bw), math.floor((sw * l - 1) / bw)
    if mc > k then
      k = mc
    end
    if mc > k - CTR_R then
      ring[mc % CTR_R] = ring[mc % CTR_R] + cur
    end
    if mp > k - CTR_R then
      ring[mp % CTR_R] = ring[mp % CTR_R] + prev
    end
  end
  return k
end

-- ctr_to1 is window j's format-2 fields in f as format 1's: window index,
-- cur, prev at now.
local function ctr_to1(j, f, now)
  local l, ls = wlen[j], wname[j]
  local bw = math.ceil(l / CTR_N)
  local k = tonumber(f[ls .. "k"])
  if not k then
    return nil
  end
  local t = now
  if k * bw > t then
    t = k * bw
  end
  local sw = math.floor(t / l)
  local cur, prev = 0, 0
  for m = k - CTR_R + 1, k do
    local c = tonumber(f[ls .. "." .. (m % CTR_R)]) or 0
    local wi = math.floor(((m + 1) * bw - 1) / l)
    if wi >= sw then
      cur = cur + c
    elseif wi == sw - 1 then
      prev = prev + c
    end
  end
  return sw, cur, prev
end

-- ctr_check2 fills windows j0..j1 in format 2 from their fields v (k then
-- the slots, per window), f (the whole hash, or false).
local function ctr_check2(v, f, j0, j1, now, cost)
  local fits = true
  local carried = false
  for j = j0, j1 do
    local w, limit = wlen[j], wlim[j]
    local bw, b = math.ceil(w / CTR_N), math.ceil(limit / CTR_N)
    cbw[j], cb[j], cfmt[j] = bw, b, 2
    local ring = cring[j]
    if not ring then
      ring = {}
      cring[j], cpre[j] = ring, {}
    end
    local k = math.floor(now / bw)
    local base = now
    local o = (j - j0) * (CTR_R + 1)
    local sk = tonumber(v[o + 1])
    if sk then
      if sk > k then
        k = sk
        base = k * bw
      end
      -- The slots of buckets (k - CTR_R, sk] as stored, the others 0.
      local keep = sk - k + CTR_R
      local slot = (k + 1) % CTR_R
      for i = 1, CTR_R do
        if i <= keep then
          local x = v[o + 2 + slot]
          ring[slot] = x and x + 0 or 0
        else
          ring[slot] = 0
        end
        slot = slot + 1
        if slot == CTR_R then
          slot = 0
        end
      end
      cK[j] = sk
    else
      for i = 0, CTR_R - 1 do
        ring[i] = 0
      end
      cK[j] = false
      local a, sw = ctr3_decode(f[wname[j] .. "w"]), f[wname[j] .. "w"]
      if a or (sw and sw ~= "#2") then
        if a then
          k = ctr3_to2(j, a, k)
        else
          k = ctr_from1(j, f, now, k)
        end
        if k * bw > now then
          base = k * bw
        end
      else
        if carried == false then
          carried = ctr_carry(f, now, j0, j1)
        end
        ring[k % CTR_R] = carried
      end
    end
    s1[j], s2[j] = k, base
    ctr_sums(j)
    local est = ctr_best(j, base)
    local count = math.ceil(est)
    if count > ctot[j] then
      count = ctot[j]
    end
    if count < 0 then
      count = 0
    end
    local retry = 0
    if cost > limit then
      retry = w
    else
      local estb = ctr_bestb(j, base)
      if estb > (limit - cost) * bw then
        retry = ctr_buntil(j, (limit - cost) * bw, base, estb) + (base - now)
      end
    end
    if retry > 0 then
      fits = false
    end
    cnt[j], rty[j] = count, retry
  end
  return fits
end

-- Format 3.

-- ctr3_after is the units of window j's buckets after m (m >= K - CTR3_R).
local function ctr3_after(j, m)
  local a = ca[j]
  local u, k = a[66], a[67]
  for i = k - CTR3_R + 1, m do
    u = u - a[63 + 3 * (i - k)]
  end
  return u
end

-- ctr3_le reports whether window j's estimate at t (t >= K * bw) is at
-- most target, a whole number, compared in whole numbers.
local function ctr3_le(j, t, target)
  local a, bw, st = ca[j], cbw[j], t - cwl[j]
  local m0 = (st - st % bw) / bw -- math.floor(st / bw), in whole numbers
  if m0 > a[67] then
    return target >= 0
  end
  local r = target - ctr3_after(j, m0)
  local o = 63 + 3 * (m0 - a[67])
  local c = a[o]
  if c == 0 then
    return r >= 0
  elseif c - cb[j] > r then
    return false
  elseif c <= r then
    return true
  end
  local f, l = m0 * bw + a[o + 1], m0 * bw + a[o + 2]
  if st >= l then
    return r >= 0
  elseif st < f then
    return false
  end
  return (c - 2) * (l - st) <= (r - 1) * (l - f)
end

-- ctr3_count is window j's estimate at t rounded up.
local function ctr3_count(j, t)
  local a, bw, st = ca[j], cbw[j], t - cwl[j]
  local m0 = (st - st % bw) / bw
  if m0 > a[67] then
    return 0
  end
  local o = 63 + 3 * (m0 - a[67])
  local c = a[o]
  local part = 0
  if c > 0 then
    local f, l = m0 * bw + a[o + 1], m0 * bw + a[o + 2]
    if st >= l then
      part = 0
    elseif st < f then
      part = c
    else
      part = 1 + math.ceil((c - 2) * (l - st) / (l - f))
    end
    if c - cb[j] > part then
      part = c - cb[j]
    end
  end
  return ctr3_after(j, m0) + part
end

-- ctr3_until is the smallest whole d >= 0 with ctr3_le(j, base + d,
-- target), segment by segment (the oldest bucket m fixed in each).
local function ctr3_until(j, target, base)
  if ctr3_le(j, base, target) then
    return 0
  end
  local a, w, bw, b = ca[j], cwl[j], cbw[j], cb[j]
  local k = a[67]
  local m = (base - w - (base - w) % bw) / bw
  local after = ctr3_after(j, m)
  while m <= k do
    local lo = m * bw
    if base - w > lo then
      lo = base - w
    end
    local r = target - after
    local o = 63 + 3 * (m - k)
    local c = a[o]
    if r >= 0 and c - b <= r then
      local at = lo
      if c > r then
        local f, l = m * bw + a[o + 1], m * bw + a[o + 2]
        local y = l
        if r >= 1 and l > f then
          y = f
          if c > 2 then
            y = l - math.floor((r - 1) * (l - f) / (c - 2))
            if y < f then
              y = f
            end
          end
        end
        if y > at then
          at = y
        end
      end
      return at + w - base
    end
    m = m + 1
    if m <= k then
      after = after - a[63 + 3 * (m - k)]
    end
  end
  local at = (k + 1) * bw
  if base - w > at then
    at = base - w
  end
  return at + w - base
end

-- ctr3_put adds units at time t to window j's bucket of t, if it is one of
-- (K - CTR3_R, K].
local function ctr3_put(j, units, t)
  local a, bw = ca[j], cbw[j]
  local m = (t - t % bw) / bw
  if units <= 0 or m <= a[67] - CTR3_R or m > a[67] then
    return
  end
  local o, x = 63 + 3 * (m - a[67]), t - m * bw
  if a[o] == 0 then
    a[o + 1], a[o + 2] = x, x
  else
    if x < a[o + 1] then
      a[o + 1] = x
    end
    if x > a[o + 2] then
      a[o + 2] = x
    end
  end
  a[o] = a[o] + units
  a[66] = a[66] + units
end

-- Format 4 (kind 2 writes it; the header above). The field is a binary
-- string of fixed-width numbers, each a whole number in bytes, the most
-- significant first (string.byte and string.char read and write them in
-- Redis's Lua and in miniredis's alike, and neither formats nor parses a
-- decimal):
--   "[3,#4", W (one byte), K (7 bytes), T (7 bytes), then 21 slots of 3 W
--   bytes: slot i = m % 21 holds bucket m of (K - 21, K]: c, f - m bw,
--   l - m bw.
-- C4H is the header's length: slot i begins after byte C4H + 3 W i.
local C4H = 20
-- (A library's body cannot read the global string when it loads: c4_init
-- sets them on a call's first use.)
-- C4PRE[W] is a field's first 6 bytes for width W.
local schar, sbyte, ssub, mceil, srep = false, false, false, false, false
local C4PRE = {}
local function c4_init()
  schar, sbyte, ssub, mceil, srep = string.char, string.byte, string.sub, math.ceil, string.rep
  for wd = 1, 7 do
    C4PRE[wd] = "[3,#4" .. schar(wd)
  end
end

-- b_put is x (a whole number, 0 <= x < 256^w, w 1..7) in w bytes.
local function b_put(x, w)
  local b1 = x % 256
  if w == 1 then
    return schar(b1)
  end
  x = (x - b1) / 256
  local b2 = x % 256
  if w == 2 then
    return schar(b2, b1)
  end
  x = (x - b2) / 256
  local b3 = x % 256
  if w == 3 then
    return schar(b3, b2, b1)
  end
  x = (x - b3) / 256
  local b4 = x % 256
  if w == 4 then
    return schar(b4, b3, b2, b1)
  end
  x = (x - b4) / 256
  local b5 = x % 256
  if w == 5 then
    return schar(b5, b4, b3, b2, b1)
  end
  x = (x - b5) / 256
  local b6 = x % 256
  if w == 6 then
    return schar(b6, b5, b4, b3, b2, b1)
  end
  return schar((x - b6) / 256, b6, b5, b4, b3, b2, b1)
end

-- b_get is the number in bytes p + 1 .. p + w of v (w 1..7).
local function b_get(v, p, w)
  local a, b, c, d, e, f, g = sbyte(v, p + 1, p + w)
  if w == 1 then
    return a
  end
  a = a * 256 + b
  if w == 2 then
    return a
  end
  a = a * 256 + c
  if w == 3 then
    return a
  end
  a = a * 256 + d
  if w == 4 then
    return a
  end
  a = a * 256 + e
  if w == 5 then
    return a
  end
  a = a * 256 + f
  if w == 6 then
    return a
  end
  return a * 256 + g
end

-- ctr4_width is the slots' width in bytes for a window of buckets bw µs
-- long and limit whose largest value is most: room for the largest of
-- them, bw - 1 and limit + ceil(limit / 20) (the values a bucket reaches,
-- so that a write in place rarely finds a value too wide).
local function ctr4_width(most, bw, limit)
  local x = limit + math.ceil(limit / CTR3_N)
  if bw - 1 > x then
    x = bw - 1
  end
  if most > x then
    x = most
  end
  local wd = 1
  while x >= 256 and wd < 7 do
    x = (x - x % 256) / 256
    wd = wd + 1
  end
  return wd
end

-- ctr4_decode is a field in format 4 as format 3's array (ctr3_decode's).
ctr4_decode = function(v)
  if not sbyte then
    c4_init()
  end
  local wd, k = sbyte(v, 6), b_get(v, 6, 7)
  local a = {3, 0}
  for q = 0, CTR3_N do
    local p = C4H + ((k - CTR3_N + q) % CTR3_R) * 3 * wd
    local o = 3 + 3 * q
    a[o], a[o + 1], a[o + 2] = b_get(v, p, wd), b_get(v, p + wd, wd), b_get(v, p + 2 * wd, wd)
  end
  a[66], a[67] = b_get(v, 13, 7), k
  return a
end

-- ctr4_encode is format 3's array a (buckets bw µs long, a window of
-- limit) as a field in format 4, whole. (a may be the fast path's lazy
-- array: it is read by index.)
ctr4_encode = function(a, bw, limit)
  if not schar then
    c4_init()
  end
  local most, k = 0, a[67]
  for o = 3, 65 do
    if a[o] > most then
      most = a[o]
    end
  end
  local wd = ctr4_width(most, bw, limit)
  -- Slot i holds bucket m = K - 20 + q with m % 21 = i.
  local q0 = (CTR3_N - k % CTR3_R) % CTR3_R -- the q of slot 0
  local s = {"[3,#4", schar(wd), b_put(k, 7), b_put(a[66], 7)}
  for i = 0, CTR3_N do
    local o = 3 + 3 * ((q0 + i) % CTR3_R)
    s[3 * i + 5], s[3 * i + 6], s[3 * i + 7] = b_put(a[o], wd), b_put(a[o + 1], wd), b_put(a[o + 2], wd)
  end
  return table.concat(s)
end

-- ctr3_from fills window j's buckets (decided at s2[j]) from a key in
-- format 2 or 1 (f, its hash): each stored bucket's or fixed window's units
-- go to the latest time they can have been admitted (its last µs, or the
-- time decided at if sooner), so that each counts at least as long as it
-- can be in the window.
local function ctr3_from(j, f)
  local l, ls, t = wlen[j], wname[j], s2[j]
  local v = f[ls .. "w"]
  if v == "#2" then
    local k = tonumber(f[ls .. "k"])
    if k then
      local bw = math.ceil(l / CTR_N)
      for m = k - CTR_R + 1, k do
        local last = (m + 1) * bw - 1
        if last > t then
          last = t
        end
        ctr3_put(j, tonumber(f[ls .. "." .. (m % CTR_R)]) or 0, last)
      end
    end
    return
  end
  local sw = tonumber(v)
  if sw then
    local last = (sw + 1) * l - 1
    if last > t then
      last = t
    end
    if last < sw * l then
      last = sw * l
    end
    ctr3_put(j, tonumber(f[ls .. "c"]) or 0, last)
    ctr3_put(j, tonumber(f[ls .. "p"]) or 0, sw * l - 1)
  end
end

-- ctr3_check fills windows j0..j1 in format 3 from their fields v (one per
-- window), f (the whole hash, or false).
local function ctr3_check(v, f, j0, j1, now, cost, want)
  local fits = true
  local carried = false
  for j = j0, j1 do
    local w, limit = wlen[j], wlim[j]
    local bw = math.ceil(w / CTR3_N)
    cbw[j], cb[j], cfmt[j], cwl[j], cenc[j] = bw, math.ceil(limit / CTR3_N), 3, w, want
    local k = math.floor(now / bw)
    local base = now
    local a, enc = ctr3_decode(v[j - j0 + 1])
    if a then
      local sk = a[67]
      -- (a field read in format 4 is written whole: cnew is format 3's)
      cK[j], cv[j], cnew[j] = sk, v[j - j0 + 1], enc == 3
      if sk > k then
        k = sk
        base = k * bw
      elseif k > sk then
        -- The buckets move down by d; those of sk + 1 .. k start empty.
        local d = 3 * (k - sk)
        for o = 3, 62 + 3, 3 do
          if o < 3 + d then
            a[66] = a[66] - a[o]
          end
          if o + d <= 63 then
            a[o], a[o + 1], a[o + 2] = a[o + d], a[o + d + 1], a[o + d + 2]
          else
            a[o], a[o + 1], a[o + 2] = 0, 0, 0
          end
        end
        a[67], cnew[j] = k, false
      end
      ca[j] = a
      s1[j], s2[j] = k, base
    else
      cK[j], cnew[j] = false, false
      a = {3, 0}
      for o = 3, 65 do
        a[o] = 0
      end
      a[66], a[67] = 0, k
      ca[j] = a
      s1[j], s2[j] = k, base
      if f and f[wname[j] .. "w"] then
        ctr3_from(j, f)
      else
        if carried == false then
          carried = ctr_carry(f, now, j0, j1)
        end
        ctr3_put(j, carried, base)
      end
    end
    local count = ctr3_count(j, base)
    local retry = 0
    if cost > limit then
      retry = w
    elseif not ctr3_le(j, base, limit - cost) then
      retry = ctr3_until(j, limit - cost, base) + (base - now)
    end
    if retry > 0 then
      fits = false
    end
    cnt[j], rty[j] = count, retry
  end
  return fits
end

-- ctr3_record adds cost to windows j0..j1 and queues their fields (each
-- window's whole); it returns the TTL in ms when it is to be set, else 0.
local function ctr3_record(j0, j1, cost, stale)
  if not FMT3 then
    if not INT then
      formats()
    end
    FMT3 = {"[3,%6" .. string.sub(INT, 2) .. ",", string.rep(INT .. ",", 3 * CTR3_R - 3),
      INT .. "," .. INT .. "," .. INT .. "," .. INT .. "," .. INT .. "]"}
  end
  local ttl, start = 0, stale
  for j = j0, j1 do
    local w, bw = wlen[j], cbw[j]
    if cost > 0 then
      ctr3_put(j, cost, s2[j])
    end
    cnt[j] = cnt[j] + cost
    if not cK[j] or s1[j] > cK[j] then
      start = true
    end
    -- Bucket K's units, first, last, then T and K end the field: when
    -- nothing else changed, the field as read is kept up to them.
    local a = ca[j]
    local field
    if cenc[j] == 4 then
      field = ctr4_encode(a, bw, wlim[j])
    elseif cnew[j] and not stale then
      local tail = string.format(FMT3[3], a[63], a[64], a[65], a[66], a[67])
      field = string.sub(cv[j], 1, a[2] - 1) .. tail
    else
      local tail = string.format(FMT3[3], a[63], a[64], a[65], a[66], a[67])
      local mid = string.format(FMT3[2], unpack(a, 3, 62))
      field = string.format(FMT3[1], 11 + #mid) .. mid .. tail
    end
    hf[hn + 1], hf[hn + 2] = wname[j] .. "w", field
    hn = hn + 2
    local t = math.ceil((w + bw) / 1000) + 1000
    if t > ttl then
      ttl = t
    end
  end
  if start then
    return ttl
  end
  return 0
end

-- ctr3_reset fills the windows' resets: the first µs at which the count
-- (after any write) has dropped by one.
local function ctr3_reset(j0, j1, now)
  for j = j0, j1 do
    local base = s2[j]
    local n = ctr3_count(j, base)
    local reset = 0
    if n > 0 then
      reset = ctr3_until(j, n - 1, base) + (base - now)
    end
    rst[j] = reset
  end
end

-- ctr_part reads and checks a counter part's windows j0..j1 in format want
-- (1 or 2); it reports whether the cost fits and whether the hash must be
-- written whole (it holds the other format, or windows a reload replaced).
function ctr_part(key, j0, j1, now, cost, want)
  local n = 0
  for j = j0, j1 do
    local fs = ctr_fields(wname[j])
    if want >= 3 then
      n = n + 1
      flist[n] = fs[2]
    elseif want == 2 then
      n = n + 1
      flist[n] = fs[1]
      for i = 3, CTR_R + 2 do
        n = n + 1
        flist[n] = fs[i]
      end
    else
      flist[n + 1], flist[n + 2], flist[n + 3] = fs[2], fs[CTR_R + 3], fs[CTR_R + 4]
      n = n + 3
    end
  end
  local v = redis.call("HMGET", key, unpack(flist, 1, n))
  local f, stale = false, false
  if want >= 3 then
    for i = 1, n do
      if not v[i] or string.sub(v[i], 1, 3) ~= "[3," then
        f = ctr_map(key)
        stale = ctr_stale(f, j0, j1, 3)
        break
      end
    end
    return ctr3_check(v, f, j0, j1, now, cost, want), stale
  end
  local per = 3
  if want == 2 then
    per = CTR_R + 1
  end
  for i = 1, n, per do
    if not v[i] or (want == 1 and (v[i] == "#2" or string.sub(v[i], 1, 1) == "[")) then
      f = ctr_map(key)
      stale = ctr_stale(f, j0, j1, want)
      break
    end
  end
  if want == 2 then
    return ctr_check2(v, f, j0, j1, now, cost), stale
  end
  for j = j0, j1 do
    cfmt[j] = 1
    local o = (j - j0) * 3
    local a = ctr3_decode(v[o + 1])
    if a then
      v[o + 1], v[o + 2], v[o + 3] = ctr3_to1(j, a, now)
    elseif v[o + 1] == "#2" then
      v[o + 1], v[o + 2], v[o + 3] = ctr_to1(j, f, now)
    end
  end
  return ctr1_check(v, f, j0, j1, now, cost), stale
end

-- ctr_record adds cost to windows j0..j1 and queues their fields; it
-- returns the TTL in ms when the key's TTL is to be set, else 0.
function ctr_record(j0, j1, cost, stale)
  if cfmt[j0] == 3 then
    return ctr3_record(j0, j1, cost, stale)
  elseif cfmt[j0] == 1 then
    return ctr1_record(j0, j1, cost)
  end
  local ttl, start = 0, false
  for j = j0, j1 do
    local w, bw, k, ring = wlen[j], cbw[j], s1[j], cring[j]
    local fs = ctr_fields(wname[j])
    local slot = k % CTR_R
    ring[slot] = ring[slot] + cost
    ctot[j] = ctot[j] + cost -- (bucket k is the last of the prefix sums)
    cpre[j][CTR_R] = ctot[j]
    cnt[j] = cnt[j] + cost
    local sk = cK[j]
    if stale or not sk then
      hf[hn + 1], hf[hn + 2] = fs[2], "#2"
      hn = hn + 2
      hset(fs[1], k)
      for i = 0, CTR_R - 1 do
        if ring[i] ~= 0 then
          hset(fs[i + 3], ring[i])
        end
      end
      start = true
    elseif k > sk then
      hset(fs[1], k)
      local m = sk + 1
      if m < k - CTR_R + 1 then
        m = k - CTR_R + 1
      end
      for x = m, k do
        hset(fs[x % CTR_R + 3], ring[x % CTR_R])
      end
      start = true
    else
      hset(fs[slot + 3], ring[slot])
    end
    local t = math.ceil((w + bw) / 1000) + 1000
    if t > ttl then
      ttl = t
    end
  end
  if start then
    return ttl
  end
  return 0
end

-- ctr_reset fills the windows' resets from their state (after any write).
function ctr_reset(j0, j1, now)
  if cfmt[j0] == 3 then
    return ctr3_reset(j0, j1, now)
  elseif cfmt[j0] == 1 then
    return ctr1_reset(j0, j1, now)
  end
  for j = j0, j1 do
    local base = s2[j]
    local estb = ctr_bestb(j, base)
    local reset = 0
    if estb > 0 then
      local target = estb - cbw[j]
      if target < 0 then
        target = 0
      end
      reset = ctr_buntil(j, target, base, estb) + (base - now)
    end
    rst[j] = reset
  end
end

-- The fast path (decide.lua's FAST) of a check of one window in format 4,
-- mode 0: ctr3_check, ctr3_record and ctr3_reset for that case, with the
-- reply's short form, on format 3's arithmetic over a lazy array: an index
-- of the array that is read is read from the field then (C4LAZY), so a
-- check reads the header and the few slots it looks at. The buckets that
-- K's move drops are subtracted from T as format 3's shift does; the
-- buckets after the stored K read 0. A key whose window has no field in
-- format 4 while it holds anything (another format, or a reload's other
-- windows) goes to decide.
local c4v, c4k, c4sk, c4w = "", 0, 0, 1

-- c4_slot is the c, f, l of the slot after byte p of v (width w).
local function c4_slot(v, p, w)
  if w == 3 then
    local a1, a2, a3, b1, b2, b3, c1, c2, c3 = sbyte(v, p + 1, p + 9)
    return (a1 * 256 + a2) * 256 + a3, (b1 * 256 + b2) * 256 + b3, (c1 * 256 + c2) * 256 + c3
  elseif w == 4 then
    local a1, a2, a3, a4, b1, b2, b3, b4, c1, c2, c3, c4 = sbyte(v, p + 1, p + 12)
    return ((a1 * 256 + a2) * 256 + a3) * 256 + a4, ((b1 * 256 + b2) * 256 + b3) * 256 + b4,
      ((c1 * 256 + c2) * 256 + c3) * 256 + c4
  end
  return b_get(v, p, w), b_get(v, p + w, w), b_get(v, p + 2 * w, w)
end

-- c4_two is c4_slot of the slot after byte p of v (width w) and of the
-- next one, by one string.byte.
local function c4_two(v, p, w)
  if w == 3 then
    local a1, a2, a3, b1, b2, b3, c1, c2, c3, d1, d2, d3, e1, e2, e3, g1, g2, g3 = sbyte(v, p + 1, p + 18)
    return (a1 * 256 + a2) * 256 + a3, (b1 * 256 + b2) * 256 + b3, (c1 * 256 + c2) * 256 + c3,
      (d1 * 256 + d2) * 256 + d3, (e1 * 256 + e2) * 256 + e3, (g1 * 256 + g2) * 256 + g3
  elseif w == 4 then
    -- (a window over 5.6 minutes, or a limit over 16M: bucket µs or units past 3 bytes)
    local a1, a2, a3, a4, b1, b2, b3, b4, c1, c2, c3, c4, d1, d2, d3, d4, e1, e2, e3, e4, g1, g2, g3, g4 =
      sbyte(v, p + 1, p + 24)
    return ((a1 * 256 + a2) * 256 + a3) * 256 + a4, ((b1 * 256 + b2) * 256 + b3) * 256 + b4,
      ((c1 * 256 + c2) * 256 + c3) * 256 + c4, ((d1 * 256 + d2) * 256 + d3) * 256 + d4,
      ((e1 * 256 + e2) * 256 + e3) * 256 + e4, ((g1 * 256 + g2) * 256 + g3) * 256 + g4
  elseif w == 2 then
    local a1, a2, b1, b2, c1, c2, d1, d2, e1, e2, g1, g2 = sbyte(v, p + 1, p + 12)
    return a1 * 256 + a2, b1 * 256 + b2, c1 * 256 + c2, d1 * 256 + d2, e1 * 256 + e2, g1 * 256 + g2
  end
  local c, f, l = c4_slot(v, p, w)
  local c1, f1, l1 = c4_slot(v, p + 3 * w, w)
  return c, f, l, c1, f1, l1
end

-- c4_slotput is c, f, l as a slot of width w.
local function c4_slotput(c, f, l, w)
  if w == 3 then
    local c3, f3, l3 = c % 256, f % 256, l % 256
    c, f, l = (c - c3) / 256, (f - f3) / 256, (l - l3) / 256
    local c2, f2, l2 = c % 256, f % 256, l % 256
    return schar((c - c2) / 256, c2, c3, (f - f2) / 256, f2, f3, (l - l2) / 256, l2, l3)
  elseif w == 4 then
    local c4, f4, l4 = c % 256, f % 256, l % 256
    c, f, l = (c - c4) / 256, (f - f4) / 256, (l - l4) / 256
    local c3, f3, l3 = c % 256, f % 256, l % 256
    c, f, l = (c - c3) / 256, (f - f3) / 256, (l - l3) / 256
    local c2, f2, l2 = c % 256, f % 256, l % 256
    return schar((c - c2) / 256, c2, c3, c4, (f - f2) / 256, f2, f3, f4, (l - l2) / 256, l2, l3, l4)
  end
  return b_put(c, w) .. b_put(f, w) .. b_put(l, w)
end

-- c4_get is the c, f, l of bucket m of the field being checked.
local function c4_get(m)
  if m > c4sk then
    return 0, 0, 0
  end
  return c4_slot(c4v, C4H + (m % CTR3_R) * 3 * c4w, c4w)
end

-- c4_next is the first bucket m' of m .. k whose units are not 0 in field s
-- (width wd; the buckets after top read 0) and its c, f, l, or k + 1: one
-- string.find of the run of zero bytes over the slots in the ring's order
-- (an empty bucket's slot is all zero bytes; the slot of the first byte
-- that is not is read to be sure of its units).
local function c4_next(s, top, wd, m, k)
  local e = k
  if e > top then
    e = top
  end
  local sw = 3 * wd
  while m <= e do
    local i = m % CTR3_R
    local last = i + (e - m)
    if last > CTR3_N then
      last = CTR3_N
    end
    local _, q = string.find(s, "^%z*", C4H + i * sw + 1)
    if q < C4H + (last + 1) * sw then
      local x = q - C4H
      local j = (x - x % sw) / sw
      local c, f, l = c4_slot(s, C4H + j * sw, wd)
      if c > 0 then
        return m + (j - i), c, f, l
      end
      m = m + (j - i) + 1
    else
      m = m + (last - i) + 1
    end
  end
  return k + 1
end

-- c4_walk goes on with ctr3_until's search from bucket m (after the oldest
-- bucket of the window, which did not end it) in field s (width wd; the
-- buckets after top read 0), after being the units of the buckets after
-- m - 1, k the newest bucket, st the window's start: the same steps on the
-- same numbers, with the empty buckets that cannot end the search (r < 0:
-- they leave r as it is) skipped by c4_next. It returns the µs the search
-- ends at (ctr3_until's at).
local function c4_walk(s, top, wd, k, m, after, target, st, bw, b)
  local sw = 3 * wd
  local r = target - after
  while m <= k do
    local c, f, l = 0, 0, 0
    if r < 0 then
      m, c, f, l = c4_next(s, top, wd, m, k)
      if m > k then
        break
      end
    elseif m <= top then
      c, f, l = c4_slot(s, C4H + (m % CTR3_R) * sw, wd)
    end
    after = after - c
    r = target - after
    if r >= 0 and c - b <= r then
      local at = m * bw
      if st > at then
        at = st
      end
      if c > r then
        f, l = m * bw + f, m * bw + l
        local y = l
        if r >= 1 and l > f then
          y = f
          if c > 2 then
            y = l - math.floor((r - 1) * (l - f) / (c - 2))
            if y < f then
              y = f
            end
          end
        end
        if y > at then
          at = y
        end
      end
      return at
    end
    m = m + 1
  end
  local at = (k + 1) * bw
  if st > at then
    at = st
  end
  return at
end

-- c4_until is ctr3_until(1, target, base) with the buckets past the
-- window's oldest read from field s (width wd; those after top read 0)
-- rather than from ca[1], by c4_walk.
local function c4_until(s, top, wd, target, base)
  if ctr3_le(1, base, target) then
    return 0
  end
  local a, w, bw, b = ca[1], cwl[1], cbw[1], cb[1]
  local k = a[67]
  local st = base - w
  local m = (st - st % bw) / bw
  local after = ctr3_after(1, m)
  local r = target - after
  local o = 63 + 3 * (m - k)
  local c = a[o]
  if r >= 0 and c - b <= r then
    local at = m * bw
    if st > at then
      at = st
    end
    if c > r then
      local f, l = m * bw + a[o + 1], m * bw + a[o + 2]
      local y = l
      if r >= 1 and l > f then
        y = f
        if c > 2 then
          y = l - math.floor((r - 1) * (l - f) / (c - 2))
          if y < f then
            y = f
          end
        end
      end
      if y > at then
        at = y
      end
    end
    return at + w - base
  end
  return c4_walk(s, top, wd, k, m + 1, after, target, st, bw, b) + w - base
end

-- The lazy array holds the oldest two buckets, K's, T and K; the first
-- index read of another bucket reads them all.
local C4LAZY = {__index = function(a, o)
  for q = 2, CTR3_N - 1 do
    local x = 3 + 3 * q
    a[x], a[x + 1], a[x + 2] = c4_get(c4k - CTR3_N + q)
  end
  return rawget(a, o)
end}
local C4TOP = {256, 65536, 16777216, 4294967296, 1099511627776, 281474976710656, 72057594037927936}

-- ctr4_lazy is the fast path of a window whose length is not 20 buckets
-- exactly (the window may start in either of its two oldest buckets), on
-- the lazy array and format 3's functions.
local function ctr4_lazy(k, V, now)
  local key, cost, w, limit = KEYS[k], V[2], V[11], V[12]
  local fw, bw = V.fw, V.cbw
  local v = rcall("HMGET", key, fw)[1] -- (HMGET, HGETALL: the commands docs/redis.md's ACL grants)
  local kk = (now - now % bw) / bw -- math.floor(now / bw)
  local base, sk, wd, tot = now, false, 1, 0
  if v then
    local h1, h2, h3, h4, h5, h6, h7, h8
    h1, wd, h2, h3, h4, h5, h6, h7, h8 = sbyte(v, 5, 13)
    if h1 ~= 52 or ssub(v, 1, 4) ~= "[3,#" then -- "4"
      return nil
    end
    sk = (((((h2 * 256 + h3) * 256 + h4) * 256 + h5) * 256 + h6) * 256 + h7) * 256 + h8
    tot = b_get(v, 13, 7)
    if sk > kk then
      kk, base = sk, sk * bw
    elseif kk > sk then
      -- Buckets sk - 20 .. kk - 21 leave (at most all 21).
      local last = kk - CTR3_R
      if last > sk then
        last = sk
      end
      for m = sk - CTR3_N, last do
        tot = tot - b_get(v, C4H + (m % CTR3_R) * 3 * wd, wd)
      end
    end
    c4sk = sk
  elseif #rcall("HGETALL", key) > 0 then
    return nil
  else
    c4sk = kk - CTR3_R -- every bucket reads 0
  end
  c4v, c4k, c4w = v, kk, wd
  local c0, f0, l0 = c4_get(kk - CTR3_N)
  local c1, f1, l1 = c4_get(kk - CTR3_N + 1)
  local c, f, l = c4_get(kk)
  local ar = setmetatable({[3] = c0, [4] = f0, [5] = l0, [6] = c1, [7] = f1, [8] = l1, [63] = c, [64] = f, [65] = l,
    [66] = tot, [67] = kk}, C4LAZY)
  ca[1], cbw[1], cb[1], cwl[1] = ar, bw, V.cb, w
  local count = ctr3_count(1, base)
  local retry = 0
  if cost > limit then
    retry = w
  elseif not ctr3_le(1, base, limit - cost) then
    retry = ctr3_until(1, limit - cost, base) + (base - now)
  end
  if retry > 0 then
    local reset = 0
    if count > 0 then
      if v then
        reset = c4_until(v, c4sk, wd, count - 1, base) + (base - now)
      else
        reset = ctr3_until(1, count - 1, base) + (base - now)
      end
    end
    return {0, count, retry, reset}
  end
  if cost > 0 then
    ctr3_put(1, cost, base)
  end
  -- Bucket K's slot and the header's K and T in place when K moved by one
  -- at most and its values fit the width; else the field whole.
  c, f, l = ar[63], ar[64], ar[65]
  local field
  if sk and kk - sk <= 1 and c < C4TOP[wd] and l < C4TOP[wd] then
    local p = C4H + (kk % CTR3_R) * 3 * wd
    if kk == sk then
      field = ssub(v, 1, 13) .. b_put(ar[66], 7) .. ssub(v, C4H + 1, p) .. c4_slotput(c, f, l, wd) ..
        ssub(v, p + 3 * wd + 1)
    else
      field = ssub(v, 1, 6) .. b_put(kk, 7) .. b_put(ar[66], 7) .. ssub(v, C4H + 1, p) .. c4_slotput(c, f, l, wd) ..
        ssub(v, p + 3 * wd + 1)
    end
  else
    field = ctr4_encode(ar, bw, limit)
  end
  rcall("HSET", key, fw, field)
  if not sk or kk > sk then
    rcall("PEXPIRE", key, V.cttl)
  end
  local n = ctr3_count(1, base)
  local reset = 0
  if n > 0 then
    reset = c4_until(field, kk, sbyte(field, 6), n - 1, base) + (base - now)
  end
  return {1, count + cost, 0, reset}
end

-- c4_le is ctr3_le(1, base, target) in a window of 20 buckets exactly
-- (it starts at st in bucket K - 20, holding c0 units first and last
-- admitted at F0 and L0), r being target less the units of the buckets
-- after K - 20.
local function c4_le(r, c0, F0, L0, st, b)
  if c0 == 0 then
    return r >= 0
  elseif c0 - b > r then
    return false
  elseif c0 <= r then
    return true
  end
  if st >= L0 then
    return r >= 0
  elseif st < F0 then
    return false
  end
  return (c0 - 2) * (L0 - st) <= (r - 1) * (L0 - F0)
end

-- c4_at is ctr3_until's at (the window's start at which its estimate is at
-- most target, not yet at st) in such a window: bucket K - 20's segment
-- from its values, the others by c4_walk on field s.
local function c4_at(s, top, wd, k, target, after, c0, F0, L0, st, bw, b)
  local r = target - after
  if r >= 0 and c0 - b <= r then
    local at = st
    if c0 > r then
      local y = L0
      if r >= 1 and L0 > F0 then
        y = F0
        if c0 > 2 then
          y = L0 - math.floor((r - 1) * (L0 - F0) / (c0 - 2))
          if y < F0 then
            y = F0
          end
        end
      end
      if y > at then
        at = y
      end
    end
    return at
  end
  return c4_walk(s, top, wd, k, k - CTR3_N + 1, after, target, st, bw, b)
end

-- ctr4_fast is the fast path. In a window of 20 buckets exactly (its
-- length a multiple of 20 µs: every window of whole ms) the window at base
-- starts in bucket K - 20, so that a check needs the header, that bucket's
-- slot and K's: it reads them by two or three string.byte, decides on
-- format 3's arithmetic for that case (c4_le, c4_at: the same operations
-- on the same numbers as ctr3_count, ctr3_le, ctr3_until and ctr3_put),
-- writes the header's K and T by one string.char beside K's slot, and
-- appends its reply flat (decide.lua's OUT). Any other window goes by
-- ctr4_lazy.
local function ctr4_fast(a, k, V)
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
  local fw = V.fw
  if not fw then
    if not sbyte then
      c4_init()
    end
    local w, limit = V[11], V[12]
    local bw = math.ceil(w / CTR3_N)
    fw = V[10] .. "w"
    V.fw, V.cbw, V.cb, V.cttl = fw, bw, math.ceil(limit / CTR3_N), sfmt(INT, math.ceil((w + bw) / 1000) + 1000)
    V.ceven = CTR3_N * bw == w
  end
  if not V.ceven then
    return ctr4_lazy(k, V, now)
  end
  local key, cost, w, limit, bw, b = KEYS[k], V[2], V[11], V[12], V.cbw, V.cb
  local v = rcall("HMGET", key, fw)[1] -- (HMGET, HGETALL: the commands docs/redis.md's ACL grants)
  local kk = (now - now % bw) / bw -- math.floor(now / bw)
  local base, sk, wd, tot = now, false, 1, 0
  local k1, k2, k3, k4, k5, k6, k7 = 0, 0, 0, 0, 0, 0, 0 -- the header's K as read
  local c0, f0, l0, c, f, l = 0, 0, 0, 0, 0, 0
  if v then
    local x1, x2, x3, x4, x5, t1, t2, t3, t4, t5, t6, t7
    x1, x2, x3, x4, x5, wd, k1, k2, k3, k4, k5, k6, k7, t1, t2, t3, t4, t5, t6, t7 = sbyte(v, 1, C4H)
    if x5 ~= 52 or x4 ~= 35 or x3 ~= 44 or x2 ~= 51 or x1 ~= 91 then -- "[3,#4"
      return nil
    end
    sk = (((((k1 * 256 + k2) * 256 + k3) * 256 + k4) * 256 + k5) * 256 + k6) * 256 + k7
    tot = (((((t1 * 256 + t2) * 256 + t3) * 256 + t4) * 256 + t5) * 256 + t6) * 256 + t7
    local sw = 3 * wd
    if sk > kk then
      kk, base = sk, sk * bw
    end
    if kk - sk <= 1 then
      -- Slot K % 21 holds bucket K (K the stored one) or the one that
      -- leaves (K one past it); the next slot in the ring, bucket K - 20.
      local i, x, y, z = kk % CTR3_R, 0, 0, 0
      if i < CTR3_N then
        x, y, z, c0, f0, l0 = c4_two(v, C4H + i * sw, wd)
      else
        x, y, z = c4_slot(v, C4H + i * sw, wd)
        c0, f0, l0 = c4_slot(v, C4H, wd)
      end
      if kk == sk then
        c, f, l = x, y, z
      else
        tot = tot - x
      end
    else
      -- Buckets sk - 20 .. kk - 21 leave (at most all 21).
      local last = kk - CTR3_R
      if last > sk then
        last = sk
      end
      for m = sk - CTR3_N, last do
        tot = tot - b_get(v, C4H + (m % CTR3_R) * sw, wd)
      end
      if kk - CTR3_N <= sk then
        c0, f0, l0 = c4_slot(v, C4H + ((kk - CTR3_N) % CTR3_R) * sw, wd)
      end
    end
  elseif #rcall("HGETALL", key) > 0 then
    return nil
  end
  local st = base - w
  local ob = (kk - CTR3_N) * bw
  local F0, L0 = ob + f0, ob + l0
  local after = tot - c0
  -- ctr3_count's part of bucket K - 20
  local part = 0
  if c0 > 0 then
    if st >= L0 then
      part = 0
    elseif st < F0 then
      part = c0
    else
      part = 1 + mceil((c0 - 2) * (L0 - st) / (L0 - F0))
    end
    if c0 - b > part then
      part = c0 - b
    end
  end
  local count = after + part
  local retry = 0
  if cost > limit then
    retry = w
  elseif not c4_le(limit - cost - after, c0, F0, L0, st, b) then
    retry = c4_at(v, sk or kk - CTR3_R, wd, kk, limit - cost, after, c0, F0, L0, st, bw, b) + w - now
  end
  local o = ON
  if retry > 0 then
    local reset = 0
    if count > 0 then
      reset = base - now
      if not c4_le(count - 1 - after, c0, F0, L0, st, b) then
        reset = c4_at(v, sk or kk - CTR3_R, wd, kk, count - 1, after, c0, F0, L0, st, bw, b) + w - now
      end
    end
    OUT[o + 1], OUT[o + 2], OUT[o + 3], OUT[o + 4] = 32, count, retry, reset -- 8 × 4 + status 0
    ON = o + 4
    return true
  end
  if cost > 0 then
    -- ctr3_put: bucket K (base's)
    local x = base - kk * bw
    if c == 0 then
      f, l = x, x
    else
      if x < f then
        f = x
      end
      if x > l then
        l = x
      end
    end
    c, tot, after = c + cost, tot + cost, after + cost
  end
  -- Bucket K's slot and the header's K and T in place when K moved by one
  -- at most and its values fit the width; else the field whole.
  local field
  local most = C4TOP[wd]
  -- alone: a new key, or one whose buckets have all left (K moved by
  -- CTR3_R or more): bucket K's units are the key's only ones.
  local alone = not sk or kk - sk >= CTR3_R
  if sk and kk - sk <= 1 and c < most and l < most then
    local sw = 3 * wd
    local p = C4H + (kk % CTR3_R) * sw
    if kk > sk then
      local x = kk
      k7 = x % 256
      x = (x - k7) / 256
      k6 = x % 256
      x = (x - k6) / 256
      k5 = x % 256
      x = (x - k5) / 256
      k4 = x % 256
      x = (x - k4) / 256
      k3 = x % 256
      x = (x - k3) / 256
      k2 = x % 256
      k1 = (x - k2) / 256
    end
    local x = tot
    local u7 = x % 256
    x = (x - u7) / 256
    local u6 = x % 256
    x = (x - u6) / 256
    local u5 = x % 256
    x = (x - u5) / 256
    local u4 = x % 256
    x = (x - u4) / 256
    local u3 = x % 256
    x = (x - u3) / 256
    local u2 = x % 256
    field = C4PRE[wd] .. schar(k1, k2, k3, k4, k5, k6, k7, (x - u2) / 256, u2, u3, u4, u5, u6, u7) ..
      ssub(v, C4H + 1, p) .. c4_slotput(c, f, l, wd) .. ssub(v, p + sw + 1)
  elseif not sk or (c < most and l < most) then
    -- A new key, or K moved by two or more (a key seen again after a
    -- bucket or more without a check: most checks of a key seen a few
    -- times): bucket K is new (its slot c, f, l) and the buckets between
    -- the stored K and it are empty (their slots zero bytes, as
    -- ctr4_encode writes an empty bucket); the others are kept as read, in
    -- the width as read (a new key's: ctr4_width of its values, as
    -- ctr4_encode's). Not through the lazy array: ctr4_encode reads its 63
    -- values by a metamethod each.
    if not sk then
      local most = c
      if l > most then
        most = l
      end
      wd = ctr4_width(most, bw, limit)
    end
    local sw = 3 * wd
    local i1 = kk % CTR3_R
    local head = C4PRE[wd] .. b_put(kk, 7) .. b_put(tot, 7)
    local slot = c4_slotput(c, f, l, wd)
    if alone then
      field = head .. srep("\0", i1 * sw) .. slot .. srep("\0", (CTR3_N - i1) * sw)
    else
      local i0 = (sk + 1) % CTR3_R -- the slot of the first bucket after the stored K
      if i0 <= i1 then
        field = head .. ssub(v, C4H + 1, C4H + i0 * sw) .. srep("\0", (i1 - i0) * sw) .. slot ..
          ssub(v, C4H + (i1 + 1) * sw + 1)
      else
        field = head .. srep("\0", i1 * sw) .. slot .. ssub(v, C4H + (i1 + 1) * sw + 1, C4H + i0 * sw) ..
          srep("\0", (CTR3_R - i0) * sw)
      end
    end
  else
    c4v, c4k, c4w, c4sk = v, kk, wd, sk or kk - CTR3_R
    local c1, f1, l1 = c4_get(kk - CTR3_N + 1)
    local ar = setmetatable({[3] = c0, [4] = f0, [5] = l0, [6] = c1, [7] = f1, [8] = l1, [63] = c, [64] = f,
      [65] = l, [66] = tot, [67] = kk}, C4LAZY)
    field = ctr4_encode(ar, bw, limit)
    wd = sbyte(field, 6)
  end
  rcall("HSET", key, fw, field)
  if not sk or kk > sk then
    rcall("PEXPIRE", key, V.cttl)
  end
  local n = after + part
  local reset = 0
  if alone then
    -- A new key, or one whose buckets have all left, holds this check's
    -- units alone, admitted at now: its count drops when they leave the
    -- window, at now + w (c4_at's answer, without the walk over its empty
    -- buckets).
    if n > 0 then
      reset = w
    end
  elseif n > 0 then
    reset = base - now
    if not c4_le(n - 1 - after, c0, F0, L0, st, b) then
      reset = c4_at(field, kk, wd, kk, n - 1, after, c0, F0, L0, st, bw, b) + w - now
    end
  end
  if o == 0 and OUT ~= KEEP then
    -- The call's first reply in a table of its own (EVALSHA's fast
    -- script): made to size. run's KEEP is sized already (replacing it
    -- grew a new table at every power of two, as tb_fast's comment says).
    OUT = {33, count + cost, 0, reset} -- 8 × 4 + status 1
  else
    OUT[o + 1], OUT[o + 2], OUT[o + 3], OUT[o + 4] = 33, count + cost, 0, reset
  end
  ON = o + 4
  return true
end
FAST[2] = ctr4_fast
end -- of sliding_counter.lua's block
