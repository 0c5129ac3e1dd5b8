-- Requests in order, each over one or more quotas, all or nothing: the
-- several-quota call is a batch of one. Mirrors
-- ratelimit-core/src/model/all.rs, each quota by its algorithm's part (from
-- src/scripts/parts/, shared with the single-quota scripts). Assembled by
-- src/scripts.rs.
-- KEYS     every request's keys, in order (each request's keys share the
--          caller's hash tag; a cluster batch holds one slot)
-- ARGV[1]  minimum expiry in ms (0 with the server clock)
-- then per request: now in µs ("" for the server's TIME), the deadline in
--   the server's µs (0 or less: none), the number n of its quotas, then per
--   quota: kind (1 fixed window, 2 sliding window, 3 sliding log, 4 token
--   bucket), shadow (0/1), x, y, z, u (u is "" for a window)
-- Returns per request 1 and 4 integers per quota {allowed, remaining,
-- reset_after_us, retry_after_us or -1}, that quota's own decision; or -1
-- alone when the request's deadline had passed before it would write
-- (expired, nothing written); then the server's TIME in µs.
-- Each request is decided in two phases, exactly as alone: every quota
-- from its stored state, writing nothing; then, only if every enforced
-- (not shadow) quota admits it, the state of each quota that admits it is
-- written (a shadow quota that denies is not). A denied request writes
-- nothing; a quota that admits it reports its remaining without it
-- (remaining + cost, at most the limit). A request sees the writes of the
-- requests before it.
local t = redis.call('TIME')
local st = t[1] * 1000000 + t[2]
local min_ms = tonumber(ARGV[1])
local fmod, fmt, find, sub, call = math.fmod, string.format, string.find, string.sub, redis.call
local out = {}
local a, ki, nargv = 2, 0, #ARGV
while a <= nargv do
  local now, rdl, cnt = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  if now == '' then now = st else now = tonumber(now) end
  local admitted = true
  local res, wvs, mss, adj, xs, kinds = {}, {}, {}, {}, {}, {}
  for i = 1, cnt do
    local kind, shadow = ARGV[a], ARGV[a + 1]
    local x, y, z, u = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
    a = a + 6
    local key = KEYS[ki + i]
    local ok, remaining, reset, retry, cost, limit, wv = 0, 0, 0, -1, 0, 0, nil
    if kind == '4' then
