-- PROTOTYPE, for benchmarks only: what the token bucket would cost stored as
-- ONE INTEGER and written as lean Lua (no per-call helper closures, no
-- string.format, no string parsing). Not used by any store, and not a
-- drop-in replacement (see BENCHMARKS.md): it is exact only while
-- now * refill stays below 2^53 (refill <= 4 units per µs with today's
-- clock), and it does not keep the model's "updated never moves back" rule.
-- Same calling convention and reply as ratelimit-redis' token_bucket.lua:
-- KEYS[1] the caller's key; ARGV: now or "", min expiry ms, cost, unit,
-- refill, full. Returns {allowed, remaining, reset_after_us, retry_after_us or -1}.
--
-- State: x = now * refill - level, so that the level at any later time is
-- min(full, now * refill - x) (GCRA's theoretical arrival time, in bucket
-- units). A missing key is a full bucket. Integers below 2^53 are exact in
-- Lua's doubles, `%` is exact for them, and Redis converts an integral Lua
-- number argument to its exact decimal digits.
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(ARGV[1])
end
local unit, refill, full = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local need = tonumber(ARGV[3]) * unit
local tu = now * refill
local level = full
local x = redis.call('GET', KEYS[1])
if x then
  level = tu - x
  if level > full then level = full end
end
local allowed = level >= need
if allowed then level = level - need end
-- reset = ceil((full - level) / refill)
local missing = full - level
local r = missing % refill
local reset = (missing - r) / refill
if r > 0 then reset = reset + 1 end
local remaining = (level - level % unit) / unit
if allowed then
  -- expiry: ceil(reset / 1000) + 1 ms, at least ARGV[2]
  local ms = reset % 1000
  ms = (reset - ms) / 1000 + (ms > 0 and 2 or 1)
  local min_ms = tonumber(ARGV[2])
  if ms < min_ms then ms = min_ms end
  redis.call('SET', KEYS[1], tu - level, 'PX', ms)
  return {1, remaining, reset, -1}
end
local short = need - level
r = short % refill
local retry = (short - r) / refill
if r > 0 then retry = retry + 1 end
return {0, remaining, reset, retry}
