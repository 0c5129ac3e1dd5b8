-- Token bucket: decide. Mirrors ratelimit-core/src/model/token_bucket.rs.
-- State: the theoretical arrival time (the instant the bucket is full
-- again) as one integer `tat` in µs, or `tat:rem` when the rate leaves a
-- sub-µs remainder (rem in bucket units). In: key, now; x = need (cost *
-- unit), y = refill (units per µs), z = full (capacity * unit); v = the
-- stored string (false: none), read by the script around this part.
-- Remaining is answered in bucket units (the client divides by the unit,
-- which the script never needs), and so are `cost` and `limit`.
-- Every value stays within full + refill <= 2^52 and tat <= now + full
-- < 2^53 (checked by the quota and the clock bound), exact in Lua's
-- doubles. For such integers Lua's `a % b` (a - floor(a / b) * b) is
-- exact, as is (a - a % b) / b = floor(a / b), for a of either sign: the
-- quotient rounds to a double no closer to an integer than 1 / b.
cost, limit = x, z
local delta, rho = 0, 0
if v then
  local tat
  local j = find(v, ':', 1, true)
  if j then
    tat, rho = tonumber(sub(v, 1, j - 1)), tonumber(sub(v, j + 1))
    if rho > y - 1 then rho = y - 1 end
  else
    -- One conversion (`tonumber` converts a string twice).
    tat = v + 0
  end
  if tat > now or (tat == now and rho > 0) then delta = tat - now else rho = 0 end
end
-- The bucket is short of full by d = delta * refill + rho units.
local room = z - x
if rho <= room and delta <= (room - rho - (room - rho) % y) / y then
  local d = delta * y + rho + x
  local rem = d % y
  local whole = (d - rem) / y
  reset = whole
  if rem > 0 then reset = whole + 1 end
  -- '%d' (a C long): integer formatting, far cheaper than the '%.17g'
  -- Redis applies to a Lua number argument.
  -- (tb_t, tb_w: the last state formatted, kept by the script around
  -- this part; a batch's requests admitted from full buckets write one.)
  if rem > 0 then
    wv = fmt('%d:%d', now + whole, rem)
  else
    local t = now + whole
    if t ~= tb_t then tb_t, tb_w = t, fmt('%d', t) end
    wv = tb_w
  end
  local level = z - d
  ok, remaining = 1, level
else
  -- Denied: nothing is written.
  local level = 0
  if rho <= z and delta <= (z - rho - (z - rho) % y) / y then
    level = z - delta * y - rho
  end
  reset = delta
  if rho > 0 then reset = delta + 1 end
  local w = rho + x - z
  local q = (w - w % y) / y
  if w % y > 0 then q = q + 1 end
  remaining, retry = level, delta + q
end
