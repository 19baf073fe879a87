-- ARGV: B, job, queue ('' = leave as recorded), overlap ('' = leave as
-- recorded), fingerprint ('' = leave as recorded). Returns the job's fields as job_list.lua does (without the
-- name).
local now = now_ms()
local k = B .. 'job:' .. ARGV[2]
if redis.call('EXISTS', k) == 0 then
  redis.call('HSET', k, 'last_slot', fmt(now), 'paused', '0')
end
if ARGV[3] ~= '' then redis.call('HSET', k, 'queue', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', k, 'overlap', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', k, 'fingerprint', ARGV[5]) end
return redis.call('HMGET', k, 'last_slot', 'paused', 'queue', 'overlap', 'pause_note',
  'pause_by', 'pause_at', 'fingerprint')
