-- ARGV: B, queue, paused (0/1). Sets or clears the queue's flag
-- `B paused` (read by claim.lua); a resume announces the queue. (The
-- index set `P{baton}:paused`, which lists paused queues, is written by
-- the caller.)
if ARGV[3] == '1' then
  redis.call('SET', B .. 'paused', '1')
else
  redis.call('DEL', B .. 'paused')
  redis.call('PUBLISH', WAKE, ARGV[2])
end
return 1
