-- ARGV: B (the job's new home), job, field count, the job hash's fields
-- and values, then the ids of its unfinished tasks. Writes the job's
-- record at B unless one is already there (a process of the new home
-- wrote it first: it stands). Returns 1 when written.
local k = B .. 'job:' .. ARGV[2]
local n = tonumber(ARGV[3])
local act = {}
for i = 4 + n, #ARGV do act[#act + 1] = ARGV[i] end
if #act > 0 then redis.call('SADD', B .. 'jobactive:' .. ARGV[2], unpack(act)) end
if n == 0 or redis.call('EXISTS', k) == 1 then return 0 end
redis.call('HSET', k, unpack(ARGV, 4, 3 + n))
return 1
