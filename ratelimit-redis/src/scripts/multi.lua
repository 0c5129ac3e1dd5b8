-- Several quotas, all or nothing. Mirrors ratelimit-core/src/model/all.rs,
-- each quota by the arithmetic of its single script (fixed_window.lua,
-- sliding_window.lua, sliding_log.lua, token_bucket.lua).
-- KEYS[i]  quota i's key (a sliding log also uses KEYS[i] .. ':c')
-- ARGV[1]  now in µs since the epoch, or "" to read the server's TIME
-- ARGV[2]  minimum expiry in ms (0 with the server clock)
-- ARGV[3]  deadline in the server's µs (TIME), or 0 for none
-- then, per quota, in KEYS order:
--   kind (1 fixed window, 2 sliding window, 3 sliding log, 4 token bucket),
--   shadow (0 or 1), then the single script's ARGV[4..]: cost, limit,
--   window µs; or need = cost * unit, refill, full, unit for a bucket.
-- Returns 4 integers per quota, in order: {allowed, remaining,
-- reset_after_us, retry_after_us or -1}, that quota's own decision, then
-- the server's µs (or -1 if TIME was not read); or {-1, server µs} when
-- past the deadline.
--
-- Two phases. First every quota is decided from its stored state, writing
-- nothing; the call is admitted iff every enforced (non-shadow) quota
-- admits it. Then, only if it is admitted, every quota that admits it is
-- written, as its single script would (a shadow quota that denies is not).
-- A denied call writes nothing; a quota that admits it reports its
-- remaining without this call (remaining + cost, at most the limit).
-- All keys of one call share the caller's hash tag: one cluster slot.
-- The server's TIME is read for "now" and for the deadline; past the
-- deadline the caller has stopped waiting: return "expired", write nothing.
local now, st, dl = ARGV[1], -1, tonumber(ARGV[3])
if now == '' or dl ~= 0 then
  local t = redis.call('TIME')
  st = t[1] * 1000000 + t[2]
  if dl > 0 and st > dl then return {-1, st} end
end
if now == '' then now = st else now = tonumber(now) end
local min_ms = tonumber(ARGV[2])
local fmod, fmt, find, sub = math.fmod, string.format, string.find, string.sub
local call = redis.call

-- The expiry of a state that resets in `reset` µs: rounded up to whole ms,
-- plus one ms, at least min_ms.
local function expiry(reset)
  local ms = fmod(reset, 1000)
  if ms > 0 then ms = (reset - ms) / 1000 + 2 else ms = reset / 1000 + 1 end
  if ms < min_ms then ms = min_ms end
  return fmt('%d', ms)
end

-- Each decide function reads one quota's state and returns its decision
-- (allowed, remaining, reset, retry), its limit and cost in the reply's
-- units, and what to write if it admits: a value and an expiry (one SET),
-- or for a sliding log a table for sl_write.

local function fw(key, cost, limit, width)
  local idx = (now - fmod(now, width)) / width
  local count = 0
  local v = call('GET', key)
  if v then
    local i = find(v, ':', 1, true)
    if i and tonumber(sub(v, 1, i - 1)) == idx then count = tonumber(sub(v, i + 1)) end
  end
  local until_end = (idx + 1) * width - now
  if count + cost <= limit then
    count = count + cost
    return 1, limit - count, until_end, -1, fmt('%d:%d', idx, count), expiry(until_end)
  end
  local remaining = 0
  if limit > count then remaining = limit - count end
  return 0, remaining, until_end, until_end
end

local function sw(key, cost, limit, width)
  local e = fmod(now, width)
  local idx = (now - e) / width
  local prev, curr = 0, 0
  local v = call('GET', key)
  if v then
    local i = find(v, ':', 1, true)
    local j = i and find(v, ':', i + 1, true)
    if j then
      local w = tonumber(sub(v, 1, i - 1))
      if w == idx then
        prev, curr = tonumber(sub(v, i + 1, j - 1)), tonumber(sub(v, j + 1))
      elseif w + 1 == idx then
        prev = tonumber(sub(v, j + 1))
      end
    end
  end
  if prev > limit then prev = limit end
  if curr > limit then curr = limit end
  local weighted = prev * (width - e)
  local allowed = curr + cost <= limit and weighted <= (limit - curr - cost) * width
  local retry = -1
  if allowed then
    curr = curr + cost
  elseif curr + cost <= limit then
    local aw = (limit - curr - cost) * width
    retry = width - (aw - fmod(aw, prev)) / prev - e
  else
    local aw = (limit - cost) * width
    retry = 2 * width - e - (aw - fmod(aw, curr)) / curr
  end
  local used = weighted + curr * width
  local remaining = 0
  if limit * width > used then
    local r = limit * width - used
    remaining = (r - fmod(r, width)) / width
  end
  local reset = 0
  if curr > 0 then
    reset = 2 * width - e
  elseif prev > 0 then
    reset = width - e
  end
  if allowed then
    return 1, remaining, reset, -1, fmt('%d:%d:%d', idx, prev, curr), expiry(reset)
  end
  return 0, remaining, reset, retry
end

local function sl(tkey, cost, limit, width)
  local ckey = tkey .. ':c'
  local edge = now - width
  local g = call('ZCOUNT', tkey, '-inf', fmt('%d', edge))
  local base, top, newest = 0, 0, nil
  local b = call('ZRANGE', ckey, g, g, 'WITHSCORES')
  if b[2] then base = tonumber(b[2]) end
  local m = call('ZRANGE', ckey, -1, -1, 'WITHSCORES')
  if m[2] then top = tonumber(m[2]) end
  local n = call('ZRANGE', tkey, -1, -1, 'WITHSCORES')
  if n[2] then newest = tonumber(n[2]) end
  local total = top - base
  if total + cost <= limit then
    local last = newest
    if last == nil or now >= last then last = now end
    local remaining = 0
    if limit > total + cost then remaining = limit - total - cost end
    local reset = last + width - now
    return 1, remaining, reset, -1,
      {tkey, ckey, edge, g, base, top, newest, m[2] ~= nil, cost},
      expiry(reset)
  end
  local first = call('ZRANGEBYSCORE', ckey, fmt('%d', top + cost - limit), '+inf', 'LIMIT', 0, 1)
  local t = tonumber(call('ZSCORE', tkey, first[1]))
  local remaining = 0
  if limit > total then remaining = limit - total end
  return 0, remaining, newest + width - now, t + width - now
end

-- The admission of a sliding log, as sliding_log.lua writes it.
local function sl_write(p, ms)
  local tkey, ckey, edge, g, base, top, newest, had, cost =
    p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9]
  if g > 0 then
    call('ZREMRANGEBYSCORE', tkey, '-inf', fmt('%d', edge))
    call('ZREMRANGEBYRANK', ckey, 0, g - 1)
  end
  if top + cost > 4503599627370496 then
    local cs = call('ZRANGE', ckey, 0, -1, 'WITHSCORES')
    local ts = call('ZRANGE', tkey, 0, -1, 'WITHSCORES')
    local renamed = {}
    for i = 1, #cs, 2 do renamed[cs[i]] = tonumber(cs[i + 1]) - base end
    call('DEL', tkey, ckey)
    local args = {}
    for i = 1, #cs, 2 do
      local v = renamed[cs[i]]
      args[#args + 1] = v
      args[#args + 1] = v
      if #args >= 4000 or i + 2 > #cs then
        call('ZADD', ckey, unpack(args))
        args = {}
      end
    end
    for i = 1, #ts, 2 do
      args[#args + 1] = ts[i + 1]
      args[#args + 1] = renamed[ts[i]]
      if #args >= 4000 or i + 2 > #ts then
        call('ZADD', tkey, unpack(args))
        args = {}
      end
    end
    top = top - base
  end
  local id = top + cost
  local cum = id
  if newest ~= nil and now < newest then
    local later = call('ZRANGEBYSCORE', tkey, fmt('(%d', now), '+inf')
    for i = 1, #later do
      call('ZINCRBY', ckey, cost, later[i])
    end
    local k = call('ZCOUNT', tkey, '-inf', fmt('%d', now))
    cum = tonumber(call('ZRANGE', ckey, k, k, 'WITHSCORES')[2] or 0) + cost
  end
  local sid = fmt('%d', id)
  call('ZADD', tkey, fmt('%d', now), sid)
  if had then
    call('ZADD', ckey, fmt('%d', cum), sid)
  else
    call('ZADD', ckey, 0, 0, fmt('%d', cum), sid)
  end
  call('PEXPIRE', tkey, ms)
  call('PEXPIRE', ckey, ms)
end

local function tb(key, need, refill, full, unit)
  local delta, rho = 0, 0
  local v = call('GET', key)
  if v then
    local tat = tonumber(v)
    if not tat then
      local i = find(v, ':', 1, true)
      tat, rho = tonumber(sub(v, 1, i - 1)), tonumber(sub(v, i + 1))
      if rho > refill - 1 then rho = refill - 1 end
    end
    if tat > now or (tat == now and rho > 0) then delta = tat - now else rho = 0 end
  end
  local room = full - need
  if rho <= room and delta <= (room - rho - fmod(room - rho, refill)) / refill then
    local d = delta * refill + rho + need
    local rem = fmod(d, refill)
    local whole = (d - rem) / refill
    local reset = whole
    if rem > 0 then reset = whole + 1 end
    local value
    if rem == 0 then value = fmt('%d', now + whole) else value = fmt('%d:%d', now + whole, rem) end
    local level = full - d
    return 1, (level - fmod(level, unit)) / unit, reset, -1, value, expiry(reset)
  end
  local level = 0
  if rho <= full and delta <= (full - rho - fmod(full - rho, refill)) / refill then
    level = full - delta * refill - rho
  end
  local reset = delta
  if rho > 0 then reset = delta + 1 end
  local x = rho + need - full
  local q = (x - fmod(x, refill)) / refill
  if fmod(x, refill) > 0 then q = q + 1 end
  return 0, (level - fmod(level, unit)) / unit, reset, delta + q
end

-- Phase 1: decide every quota, write nothing.
local out, writes, costs, limits = {}, {}, {}, {}
local admitted = true
local a = 4
for i = 1, #KEYS do
  local kind, shadow = ARGV[a], ARGV[a + 1]
  local x, y, z = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local ok, remaining, reset, retry, value, ms
  if kind == '4' then
    local unit = tonumber(ARGV[a + 5])
    a = a + 6
    ok, remaining, reset, retry, value, ms = tb(KEYS[i], x, y, z, unit)
    costs[i], limits[i] = x / unit, z / unit
  else
    a = a + 5
    if kind == '1' then
      ok, remaining, reset, retry, value, ms = fw(KEYS[i], x, y, z)
    elseif kind == '2' then
      ok, remaining, reset, retry, value, ms = sw(KEYS[i], x, y, z)
    else
      ok, remaining, reset, retry, value, ms = sl(KEYS[i], x, y, z)
    end
    costs[i], limits[i] = x, y
  end
  if ok == 1 then
    writes[i] = {value, ms}
  elseif shadow == '0' then
    admitted = false
  end
  local o = 4 * (i - 1)
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = ok, remaining, reset, retry
end

-- Phase 2: write, only if admitted; else report the uncharged remaining.
for i = 1, #KEYS do
  local w = writes[i]
  if w then
    if admitted then
      if type(w[1]) == 'table' then
        sl_write(w[1], w[2])
      else
        call('SET', KEYS[i], w[1], 'PX', w[2])
      end
    else
      local o = 4 * (i - 1) + 2
      local r = out[o] + costs[i]
      if r > limits[i] then r = limits[i] end
      out[o] = r
    end
  end
end
out[#out + 1] = st
return out
