-- ARGV: B, queue. Returns {flat counts, oldest due pending age ms or '',
-- paused 0/1, last pause or resume: note, by, at (each nil when absent)}
-- of B's queue.
local now = now_ms()
local q = ARGV[2]
local c = redis.call('HGETALL', B .. 'counts')
local oldest = nil
local s = redis.call('ZRANGEBYSCORE', qkey(q, 'sched'), '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
if #s >= 2 then oldest = tonumber(s[2]) end
local lo = '-inf'
while true do
  local r = redis.call('ZRANGEBYSCORE', qkey(q, 'ready'), lo, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #r < 2 then break end
  local sc = tonumber(r[2])
  local band = math.floor(sc / SHIFT)
  local ra = sc - band * SHIFT
  if (not oldest) or ra < oldest then oldest = ra end
  lo = '(' .. fmt((band + 1) * SHIFT - 1)
end
local age = ''
if oldest then
  local a = now - oldest
  if a < 0 then a = 0 end
  age = fmt(a)
end
local p = '0'
if redis.call('GET', B .. 'paused') == '1' then p = '1' end
local n = redis.call('HMGET', B .. 'pause', 'note', 'by', 'at')
return {c, age, p, n[1], n[2], n[3]}
