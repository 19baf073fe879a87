-- ARGV: B, batch size, lease-expired text. Returns {requeued, failed, cancelled, examined}.
local now = now_ms()
local exp = redis.call('ZRANGEBYSCORE', B .. 'running', '-inf', '(' .. fmt(now), 'LIMIT', 0, tonumber(ARGV[2]))
local rq, fl, cn = 0, 0, 0
local wake = {}
for _, p in ipairs(exp) do
  local sid = fmt(tonumber(p))
  local h = redis.call('HMGET', tkey(sid), 'state', 'attempt', 'max_attempts', 'cancel_requested',
    'queue', 'unique_key', 'unique_forever', 'job', 'priority', 'lease_until', 'run_at')
  if h[1] ~= 'running' then
    redis.call('ZREM', B .. 'running', p)
  elseif tonumber(h[10] or '0') < now then
    local attempt = tonumber(h[2])
    local queue = h[5]
    append_error(sid, attempt, now, ARGV[3])
    if h[4] == '1' then
      terminal(sid, queue, 'running', 'cancelled', now, h[6], h[7], h[8])
      cn = cn + 1
    elseif attempt >= tonumber(h[3]) then
      terminal(sid, queue, 'running', 'failed', now, h[6], h[7], h[8])
      fl = fl + 1
    else
      -- Keep its place in line (its run_at): a rescued task resumes first.
      running_to_pending(sid, queue, tonumber(h[9]), tonumber(h[11] or '') or now, now, nil)
      rq = rq + 1
      wake[queue] = true
    end
  end
end
for q, _ in pairs(wake) do redis.call('PUBLISH', WAKE, q) end
return {rq, fl, cn, #exp}
