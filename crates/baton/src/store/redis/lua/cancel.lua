-- The one decision of `task_cancel` (crates/baton/src/store/job_advance.rs,
-- `task_cancel`), which the SQL backends run over a transaction, mirrored
-- step for step: a script is atomic, so Redis needs no row locks. A
-- change to the decision is made there and here together; every birth
-- and transition is a row of `store::state::TRANSITIONS`.
-- ARGV: B, id. Returns {outcome, state}.
local now = now_ms()
local sid = ARGV[2]
local h = redis.call('HMGET', tkey(sid), 'state', 'queue', 'unique_key', 'unique_forever', 'job',
  'concurrency_key')
if not h[1] then return {'notfound', ''} end
if h[1] == 'pending' then
  local p = pad(sid)
  ready_del(p, h[6])
  redis.call('ZREM', qkey(h[2], 'sched'), p)
  if h[6] then redis.call('ZREM', B .. 'kpark:' .. h[6], p) end
  terminal(sid, h[2], 'pending', 'cancelled', now, h[3], h[4], h[5])
  return {'cancelled', ''}
elseif h[1] == 'running' then
  redis.call('HSET', tkey(sid), 'cancel_requested', '1')
  return {'requested', ''}
end
return {'finished', h[1]}
