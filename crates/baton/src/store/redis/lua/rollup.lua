-- An index script (B = `P{baton}:`): the throughput rollup. One hash a
-- bucket, `B roll:<res>:<bucket ms>`, fields `<queue> \31 <kind> \31 <column>`
-- (a job's tasks: the kind argument is `<kind> \31 <job>`; a missing field
-- is 0); a sorted set a resolution, `B roll:<res>`, of its
-- buckets' starts (member and score), for reads and the prune.
-- ARGV: B, then
--   'add', then 14 values a row: res, bucket, queue, kind and the counts
--     in `stats_sql::COUNT_COLS` order (counts added, `*_max_ms` kept at
--     the larger) -> 0;
--   'read', res, since ms -> bucket, field, value, … flat;
--   'prune', then pairs of res and how long its buckets stay (ms, width
--     included) -> buckets deleted.
local mode = ARGV[2]
local cols = {'succeeded', 'failed', 'dead', 'cancelled', 'wait_n', 'wait_ms',
  'wait_max_ms', 'run_n', 'run_ms', 'run_max_ms'}
if mode == 'add' then
  local i = 3
  while i + 13 <= #ARGV do
    local res, bucket = ARGV[i], ARGV[i + 1]
    local key = B .. 'roll:' .. res .. ':' .. bucket
    local f = ARGV[i + 2] .. '\31' .. ARGV[i + 3] .. '\31'
    for c = 1, 10 do
      local v = tonumber(ARGV[i + 3 + c])
      local name = f .. cols[c]
      if c == 7 or c == 10 then
        if v > tonumber(redis.call('HGET', key, name) or '0') then
          redis.call('HSET', key, name, v)
        end
      elseif v ~= 0 then
        redis.call('HINCRBY', key, name, v)
      end
    end
    redis.call('ZADD', B .. 'roll:' .. res, bucket, bucket)
    i = i + 14
  end
  return 0
elseif mode == 'read' then
  local res = ARGV[3]
  local out = {}
  for _, bucket in ipairs(redis.call('ZRANGEBYSCORE', B .. 'roll:' .. res, ARGV[4], '+inf')) do
    local kv = redis.call('HGETALL', B .. 'roll:' .. res .. ':' .. bucket)
    for j = 1, #kv, 2 do
      out[#out + 1] = bucket
      out[#out + 1] = kv[j]
      out[#out + 1] = kv[j + 1]
    end
  end
  return out
else
  local now = now_ms()
  local gone = 0
  for i = 3, #ARGV - 1, 2 do
    local res, idx = ARGV[i], B .. 'roll:' .. ARGV[i]
    local old = redis.call('ZRANGEBYSCORE', idx, '-inf', '(' .. (now - tonumber(ARGV[i + 1])), 'LIMIT', 0, 1000)
    for _, bucket in ipairs(old) do
      redis.call('DEL', B .. 'roll:' .. res .. ':' .. bucket)
      redis.call('ZREM', idx, bucket)
      gone = gone + 1
    end
  end
  return gone
end
