-- ARGV: B, older than ms, batch. Returns {deleted, examined, deleted ids}.
local now = now_ms()
local cutoff = now - tonumber(ARGV[2])
local ps = redis.call('ZRANGEBYSCORE', B .. 'done', '-inf', '(' .. fmt(cutoff), 'LIMIT', 0, tonumber(ARGV[3]))
local n = 0
local gone = {}
for _, p in ipairs(ps) do
  local sid = fmt(tonumber(p))
  local k = tkey(sid)
  local h = redis.call('HMGET', k, 'state', 'queue', 'unique_key', 'job', 'finished_at',
    'unique_forever', 'slot', 'last_error')
  if (h[1] == 'succeeded' or h[1] == 'failed' or h[1] == 'cancelled') and tonumber(h[5] or '0') < cutoff then
    if h[3] and h[4] and h[6] == '1' then
      -- A slot's task: its tombstone keeps the slot's key taken, forever.
      local t = {'job', h[4], 'task_id', sid, 'state', h[1], 'finished_at', h[5] or ''}
      if h[7] then t[#t + 1] = 'slot'; t[#t + 1] = h[7] end
      if h[8] then t[#t + 1] = 'last_error'; t[#t + 1] = string.sub(h[8], 1, 1000) end
      redis.call('HSET', B .. 'slot:' .. h[3], unpack(t))
    end
    redis.call('DEL', k)
    count(h[2], h[1], -1)
    redis.call('ZREM', B .. 'ids', p)
    if h[3] then
      local ukey = B .. 'uniq:' .. h[3]
      if redis.call('GET', ukey) == sid then redis.call('DEL', ukey) end
    end
    if h[4] then redis.call('SREM', B .. 'jobactive:' .. h[4], sid) end
    n = n + 1
    gone[#gone + 1] = sid
  end
  redis.call('ZREM', B .. 'done', p)
end
return {n, #ps, gone}
