-- Sliding log. Mirrors ratelimit-core/src/model/sliding_log.rs step for step.
-- KEYS[1]  the caller's key: a sorted set, score = time in µs, member
--          "time:cost", one member per time (calls at the same µs merged)
-- ARGV[1]  now in µs since the epoch, or "" to read the server's TIME
-- ARGV[2]  minimum expiry in ms (0 with the server clock)
-- ARGV[3]  cost
-- ARGV[4]  limit
-- ARGV[5]  window in µs
-- Returns {allowed, remaining, reset_after_us, retry_after_us or -1}.

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
local limit = tonumber(ARGV[4])
local width = tonumber(ARGV[5])
local function fmt(x) return string.format('%.0f', x) end

-- Entries at t <= now - W have left the trailing window (now - W, now].
-- Entries later than now (a clock that went back) still count. They are
-- dropped only by an admission: a denial writes nothing.
local members = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now - width), '+inf')
local times, costs, names = {}, {}, {}
local total = 0
for _, m in ipairs(members) do
  local t, c = string.match(m, '^(%d+):(%d+)$')
  if t then
    local i = #times + 1
    times[i], costs[i], names[i] = tonumber(t), tonumber(c), m
    total = total + costs[i]
  end
end

local allowed = total + cost <= limit
local retry = -1
local newest = times[#times]
if allowed then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - width))
  -- Merge with an entry at the same time, as the model does.
  local merged = cost
  for i = 1, #times do
    if times[i] == now then
      merged = merged + costs[i]
      redis.call('ZREM', key, names[i])
      break
    end
  end
  redis.call('ZADD', key, fmt(now), fmt(now) .. ':' .. fmt(merged))
  if newest == nil or now > newest then newest = now end
else
  -- Oldest first: wait until enough entries have left the window.
  local left = total
  for i = 1, #times do
    left = left - costs[i]
    if left + cost <= limit then
      retry = times[i] + width - now
      break
    end
  end
end

local used = total
if allowed then used = total + cost end
local remaining = 0
if limit > used then remaining = limit - used end
local reset = 0
if newest ~= nil and newest + width > now then reset = newest + width - now end

if allowed then
  local ms = math.fmod(reset, 1000)
  if ms > 0 then ms = (reset - ms) / 1000 + 2 else ms = reset / 1000 + 1 end
  if ms < min_ms then ms = min_ms end
  redis.call('PEXPIRE', key, ms)
  return {1, remaining, reset, -1}
end
-- A denial wrote nothing; the newest entry, and so the expiry set with it,
-- is unchanged.
return {0, remaining, reset, retry}
