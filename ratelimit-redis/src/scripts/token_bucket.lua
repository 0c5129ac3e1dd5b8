-- Token bucket. Mirrors ratelimit-core/src/model/token_bucket.rs step for step.
-- KEYS[1]  the caller's key (a string "level:updated", level in units)
-- ARGV[1]  now in µs since the epoch, or "" to read the server's TIME
-- ARGV[2]  minimum expiry in ms (0 with the server clock)
-- ARGV[3]  cost
-- ARGV[4]  unit: bucket units per token
-- ARGV[5]  refill: units gained per µs
-- ARGV[6]  full: capacity * unit
-- Returns {allowed, remaining, reset_after_us, retry_after_us or -1}.
-- No product exceeds full + refill <= 2^53 - 1 (checked by the quota).

-- (floordiv, ceildiv, fmt, expire_ms, key, now, min_ms and cost come from prelude.lua)
local unit = tonumber(ARGV[4])
local refill = tonumber(ARGV[5])
local full = tonumber(ARGV[6])

local level, updated = full, now
local stored_level, stored_updated = nil, nil
local raw = redis.call('GET', key)
if raw then
  local l, u = string.match(raw, '^(%d+):(%d+)$')
  if l then
    l, u = tonumber(l), tonumber(u)
    stored_level, stored_updated = l, u
    local elapsed = 0
    if now > u then elapsed = now - u end
    local capped = l
    if capped > full then capped = full end
    local missing = full - capped
    -- Full once elapsed >= ceil(missing / refill); otherwise the product
    -- elapsed * refill stays below missing + refill.
    if elapsed >= ceildiv(missing, refill) then
      level = full
    else
      level = l + elapsed * refill
    end
    if u > now then updated = u else updated = now end
  end
end

local need = cost * unit
local allowed = level >= need
local retry = -1
if allowed then
  level = level - need
else
  retry = (updated - now) + ceildiv(need - level, refill)
end
local reset = (updated - now) + ceildiv(full - level, refill)
local remaining = floordiv(level, unit)

-- A denial that changed nothing skips the write. One after a refill must
-- store the refilled state (level and time): a clock that later steps back
-- would otherwise refill from the older state and see fewer tokens.
if allowed or level ~= stored_level or updated ~= stored_updated then
  redis.call('SET', key, fmt(level) .. ':' .. fmt(updated), 'PX', fmt(expire_ms(reset, min_ms)))
end
if allowed then
  return {1, remaining, reset, -1}
end
return {0, remaining, reset, retry}
