-- The one decision of `job_advance` (crates/baton/src/store/job_advance.rs,
-- `job_advance`), which the SQL backends run over a transaction, mirrored
-- step for step: a script is atomic, so Redis needs no row locks. A
-- change to the decision is made there and here together; every birth
-- and transition is a row of `store::state::TRANSITIONS`.
-- ARGV: B, job, expected or '', slot, overlap (f skip / a allow / b1
-- buffer_one / ba buffer_all / c cancel_other), skip reason, record
-- (e enqueue / r run / s skip), lease ms, worker, batch_after or '',
-- due_only (0/1), until or '', has task (0/1), not_before or '' (an early
-- take), the id reserved for the task (`ids.lua`; '' without a task),
-- then NF task args, then (with a task) the buffer_one skip reason, the
-- cancel_other reason and the waiting run_at ms. B is the job's queue's base: the job's keys live
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
-- Any policy but allow: the job's unfinished earlier runs.
local ov = ARGV[5]
local T = 16
local W = tonumber(ARGV[T + NF + 2])
local busy, anyrun, anywait = false, false, false
local prev = {}
if ARGV[13] == '1' and rec == 'e' and ov ~= 'a' then
  local akey = B .. 'jobactive:' .. job
  local after = tonumber(ARGV[10])
  for _, sid in ipairs(redis.call('SMEMBERS', akey)) do
    local t = redis.call('HMGET', tkey(sid), 'state', 'slot', 'created_at', 'run_at')
    if t[1] == 'pending' or t[1] == 'running' then
      -- Tasks of the same catch-up batch (slot after ARGV[10]) do not
      -- count, nor tasks created once this slot was due (the same catch-up
      -- by the store's clock).
      if ((not after) or (not t[2]) or tonumber(t[2]) <= after)
        and ((not t[3]) or tonumber(t[3]) < slot) then
        busy = true
        prev[#prev + 1] = {sid, t[1]}
        if t[1] == 'running' then anyrun = true end
        if t[1] == 'pending' and tonumber(t[4]) >= W then anywait = true end
      end
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
-- How the slot is recorded (`overlap_birth` in job_advance.rs).
local reason, wait = nil, false
if rec == 's' then reason = ARGV[6]
elseif busy then
  if ov == 'f' then reason = ARGV[6]
  elseif ov == 'b1' and anywait then reason = ARGV[T + NF]
  elseif ov == 'b1' or ov == 'ba' then wait = true
  elseif ov == 'c' then wait = anyrun end
end
if reason then
  local id = insert(now, T, reason)
  flush()
  return {'skipped', fmt(id), 1}
end
if wait then
  -- Waiting: run_at far ahead, so no claim takes it (job_release.lua).
  ARGV[T + 4] = 'a'
  ARGV[T + 5] = ARGV[T + NF + 2]
end
local id, ins, due, run_at = insert(now, T, nil)
flush()
if ins == 1 and ov == 'c' and busy then
  -- The slot replaces the previous runs: those not started are cancelled
  -- with the reason, a running one is asked to stop.
  for _, p in ipairs(prev) do
    local psid = p[1]
    if p[2] == 'pending' then
      local h = redis.call('HMGET', tkey(psid), 'queue', 'unique_key', 'unique_forever', 'job',
        'concurrency_key')
      local pp = pad(psid)
      ready_del(pp, h[5])
      redis.call('ZREM', qkey(h[1], 'sched'), pp)
      if h[5] then redis.call('ZREM', B .. 'kpark:' .. h[5], pp) end
      redis.call('HSET', tkey(psid), 'last_error', ARGV[T + NF + 1])
      terminal(psid, h[1], 'pending', 'cancelled', now, h[2], h[3], h[4])
    else
      redis.call('HSET', tkey(psid), 'cancel_requested', '1')
    end
  end
end
if wait and ins == 1 then return {'waiting', fmt(id), 1} end
if rec == 'r' and ins == 1 then
  local sid = fmt(id)
  local p = pad(sid)
  local queue = ARGV[T]
  local lu = now + tonumber(ARGV[8])
  local ck = redis.call('HGET', tkey(sid), 'concurrency_key')
  ready_del(p, ck)
  redis.call('ZREM', qkey(queue, 'sched'), p)
  redis.call('HSET', tkey(sid), 'state', 'running', 'attempt', '1', 'started_at', fmt(now),
    'lease_until', fmt(lu), 'worker', ARGV[9], 'claim_token', '1')
  redis.call('ZADD', B .. 'running', lu, p)
  key_claimed(ck)
  count(queue, 'pending', -1)
  count(queue, 'running', 1)
  return {'enqueued', sid, 1}
end
if ins == 1 and due == 1 then redis.call('PUBLISH', WAKE, ARGV[T]) end
if ins == 1 and due == 0 then wake_at(ARGV[T], run_at) end
return {'enqueued', fmt(id), ins}
