-- Sliding window counter (layout sw). Mirrors
-- ratelimit-core/src/model/sliding_window.rs.
-- KEYS[1]  the caller's key: the string `window:prev:curr`
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
-- Every product is at most limit * window <= 2^53 - 1 (checked by the
-- quota), so Lua's doubles hold every value exactly; math.fmod is exact, so
-- (a - fmod(a, b)) / b is the exact floor of a / b. No closures; the state
-- is split at its two ':' (no pattern matching).
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
local fmod = math.fmod
local e = fmod(now, width)
local idx = (now - e) / width
local prev, curr = 0, 0
local v = redis.call('GET', KEYS[1])
if v then
  local i = string.find(v, ':', 1, true)
  local j = i and string.find(v, ':', i + 1, true)
  if j then
    local w = tonumber(string.sub(v, 1, i - 1))
    if w == idx then
      prev, curr = tonumber(string.sub(v, i + 1, j - 1)), tonumber(string.sub(v, j + 1))
    elseif w + 1 == idx then
      -- Rolled on read: the stored window's count is now the previous one.
      prev = tonumber(string.sub(v, j + 1))
    end
    -- Any other window (older, or later after a clock went back): fresh.
  end
end
-- Counters above the limit (the policy's limit was lowered under the same
-- name) count as the limit, so every product stays within limit * W.
if prev > limit then prev = limit end
if curr > limit then curr = limit end

local weighted = prev * (width - e)
local allowed = curr + cost <= limit and weighted <= (limit - curr - cost) * width
local retry = -1
if allowed then
  curr = curr + cost
elseif curr + cost <= limit then
  -- Admissible later in this window, once the previous window's weight has
  -- shrunk: the first e' with prev * (W - e') <= a * W. prev > 0 here.
  local aw = (limit - curr - cost) * width
  retry = width - (aw - fmod(aw, prev)) / prev - e
else
  -- Only in the next window, where prev' = curr > 0 and curr' = 0.
  local aw = (limit - cost) * width
  retry = 2 * width - e - (aw - fmod(aw, curr)) / curr
end

local used = weighted + curr * width
local remaining = 0
if limit * width > used then
  local r = limit * width - used
  remaining = (r - fmod(r, width)) / width
end
local reset = 0
if curr > 0 then
  reset = 2 * width - e
elseif prev > 0 then
  reset = width - e
end

if allowed then
  local deadline = tonumber(dl)
  if deadline < 0 then deadline = -1 - deadline end
  if deadline > 0 and st > deadline then return {-1, st} end
  local ms = fmod(reset, 1000)
  if ms > 0 then ms = (reset - ms) / 1000 + 2 else ms = reset / 1000 + 1 end
  local min_ms = tonumber(ARGV[2])
  if ms < min_ms then ms = min_ms end
  redis.call('SET', KEYS[1], string.format('%d:%d:%d', idx, prev, curr), 'PX', string.format('%d', ms))
  return {1, remaining, reset, -1, tail}
end
-- Denied: nothing is written. The stored state is the model's (the roll
-- into a new window is computed on read).
return {0, remaining, reset, retry, tail}
