-- The one decision of `job_advance` (crates/baton/src/store/job_advance.rs,
-- `job_advance`), which the SQL backends run over a transaction, mirrored
-- step for step: a script is atomic, so Redis needs no row locks. A
-- change to the decision is made there and here together; every birth
-- and transition is a row of `store::state::TRANSITIONS`.
-- ARGV: B, job, expected or '', slot, overlap (f/a), skip reason, record
-- (e enqueue / r run / s skip), lease ms, worker, batch_after or '',
-- due_only (0/1), until or '', has task (0/1), not_before or '' (an early
-- take), the id reserved for the task (`ids.lua`; '' without a task),
-- then NF task args. B is the job's queue's base: the job's keys live
-- with its queue's, so the slot and its task are one script on one shard.
local now = now_ms()
local job = ARGV[2]
local k = B .. 'job:' .. job
if redis.call('EXISTS', k) == 0 then return {'unknown', '', 0} end
local h = redis.call('HMGET', k, 'last_slot', 'paused')
if h[2] == '1' then return {'paused', '', 0} end
local cur = h[1] or ''
if cur ~= ARGV[3] then return {'moved', cur, 0} end
local slot = tonumber(ARGV[4])
local nb = tonumber(ARGV[14])
if (ARGV[11] == '1' and slot > now) or (ARGV[12] ~= '' and now >= tonumber(ARGV[12]))
  or (nb and now < nb) then
  return {'notdue', fmt(now), 0}
end
local rec = ARGV[7]
-- Overlap = forbid: is an earlier run of the job unfinished?
local busy = false
if ARGV[13] == '1' and rec == 'e' and ARGV[5] == 'f' then
  local akey = B .. 'jobactive:' .. job
  local after = tonumber(ARGV[10])
  for _, sid in ipairs(redis.call('SMEMBERS', akey)) do
    local t = redis.call('HMGET', tkey(sid), 'state', 'slot', 'created_at')
    if t[1] == 'pending' or t[1] == 'running' then
      -- Tasks of the same catch-up batch (slot after ARGV[10]) do not
      -- count, nor tasks created once this slot was due (the same catch-up
      -- by the store's clock).
      if ((not after) or (not t[2]) or tonumber(t[2]) <= after)
        and ((not t[3]) or tonumber(t[3]) < slot) then busy = true end
    else
      redis.call('SREM', akey, sid)
    end
  end
end
-- An early take (before the slot) with the previous run unfinished: the
-- overlap rule is judged at the slot, so nothing is recorded now.
if busy and nb and now < slot then return {'notdue', fmt(now), 0} end
redis.call('HSET', k, 'last_slot', ARGV[4])
if ARGV[13] ~= '1' then return {'enqueued', '0', 0} end
next_free = tonumber(ARGV[15])
local T = 16
-- The slot's own run may exist already (a trigger made it): that run is
-- this slot's, not a previous one, so it is returned, never "skipped".
local uk = opt(ARGV[T + 8])
local held = uk and redis.call('GET', B .. 'uniq:' .. uk)
if held and redis.call('EXISTS', tkey(held)) == 1 then
  return {'enqueued', held, 0}
end
-- A pruned slot: its tombstone keeps the key (never run again).
local pruned = uk and redis.call('HGET', B .. 'slot:' .. uk, 'task_id')
if pruned then return {'enqueued', pruned, 0} end
local skip = rec == 's' or busy
if skip then
  local id = insert(now, T, ARGV[6])
  flush()
  return {'skipped', fmt(id), 1}
end
local id, ins, due, run_at = insert(now, T, nil)
flush()
if rec == 'r' and ins == 1 then
  local sid = fmt(id)
  local p = pad(sid)
  local queue = ARGV[T]
  local lu = now + tonumber(ARGV[8])
  redis.call('ZREM', qkey(queue, 'ready'), p)
  redis.call('ZREM', qkey(queue, 'sched'), p)
  redis.call('HSET', tkey(sid), 'state', 'running', 'attempt', '1', 'started_at', fmt(now),
    'lease_until', fmt(lu), 'worker', ARGV[9], 'claim_token', '1')
  redis.call('ZADD', B .. 'running', lu, p)
  key_claimed(redis.call('HGET', tkey(sid), 'concurrency_key'))
  count(queue, 'pending', -1)
  count(queue, 'running', 1)
  return {'enqueued', sid, 1}
end
if ins == 1 and due == 1 then redis.call('PUBLISH', WAKE, ARGV[T]) end
if ins == 1 and due == 0 then wake_at(ARGV[T], run_at) end
return {'enqueued', fmt(id), ins}
