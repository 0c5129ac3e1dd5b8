-- Fixed window. Mirrors ratelimit-core/src/model/fixed_window.rs step for step.
-- KEYS[1]  the caller's key (a string "window:count")
-- ARGV[1]  now in µs since the epoch, or "" to read the server's TIME
-- ARGV[2]  minimum expiry in ms (0 with the server clock)
-- ARGV[3]  cost
-- ARGV[4]  limit
-- ARGV[5]  window in µs
-- Returns {allowed, remaining, reset_after_us, retry_after_us or -1}.
-- Every number is an integer below 2^53, so Lua's doubles hold it exactly.

-- (floordiv, ceildiv, fmt, expire_ms, key, now, min_ms and cost come from prelude.lua)
local limit = tonumber(ARGV[4])
local width = tonumber(ARGV[5])

local idx = floordiv(now, width)
local count = 0
local raw = redis.call('GET', key)
if raw then
  local w, c = string.match(raw, '^(%d+):(%d+)$')
  -- A state of any other window (or unreadable) is a fresh one.
  if w and tonumber(w) == idx then count = tonumber(c) end
end
local until_end = (idx + 1) * width - now
local allowed = count + cost <= limit
if allowed then
  count = count + cost
  redis.call('SET', key, fmt(idx) .. ':' .. fmt(count), 'PX', fmt(expire_ms(until_end, min_ms)))
end
-- A denial leaves the stored state as it is: the model's new state equals it.
local remaining = 0
if limit > count then remaining = limit - count end
if allowed then
  return {1, remaining, until_end, -1}
end
return {0, remaining, until_end, until_end}
