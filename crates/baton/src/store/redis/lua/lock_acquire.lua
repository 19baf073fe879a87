-- KEYS: lock. ARGV: holder, at_most ms.
-- Returns {1, token, locked_at, lock_until},
-- {0, holder, token, locked_at, lock_until, now} (integers but the holder),
-- or {2, type, pttl, now} when the key holds a value baton did not write
-- (another type, or a hash without baton's fields): held by something
-- else, and left as it is.
local h = redis.pcall('HMGET', KEYS[1], 'holder', 'token', 'locked_at', 'lock_until')
local last = 0
if ours(h) then
  if tonumber(h[4]) > now then
    return {0, h[1], tonumber(h[2]), tonumber(h[3]), tonumber(h[4]), now}
  end
  last = tonumber(h[2])
elseif h.err or redis.call('EXISTS', KEYS[1]) == 1 then
  return {2, redis.call('TYPE', KEYS[1]).ok, redis.call('PTTL', KEYS[1]), now}
end
-- The token: one above the last, and at least the server's clock in
-- microseconds, so it grows even over a record that was lost.
local token = now_s * 1000000 + now_frac
if last >= token then token = last + 1 end
local lu = now + tonumber(ARGV[2])
-- The record keeps the last token forever: no TTL (schema step 1 -> 2
-- removed the TTL of older records).
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', fmt(token), 'locked_at', fmt(now), 'lock_until', fmt(lu))
return {1, token, now, lu}
