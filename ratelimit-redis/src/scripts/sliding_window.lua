-- Sliding window counter. Mirrors ratelimit-core/src/model/sliding_window.rs
-- step for step.
-- KEYS[1]  the caller's key (a string "window:prev:curr")
-- ARGV[1]  now in µs since the epoch, or "" to read the server's TIME
-- ARGV[2]  minimum expiry in ms (0 with the server clock)
-- ARGV[3]  cost
-- ARGV[4]  limit
-- ARGV[5]  window in µs
-- Returns {allowed, remaining, reset_after_us, retry_after_us or -1}.
-- Every product is at most limit * window <= 2^53 - 1 (checked by the quota),
-- so Lua's doubles hold every value exactly.

-- (floordiv, ceildiv, fmt, expire_ms, key, now, min_ms and cost come from prelude.lua)
local limit = tonumber(ARGV[4])
local width = tonumber(ARGV[5])

local idx = floordiv(now, width)
local e = now - idx * width
local prev, curr = 0, 0
local same_window = false
local raw = redis.call('GET', key)
if raw then
  local w, p, c = string.match(raw, '^(%d+):(%d+):(%d+)$')
  if w then
    w = tonumber(w)
    if w == idx then
      same_window = true
      prev, curr = tonumber(p), tonumber(c)
    elseif w + 1 == idx then
      prev = tonumber(c)
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
  local a = limit - curr - cost
  local first = width - floordiv(a * width, prev)
  retry = first - e
else
  -- Only in the next window, where prev' = curr > 0 and curr' = 0.
  local first = width - floordiv((limit - cost) * width, curr)
  retry = width - e + first
end

local used = weighted + curr * width
local remaining = 0
if limit * width > used then remaining = floordiv(limit * width - used, width) end
local reset = 0
if curr > 0 then
  reset = 2 * width - e
elseif prev > 0 then
  reset = width - e
end

-- A denial in the stored window changes nothing: skip the write. A denial
-- that rolled the state into a new window must store the rolled state, or a
-- clock that later steps back would see the old window's counts again.
if allowed or not same_window then
  redis.call('SET', key, fmt(idx) .. ':' .. fmt(prev) .. ':' .. fmt(curr),
    'PX', fmt(expire_ms(reset, min_ms)))
end
if allowed then
  return {1, remaining, reset, -1}
end
return {0, remaining, reset, retry}
