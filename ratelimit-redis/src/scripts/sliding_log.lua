-- Sliding log (layout sl2). Mirrors ratelimit-core/src/model/sliding_log.rs.
-- Every call costs O(log n) in the number n of entries, plus the entries an
-- admission drops: no call reads or loops over the whole log.
--
-- KEYS[1]  the caller's key T: a sorted set of the admitted calls, score =
--          time in µs, member = the call's id (an integer, unique per key)
-- T .. ':c' (same hash tag, so the same cluster slot): a sorted set C of the
--          same ids, score = the cumulative cost admitted up to and
--          including the call, in time order. Its lowest element is the
--          base: the cumulative cost of everything dropped so far.
-- ARGV[1]  now in µs since the epoch, or "" to read the server's TIME
-- ARGV[2]  minimum expiry in ms (0 with the server clock)
-- ARGV[3]  deadline in the server's µs (TIME), or 0 for none; -(deadline + 1)
--          to also return TIME (-1: no deadline, return TIME)
-- ARGV[4]  cost
-- ARGV[5]  limit
-- ARGV[6]  window in µs
-- Returns {allowed, remaining, reset_after_us, retry_after_us or -1}, with
-- the server's µs after them if asked, or {-1, server µs} when past the
-- deadline.
--
-- Cumulative cost is monotone in time order, so with g the number of
-- entries at t <= now - W (gone from the trailing window, one ZCOUNT):
--   total in the window = C.max - (the g-th score of C above the base),
-- and the oldest entry that must leave before `cost` fits is the first in C
-- with a score >= C.max + cost - limit (one ZRANGEBYSCORE ... LIMIT 0 1).
-- Entries later than now (a clock that went back) count, as in the model.
-- An admission with a clock behind the newest entry inserts in time order
-- and adds its cost to the later entries' cumulative scores (O(entries
-- after it); only then). A denial writes nothing.
-- The server's TIME is read for "now" and for the deadline (ARGV[3]),
-- which is checked only before writing: a call that would write after it
-- returns "expired" ({-1, TIME}) and writes nothing; a denial writes nothing
-- anyway and is answered as usual. A negative ARGV[3], -(deadline + 1),
-- also asks for TIME at the end of the reply (tail; nil ends the reply
-- before it).
local now, st, dl, tail = ARGV[1], -1, ARGV[3], nil
if dl < '0' then tail = true end
if now == '' or dl ~= '0' then
  local t = redis.call('TIME')
  st = t[1] * 1000000 + t[2]
  if tail then tail = st end
end
if now == '' then now = st else now = tonumber(now) end
local cost, limit, width = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local tkey = KEYS[1]
local ckey = tkey .. ':c'
local edge = now - width

-- g: entries gone from the window. base: cumulative cost before the oldest
-- entry still in it. top: cumulative cost of all entries (C's maximum).
local fmt = string.format
local g = redis.call('ZCOUNT', tkey, '-inf', fmt('%d', edge))
local base, top, newest = 0, 0, nil
local b = redis.call('ZRANGE', ckey, g, g, 'WITHSCORES')
if b[2] then base = tonumber(b[2]) end
local m = redis.call('ZRANGE', ckey, -1, -1, 'WITHSCORES')
if m[2] then top = tonumber(m[2]) end
local n = redis.call('ZRANGE', tkey, -1, -1, 'WITHSCORES')
if n[2] then newest = tonumber(n[2]) end
local total = top - base

if total + cost <= limit then
  local deadline = tonumber(dl)
  if deadline < 0 then deadline = -1 - deadline end
  if deadline > 0 and st > deadline then return {-1, st} end
  if g > 0 then
    -- Drop the gone entries; the newest of them stays in C as the base.
    redis.call('ZREMRANGEBYSCORE', tkey, '-inf', fmt('%d', edge))
    redis.call('ZREMRANGEBYRANK', ckey, 0, g - 1)
  end
  if top + cost > 4503599627370496 then
    -- Cumulative costs near 2^52 (a log admitting for a very long time):
    -- renumber everything from the base, so every score stays exact below
    -- 2^53. O(n), once per 2^52 units of admitted cost.
    local cs = redis.call('ZRANGE', ckey, 0, -1, 'WITHSCORES')
    local ts = redis.call('ZRANGE', tkey, 0, -1, 'WITHSCORES')
    local renamed = {}
    for i = 1, #cs, 2 do renamed[cs[i]] = tonumber(cs[i + 1]) - base end
    redis.call('DEL', tkey, ckey)
    local args = {}
    for i = 1, #cs, 2 do
      local v = renamed[cs[i]]
      args[#args + 1] = v
      args[#args + 1] = v
      if #args >= 4000 or i + 2 > #cs then
        redis.call('ZADD', ckey, unpack(args))
        args = {}
      end
    end
    for i = 1, #ts, 2 do
      args[#args + 1] = ts[i + 1]
      args[#args + 1] = renamed[ts[i]]
      if #args >= 4000 or i + 2 > #ts then
        redis.call('ZADD', tkey, unpack(args))
        args = {}
      end
    end
    top, base = top - base, 0
  end
  local id = top + cost
  local cum = id
  if newest ~= nil and now < newest then
    -- The clock went back: the call goes after the entries at t <= now
    -- (a prefix of C, above the base) and before the later ones, whose
    -- cumulative cost grows by `cost`.
    local later = redis.call('ZRANGEBYSCORE', tkey, fmt('(%d', now), '+inf')
    for i = 1, #later do
      redis.call('ZINCRBY', ckey, cost, later[i])
    end
    local k = redis.call('ZCOUNT', tkey, '-inf', fmt('%d', now))
    cum = tonumber(redis.call('ZRANGE', ckey, k, k, 'WITHSCORES')[2] or 0) + cost
  else
    newest = now
  end
  local sid = fmt('%d', id)
  redis.call('ZADD', tkey, fmt('%d', now), sid)
  if m[2] then
    redis.call('ZADD', ckey, fmt('%d', cum), sid)
  else
    -- A new log: C starts with its base, id 0 at cumulative cost 0.
    redis.call('ZADD', ckey, 0, 0, fmt('%d', cum), sid)
  end
  local reset = newest + width - now
  local ms = math.fmod(reset, 1000)
  if ms > 0 then ms = (reset - ms) / 1000 + 2 else ms = reset / 1000 + 1 end
  local min_ms = tonumber(ARGV[2])
  if ms < min_ms then ms = min_ms end
  ms = fmt('%d', ms)
  redis.call('PEXPIRE', tkey, ms)
  redis.call('PEXPIRE', ckey, ms)
  local remaining = 0
  if limit > total + cost then remaining = limit - total - cost end
  return {1, remaining, reset, -1, tail}
end

-- Denied: wait until the oldest entries whose cost must leave have left.
local first = redis.call('ZRANGEBYSCORE', ckey, fmt('%d', top + cost - limit), '+inf', 'LIMIT', 0, 1)
local t = tonumber(redis.call('ZSCORE', tkey, first[1]))
local remaining = 0
if limit > total then remaining = limit - total end
return {0, remaining, newest + width - now, t + width - now, tail}
