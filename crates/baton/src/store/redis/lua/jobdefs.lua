-- An index script (B = `P{baton}:`): job definitions, the hash
-- `B jobdefs` (name -> JSON record {name, version, spec, deleted,
-- created_at, updated_at, by}; a delete keeps a tombstone, so a name's
-- version never repeats) and the change counter `B jobdefs_rev`, raised
-- by every write. ARGV: B, then
--   'put', name, expected version or '' (create), spec, by;
--   'delete', name, expected version or '' (any), by
--     -> {1, new version} or {0, live version or -1} (nothing changed);
--   'list' -> every record; 'get', name -> its record or nil;
--   'rev' -> the counter;
--   'prune', ms -> how many tombstones written more than ms ago were
--     deleted (the counter raised when any were).
local mode = ARGV[2]
local key = B .. 'jobdefs'
local rev = B .. 'jobdefs_rev'
if mode == 'list' then return redis.call('HVALS', key) end
if mode == 'get' then return redis.call('HGET', key, ARGV[3]) end
if mode == 'rev' then return tonumber(redis.call('GET', rev) or '0') end
if mode == 'prune' then
  local before = now_ms() - tonumber(ARGV[3])
  local all = redis.call('HGETALL', key)
  local gone = 0
  for i = 1, #all, 2 do
    local r = cjson.decode(all[i + 1])
    if r.deleted and r.updated_at < before then
      redis.call('HDEL', key, all[i])
      gone = gone + 1
    end
  end
  if gone > 0 then redis.call('INCR', rev) end
  return gone
end
local name = ARGV[3]
local expected = ARGV[4]
local raw = redis.call('HGET', key, name)
local rec = nil
if raw then rec = cjson.decode(raw) end
local live = -1
if rec and not rec.deleted then live = rec.version end
local now = now_ms()
if mode == 'put' then
  local ok
  if expected == '' then
    ok = (rec == nil) or rec.deleted
  else
    ok = live >= 0 and live == tonumber(expected)
  end
  if not ok then return {0, live} end
  local created = now
  local version = 1
  if rec then
    version = rec.version + 1
    if not rec.deleted then created = rec.created_at end
  end
  rec = {name = name, version = version, spec = ARGV[5], deleted = false,
    created_at = created, updated_at = now, by = ARGV[6]}
else
  if live < 0 or (expected ~= '' and tonumber(expected) ~= live) then return {0, live} end
  rec.version = rec.version + 1
  rec.deleted = true
  rec.updated_at = now
  rec.by = ARGV[5]
end
redis.call('HSET', key, name, cjson.encode(rec))
redis.call('INCR', rev)
return {1, rec.version}
