    end
    if ok == 1 then
      -- The expiry: the reset rounded up to whole ms, plus one, at least
      -- the minimum.
      local ms = fmod(reset, 1000)
      if ms > 0 then ms = (reset - ms) / 1000 + 2 else ms = reset / 1000 + 1 end
      if ms < min_ms then ms = min_ms end
      mss[i], wvs[i] = fmt('%d', ms), wv
      -- If another quota denies the request: the remaining without it.
      local r = remaining + cost
      if r > limit then r = limit end
      adj[i] = r
    elseif shadow == '0' then
      admitted = false
    end
    xs[i], kinds[i] = x, kind
    res[i] = {ok, remaining, reset, retry}
  end
  if admitted and rdl > 0 and st > rdl then
    -- Past its deadline: expired, nothing written.
    out[#out + 1] = -1
  else
    out[#out + 1] = 1
    for i = 1, cnt do
      local r = res[i]
      local wv = wvs[i]
      if wv == nil then
        -- This quota denies (a shadow one, or the request is denied).
      elseif not admitted then
        r[2] = adj[i]
      elseif kinds[i] == '3' then
        local key, ms, x = KEYS[ki + i], mss[i], xs[i]
