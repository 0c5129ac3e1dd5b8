if ok == 1 then
  local deadline = dl + 0
  if deadline < 0 then deadline = -1 - deadline end
  if deadline > 0 and st > deadline then return {-1, st} end
  -- The expiry: the reset rounded up to whole ms, plus one (the server's
  -- expiry clock counts whole ms); at least the minimum.
  local ms = reset % 1000
  if ms > 0 then ms = (reset - ms) / 1000 + 2 else ms = reset / 1000 + 1 end
  if ms < min_ms then ms = min_ms end
  ms = fmt('%d', ms)
