-- An index script (B = `P{baton}:`): the audit log, a sorted set `B audit`
-- of JSON records scored by id (ids from the counter `B audit_seq`).
-- ARGV: B, then
--   'append', actor, action, target, source, outcome -> the id;
--   'list', before id or '', limit -> records, newest first;
--   'prune', older than ms -> how many deleted (at most 1000 a call).
local mode = ARGV[2]
local key = B .. 'audit'
if mode == 'append' then
  local id = redis.call('INCR', B .. 'audit_seq')
  local rec = cjson.encode({id = id, at = now_ms(), actor = ARGV[3], action = ARGV[4],
    target = ARGV[5], source = ARGV[6], outcome = ARGV[7]})
  redis.call('ZADD', key, id, rec)
  return id
elseif mode == 'list' then
  local hi = '+inf'
  if ARGV[3] ~= '' then hi = '(' .. ARGV[3] end
  return redis.call('ZREVRANGEBYSCORE', key, hi, '-inf', 'LIMIT', 0, tonumber(ARGV[4]))
else
  local cutoff = now_ms() - tonumber(ARGV[3])
  local gone = 0
  for _, rec in ipairs(redis.call('ZRANGE', key, 0, 999)) do
    if cjson.decode(rec).at >= cutoff then break end
    redis.call('ZREM', key, rec)
    gone = gone + 1
  end
  return gone
end
