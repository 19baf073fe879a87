-- ARGV: B, the cancel-requested text, then per item: id, claim token,
-- kind (s/f/c/h), text, retry ms or '' (for h: a snooze's delay). Returns 1 or 0 per item (0: the
-- claim is no longer current). Transitions: DESIGN.md's task state table.
local now = now_ms()
local CANCEL_REQUESTED = ARGV[2]
local later = {}
local function finish_one(sid, tok, kind, text, retry)
  local k = tkey(sid)
  local h = redis.call('HMGET', k, 'state', 'claim_token', 'queue', 'unique_key', 'unique_forever', 'job', 'max_attempts', 'priority', 'run_at', 'attempt', 'cancel_requested')
  if h[1] ~= 'running' or h[2] ~= tok then return 0 end
  local queue = h[3]
  local uk = h[4]
  local forever = h[5]
  local job = h[6]
  local attempt = tonumber(h[10])
  local cancel = h[11] == '1'
  if kind == 's' then
    terminal(sid, queue, 'running', 'succeeded', now, uk, forever, job)
  elseif kind == 'f' then
    append_error(sid, attempt, now, text)
    if retry ~= '' and attempt < tonumber(h[7]) and cancel then
      redis.call('HSET', k, 'last_error', CANCEL_REQUESTED .. ': ' .. text)
      terminal(sid, queue, 'running', 'cancelled', now, uk, forever, job)
    elseif retry ~= '' and attempt < tonumber(h[7]) then
      local at = now + tonumber(retry)
      if running_to_pending(sid, queue, tonumber(h[8]), at, now, nil) == 1 then
        redis.call('PUBLISH', WAKE, queue)
      else
        keep_min(later, queue, at)
      end
    else
      terminal(sid, queue, 'running', 'failed', now, uk, forever, job)
    end
  elseif kind == 'c' then
    redis.call('HSET', k, 'last_error', text)
    terminal(sid, queue, 'running', 'cancelled', now, uk, forever, job)
  elseif cancel then
    -- Handed back after its cancel was requested: cancelled, uncounted.
    redis.call('HSET', k, 'attempt', fmt(attempt - 1), 'last_error', CANCEL_REQUESTED)
    terminal(sid, queue, 'running', 'cancelled', now, uk, forever, job)
  elseif retry ~= '' then
    -- Snoozed: a hand-back due `retry` ms from now.
    local at = now + tonumber(retry)
    if running_to_pending(sid, queue, tonumber(h[8]), at, now, {'attempt', fmt(attempt - 1)}) == 1 then
      redis.call('PUBLISH', WAKE, queue)
    else
      keep_min(later, queue, at)
    end
  else
    -- Handed back: keep its place in line (its run_at), resume at once.
    running_to_pending(sid, queue, tonumber(h[8]), tonumber(h[9] or '') or now, now, {'attempt', fmt(attempt - 1)})
    redis.call('PUBLISH', WAKE, queue)
  end
  return 1
end
local out = {}
for i = 3, #ARGV - 4, 5 do
  out[#out + 1] = finish_one(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
end
for q, at in pairs(later) do wake_at(q, at) end
return out
