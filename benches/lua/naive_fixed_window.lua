-- NAIVE REFERENCE, for benchmarks only: the INCR + EXPIRE fixed window of the
-- problem statement (a counter per caller per calendar window). Not used by
-- any store. Written for this project's benchmarks.
-- KEYS[1]  the caller's key stem; the counter is KEYS[1]:<window index>
-- ARGV[1]  limit
-- ARGV[2]  window in seconds
-- The window index comes from the server's TIME (so that redis-benchmark,
-- which cannot compute it, runs the same script); a client that computes it
-- sends the full key instead, and the server does the same INCR and EXPIRE.
-- Returns {allowed, remaining}.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local t = redis.call('TIME')
local key = KEYS[1] .. ':' .. math.floor(tonumber(t[1]) / window)
local n = redis.call('INCR', key)
if n == 1 then
  redis.call('EXPIRE', key, window)
end
if n > limit then
  return {0, 0}
end
return {1, limit - n}
