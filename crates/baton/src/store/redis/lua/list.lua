-- ARGV: B, before id or '', limit, state or '', queue (opt), job (opt),
-- scan, kind (opt), key (opt), payload text (opt), created from ms or '',
-- created to ms or ''.
-- Returns {tasks, last id examined, exhausted}.
local hi = '+inf'
if ARGV[2] ~= '' then hi = '(' .. ARGV[2] end
local limit = tonumber(ARGV[3])
local st = ARGV[4]
local q = opt(ARGV[5])
local job = opt(ARGV[6])
local scan = tonumber(ARGV[7])
local kind = opt(ARGV[8])
local key = opt(ARGV[9])
local text = opt(ARGV[10])
local from = tonumber(ARGV[11])
local to = tonumber(ARGV[12])
local tail = nil
if key then tail = '\31' .. key end
-- A key as given, the caller's key at the end of a scoped composite, or a
-- concurrency key (as the SQL stores match it).
local function key_ok(uk, ck)
  if ck == key then return true end
  if not uk then return false end
  if uk == key then return true end
  return #uk > #tail and string.sub(uk, -#tail) == tail
end
local ids = redis.call('ZREVRANGEBYSCORE', B .. 'ids', hi, '-inf', 'LIMIT', 0, scan)
local out = {}
local last = ''
for _, p in ipairs(ids) do
  local sid = fmt(tonumber(p))
  last = sid
  local h = redis.call('HMGET', tkey(sid), 'state', 'queue', 'job', 'kind', 'unique_key',
    'concurrency_key', 'created_at')
  local ok = h[1] and (st == '' or h[1] == st) and ((not q) or h[2] == q)
    and ((not job) or h[3] == job) and ((not kind) or h[4] == kind)
    and ((not key) or key_ok(h[5], h[6]))
  if ok and (from or to) then
    local c = tonumber(h[7]) or 0
    ok = ((not from) or c >= from) and ((not to) or c < to)
  end
  if ok and text then
    local payload = redis.call('HGET', tkey(sid), 'payload') or ''
    ok = string.find(payload, text, 1, true) ~= nil
  end
  if ok then
    out[#out + 1] = redis.call('HGETALL', tkey(sid))
    if #out >= limit then break end
  end
end
local exhausted = 0
if #ids < scan then exhausted = 1 end
return {out, last, exhausted}
