-- KEYS: lock. ARGV: token, within ms. An operator's force-release: the
-- token is bumped (the holder's extensions and release are refused from
-- now on; the next grant's token is still higher), the holder marked
-- `revoked:`, and the lease ends at min(lock_until, now + within).
-- Returns the new lock_until, or 0 when the lock was not held by this
-- token any more.
local h = redis.call('HMGET', KEYS[1], 'token', 'lock_until', 'holder')
if h[1] ~= ARGV[1] or (not h[2]) or tonumber(h[2]) <= now then return 0 end
local lu = now + tonumber(ARGV[2])
if tonumber(h[2]) < lu then lu = tonumber(h[2]) end
redis.call('HSET', KEYS[1], 'token', fmt(tonumber(h[1]) + 1), 'holder', 'revoked:' .. (h[3] or ''), 'lock_until', fmt(lu))
return lu
