-- ARGV: B, publish flag, the first of the ids reserved for these tasks
-- (`ids.lua`), then NF arguments per task, every task of B's queue.
local now = now_ms()
local out = {}
local wake = {}
local later = {}
local i = 4
while i + NF - 1 <= #ARGV do
  -- Each task's own reserved id (taken only if it is inserted).
  next_free = tonumber(ARGV[3]) + (i - 4) / NF
  local id, ins, due, run_at = insert(now, i, nil)
  out[#out + 1] = id
  out[#out + 1] = ins
  out[#out + 1] = due
  if ins == 1 and due == 1 then wake[ARGV[i]] = true end
  if ins == 1 and due == 0 then keep_min(later, ARGV[i], run_at) end
  i = i + NF
end
flush()
if ARGV[2] == '1' then
  for q, _ in pairs(wake) do redis.call('PUBLISH', WAKE, q) end
end
-- Work due later is announced by every chunk (the caller publishes only
-- the due queues of a multi-chunk batch).
for q, at in pairs(later) do wake_at(q, at) end
return out
