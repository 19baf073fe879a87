-- KEYS: lock. ARGV: token, at_least ms.
local h = redis.call('HMGET', KEYS[1], 'token', 'locked_at', 'lock_until')
if h[1] ~= ARGV[1] or (not h[3]) or tonumber(h[3]) <= now then return 0 end
local lu = tonumber(h[2]) + tonumber(ARGV[2])
if lu < now then lu = now end
redis.call('HSET', KEYS[1], 'lock_until', fmt(lu))
return 1
