-- ARGV: B, queue, worker, limit, lease ms, cluster-wide cap on running (or
-- ''), the `last_error` of a pending task found with its cancel requested,
-- how many of the claimed start at once (the rest wait in the worker's
-- prefetch buffer, so they are taken only among tasks with an attempt to
-- spare: `TaskClaim::buffered`), the cap per concurrency key (or ''), a
-- rate limit's start log key (or ''), its starts per window and its
-- window in ms. With a rate limit the answer starts with {'now', now,
-- 'next', t}: t the instant (ms) the limit next allows a start, 0 if now.
local now = now_ms()
local queue = ARGV[2]
-- A paused queue claims nothing (its tasks stay where they are).
if redis.call('GET', B .. 'paused') == '1' then
  if ARGV[10] ~= '' then return {{'now', fmt(now), 'next', '0'}} end
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
    local h = redis.call('HMGET', tkey(fmt(tonumber(p))), 'priority', 'run_at', 'state')
    if h[3] == 'pending' then
      add[#add + 1] = rscore(tonumber(h[1]), tonumber(h[2]))
      add[#add + 1] = p
    end
  end
  if #add > 0 then redis.call('ZADD', ready, unpack(add)) end
  redis.call('ZREM', sched, unpack(due))
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
-- Tasks on their last attempt met beyond the first `now_share`: put back
-- (score, member) after the walk, which steps over at most `limit` of them.
local skipped = {}
while #out < limit and #skipped < 2 * limit and parked < PARK_MAX do
  local popped = redis.call('ZPOPMIN', ready, limit - #out)
  if #popped == 0 then break end
  for j = 1, #popped, 2 do
    local p = popped[j]
    local sid = fmt(tonumber(p))
    local k = tkey(sid)
    local h = redis.call('HGETALL', k)
    local f = {}
    for j = 1, #h - 1, 2 do f[h[j]] = h[j + 1] end
    if f.state == 'pending' and f.cancel_requested == '1' then
      -- Its cancel was requested while it ran: never claim it again.
      redis.call('HSET', k, 'last_error', CANCEL_REQUESTED)
      terminal(sid, queue, 'pending', 'cancelled', now, f.unique_key, f.unique_forever, f.job)
    elseif f.state == 'pending' and per_key and f.concurrency_key
        and tonumber(redis.call('HGET', B .. 'krun', f.concurrency_key) or '0') >= per_key then
      parked = parked + 1
      redis.call('ZADD', B .. 'kpark:' .. f.concurrency_key, popped[j + 1], p)
    elseif f.state == 'pending' and pos >= now_share
        and tonumber(f.attempt) + 1 >= tonumber(f.max_attempts) then
      pos = pos + 1
      skipped[#skipped + 1] = popped[j + 1]
      skipped[#skipped + 1] = p
    elseif f.state == 'pending' then
      pos = pos + 1
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
      -- The key's last start, for throttle (enqueue.lua).
      if f.unique_key then redis.call('HSET', B .. 'kstart', f.unique_key, fmt(now) .. ':' .. sid) end
      cacc(queue, 'pending', -1)
      cacc(queue, 'running', 1)
      out[#out + 1] = h
    end
  end
end
if #skipped > 0 then redis.call('ZADD', ready, unpack(skipped)) end
flush()
if rkey == '' then return out end
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
table.insert(out, 1, {'now', fmt(now), 'next', fmt(next)})
return out
