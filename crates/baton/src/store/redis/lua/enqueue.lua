-- ARGV: B, publish flag, the first of the ids reserved for these tasks
-- (`ids.lua`), then NF arguments per task, every task of B's queue.
-- Debounce and throttle (`store::key_policy`, whose table this mirrors)
-- of the task whose arguments start at ARGV[i], which has a key and the
-- policy `policy` ('d<ms>' or 't<ms>'). Returns id, what happened (1
-- inserted, 0 existing, 2 debounced, 3 throttled), due now, and run_at
-- (inserted or debounced) or until (throttled).
local function keyed(now, i, policy)
  -- Earlier tasks of this call are indexed first, so one of them can be
  -- debounced here.
  flush()
  local uk = opt(ARGV[i + 8])
  local p_ms = tonumber(string.sub(policy, 2))
  local hid, hstate = nil, nil
  local ex = redis.call('GET', B .. 'uniq:' .. uk)
  if ex and redis.call('EXISTS', tkey(ex)) == 1 then
    hid = ex
    hstate = redis.call('HGET', tkey(ex), 'state')
  end
  if string.sub(policy, 1, 1) == 'd' then
    if hstate == 'pending' then
      -- The pending holder takes the payload and priority, due p_ms after
      -- now: out of `ready`, `sched` or its key's parking, then placed.
      local k = tkey(hid)
      local p = pad(hid)
      local run_at = now + p_ms
      local ck = redis.call('HGET', k, 'concurrency_key')
      redis.call('HSET', k, 'payload', ARGV[i + 2], 'priority', ARGV[i + 3], 'run_at', fmt(run_at))
      ready_del(p, ck)
      redis.call('ZREM', B .. 'sched', p)
      if ck then redis.call('ZREM', B .. 'kpark:' .. ck, p) end
      place(hid, ARGV[i], tonumber(ARGV[i + 3]), run_at, now)
      return tonumber(hid), 2, 0, run_at
    elseif hstate == 'running' then
      -- Never changed but for its key, which passes to the new task.
      redis.call('HDEL', tkey(hid), 'unique_key', 'unique_forever', 'unique_until_failed')
      redis.call('DEL', B .. 'uniq:' .. uk)
    elseif hid then
      return tonumber(hid), 0, 0, 0
    end
  else
    if hstate == 'pending' then return tonumber(hid), 0, 0, 0 end
    -- `B kstart`: per key, the last start as `<ms>:<id>` (claim.lua).
    local ls = redis.call('HGET', B .. 'kstart', uk)
    if ls then
      local sep = string.find(ls, ':', 1, true)
      local until_ms = tonumber(string.sub(ls, 1, sep - 1)) + p_ms
      if now < until_ms then return tonumber(string.sub(ls, sep + 1)), 3, 0, until_ms end
    end
    if hid then return tonumber(hid), 0, 0, 0 end
  end
  return insert(now, i, nil)
end
local now = now_ms()
local out = {}
local wake = {}
local later = {}
local i = 4
while i + NF - 1 <= #ARGV do
  -- Each task's own reserved id (taken only if it is inserted).
  next_free = tonumber(ARGV[3]) + (i - 4) / NF
  local id, ins, due, run_at
  local policy = ARGV[i + 14]
  if policy ~= '' then
    id, ins, due, run_at = keyed(now, i, policy)
  else
    id, ins, due, run_at = insert(now, i, nil)
  end
  out[#out + 1] = id
  out[#out + 1] = ins
  out[#out + 1] = due
  out[#out + 1] = ins == 3 and run_at or 0
  if ins == 1 and due == 1 then wake[ARGV[i]] = true end
  if (ins == 1 or ins == 2) and due == 0 then keep_min(later, ARGV[i], run_at) end
  i = i + NF
end
flush()
if ARGV[2] == '1' then
  for q, _ in pairs(wake) do redis.call('PUBLISH', WAKE, q) end
end
-- Work due later is announced by every chunk (the caller publishes only
-- the due queues of a multi-chunk batch).
for q, at in pairs(later) do wake_at(q, at) end
return out
