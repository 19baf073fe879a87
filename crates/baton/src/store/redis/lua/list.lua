-- ARGV: B, before id or '', limit, state or '', queue (opt), job (opt).
-- Returns {tasks, last id examined, exhausted}.
local hi = '+inf'
if ARGV[2] ~= '' then hi = '(' .. ARGV[2] end
local limit = tonumber(ARGV[3])
local st = ARGV[4]
local q = opt(ARGV[5])
local job = opt(ARGV[6])
local scan = tonumber(ARGV[7])
local ids = redis.call('ZREVRANGEBYSCORE', B .. 'ids', hi, '-inf', 'LIMIT', 0, scan)
local out = {}
local last = ''
for _, p in ipairs(ids) do
  local sid = fmt(tonumber(p))
  last = sid
  local h = redis.call('HMGET', tkey(sid), 'state', 'queue', 'job')
  if h[1] and (st == '' or h[1] == st) and ((not q) or h[2] == q) and ((not job) or h[3] == job) then
    out[#out + 1] = redis.call('HGETALL', tkey(sid))
    if #out >= limit then break end
  end
end
local exhausted = 0
if #ids < scan then exhausted = 1 end
return {out, last, exhausted}
