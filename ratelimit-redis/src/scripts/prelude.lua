-- Shared prelude of every rate-limit script (prepended at build time by
-- scripts.rs). Common arguments:
-- KEYS[1]  the caller's key
-- ARGV[1]  now in µs since the epoch, or "" to read the server's TIME
-- ARGV[2]  minimum expiry in ms (0 with the server clock)
-- ARGV[3]  cost
-- Every number is an integer below 2^53, so Lua's doubles hold it exactly.

local function floordiv(a, b)
  -- Exact for integers 0 <= a, 0 < b below 2^53: fmod is exact, and
  -- (a - r) / b is an exactly representable integer.
  return (a - math.fmod(a, b)) / b
end
local function ceildiv(a, b)
  local q = floordiv(a, b)
  if math.fmod(a, b) > 0 then q = q + 1 end
  return q
end
local function fmt(x) return string.format('%.0f', x) end
local function expire_ms(ttl_us, min_ms)
  -- Rounded up to whole ms, plus one ms for the server's ms expiry clock.
  local ms = ceildiv(ttl_us, 1000) + 1
  if ms < min_ms then ms = min_ms end
  return ms
end

local key = KEYS[1]
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local min_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

