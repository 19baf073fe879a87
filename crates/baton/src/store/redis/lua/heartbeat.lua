-- ARGV: B, lease ms, then (id, claim token) pairs. 0 lost, 1 extended, 2 cancel requested.
local now = now_ms()
local lu = now + tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV - 1, 2 do
  local sid = ARGV[i]
  local k = tkey(sid)
  local h = redis.call('HMGET', k, 'state', 'claim_token', 'cancel_requested')
  if h[1] == 'running' and h[2] == ARGV[i + 1] then
    redis.call('HSET', k, 'lease_until', fmt(lu))
    redis.call('ZADD', B .. 'running', lu, pad(sid))
    if h[3] == '1' then out[#out + 1] = 2 else out[#out + 1] = 1 end
  else
    out[#out + 1] = 0
  end
end
return out
