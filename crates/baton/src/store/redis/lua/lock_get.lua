-- KEYS: locks. Returns {now, then holder, token, locked_at, lock_until per key ('' when absent,
-- or when the key holds a value baton did not write)}.
local out = {fmt(now)}
for _, k in ipairs(KEYS) do
  local h = redis.pcall('HMGET', k, 'holder', 'token', 'locked_at', 'lock_until')
  if not ours(h) then h = {false, false, false, false} end
  for j = 1, 4 do out[#out + 1] = h[j] or '' end
end
return out
