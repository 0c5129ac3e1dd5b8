-- Sliding log: write an admission (wv from the decide part). In: key, wv,
-- ms (the expiry), now, x = cost.
local ckey, edge, g, base, top, newest, had = wv[1], wv[2], wv[3], wv[4], wv[5], wv[6], wv[7]
if g > 0 then
  -- Drop the gone entries; the newest of them stays in C as the base.
  call('ZREMRANGEBYSCORE', key, '-inf', fmt('%d', edge))
  call('ZREMRANGEBYRANK', ckey, 0, g - 1)
end
if top + x > 4503599627370496 then
  -- Cumulative costs near 2^52 (a log admitting for a very long time):
  -- renumber everything from the base, so every score stays exact below
  -- 2^53. O(n), once per 2^52 units of admitted cost.
  local cs = call('ZRANGE', ckey, 0, -1, 'WITHSCORES')
  local ts = call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local renamed = {}
  for j = 1, #cs, 2 do renamed[cs[j]] = tonumber(cs[j + 1]) - base end
  call('DEL', key, ckey)
  local args = {}
  for j = 1, #cs, 2 do
    local r = renamed[cs[j]]
    args[#args + 1] = r
    args[#args + 1] = r
    if #args >= 4000 or j + 2 > #cs then
      call('ZADD', ckey, unpack(args))
      args = {}
    end
  end
  for j = 1, #ts, 2 do
    args[#args + 1] = ts[j + 1]
    args[#args + 1] = renamed[ts[j]]
    if #args >= 4000 or j + 2 > #ts then
      call('ZADD', key, unpack(args))
      args = {}
    end
  end
  top = top - base
end
local id = top + x
local cum = id
if newest ~= nil and now < newest then
  -- The clock went back: the call goes after the entries at t <= now (a
  -- prefix of C, above the base) and before the later ones, whose
  -- cumulative cost grows by `cost`.
  local later = call('ZRANGEBYSCORE', key, fmt('(%d', now), '+inf')
  for j = 1, #later do
    call('ZINCRBY', ckey, x, later[j])
  end
  local k = call('ZCOUNT', key, '-inf', fmt('%d', now))
  cum = tonumber(call('ZRANGE', ckey, k, k, 'WITHSCORES')[2] or 0) + x
end
local sid = fmt('%d', id)
call('ZADD', key, fmt('%d', now), sid)
if had then
  call('ZADD', ckey, fmt('%d', cum), sid)
else
  -- A new log: C starts with its base, id 0 at cumulative cost 0.
  call('ZADD', ckey, 0, 0, fmt('%d', cum), sid)
end
call('PEXPIRE', key, ms)
call('PEXPIRE', ckey, ms)
