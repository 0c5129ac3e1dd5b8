-- Requests in order, each over one or more quotas, all or nothing: the
-- several-quota call is a batch of one. Mirrors
-- ratelimit-core/src/model/all.rs, each quota by its algorithm's part (from
-- src/scripts/parts/, shared with the single-quota scripts). Assembled by
-- src/scripts.rs.
-- KEYS     every request's keys, in order (each request's keys share the
--          caller's hash tag; a cluster batch holds one slot)
-- ARGV[1]  minimum expiry in ms (0 with the server clock)
-- ARGV[2]  the fields per request: 1 (every request on the call's one
--          quota set and the server's clock: the deadline alone) or 3
-- ARGV[3]  the earliest deadline of the call's requests, in the server's
--          µs (0: none has one): while TIME is not past it, no request can
--          have expired, and no request's own deadline is read
-- ARGV[4]  1 when no key appears twice in KEYS, else 0 (the script then
--          keeps what it writes, for the requests after that read it)
-- ARGV[5]  the number of quota sets, then each set: its id, its number n
--          of quotas, then per quota: kind (1 fixed window, 2 sliding
--          window, 3 sliding log, 4 token bucket), shadow (0/1), x, y, z
--          (as the single scripts' ARGV[2..4]). Requests over the same
--          quotas share one set: its arguments are sent and parsed once per
--          call.
-- then, with 3 fields: per request, now in µs ("" for the server's TIME),
--   the deadline in the server's µs (0: none), the id of its quota set;
--   with 1: one argument, every request's deadline in order, separated by
--   spaces (split only when TIME is past the earliest: one string where a
--   field per request would cost the server an argument each)
-- Returns per request 4 integers per quota {allowed (0/1), remaining (in
-- bucket units for a token bucket), reset_after_us, retry_after_us or -1},
-- that quota's own decision, except a token bucket that admits a request
-- that is admitted: one integer, -2 - d, where d = full - remaining is the
-- units the bucket is short of full (the client computes the four from it
-- and the quota's numbers); or -1 alone when the request's deadline had
-- passed before it would write (expired, nothing written); then the
-- server's TIME in µs. The first integer of a quota's answer tells its
-- form: 0 or 1 (four), -2 or less (one).
-- Each request is decided in two phases, exactly as alone: every quota
-- from its stored state, writing nothing; then, only if every enforced
-- (not shadow) quota admits it, the state of each quota that admits it is
-- written (a shadow quota that denies is not). A denied request writes
-- nothing; a quota that admits it reports its remaining without it
-- (remaining + cost, at most the limit). A request sees the writes of the
-- requests before it. Every key's stored string is read up front, one
-- MGET per 1,000 keys (a key that holds no string, such as a sliding
-- log's sorted set, reads as none there; the log's part reads its own).
local t = redis.call('TIME')
local st = t[1] * 1000000 + t[2]
local min_ms = tonumber(ARGV[1])
local fmt, find, sub, call = string.format, string.find, string.sub, redis.call
local out, o = {}, 0
local nargv = #ARGV
-- The quota sets, by id: {n, then per quota kind, shadow, x, y, z}.
local compact = ARGV[2] == '1'
local early = ARGV[3]
local late = early ~= '0' and st > early + 0
-- What this call wrote, by key, when a key repeats.
local written = nil
if ARGV[4] ~= '1' then written = {} end
local nk, pre = #KEYS, nil
if nk <= 1000 then
  pre = call('MGET', unpack(KEYS))
else
  pre = {}
  for k0 = 1, nk, 1000 do
    local k1 = k0 + 999
    if k1 > nk then k1 = nk end
    local got = call('MGET', unpack(KEYS, k0, k1))
    for k = 1, k1 - k0 + 1 do pre[k0 + k - 1] = got[k] end
  end
end
local sets, a, q = {}, 6, nil
for _ = 1, tonumber(ARGV[5]) do
  local n = tonumber(ARGV[a + 1])
  q = {n}
  for i = 1, n do
    local b, j = a + 2 + 5 * (i - 1), 5 * (i - 1) + 1
    q[j + 1], q[j + 2] = ARGV[b], ARGV[b + 1]
    q[j + 3], q[j + 4], q[j + 5] = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  end
  sets[ARGV[a]] = q
  a = a + 2 + 5 * n
end
-- Per quota of the current request, reused from request to request (each
-- is written for 1..cnt before it is read): the decision's four numbers,
-- the state to write and its expiry in ms, the remaining without this
-- request, the charge, the kind.
local r1, r2, r3, r4, wvs, mss, adj, xs, kinds = {}, {}, {}, {}, {}, {}, {}, {}, {}
-- The last state and expiry formatted, with their strings: requests of one
-- quota admitted at one instant from a full bucket, or in one window,
-- write the same expiry (and a bucket the same state); formatted once.
local tb_t, tb_w, last_ms, last_mss = nil, nil, nil, nil
local ki, nreq, dls, lone = 0, 0, nil, false
if compact then
  -- The call's one set (the last parsed), the server's clock.
  nreq = nk / q[1]
  if late then
    dls = {}
    for d in string.gmatch(ARGV[a], '%d+') do dls[#dls + 1] = d end
  end
else
  nreq = (nargv - a + 1) / 3
end
for r = 1, nreq do
  local now, rdl = st, '0'
  if compact then
    if dls then rdl = dls[r] end
  else
    now, rdl, q = ARGV[a], ARGV[a + 1], sets[ARGV[a + 2]]
    a = a + 3
    if now == '' then now = st else now = tonumber(now) end
  end
  local cnt = q[1]
  local admitted = true
  for i = 1, cnt do
    local j = 5 * (i - 1) + 1
    local kind, shadow, x, y, z = q[j + 1], q[j + 2], q[j + 3], q[j + 4], q[j + 5]
    local key = KEYS[ki + i]
    local ok, remaining, reset, retry, cost, limit, wv = 0, 0, 0, -1, 0, 0, nil
    local v = pre[ki + i]
    if written then
      local w = written[key]
      if w then v = w end
    end
    if kind == '4' then
