-- ARGV: B, older than ms, batch. Returns {deleted, examined}.
local now = now_ms()
local cutoff = now - tonumber(ARGV[2])
local ps = redis.call('ZRANGEBYSCORE', B .. 'done', '-inf', '(' .. fmt(cutoff), 'LIMIT', 0, tonumber(ARGV[3]))
local n = 0
for _, p in ipairs(ps) do
  local sid = fmt(tonumber(p))
  local k = tkey(sid)
  local h = redis.call('HMGET', k, 'state', 'queue', 'unique_key', 'job', 'finished_at')
  if (h[1] == 'succeeded' or h[1] == 'failed' or h[1] == 'cancelled') and tonumber(h[5] or '0') < cutoff then
    redis.call('DEL', k)
    count(h[2], h[1], -1)
    redis.call('ZREM', B .. 'ids', p)
    if h[3] then
      local ukey = B .. 'uniq:' .. h[3]
      if redis.call('GET', ukey) == sid then redis.call('DEL', ukey) end
    end
    if h[4] then redis.call('SREM', B .. 'jobactive:' .. h[4], sid) end
    n = n + 1
  end
  redis.call('ZREM', B .. 'done', p)
end
return {n, #ps}
