-- ARGV: B, then job names (each job's home is B's queue). Returns
-- {name, last_slot or '', paused, queue or ''} per job found.
local out = {}
for i = 2, #ARGV do
  local name = ARGV[i]
  local h = redis.call('HMGET', B .. 'job:' .. name, 'last_slot', 'paused', 'queue')
  if h[2] then out[#out + 1] = {name, h[1] or '', h[2], h[3] or ''} end
end
return out
