-- ARGV: B, job, queue ('' = leave as recorded). Returns {last_slot or '', paused, queue or ''}.
local now = now_ms()
local k = B .. 'job:' .. ARGV[2]
if redis.call('EXISTS', k) == 0 then
  redis.call('HSET', k, 'last_slot', fmt(now), 'paused', '0')
end
if ARGV[3] ~= '' then redis.call('HSET', k, 'queue', ARGV[3]) end
local h = redis.call('HMGET', k, 'last_slot', 'paused', 'queue')
return {h[1] or '', h[2] or '0', h[3] or ''}
