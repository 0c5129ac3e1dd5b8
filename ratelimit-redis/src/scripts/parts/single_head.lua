-- One decision under one quota: one algorithm's part (from
-- src/scripts/parts/, shared with the batch script), between this head and
-- the tail below. Assembled by src/scripts.rs.
-- KEYS[1]  the caller's key (see src/keys.rs)
-- ARGV[1]  now in µs since the epoch, or "" to read the server's TIME
-- ARGV[2]  minimum expiry in ms (0 with the server clock)
-- ARGV[3]  deadline in the server's µs (TIME), or 0 for none; -(deadline + 1)
--          to also return TIME (-1: no deadline, return TIME)
-- ARGV[4..7]  x, y, z, u: cost, limit, window µs (windows); need = cost *
--          unit, refill, full = capacity * unit, unit (token bucket)
-- Returns {allowed, remaining, reset_after_us, retry_after_us or -1}, with
-- the server's µs after them if asked, or {-1, server µs} when past the
-- deadline: expired, nothing written. The deadline is checked only before
-- writing: a denial writes nothing anyway and is answered as usual.
local now, st, dl, tail = ARGV[1], -1, ARGV[3], nil
if dl < '0' then tail = true end
if now == '' or dl ~= '0' then
  local t = redis.call('TIME')
  st = t[1] * 1000000 + t[2]
  if tail then tail = st end
end
if now == '' then now = st else now = tonumber(now) end
local fmod, fmt, find, sub, call = math.fmod, string.format, string.find, string.sub, redis.call
local key = KEYS[1]
local x, y, z, u = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local ok, remaining, reset, retry, cost, limit, wv = 0, 0, 0, -1, 0, 0, nil
