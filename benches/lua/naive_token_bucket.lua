-- NAIVE REFERENCE, for benchmarks only: the hash-of-floats token bucket that
-- the problem statement describes (and that is commonly written). Not used
-- by any store. Written for this project's benchmarks.
-- KEYS[1]  the caller's hash {tokens, ts}
-- ARGV[1]  rate in tokens per second (a float)
-- ARGV[2]  capacity (burst)
-- ARGV[3]  cost
-- Time is the server's TIME, in float seconds, as our scripts also read TIME.
-- Returns {allowed, floor(tokens left)}. Every call writes the hash and
-- resets the expiry, admitted or not.
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = capacity
  ts = now
end
local elapsed = math.max(0, now - ts)
tokens = math.min(capacity, tokens + elapsed * rate)
local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000))
return {allowed, math.floor(tokens)}
