-- ARGV: B, queue, paused (0/1). Sets or clears the queue's flag in
-- `B paused` (read by claim.lua); a resume announces the queue.
if ARGV[3] == '1' then
  redis.call('SADD', B .. 'paused', ARGV[2])
else
  redis.call('SREM', B .. 'paused', ARGV[2])
  redis.call('PUBLISH', B .. 'wake', ARGV[2])
end
return 1
