-- ARGV: B, id, claim token, progress JSON.
local k = tkey(ARGV[2])
local h = redis.call('HMGET', k, 'state', 'claim_token')
if h[1] ~= 'running' or h[2] ~= ARGV[3] then return 0 end
redis.call('HSET', k, 'progress', ARGV[4])
return 1
