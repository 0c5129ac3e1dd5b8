-- Fixed window (layout fw). Mirrors ratelimit-core/src/model/fixed_window.rs.
-- KEYS[1]  the caller's key: the string `window:count`
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
-- Every number is an integer below 2^53, exact in Lua's doubles; math.fmod
-- is exact, so (a - fmod(a, b)) / b is the exact floor of a / b. No
-- closures; the state is split at its one ':' (no pattern matching).
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
local idx = (now - math.fmod(now, width)) / width
local count = 0
local v = redis.call('GET', KEYS[1])
if v then
  local i = string.find(v, ':', 1, true)
  -- A state of any other window is a fresh one.
  if i and tonumber(string.sub(v, 1, i - 1)) == idx then count = tonumber(string.sub(v, i + 1)) end
end
local until_end = (idx + 1) * width - now
if count + cost <= limit then
  local deadline = tonumber(dl)
  if deadline < 0 then deadline = -1 - deadline end
  if deadline > 0 and st > deadline then return {-1, st} end
  count = count + cost
  local ms = math.fmod(until_end, 1000)
  if ms > 0 then ms = (until_end - ms) / 1000 + 2 else ms = until_end / 1000 + 1 end
  local min_ms = tonumber(ARGV[2])
  if ms < min_ms then ms = min_ms end
  redis.call('SET', KEYS[1], string.format('%d:%d', idx, count), 'PX', string.format('%d', ms))
  local remaining = limit - count
  return {1, remaining, until_end, -1, tail}
end
-- Denied: nothing is written (the model's state is the stored one).
local remaining = 0
if limit > count then remaining = limit - count end
return {0, remaining, until_end, until_end, tail}
