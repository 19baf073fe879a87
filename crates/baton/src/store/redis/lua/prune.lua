-- ARGV: B, older than ms, batch. Returns {deleted, examined, deleted ids}.
local now = now_ms()
local cutoff = now - tonumber(ARGV[2])
local ps = redis.call('ZRANGEBYSCORE', B .. 'done', '-inf', '(' .. fmt(cutoff), 'LIMIT', 0, tonumber(ARGV[3]))
local n = 0
local gone = {}
for _, p in ipairs(ps) do
  local sid = fmt(tonumber(p))
  local h = redis.call('HMGET', tkey(sid), unpack(FORGET))
  if finished(h[1]) and tonumber(h[5] or '0') < cutoff then
    forget(sid, h)
    n = n + 1
    gone[#gone + 1] = sid
  end
  redis.call('ZREM', B .. 'done', p)
end
return {n, #ps, gone}
