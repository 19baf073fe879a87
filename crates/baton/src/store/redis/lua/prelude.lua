-- Shared helpers for the queue and job scripts. `ARGV[1]` is always the
-- key base: a queue's `P{baton:q:<queue>}:` (every key a queue or job
-- script touches is under it, so the script runs on the one shard of that
-- hash tag), or the index base `P{baton}:` for the index scripts (ids,
-- migrate); `KEYS[1]` is a key in the same slot for routing.
local B = ARGV[1]
-- The wake-up channel is the index base's (`P{baton}:wake`): a channel is
-- not a key, and a publish reaches every node of a cluster.
local WAKE = string.sub(B, 1, string.find(B, '{baton', 1, true) - 1) .. '{baton}:wake'
local SHIFT = 8796093022208
local NF = 15
local function fmt(n) return string.format('%d', n) end
local function pad(id) return string.format('%016d', tonumber(id)) end
local function tkey(sid) return B .. 'task:' .. sid end
-- (The queue is the base's: `queue` only documents the call.)
local function qkey(queue, what) return B .. what end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function rscore(prio, run_at)
  local r = run_at
  if r < 0 then r = 0 end
  if r >= SHIFT then r = SHIFT - 1 end
  return (prio + 128) * SHIFT + r
end
local function count(queue, state, d)
  redis.call('HINCRBY', B .. 'counts', state, d)
end
local function opt(s)
  if s == nil or s == false or s == '' then return nil end
  return string.sub(s, 2)
end
local function append_error(sid, attempt, now, err)
  local k = tkey(sid)
  local w = redis.call('HMGET', k, 'worker', 'started_at')
  local item = '{"attempt":' .. fmt(attempt) .. ',"at":' .. fmt(now) .. ',"error":' .. cjson.encode(err)
  if w[1] then item = item .. ',"worker":' .. cjson.encode(w[1]) end
  if w[2] and w[2] ~= '' then item = item .. ',"started_at":' .. w[2] end
  item = item .. '}'
  local cur = redis.call('HGET', k, 'errors')
  local v
  if (not cur) or cur == '' or cur == '[]' then
    v = '[' .. item .. ']'
  else
    v = string.sub(cur, 1, -2) .. ',' .. item .. ']'
  end
  redis.call('HSET', k, 'errors', v, 'last_error', err)
end
-- Fair claiming's index (`TaskClaim::fair`, schema 15): `B fk:<key>`
-- holds each concurrency key's tasks of `ready` with their `ready` score
-- (`B fk:` those without a key: no key is empty), and `B fkeys` the keys
-- with a task there (score 0: in key order for ZRANGEBYLEX). A task
-- enters and leaves its group's set with `ready`: through `ready_add`
-- and `ready_del`, or `group_del` once it is out of `ready`.
local function group_key(ck) return B .. 'fk:' .. (ck or '') end
local function ready_add(score, p, ck)
  redis.call('ZADD', B .. 'ready', score, p)
  redis.call('ZADD', group_key(ck), score, p)
  if ck then redis.call('ZADD', B .. 'fkeys', 0, ck) end
end
local function group_del(p, ck)
  local g = group_key(ck)
  if redis.call('ZREM', g, p) == 1 and ck and redis.call('EXISTS', g) == 0 then
    redis.call('ZREM', B .. 'fkeys', ck)
  end
end
local function ready_del(p, ck)
  redis.call('ZREM', B .. 'ready', p)
  group_del(p, ck)
end
local function place(sid, queue, prio, run_at, now)
  if run_at <= now then
    ready_add(rscore(prio, run_at), pad(sid), redis.call('HGET', tkey(sid), 'concurrency_key'))
    return 1
  end
  redis.call('ZADD', qkey(queue, 'sched'), run_at, pad(sid))
  return 0
end
-- Batched writes: many tasks' index updates become one call per key.
local acc_z, acc_c = {}, {}
local function zacc(key, score, member)
  local t = acc_z[key]
  if not t then t = {}; acc_z[key] = t end
  t[#t + 1] = score
  t[#t + 1] = member
end
local function cacc(queue, state, d)
  local k = B .. 'counts'
  local t = acc_c[k]
  if not t then t = {}; acc_c[k] = t end
  t[state] = (t[state] or 0) + d
end
local function flush()
  for k, t in pairs(acc_z) do
    for j = 1, #t, 1000 do
      redis.call('ZADD', k, unpack(t, j, math.min(j + 999, #t)))
    end
  end
  for k, t in pairs(acc_c) do
    for st, n in pairs(t) do
      if n ~= 0 then redis.call('HINCRBY', k, st, n) end
    end
  end
  acc_z, acc_c = {}, {}
end
-- A task that ends in `state` frees its unique key unless its hold keeps
-- it: `unique_forever` in every state, `unique_until_failed` (the hold
-- UntilFailed) when it succeeded.
local function release_uniq(sid, uk, forever, state)
  if state == 'succeeded' and uk
      and redis.call('HGET', tkey(sid), 'unique_until_failed') == '1' then
    return
  end
  if uk and forever ~= '1' then
    local k = B .. 'uniq:' .. uk
    if redis.call('GET', k) == sid then redis.call('DEL', k) end
  end
end
-- Per-key caps (`TaskClaim::per_key_max_running`): `B krun` counts each
-- concurrency key's running tasks (every claim counts, capped or not);
-- `B kpark:<key>` holds, scored as in `ready`, the due tasks a capped
-- claim met while their key was at its cap. Each time a task of the key
-- leaves `running` (or leaves `ready` without starting: a cancel), the
-- first parked task goes back to `ready`; so while tasks are parked their
-- key has a task running or ready, and none waits forever.
local function key_claimed(ck)
  if ck then redis.call('HINCRBY', B .. 'krun', ck, 1) end
end
local function key_left(sid, from)
  local ck = redis.call('HGET', tkey(sid), 'concurrency_key')
  if not ck then return end
  if from == 'running' and redis.call('HINCRBY', B .. 'krun', ck, -1) <= 0 then
    redis.call('HDEL', B .. 'krun', ck)
  end
  local m = redis.call('ZPOPMIN', B .. 'kpark:' .. ck)
  if #m > 0 then ready_add(m[2], m[1], ck) end
end
local function terminal(sid, queue, from, state, now, uk, forever, job)
  key_left(sid, from)
  local k = tkey(sid)
  local p = pad(sid)
  redis.call('HSET', k, 'state', state, 'finished_at', fmt(now))
  redis.call('HDEL', k, 'lease_until')
  redis.call('ZREM', B .. 'running', p)
  redis.call('ZADD', B .. 'done', now, p)
  count(queue, from, -1)
  count(queue, state, 1)
  release_uniq(sid, uk, forever, state)
  if job then redis.call('SREM', B .. 'jobactive:' .. job, sid) end
end
-- The fields `forget` reads, in its order.
local FORGET = {'state', 'queue', 'unique_key', 'job', 'finished_at', 'unique_forever', 'slot',
  'last_error'}
-- Delete finished task `sid` (h: its FORGET fields; the caller checked
-- that it is finished): a slot's task leaves its tombstone, which keeps
-- the slot's key taken, forever; its counts, indexes and key go.
local function forget(sid, h)
  local p = pad(sid)
  if h[3] and h[4] and h[6] == '1' then
    local t = {'job', h[4], 'task_id', sid, 'state', h[1], 'finished_at', h[5] or ''}
    if h[7] then t[#t + 1] = 'slot'; t[#t + 1] = h[7] end
    if h[8] then t[#t + 1] = 'last_error'; t[#t + 1] = string.sub(h[8], 1, 1000) end
    redis.call('HSET', B .. 'slot:' .. h[3], unpack(t))
  end
  redis.call('DEL', tkey(sid))
  count(h[2], h[1], -1)
  redis.call('ZREM', B .. 'ids', p)
  redis.call('ZREM', B .. 'done', p)
  if h[3] then
    local ukey = B .. 'uniq:' .. h[3]
    if redis.call('GET', ukey) == sid then redis.call('DEL', ukey) end
    -- A deleted task's start no longer throttles its key (as on SQL).
    local ls = redis.call('HGET', B .. 'kstart', h[3])
    if ls and string.sub(ls, -(#sid + 1)) == ':' .. sid then
      redis.call('HDEL', B .. 'kstart', h[3])
    end
  end
  if h[4] then redis.call('SREM', B .. 'jobactive:' .. h[4], sid) end
end
local function finished(state)
  return state == 'succeeded' or state == 'failed' or state == 'cancelled'
end
local function running_to_pending(sid, queue, prio, run_at, now, extra)
  key_left(sid, 'running')
  local k = tkey(sid)
  redis.call('HSET', k, 'state', 'pending', 'run_at', fmt(run_at))
  if extra then redis.call('HSET', k, unpack(extra)) end
  redis.call('HDEL', k, 'lease_until')
  redis.call('ZREM', B .. 'running', pad(sid))
  count(queue, 'running', -1)
  count(queue, 'pending', 1)
  return place(sid, queue, prio, run_at, now)
end
-- The next task id: ids are reserved before the script by the index
-- script `ids.lua` (one counter for every queue, so ids never collide
-- across shards); the script that inserts sets `next_free` to the first.
local next_free = nil
local function next_id()
  local id = next_free
  next_free = next_free + 1
  return id
end
-- Insert the task whose NF arguments start at ARGV[i]. With skipped set,
-- insert it directly as cancelled with that reason.
local function insert(now, i, skipped)
  local queue = ARGV[i]
  local prio = tonumber(ARGV[i + 3])
  local mode = ARGV[i + 4]
  local run_at = now
  if mode == 'd' then run_at = now + tonumber(ARGV[i + 5])
  elseif mode == 'a' then run_at = tonumber(ARGV[i + 5]) end
  local uk = opt(ARGV[i + 8])
  -- The hold: '0' unfinished, '1' forever, '2' until failed.
  local hold = ARGV[i + 9]
  local forever = hold == '1' and '1' or '0'
  local job = opt(ARGV[i + 10])
  if uk and not skipped then
    local ex = redis.call('GET', B .. 'uniq:' .. uk)
    if ex and redis.call('EXISTS', tkey(ex)) == 1 then return tonumber(ex), 0, 0 end
  end
  -- A slot whose task was pruned keeps its key in a tombstone.
  if uk and forever == '1' and job then
    local pruned = redis.call('HGET', B .. 'slot:' .. uk, 'task_id')
    if pruned then return tonumber(pruned), 0, 0 end
  end
  local id = next_id()
  local sid = fmt(id)
  local f = {'id', sid, 'queue', queue, 'kind', ARGV[i + 1], 'payload', ARGV[i + 2],
    'priority', ARGV[i + 3], 'attempt', '0', 'max_attempts', ARGV[i + 6],
    'run_at', fmt(run_at), 'created_at', fmt(now), 'cancel_requested', '0'}
  local function add(k, v) f[#f + 1] = k; f[#f + 1] = v end
  if ARGV[i + 7] ~= '' then add('timeout_ms', ARGV[i + 7]) end
  if uk then
    add('unique_key', uk)
    add('unique_forever', forever)
    if hold == '2' then add('unique_until_failed', '1') end
  end
  if job then add('job', job) end
  if ARGV[i + 11] ~= '' then add('slot', ARGV[i + 11]) end
  local tp = opt(ARGV[i + 12])
  if tp then add('traceparent', tp) end
  local ck = opt(ARGV[i + 13])
  if ck then add('concurrency_key', ck) end
  local state = 'pending'
  if skipped then
    state = 'cancelled'
    add('finished_at', fmt(now))
    add('last_error', skipped)
  end
  add('state', state)
  redis.call('HSET', tkey(sid), unpack(f))
  local p = pad(sid)
  zacc(B .. 'ids', id, p)
  cacc(queue, state, 1)
  local due = 0
  if skipped then
    zacc(B .. 'done', now, p)
    if uk and forever == '1' then redis.call('SET', B .. 'uniq:' .. uk, sid, 'NX') end
  else
    if run_at <= now then
      zacc(qkey(queue, 'ready'), rscore(prio, run_at), p)
      zacc(group_key(ck), rscore(prio, run_at), p)
      if ck then zacc(B .. 'fkeys', 0, ck) end
      due = 1
    else
      zacc(qkey(queue, 'sched'), run_at, p)
    end
    if job then redis.call('SADD', B .. 'jobactive:' .. job, sid) end
    if uk then redis.call('SET', B .. 'uniq:' .. uk, sid) end
  end
  return id, 1, due, run_at
end
-- Announce work due later: `queue\n<run_at in µs>` (see Wake::parse).
local function wake_at(queue, run_at)
  redis.call('PUBLISH', WAKE, queue .. '\n' .. fmt(run_at * 1000))
end
-- Keep the earliest future run_at per queue in `t`.
local function keep_min(t, queue, run_at)
  if (not t[queue]) or run_at < t[queue] then t[queue] = run_at end
end
