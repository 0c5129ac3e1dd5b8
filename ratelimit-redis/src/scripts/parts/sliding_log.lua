-- Sliding log: decide. Mirrors ratelimit-core/src/model/sliding_log.rs.
-- Every call costs O(log n) in the number n of entries, plus the entries an
-- admission drops: no call reads or loops over the whole log.
-- State: `key` T, a sorted set of the admitted calls, score = time in µs,
-- member = the call's id (an integer, unique per key); T .. ':c' (same hash
-- tag, so the same cluster slot), a sorted set C of the same ids, score =
-- the cumulative cost admitted up to and including the call, in time
-- order, whose lowest element is the base (the cumulative cost of
-- everything dropped so far). In: key, now; x = cost, y = limit, z = window
-- in µs. Cumulative cost is monotone in time order, so with g the number of
-- entries at t <= now - W (one ZCOUNT): total in the window = C.max - (the
-- g-th score of C above the base), and the oldest entry that must leave
-- before `cost` fits is the first in C with a score >= C.max + cost - limit.
-- Entries later than now (a clock that went back) count, as in the model.
cost, limit = x, y
local ckey = key .. ':c'
local edge = now - z
local g = call('ZCOUNT', key, '-inf', fmt('%d', edge))
local base, top, newest = 0, 0, nil
local b = call('ZRANGE', ckey, g, g, 'WITHSCORES')
if b[2] then base = tonumber(b[2]) end
local m = call('ZRANGE', ckey, -1, -1, 'WITHSCORES')
if m[2] then top = tonumber(m[2]) end
local n = call('ZRANGE', key, -1, -1, 'WITHSCORES')
if n[2] then newest = tonumber(n[2]) end
local total = top - base
if total + x <= y then
  local last = newest
  if last == nil or now >= last then last = now end
  if y > total + x then remaining = y - total - x end
  ok, reset = 1, last + z - now
  wv = {ckey, edge, g, base, top, newest, m[2] ~= nil}
else
  -- Denied: wait until the oldest entries whose cost must leave have left.
  local first = call('ZRANGEBYSCORE', ckey, fmt('%d', top + x - y), '+inf', 'LIMIT', 0, 1)
  local t = tonumber(call('ZSCORE', key, first[1]))
  if y > total then remaining = y - total end
  reset, retry = newest + z - now, t + z - now
end
