-- Schema upgrades of lock keys, one key per call; a key is touched only
-- when it is baton's by shape (a hash of exactly holder, token, locked_at
-- and lock_until, the last three integers): any other key is left as it
-- is, value and TTL. The moves between key forms are done by the caller,
-- key by key (on a cluster the forms hash to different slots).
-- KEYS: a lock key. ARGV: op ('persist': remove its TTL, or 'read').
-- Returns {1, holder, token, locked_at, lock_until} when the key is
-- baton's, {0} otherwise.
local h = redis.pcall('HMGET', KEYS[1], 'holder', 'token', 'locked_at', 'lock_until')
if not (ours(h) and redis.call('HLEN', KEYS[1]) == 4) then return {0} end
if ARGV[1] == 'persist' then redis.call('PERSIST', KEYS[1]) end
return {1, h[1], h[2], h[3], h[4]}
