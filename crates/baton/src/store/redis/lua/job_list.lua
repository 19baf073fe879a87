-- ARGV: B. Returns {name, last_slot or '', paused, queue or ''} per job.
local out = {}
for _, name in ipairs(redis.call('SMEMBERS', B .. 'jobs')) do
  local h = redis.call('HMGET', B .. 'job:' .. name, 'last_slot', 'paused', 'queue')
  if h[2] then out[#out + 1] = {name, h[1] or '', h[2], h[3] or ''} end
end
return out
