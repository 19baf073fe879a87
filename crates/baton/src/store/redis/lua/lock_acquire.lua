-- KEYS: lock. ARGV: holder, at_most ms.
-- Returns {1, token, locked_at, lock_until} or
-- {0, holder, token, locked_at, lock_until, now} (integers but the holder).
local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'locked_at', 'lock_until')
if h[4] and tonumber(h[4]) > now then
  return {0, h[1] or '', tonumber(h[2] or '0'), tonumber(h[3] or '0'), tonumber(h[4]), now}
end
-- The token: one above the last, and at least the server's clock in
-- microseconds, so it grows even over a record that was lost.
local token = now_s * 1000000 + now_frac
local last = tonumber(h[2] or '0')
if last >= token then token = last + 1 end
local lu = now + tonumber(ARGV[2])
-- The record keeps the last token forever: no TTL (schema step 1 -> 2
-- removed the TTL of older records).
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', fmt(token), 'locked_at', fmt(now), 'lock_until', fmt(lu))
return {1, token, now, lu}
