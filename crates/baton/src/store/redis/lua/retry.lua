-- ARGV: B, id. Returns 1 retried, 0 not failed/cancelled, -1 unique key conflict.
local now = now_ms()
local sid = ARGV[2]
local k = tkey(sid)
local h = redis.call('HMGET', k, 'state', 'queue', 'unique_key', 'unique_forever', 'job', 'attempt', 'max_attempts', 'priority')
if h[1] ~= 'failed' and h[1] ~= 'cancelled' then return 0 end
local queue = h[2]
local uk = h[3]
if uk then
  local ukey = B .. 'uniq:' .. uk
  local ex = redis.call('GET', ukey)
  if ex and ex ~= sid then
    local o = redis.call('HMGET', tkey(ex), 'state', 'unique_forever', 'unique_until_failed')
    if o[1] == 'pending' or o[1] == 'running' or (o[1] and o[2] == '1')
        or (o[1] == 'succeeded' and o[3] == '1') then return -1 end
  end
  redis.call('SET', ukey, sid)
end
local maxa = tonumber(h[7])
local need = tonumber(h[6]) + 1
if need > maxa then maxa = need end
redis.call('HSET', k, 'state', 'pending', 'run_at', fmt(now), 'cancel_requested', '0', 'max_attempts', fmt(maxa))
redis.call('HDEL', k, 'finished_at', 'lease_until')
redis.call('ZREM', B .. 'done', pad(sid))
count(queue, h[1], -1)
count(queue, 'pending', 1)
place(sid, queue, tonumber(h[8]), now, now)
if h[5] then redis.call('SADD', B .. 'jobactive:' .. h[5], sid) end
redis.call('PUBLISH', WAKE, queue)
return 1
