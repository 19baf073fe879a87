-- ARGV: B, then job names (each job's home is B's queue). Returns, per
-- job found, {name, last_slot, paused, queue, overlap, pause_note,
-- pause_by, pause_at, fingerprint}, each missing field nil.
local out = {}
for i = 2, #ARGV do
  local name = ARGV[i]
  local h = redis.call('HMGET', B .. 'job:' .. name, 'last_slot', 'paused', 'queue', 'overlap',
    'pause_note', 'pause_by', 'pause_at', 'fingerprint')
  if h[2] then
    out[#out + 1] = {name, h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]}
  end
end
return out
