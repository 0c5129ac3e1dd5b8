    end
    if ok == 1 then
      -- The expiry: the reset rounded up to whole ms, plus one, at least
      -- the minimum.
      local ms = reset % 1000
      if ms > 0 then ms = (reset - ms) / 1000 + 2 else ms = reset / 1000 + 1 end
      if ms < min_ms then ms = min_ms end
      if ms ~= last_ms then last_ms, last_mss = ms, fmt('%d', ms) end
    end
    if cnt == 1 and kind ~= '3' then
      -- A request of one quota kept as a string (the common request):
      -- answered here, as the two passes below would, without their
      -- per-quota tables.
      lone = true
      -- The expiry test of the second pass below (`admitted and late ...`;
      -- one quota: admitted is `ok == 1 or shadow ~= '0'`), made here
      -- because this request is answered in this pass.
      if (ok == 1 or shadow ~= '0') and late and rdl > '0' and st > rdl + 0 then
        -- Past its deadline: expired, nothing written.
        o = o + 1
        out[o] = -1
      elseif ok == 1 then
        call('PSETEX', key, last_mss, wv)
        if written then written[key] = wv end
        if kind == '4' then
          -- An admitting token bucket: one integer, as below.
          o = o + 1
          out[o] = remaining - z - 2
        else
          out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 1, remaining, reset, retry
          o = o + 4
        end
      else
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] = 0, remaining, reset, retry
        o = o + 4
      end
    else
      if ok == 1 then
        mss[i] = last_mss
        -- If another quota denies the request: the remaining without it.
        local r = remaining + cost
        if r > limit then r = limit end
        adj[i] = r
      else
        wv = nil
        if shadow == '0' then admitted = false end
      end
      wvs[i], xs[i], kinds[i] = wv, x, kind
      r1[i], r2[i], r3[i], r4[i] = ok, remaining, reset, retry
    end
  end
  -- A deadline ("0": none) is read only when it can matter: the request
  -- writes, and TIME is past the call's earliest deadline.
  if lone then
    lone = false
  elseif admitted and late and rdl > '0' and st > rdl + 0 then
    -- Past its deadline: expired, nothing written.
    o = o + 1
    out[o] = -1
  else
    for i = 1, cnt do
      local wv = wvs[i]
      if wv == nil then
        -- This quota denies (a shadow one, or the request is denied).
      elseif not admitted then
        r2[i] = adj[i]
      elseif kinds[i] == '3' then
        local key, ms, x = KEYS[ki + i], mss[i], xs[i]
