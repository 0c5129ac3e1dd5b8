-- PROTOTYPE, for benchmarks only: what the token bucket would cost stored as
-- ONE INTEGER instead of the string "level:updated". Not used by any store,
-- and not a drop-in replacement (see BENCHMARKS.md): it is exact only while
-- now * refill stays below 2^53 (refill <= 4 units per µs today), and it
-- does not keep the model's "updated never moves back" rule.
-- Same calling convention and reply as ratelimit-redis' token_bucket.lua:
-- KEYS[1] the caller's key; ARGV: now or "", min expiry ms, cost, unit,
-- refill, full. Returns {allowed, remaining, reset_after_us, retry_after_us or -1}.
--
-- State: x = now * refill - level, so that the level at any later time is
-- min(full, now * refill - x) (GCRA's theoretical arrival time, in bucket
-- units). A missing key is a full bucket.
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local min_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local unit = tonumber(ARGV[4])
local refill = tonumber(ARGV[5])
local full = tonumber(ARGV[6])

local t_units = now * refill
local level = full
local x = tonumber(redis.call('GET', KEYS[1]))
if x then
  level = t_units - x
  if level > full then level = full end
end
local need = cost * unit
local function ceildiv(a, b)
  local r = math.fmod(a, b)
  local q = (a - r) / b
  if r > 0 then q = q + 1 end
  return q
end
if level >= need then
  level = level - need
  local reset = ceildiv(full - level, refill)
  local ms = ceildiv(reset, 1000) + 1
  if ms < min_ms then ms = min_ms end
  redis.call('SET', KEYS[1], string.format('%.0f', t_units - level), 'PX', ms)
  return {1, (level - math.fmod(level, unit)) / unit, reset, -1}
end
local reset = ceildiv(full - level, refill)
return {0, (level - math.fmod(level, unit)) / unit, reset, ceildiv(need - level, refill)}
