-- ARGV: B, id... (tasks of this queue). Deletes the finished ones as
-- prune does (`forget`); pending and running tasks and unknown ids are
-- left alone. Returns the ids deleted.
local gone = {}
for i = 2, #ARGV do
  local sid = fmt(tonumber(ARGV[i]))
  local h = redis.call('HMGET', tkey(sid), unpack(FORGET))
  if finished(h[1]) then
    forget(sid, h)
    gone[#gone + 1] = tonumber(sid)
  end
end
return gone
