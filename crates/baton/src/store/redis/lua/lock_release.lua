-- KEYS: lock. ARGV: token, at_least ms. Returns 1, or 0 when the lock was
-- not held by this token any more (or the key holds a value baton did not
-- write: it is left alone).
local h = redis.pcall('HMGET', KEYS[1], 'token', 'lock_until', 'locked_at')
if h.err or h[1] ~= ARGV[1] or (not tonumber(h[2])) or tonumber(h[2]) <= now then return 0 end
local lu = now
if ARGV[2] ~= '0' and tonumber(h[3]) then
  local least = tonumber(h[3]) + tonumber(ARGV[2])
  if least > lu then lu = least end
end
redis.call('HSET', KEYS[1], 'lock_until', fmt(lu))
return 1
