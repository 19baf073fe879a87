-- ARGV: B, slot key. Returns {} or {job, slot or '', task_id, state, last_error or '', finished_at or '', has_error}.
local h = redis.call('HMGET', B .. 'slot:' .. ARGV[2], 'job', 'slot', 'task_id', 'state', 'last_error', 'finished_at')
if not h[3] then return {} end
local e = '0'
if h[5] then e = '1' end
return {h[1] or '', h[2] or '', h[3], h[4] or '', h[5] or '', h[6] or '', e}
