-- ARGV: B, job, paused (0/1), has note (0/1), note, has by (0/1), by.
-- Sets the flag and records the change: its note and author (removed
-- when not given) and the store's now.
local k = B .. 'job:' .. ARGV[2]
if redis.call('EXISTS', k) == 0 then return 0 end
redis.call('HSET', k, 'paused', ARGV[3], 'pause_at', fmt(now_ms()))
if ARGV[4] == '1' then redis.call('HSET', k, 'pause_note', ARGV[5])
else redis.call('HDEL', k, 'pause_note') end
if ARGV[6] == '1' then redis.call('HSET', k, 'pause_by', ARGV[7])
else redis.call('HDEL', k, 'pause_by') end
return 1
