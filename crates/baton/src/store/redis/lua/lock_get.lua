-- KEYS: locks. Returns {now, then holder, token, locked_at, lock_until per key ('' when absent)}.
local out = {fmt(now)}
for _, k in ipairs(KEYS) do
  local h = {false, false, false, false}
  if redis.call('TYPE', k).ok == 'hash' then
    h = redis.call('HMGET', k, 'holder', 'token', 'locked_at', 'lock_until')
  end
  for j = 1, 4 do out[#out + 1] = h[j] or '' end
end
return out
