-- One decision under one quota: one algorithm's part (from
-- src/scripts/parts/, shared with the batch script), between this head and
-- the tail below. Assembled by src/scripts.rs.
-- KEYS[1]  the caller's key (see src/keys.rs)
-- ARGV[1]  deadline in the server's µs (TIME), or 0 for none; -(deadline + 1)
--          to also return TIME (-1: no deadline, return TIME)
-- ARGV[2..4]  x, y, z: cost, limit, window µs (windows); need = cost *
--          unit, refill, full = capacity * unit (token bucket)
-- ARGV[5], ARGV[6]  with an injected clock only: now in µs since the epoch
--          and the minimum expiry in ms; without them the server's TIME
-- A quota's own script (src/scripts.rs) has y, z and the unit compiled in
-- by the line below: ARGV[2] is the cost, the clock's at ARGV[3], ARGV[4].
-- Returns {allowed, remaining, reset_after_us, retry_after_us or -1}
-- (remaining in bucket units for a token bucket), with
-- the server's µs after them if asked, or {-1, server µs} when past the
-- deadline: expired, nothing written. A token bucket's admission not asked
-- for the server's µs returns one integer instead of the four (see
-- src/scripts.rs, TOKEN_BUCKET). The deadline is checked only before
-- writing: a denial writes nothing anyway and is answered as usual.
-- `s + 0` converts a numeric string once (`tonumber` converts it twice).
local x, y, z, c = ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0, 5
local dl, now, min_ms, st, tail = ARGV[1], ARGV[c], 0, -1, nil
if dl < '0' then tail = true end
if not now or dl ~= '0' then
  local t = redis.call('TIME')
  st = t[1] * 1000000 + t[2]
  if tail then tail = st end
end
if now then now, min_ms = now + 0, ARGV[c + 1] + 0 else now = st end
local fmt, find, sub, call = string.format, string.find, string.sub, redis.call
local key = KEYS[1]
local ok, remaining, reset, retry, cost, limit, wv = 0, 0, 0, -1, 0, 0, nil
local tb_t, tb_w = nil, nil
