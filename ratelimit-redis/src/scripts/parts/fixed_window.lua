-- Fixed window: decide. Mirrors ratelimit-core/src/model/fixed_window.rs.
-- State: the string `window:count`. In: key, now; x = cost, y = limit,
-- z = window in µs; v = the stored string (false: none), read by the
-- script around this part. A state of any other window is a fresh one.
cost, limit = x, y
local idx = (now - now % z) / z
local count = 0
if v then
  local j = find(v, ':', 1, true)
  if j and tonumber(sub(v, 1, j - 1)) == idx then count = tonumber(sub(v, j + 1)) end
end
reset = (idx + 1) * z - now
if count + x <= y then
  count = count + x
  ok, remaining = 1, y - count
  wv = fmt('%d:%d', idx, count)
else
  -- Denied: nothing is written (the model's state is the stored one).
  if y > count then remaining = y - count end
  retry = reset
end
