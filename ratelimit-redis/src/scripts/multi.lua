-- Several quotas, all or nothing. Mirrors ratelimit-core/src/model/all.rs,
-- each quota by the arithmetic of its single script (fixed_window.lua,
-- sliding_window.lua, sliding_log.lua, token_bucket.lua).
-- KEYS[i]  quota i's key (a sliding log also uses KEYS[i] .. ':c')
-- ARGV[1]  now in µs since the epoch, or "" to read the server's TIME
-- ARGV[2]  minimum expiry in ms (0 with the server clock)
-- ARGV[3]  deadline in the server's µs (TIME), or 0 for none; -(deadline + 1)
--          to also return TIME (-1: no deadline, return TIME)
-- then, per quota, in KEYS order:
--   kind (1 fixed window, 2 sliding window, 3 sliding log, 4 token bucket),
--   shadow (0 or 1), then the single script's ARGV[4..]: cost, limit,
--   window µs; or need = cost * unit, refill, full, unit for a bucket.
-- Returns 4 integers per quota, in order: {allowed, remaining,
-- reset_after_us, retry_after_us or -1}, that quota's own decision, then
-- the server's µs if asked; or {-1, server µs} when past the deadline.
--
-- Two phases. First every quota is decided from its stored state, writing
-- nothing; the call is admitted iff every enforced (non-shadow) quota
-- admits it. Then, only if it is admitted, every quota that admits it is
-- written, as its single script would (a shadow quota that denies is not).
-- A denied call writes nothing; a quota that admits it reports its
-- remaining without this call (remaining + cost, at most the limit).
-- All keys of one call share the caller's hash tag: one cluster slot.
-- The server's TIME is read for "now" and for the deadline (ARGV[3]),
-- which is checked only before writing: a call that would write after it
-- returns "expired" ({-1, TIME}) and writes nothing; a denial writes nothing
-- anyway and is answered as usual. A negative ARGV[3], -(deadline + 1),
-- also asks for TIME at the end of the reply (tail; nil ends the reply
-- before it).
local now, st, dl, tail = ARGV[1], -1, ARGV[3], nil
if dl < '0' then tail = true end
if now == '' or dl ~= '0' then
  local t = redis.call('TIME')
  st = t[1] * 1000000 + t[2]
  if tail then tail = st end
end
if now == '' then now = st else now = tonumber(now) end
local min_ms = tonumber(ARGV[2])
local fmod, fmt, find, sub = math.fmod, string.format, string.find, string.sub
local call = redis.call

-- No functions: each would be a new closure on every call. Each quota's
-- arithmetic is inline below, as in its single script; what to write if
-- it admits is kept per quota (wv: the value of one SET, or for a sliding
-- log a table of what its write needs; wm: the expiry in ms), with adj the
-- remaining it reports if the call is denied by another quota.
local out, wv, wm, adj = {}, {}, {}, {}
local admitted = true
local a = 4
for i = 1, #KEYS do
  local key, kind, shadow = KEYS[i], ARGV[a], ARGV[a + 1]
  local x, y, z = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local ok, remaining, reset, retry, cost, limit = 0, 0, 0, -1, x, y
  if kind == '4' then
    -- Token bucket (token_bucket.lua): x = need, y = refill, z = full.
    local unit = tonumber(ARGV[a + 5])
    a = a + 6
    cost, limit = x / unit, z / unit
    local need, refill, full = x, y, z
    local delta, rho = 0, 0
    local v = call('GET', key)
    if v then
      local tat = tonumber(v)
      if not tat then
        local j = find(v, ':', 1, true)
        tat, rho = tonumber(sub(v, 1, j - 1)), tonumber(sub(v, j + 1))
        if rho > refill - 1 then rho = refill - 1 end
      end
      if tat > now or (tat == now and rho > 0) then delta = tat - now else rho = 0 end
    end
    local room = full - need
    if rho <= room and delta <= (room - rho - fmod(room - rho, refill)) / refill then
      local d = delta * refill + rho + need
      local rem = fmod(d, refill)
      local whole = (d - rem) / refill
      reset = whole
      if rem > 0 then reset = whole + 1 end
      if rem == 0 then wv[i] = fmt('%d', now + whole) else wv[i] = fmt('%d:%d', now + whole, rem) end
      local level = full - d
      ok, remaining = 1, (level - fmod(level, unit)) / unit
    else
      local level = 0
      if rho <= full and delta <= (full - rho - fmod(full - rho, refill)) / refill then
        level = full - delta * refill - rho
      end
      reset = delta
      if rho > 0 then reset = delta + 1 end
      local w = rho + need - full
      local q = (w - fmod(w, refill)) / refill
      if fmod(w, refill) > 0 then q = q + 1 end
      remaining, retry = (level - fmod(level, unit)) / unit, delta + q
    end
  elseif kind == '1' then
    -- Fixed window (fixed_window.lua): x = cost, y = limit, z = window.
    a = a + 5
    local width = z
    local idx = (now - fmod(now, width)) / width
    local count = 0
    local v = call('GET', key)
    if v then
      local j = find(v, ':', 1, true)
      if j and tonumber(sub(v, 1, j - 1)) == idx then count = tonumber(sub(v, j + 1)) end
    end
    reset = (idx + 1) * width - now
    if count + cost <= limit then
      count = count + cost
      ok, remaining = 1, limit - count
      wv[i] = fmt('%d:%d', idx, count)
    else
      if limit > count then remaining = limit - count end
      retry = reset
    end
  elseif kind == '2' then
    -- Sliding window counter (sliding_window.lua): x = cost, y = limit,
    -- z = window.
    a = a + 5
    local width = z
    local e = fmod(now, width)
    local idx = (now - e) / width
    local prev, curr = 0, 0
    local v = call('GET', key)
    if v then
      local j = find(v, ':', 1, true)
      local k = j and find(v, ':', j + 1, true)
      if k then
        local w = tonumber(sub(v, 1, j - 1))
        if w == idx then
          prev, curr = tonumber(sub(v, j + 1, k - 1)), tonumber(sub(v, k + 1))
        elseif w + 1 == idx then
          prev = tonumber(sub(v, k + 1))
        end
      end
    end
    if prev > limit then prev = limit end
    if curr > limit then curr = limit end
    local weighted = prev * (width - e)
    local allowed = curr + cost <= limit and weighted <= (limit - curr - cost) * width
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
    if limit * width > used then
      local r = limit * width - used
      remaining = (r - fmod(r, width)) / width
    end
    if curr > 0 then
      reset = 2 * width - e
    elseif prev > 0 then
      reset = width - e
    end
    if allowed then
      ok = 1
      wv[i] = fmt('%d:%d:%d', idx, prev, curr)
    end
  else
    -- Sliding log (sliding_log.lua): x = cost, y = limit, z = window.
    a = a + 5
    local width = z
    local ckey = key .. ':c'
    local edge = now - width
    local g = call('ZCOUNT', key, '-inf', fmt('%d', edge))
    local base, top, newest = 0, 0, nil
    local b = call('ZRANGE', ckey, g, g, 'WITHSCORES')
    if b[2] then base = tonumber(b[2]) end
    local m = call('ZRANGE', ckey, -1, -1, 'WITHSCORES')
    if m[2] then top = tonumber(m[2]) end
    local n = call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if n[2] then newest = tonumber(n[2]) end
    local total = top - base
    if total + cost <= limit then
      local last = newest
      if last == nil or now >= last then last = now end
      if limit > total + cost then remaining = limit - total - cost end
      ok, reset = 1, last + width - now
      wv[i] = {ckey, edge, g, base, top, newest, m[2] ~= nil}
    else
      local first = call('ZRANGEBYSCORE', ckey, fmt('%d', top + cost - limit), '+inf', 'LIMIT', 0, 1)
      local t = tonumber(call('ZSCORE', key, first[1]))
      if limit > total then remaining = limit - total end
      reset, retry = newest + width - now, t + width - now
    end
  end
  if ok == 1 then
    -- The expiry: the reset rounded up to whole ms, plus one, at least
    -- min_ms.
    local ms = fmod(reset, 1000)
    if ms > 0 then ms = (reset - ms) / 1000 + 2 else ms = reset / 1000 + 1 end
    if ms < min_ms then ms = min_ms end
    wm[i] = fmt('%d', ms)
    -- If another quota denies the call: the remaining without it.
    local r = remaining + cost
    if r > limit then r = limit end
    adj[i] = r
  elseif shadow == '0' then
    admitted = false
  end
  local o = 4 * (i - 1)
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = ok, remaining, reset, retry
end

-- Past the deadline, an admitted call is not written: "expired".
if admitted then
  local deadline = tonumber(dl)
  if deadline < 0 then deadline = -1 - deadline end
  if deadline > 0 and st > deadline then return {-1, st} end
end

-- Phase 2: write, only if admitted; else report the uncharged remaining.
local a2 = 4
for i = 1, #KEYS do
  local v = wv[i]
  local kind = ARGV[a2]
  if kind == '4' then a2 = a2 + 6 else a2 = a2 + 5 end
  if v == nil then
    -- This quota denies (a shadow one, or the call is denied): no write.
  elseif not admitted then
    out[4 * (i - 1) + 2] = adj[i]
  elseif type(v) == 'string' then
    call('SET', KEYS[i], v, 'PX', wm[i])
  else
    -- A sliding log's admission, as sliding_log.lua writes it.
    local tkey, ms, cost = KEYS[i], wm[i], tonumber(ARGV[a2 - 3])
    local ckey, edge, g, base, top, newest, had = v[1], v[2], v[3], v[4], v[5], v[6], v[7]
    if g > 0 then
      call('ZREMRANGEBYSCORE', tkey, '-inf', fmt('%d', edge))
      call('ZREMRANGEBYRANK', ckey, 0, g - 1)
    end
    if top + cost > 4503599627370496 then
      local cs = call('ZRANGE', ckey, 0, -1, 'WITHSCORES')
      local ts = call('ZRANGE', tkey, 0, -1, 'WITHSCORES')
      local renamed = {}
      for j = 1, #cs, 2 do renamed[cs[j]] = tonumber(cs[j + 1]) - base end
      call('DEL', tkey, ckey)
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
      for j = 1, #later do
        call('ZINCRBY', ckey, cost, later[j])
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
end
out[#out + 1] = tail
return out
