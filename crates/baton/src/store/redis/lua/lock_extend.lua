-- KEYS: lock. ARGV: token, at_most ms. Returns the new lock_until, or 0
-- when the lock was not held by this token any more (or the key holds a
-- value baton did not write: it is left alone).
local h = redis.pcall('HMGET', KEYS[1], 'token', 'lock_until')
if h.err or h[1] ~= ARGV[1] or (not tonumber(h[2])) or tonumber(h[2]) <= now then return 0 end
local lu = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lock_until', fmt(lu))
return lu
