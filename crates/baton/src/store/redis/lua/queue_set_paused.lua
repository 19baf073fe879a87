-- ARGV: B, queue, paused (0/1), has note (0/1), note, has by (0/1), by.
-- Sets or clears the queue's flag `B paused` (read by claim.lua) and
-- records the change in the hash `B pause` (note and author, removed when
-- not given, and the store's now; read by stats.lua); a resume announces
-- the queue. (The index set `P{baton}:paused`, which lists paused queues,
-- is written by the caller.)
if ARGV[3] == '1' then
  redis.call('SET', B .. 'paused', '1')
else
  redis.call('DEL', B .. 'paused')
end
local k = B .. 'pause'
redis.call('HSET', k, 'at', fmt(now_ms()))
if ARGV[4] == '1' then redis.call('HSET', k, 'note', ARGV[5])
else redis.call('HDEL', k, 'note') end
if ARGV[6] == '1' then redis.call('HSET', k, 'by', ARGV[7])
else redis.call('HDEL', k, 'by') end
if ARGV[3] ~= '1' then redis.call('PUBLISH', WAKE, ARGV[2]) end
return 1
