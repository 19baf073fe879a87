-- ARGV: B, job, paused (0/1).
local k = B .. 'job:' .. ARGV[2]
if redis.call('EXISTS', k) == 0 then return 0 end
redis.call('HSET', k, 'paused', ARGV[3])
return 1
