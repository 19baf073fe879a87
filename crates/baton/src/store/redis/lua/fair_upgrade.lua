-- Schema step 14 -> 15 (fair claiming's index): ARGV: B. Every task in
-- the queue's `ready` enters its group's set `B fk:<key>` (`B fk:` without
-- a key) with its `ready` score, and its key `B fkeys` (see `ready_add` in
-- the prelude). Idempotent; one script per queue, so atomic against the
-- claims. Returns the number of tasks indexed.
local ready = B .. 'ready'
local n = redis.call('ZCARD', ready)
for i = 0, n - 1, 1000 do
  local r = redis.call('ZRANGE', ready, i, i + 999, 'WITHSCORES')
  for j = 1, #r - 1, 2 do
    local ck = redis.call('HGET', tkey(fmt(tonumber(r[j]))), 'concurrency_key')
    redis.call('ZADD', group_key(ck), r[j + 1], r[j])
    if ck then redis.call('ZADD', B .. 'fkeys', 0, ck) end
  end
end
return n
