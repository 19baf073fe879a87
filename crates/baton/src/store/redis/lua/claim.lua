-- ARGV: B, queue, worker, limit, lease ms, cluster-wide cap on running (or
-- ''), the `last_error` of a pending task found with its cancel requested,
-- how many of the claimed start at once (the rest wait in the worker's
-- prefetch buffer, so they are taken only among tasks with an attempt to
-- spare: `TaskClaim::buffered`), the cap per concurrency key (or ''), a
-- rate limit's start log key (or ''), its starts per window and its
-- window in ms, '1' for a fair claim (`TaskClaim::fair`, fair.lua), a
-- rate per concurrency key's starts per window (or '') and its window in
-- ms. With a rate limit or a rate per key the answer starts with {'now',
-- now, 'next', t, 'knext', k}: t the instant (ms) the limit next allows a
-- start, 0 if now; k the earliest instant a key held back by its rate
-- (with tasks parked) may start again, 0 if none.
local now = now_ms()
local queue = ARGV[2]
local rated = ARGV[10] ~= '' or ARGV[14] ~= ''
-- A paused queue claims nothing (its tasks stay where they are).
if redis.call('GET', B .. 'paused') == '1' then
  if rated then return {{'now', fmt(now), 'next', '0', 'knext', '0'}} end
  return {}
end
local sched = qkey(queue, 'sched')
local ready = qkey(queue, 'ready')
-- Move due scheduled tasks into ready, oldest first; at most 10000 per
-- claim so one call stays short (a larger backlog moves over a few claims).
for _ = 1, 20 do
  local due = redis.call('ZRANGEBYSCORE', sched, '-inf', now, 'LIMIT', 0, 500)
  if #due == 0 then break end
  local add = {}
  for _, p in ipairs(due) do
    local h = redis.call('HMGET', tkey(fmt(tonumber(p))), 'priority', 'run_at', 'state',
      'concurrency_key')
    if h[3] == 'pending' then
      local score = rscore(tonumber(h[1]), tonumber(h[2]))
      add[#add + 1] = score
      add[#add + 1] = p
      redis.call('ZADD', group_key(h[4]), score, p)
      if h[4] then redis.call('ZADD', B .. 'fkeys', 0, h[4]) end
    end
  end
  if #add > 0 then redis.call('ZADD', ready, unpack(add)) end
  redis.call('ZREM', sched, unpack(due))
end
-- A rate per concurrency key (ARGV[14], '' for none): `B krate:<key>` is
-- the key's log, a sorted set of its latest ARGV[14] starts (score:
-- started_at in ms, member ms:id), expiring ARGV[15] ms after its latest
-- start (then it holds no start in any window to come). A task claimed
-- beyond the first `now_share` waits in the worker's prefetch buffer: its
-- start is logged at now + ARGV[16] ms (`store::BUFFER_HOLD`), the
-- latest it may start (the worker hands it back unstarted after that). A due task whose
-- key has ARGV[14] starts after now - ARGV[15] is parked in `kpark:<key>`
-- (the per-key cap's set) and the key entered in `B krwait`, scored by
-- when it may start again; a claim from then on moves up to ARGV[14] of
-- its parked tasks back to `ready`.
local krmax, krper = tonumber(ARGV[14]), tonumber(ARGV[15])
local krhold = tonumber(ARGV[16]) or 0
local krwait = B .. 'krwait'
-- Each key's log as this claim sees it, read once per key (`now` is the
-- claim's one instant): `used` its starts after now - krper, this
-- claim's own included; `new` the starts this claim adds (score, member),
-- written once per key after the walk (`keys_logged`).
local klogs = {}
local function key_log(ck)
  local l = klogs[ck]
  if not l then
    l = {used = redis.call('ZCOUNT', B .. 'krate:' .. ck, '(' .. fmt(now - krper), '+inf'),
      new = {}}
    klogs[ck] = l
  end
  return l
end
-- When key `ck` may start again: its krmax-th latest start + krper (its
-- log written: after `keys_logged`); 0 if it has fewer starts.
local function key_free_at(ck)
  local nth = redis.call('ZRANGE', B .. 'krate:' .. ck, -krmax, -krmax, 'WITHSCORES')
  if #nth == 2 then return tonumber(nth[2]) + krper end
  return 0
end
if krmax then
  local freed = redis.call('ZRANGEBYSCORE', krwait, '-inf', now, 'LIMIT', 0, 100)
  for _, ck in ipairs(freed) do
    redis.call('ZREM', krwait, ck)
    local m = redis.call('ZPOPMIN', B .. 'kpark:' .. ck, krmax)
    for j = 1, #m, 2 do ready_add(m[j + 1], m[j], ck) end
  end
end
-- The keys this claim started tasks of, or parked tasks of, under a rate
-- per key.
local claimed_keys, parked_keys = {}, {}
-- Log a start of key `ck` (task `sid`) under the rate per key: at now,
-- or at now + krhold when `buffered`.
local function key_started(sid, ck, buffered)
  if not (krmax and ck) then return end
  local l = key_log(ck)
  local at = now
  if buffered then at = now + krhold end
  l.used = l.used + 1
  l.new[#l.new + 1] = at
  l.new[#l.new + 1] = fmt(at) .. ':' .. sid
  claimed_keys[ck] = true
end
-- Write each started key's log: its new starts, trimmed to the latest
-- krmax, expiring krper after its latest start (now, or later for a
-- buffered start).
local function keys_logged()
  for ck in pairs(claimed_keys) do
    local lk = B .. 'krate:' .. ck
    local t = klogs[ck].new
    for j = 1, #t, 1000 do redis.call('ZADD', lk, unpack(t, j, math.min(j + 999, #t))) end
    redis.call('ZREMRANGEBYRANK', lk, 0, -(krmax + 1))
    -- Until a window past its latest start (a buffered one's lies ahead).
    local top = redis.call('ZRANGE', lk, -1, -1, 'WITHSCORES')
    local latest = now
    if #top == 2 and tonumber(top[2]) > now then latest = tonumber(top[2]) end
    redis.call('PEXPIRE', lk, latest - now + krper)
  end
end
-- A cap per concurrency key: each key's running count, read once per key
-- and counted up with this claim's starts (`key_claimed` writes them).
local kruns = {}
local function key_running(ck)
  local n = kruns[ck]
  if not n then
    n = tonumber(redis.call('HGET', B .. 'krun', ck) or '0')
    kruns[ck] = n
  end
  return n
end
local out = {}
local us = now_us()
local CANCEL_REQUESTED = ARGV[7]
local limit = tonumber(ARGV[4])
local lu = now + tonumber(ARGV[5])
-- A cluster-wide cap on the queue's running tasks (ARGV[6], '' for none).
if ARGV[6] ~= '' then
  local running = tonumber(redis.call('HGET', B .. 'counts', 'running') or '0')
  local room = tonumber(ARGV[6]) - running
  if room < limit then limit = room end
end
local now_share = tonumber(ARGV[8])
-- A rate limit (ARGV[10], '' for none): the log is a sorted set of the
-- latest ARGV[11] starts (score: started_at in ms, member ms:id); a claim
-- takes at most ARGV[11] less the starts after now - ARGV[12].
local rkey, rmax, rper = ARGV[10], tonumber(ARGV[11]), tonumber(ARGV[12])
if rkey ~= '' then
  local used = redis.call('ZCOUNT', rkey, '(' .. fmt(now - rper), '+inf')
  if rmax - used < limit then limit = rmax - used end
end
-- A cap per concurrency key (ARGV[9], '' for none): a task whose key has
-- that many running is parked (see `key_left`) instead of claimed; at
-- most PARK_MAX per call, so one call stays short.
local per_key = tonumber(ARGV[9])
local PARK_MAX = 1000
local parked = 0
local pos = 0 -- claimable tasks met, in claim order
-- Start the attempt of pending task `p` (`h`: its hash as HGETALL read
-- it, `f` the same as a table), out of `ready` already.
local function start(p, k, h, f)
  local sid = fmt(tonumber(p))
  -- The claim token only rises: max(previous + 1, store clock in µs).
  local tok = tonumber(f.claim_token or '0') + 1
  if us > tok then tok = us end
  local set = {state = 'running', attempt = fmt(tonumber(f.attempt) + 1), started_at = fmt(now),
    lease_until = fmt(lu), worker = ARGV[3], claim_token = fmt(tok)}
  redis.call('HSET', k, 'state', set.state, 'attempt', set.attempt,
    'started_at', set.started_at, 'lease_until', set.lease_until, 'worker', set.worker,
    'claim_token', set.claim_token)
  -- Answer with the updated record without reading it again.
  for j = 1, #h - 1, 2 do
    local v = set[h[j]]
    if v then h[j + 1] = v; set[h[j]] = nil end
  end
  for f, v in pairs(set) do h[#h + 1] = f; h[#h + 1] = v end
  zacc(B .. 'running', lu, p)
  key_claimed(f.concurrency_key)
  local ck = f.concurrency_key
  if ck and kruns[ck] then kruns[ck] = kruns[ck] + 1 end
  -- The key's last start, for throttle (enqueue.lua).
  if f.unique_key then redis.call('HSET', B .. 'kstart', f.unique_key, fmt(now) .. ':' .. sid) end
  cacc(queue, 'pending', -1)
  cacc(queue, 'running', 1)
  out[#out + 1] = h
end
local function read(p)
  local k = tkey(fmt(tonumber(p)))
  local h = redis.call('HGETALL', k)
  local f = {}
  for j = 1, #h - 1, 2 do f[h[j]] = h[j + 1] end
  return k, h, f
end
-- Under a cap per key, the buffer's share (beyond `now_share`) is granted
-- only where the keys of the next due tasks have places to spare, at
-- least twice the claim (each distinct key's cap less its running tasks,
-- a task of no key one place; `store::key_capped_take`, as the SQL
-- stores): else a buffered task would hold a place another worker's free
-- slot could run. The next 4 x limit tasks are looked at, stopping once
-- the places suffice.
if per_key and now_share < limit and ARGV[13] ~= '1' then
  local need = 2 * tonumber(ARGV[4])
  local places, seen = 0, {}
  for _, p in ipairs(redis.call('ZRANGE', ready, 0, 4 * tonumber(ARGV[4]) - 1)) do
    local ck = redis.call('HGET', tkey(fmt(tonumber(p))), 'concurrency_key')
    if not ck then
      places = places + 1
    elseif not seen[ck] then
      seen[ck] = true
      places = places + math.max(0, per_key - key_running(ck))
    end
    if places >= need then break end
  end
  if places < need then limit = now_share end
end
-- Tasks on their last attempt met beyond the first `now_share`: put back
-- (score, member) after the walk, which steps over at most `limit` of them.
local skipped = {}
if ARGV[13] == '1' then
  -- A fair claim: the plan (fair.lua), then its tasks started in order.
  local plan = fair_plan({total = limit, per_key = per_key, share = now_share,
    extra = math.max(tonumber(ARGV[4]) - now_share, 0), reason = CANCEL_REQUESTED,
    queue = queue, now = now})
  for _, cd in ipairs(plan) do
    local k, h, f = read(cd.p)
    ready_del(cd.p, f.concurrency_key)
    if f.state == 'pending' then start(cd.p, k, h, f) end
  end
  limit = 0
end
while #out < limit and #skipped < 2 * limit and parked < PARK_MAX do
  local popped = redis.call('ZPOPMIN', ready, limit - #out)
  if #popped == 0 then break end
  for j = 1, #popped, 2 do
    local p = popped[j]
    local sid = fmt(tonumber(p))
    local k, h, f = read(p)
    if f.state == 'pending' and f.cancel_requested == '1' then
      -- Its cancel was requested while it ran: never claim it again.
      group_del(p, f.concurrency_key)
      redis.call('HSET', k, 'last_error', CANCEL_REQUESTED)
      terminal(sid, queue, 'pending', 'cancelled', now, f.unique_key, f.unique_forever, f.job)
    elseif f.state == 'pending' and per_key and f.concurrency_key
        and key_running(f.concurrency_key) >= per_key then
      parked = parked + 1
      group_del(p, f.concurrency_key)
      redis.call('ZADD', B .. 'kpark:' .. f.concurrency_key, popped[j + 1], p)
    elseif f.state == 'pending' and krmax and f.concurrency_key
        and key_log(f.concurrency_key).used >= krmax then
      -- Entered in `krwait` after the walk, once the key's log is written.
      parked = parked + 1
      group_del(p, f.concurrency_key)
      redis.call('ZADD', B .. 'kpark:' .. f.concurrency_key, popped[j + 1], p)
      parked_keys[f.concurrency_key] = true
    elseif f.state == 'pending' and pos >= now_share
        and tonumber(f.attempt) + 1 >= tonumber(f.max_attempts) then
      pos = pos + 1
      skipped[#skipped + 1] = popped[j + 1]
      skipped[#skipped + 1] = p
    elseif f.state == 'pending' then
      pos = pos + 1
      group_del(p, f.concurrency_key)
      start(p, k, h, f)
      key_started(sid, f.concurrency_key, pos > now_share)
    else
      group_del(p, f.concurrency_key)
    end
  end
end
if #skipped > 0 then redis.call('ZADD', ready, unpack(skipped)) end
flush()
if not rated then return out end
-- A key this claim parked tasks of, or used up with tasks still parked,
-- waits in `krwait` (else nothing would move them back once its window
-- allows).
local knext = 0
if krmax then
  keys_logged()
  for ck in pairs(parked_keys) do
    redis.call('ZADD', krwait, key_free_at(ck), ck)
  end
  for ck in pairs(claimed_keys) do
    if not parked_keys[ck] and klogs[ck].used >= krmax
        and redis.call('ZCARD', B .. 'kpark:' .. ck) > 0 then
      redis.call('ZADD', krwait, key_free_at(ck), ck)
    end
  end
  -- Said only when the claim came back short (as the SQL stores).
  local first = redis.call('ZRANGE', krwait, 0, 0, 'WITHSCORES')
  if #out < tonumber(ARGV[4]) and #first == 2 and tonumber(first[2]) > now then
    knext = tonumber(first[2])
  end
end
if rkey == '' then
  table.insert(out, 1, {'now', fmt(now), 'next', '0', 'knext', fmt(knext)})
  return out
end
local logged = {}
for _, h in ipairs(out) do
  for j = 1, #h - 1, 2 do
    if h[j] == 'id' then
      logged[#logged + 1] = fmt(now)
      logged[#logged + 1] = fmt(now) .. ':' .. h[j + 1]
    end
  end
end
if #logged > 0 then
  redis.call('ZADD', rkey, unpack(logged))
  redis.call('ZREMRANGEBYRANK', rkey, 0, -(rmax + 1))
  redis.call('PEXPIRE', rkey, rper)
end
-- Used up until the rmax-th latest start leaves the window.
local next = 0
local nth = redis.call('ZRANGE', rkey, -rmax, -rmax, 'WITHSCORES')
if #nth == 2 and tonumber(nth[2]) + rper > now then next = tonumber(nth[2]) + rper end
table.insert(out, 1, {'now', fmt(now), 'next', fmt(next), 'knext', fmt(knext)})
return out
