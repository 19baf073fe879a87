-- The one decision of `job_release` (crates/baton/src/store/job_advance.rs,
-- `job_release`), mirrored: the job's earliest waiting slot task (pending,
-- run_at at the waiting mark) becomes due now once no other run of the job
-- is pending or running. ARGV: B, job, the waiting run_at ms. Returns the
-- released id or ''.
local now = now_ms()
local akey = B .. 'jobactive:' .. ARGV[2]
local W = tonumber(ARGV[3])
local first = nil
for _, sid in ipairs(redis.call('SMEMBERS', akey)) do
  local t = redis.call('HMGET', tkey(sid), 'state', 'run_at')
  if t[1] == 'pending' and tonumber(t[2]) >= W then
    if (not first) or tonumber(sid) < tonumber(first) then first = sid end
  elseif t[1] == 'pending' or t[1] == 'running' then
    return ''
  else
    redis.call('SREM', akey, sid)
  end
end
if not first then return '' end
local h = redis.call('HMGET', tkey(first), 'queue', 'priority', 'concurrency_key')
local p = pad(first)
redis.call('HSET', tkey(first), 'run_at', fmt(now))
redis.call('ZREM', qkey(h[1], 'sched'), p)
ready_add(rscore(tonumber(h[2]), now), p, h[3])
redis.call('PUBLISH', WAKE, h[1])
return first
