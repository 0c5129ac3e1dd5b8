-- Sliding window counter: decide. Mirrors
-- ratelimit-core/src/model/sliding_window.rs. State: the string
-- `window:prev:curr`. In: key, now; x = cost, y = limit, z = window in µs;
-- v = the stored string (false: none), read by the script around this part.
cost, limit = x, y
local e = now % z
local idx = (now - e) / z
local prev, curr = 0, 0
if v then
  local j = find(v, ':', 1, true)
  local k = j and find(v, ':', j + 1, true)
  if k then
    local w = tonumber(sub(v, 1, j - 1))
    if w == idx then
      prev, curr = tonumber(sub(v, j + 1, k - 1)), tonumber(sub(v, k + 1))
    elseif w + 1 == idx then
      -- Rolled on read: the stored window's count is now the previous one.
      prev = tonumber(sub(v, k + 1))
    end
    -- Any other window (older, or later after a clock went back): fresh.
  end
end
-- Counters above the limit (the policy's limit was lowered under the same
-- name) count as the limit, so every product stays within limit * W.
if prev > y then prev = y end
if curr > y then curr = y end
local weighted = prev * (z - e)
local allowed = curr + x <= y and weighted <= (y - curr - x) * z
if allowed then
  curr = curr + x
elseif curr + x <= y then
  -- Admissible later in this window, once the previous window's weight has
  -- shrunk: the first e' with prev * (W - e') <= a * W. prev > 0 here.
  local aw = (y - curr - x) * z
  retry = z - (aw - aw % prev) / prev - e
else
  -- Only in the next window, where prev' = curr > 0 and curr' = 0.
  local aw = (y - x) * z
  retry = 2 * z - e - (aw - aw % curr) / curr
end
local used = weighted + curr * z
if y * z > used then
  local r = y * z - used
  remaining = (r - r % z) / z
end
if curr > 0 then
  reset = 2 * z - e
elseif prev > 0 then
  reset = z - e
end
if allowed then
  ok = 1
  wv = fmt('%d:%d:%d', idx, prev, curr)
end
-- Denied: nothing is written. The stored state is the model's (the roll
-- into a new window is computed on read).
