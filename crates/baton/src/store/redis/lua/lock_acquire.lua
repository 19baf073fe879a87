-- KEYS: lock. ARGV: holder, at_most ms.
local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'locked_at', 'lock_until')
if h[4] and tonumber(h[4]) > now then
  return {'0', h[1] or '', h[2] or '0', h[3] or '0', h[4], fmt(now)}
end
local token = tonumber(h[2] or '0') + 1
if now_us > token then token = now_us end
local lu = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', fmt(token), 'locked_at', fmt(now), 'lock_until', fmt(lu))
-- The record keeps the last token forever: no TTL (a key of schema 1 had one).
redis.call('PERSIST', KEYS[1])
return {'1', fmt(token), fmt(now), fmt(lu)}
