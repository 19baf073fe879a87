-- ARGV: B, job. Returns {last_slot or '', paused}.
local now = now_ms()
local k = B .. 'job:' .. ARGV[2]
if redis.call('EXISTS', k) == 0 then
  redis.call('HSET', k, 'last_slot', fmt(now), 'paused', '0')
  redis.call('SADD', B .. 'jobs', ARGV[2])
end
local h = redis.call('HMGET', k, 'last_slot', 'paused')
return {h[1] or '', h[2] or '0'}
