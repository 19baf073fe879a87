-- A queue's declared limits and its keys' load (`store::queue_view`).
-- ARGV: B, then
--   'declare', queue, limits JSON, by -> the replaced declaration
--     (JSON {limits, by, at}) or nil; B is the index base `P{baton}:`,
--     whose hash `B qlimits` holds one declaration a queue;
--   'list' -> the flat hash (queue, declaration, ...); B the index base;
--   'keys', queue, scan max -> {truncated 0/1, key, running, pending, ...}
--     for every key with tasks running or pending; B is the queue's base.
--     Running is `B krun`; pending counts the first `scan max` tasks of
--     `ready` and `sched` by their key, plus every parked task of a
--     running key (`B kpark:<key>`).
local mode = ARGV[2]
if mode == 'declare' then
  local h = B .. 'qlimits'
  local old = redis.call('HGET', h, ARGV[3])
  redis.call('HSET', h, ARGV[3], cjson.encode({limits = ARGV[4], by = ARGV[5], at = now_ms()}))
  return old
elseif mode == 'list' then
  return redis.call('HGETALL', B .. 'qlimits')
end
local max = tonumber(ARGV[4])
local run, pend, order = {}, {}, {}
local function seen(ck)
  if run[ck] == nil then
    run[ck], pend[ck] = 0, 0
    order[#order + 1] = ck
  end
end
local krun = redis.call('HGETALL', B .. 'krun')
for i = 1, #krun, 2 do
  local n = tonumber(krun[i + 1])
  if n > 0 then
    seen(krun[i])
    run[krun[i]] = n
    pend[krun[i]] = redis.call('ZCARD', B .. 'kpark:' .. krun[i])
  end
end
local scanned, truncated = 0, 0
for _, z in ipairs({B .. 'ready', B .. 'sched'}) do
  local from = 0
  while truncated == 0 do
    local ids = redis.call('ZRANGE', z, from, from + 499)
    if #ids == 0 then break end
    for _, p in ipairs(ids) do
      if scanned >= max then truncated = 1 break end
      scanned = scanned + 1
      local ck = redis.call('HGET', tkey(fmt(tonumber(p))), 'concurrency_key')
      if ck then
        seen(ck)
        pend[ck] = pend[ck] + 1
      end
    end
    from = from + 500
  end
end
local out = {truncated}
for _, ck in ipairs(order) do
  out[#out + 1] = ck
  out[#out + 1] = run[ck]
  out[#out + 1] = pend[ck]
end
return out
