-- Token bucket (layout tb2). Mirrors ratelimit-core/src/model/token_bucket.rs.
-- KEYS[1]  the caller's key: the theoretical arrival time (the instant the
--          bucket is full again) as one integer `tat` in µs, or `tat:rem`
--          when the rate leaves a sub-µs remainder (rem in bucket units)
-- ARGV[1]  now in µs since the epoch, or "" to read the server's TIME
-- ARGV[2]  minimum expiry in ms (0 with the server clock)
-- ARGV[3]  deadline in the server's µs (TIME), or 0 for none; -(deadline + 1)
--          to also return TIME (-1: no deadline, return TIME)
-- ARGV[4]  need = cost * unit
-- ARGV[5]  refill: units gained per µs
-- ARGV[6]  full = capacity * unit
-- ARGV[7]  unit: units per token
-- Returns {allowed, remaining, reset_after_us, retry_after_us or -1}, with
-- the server's µs after them if asked, or {-1, server µs} when past the
-- deadline.
-- Every value stays within full + refill <= 2^53 - 1 (checked by the quota),
-- so Lua's doubles hold it exactly; math.fmod is exact, so
-- (a - fmod(a, b)) / b is the exact floor of a / b for a >= 0 (and the
-- truncation, i.e. the ceiling, for a < 0). No closures; numbers reach
-- Redis formatted as integers ('%d', exact below 2^53).
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
local need, refill, full = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local fmod = math.fmod
-- The bucket is short of full by d = delta * refill + rho units.
local delta, rho = 0, 0
local v = redis.call('GET', KEYS[1])
if v then
  local tat = tonumber(v)
  if not tat then
    local i = string.find(v, ':', 1, true)
    tat, rho = tonumber(string.sub(v, 1, i - 1)), tonumber(string.sub(v, i + 1))
    if rho > refill - 1 then rho = refill - 1 end
  end
  if tat > now or (tat == now and rho > 0) then delta = tat - now else rho = 0 end
end
local room = full - need
local unit = tonumber(ARGV[7])
if rho <= room and delta <= (room - rho - fmod(room - rho, refill)) / refill then
  local deadline = tonumber(dl)
  if deadline < 0 then deadline = -1 - deadline end
  if deadline > 0 and st > deadline then return {-1, st} end
  local d = delta * refill + rho + need
  local rem = fmod(d, refill)
  local whole = (d - rem) / refill
  local reset = whole
  if rem > 0 then reset = whole + 1 end
  -- Expiry: the reset rounded up to whole ms, plus one ms.
  local ms = fmod(reset, 1000)
  if ms > 0 then ms = (reset - ms) / 1000 + 2 else ms = reset / 1000 + 1 end
  -- The minimum expiry is '0' with the server's clock: no number to parse.
  if ARGV[2] ~= '0' then
    local min_ms = tonumber(ARGV[2])
    if ms < min_ms then ms = min_ms end
  end
  -- '%d' (a C long): integer formatting, far cheaper than the '%.17g'
  -- Redis applies to a Lua number argument.
  if rem == 0 then
    redis.call('SET', KEYS[1], string.format('%d', now + whole), 'PX', string.format('%d', ms))
  else
    redis.call('SET', KEYS[1], string.format('%d:%d', now + whole, rem), 'PX', string.format('%d', ms))
  end
  local level = full - d
  return {1, (level - fmod(level, unit)) / unit, reset, -1, tail}
end
-- Denied: nothing is written.
local level = 0
if rho <= full and delta <= (full - rho - fmod(full - rho, refill)) / refill then
  level = full - delta * refill - rho
end
local reset = delta
if rho > 0 then reset = delta + 1 end
local x = rho + need - full
local r = fmod(x, refill)
local q = (x - r) / refill
if r > 0 then q = q + 1 end
return {0, (level - fmod(level, unit)) / unit, reset, delta + q, tail}
