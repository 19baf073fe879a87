-- Schema step 7 -> 8 (one tag per queue): ARGV: B (the task's queue's
-- base), then the old task hash's fields and values. Writes the task at
-- B and indexes it by its state as the scripts would have (pending:
-- `sched`, which the next claim moves to `ready` when due; running:
-- `running`; finished: `done`), unless it is there already (an
-- interrupted upgrade resumed). Returns 1 when written.
local f = {}
for i = 2, #ARGV - 1, 2 do f[ARGV[i]] = ARGV[i + 1] end
local sid = f.id
local k = tkey(sid)
if redis.call('EXISTS', k) == 1 then return 0 end
redis.call('HSET', k, unpack(ARGV, 2, #ARGV))
local p = pad(sid)
redis.call('ZADD', B .. 'ids', tonumber(sid), p)
local st = f.state
if st == 'pending' then
  redis.call('ZADD', qkey(f.queue, 'sched'), tonumber(f.run_at or '0'), p)
elseif st == 'running' then
  redis.call('ZADD', B .. 'running', tonumber(f.lease_until or '0'), p)
else
  redis.call('ZADD', B .. 'done', tonumber(f.finished_at or '0'), p)
end
count(f.queue, st, 1)
return 1
