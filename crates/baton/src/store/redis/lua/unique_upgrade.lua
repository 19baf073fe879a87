-- Schema step 9 -> 10 (unique key scopes): ARGV: B, then task ids as the
-- queue's `ids` zset holds them. Rewrites the unique key of each listed
-- task that is no job's run and has a key from before scopes (no leading
-- \31) into the default scope's composite
-- `\31 k \31 queue \31 kind \31 \31 \31 key` (as `UniqueKey::upgraded`
-- spells it), moving `uniq:<key>` with it when that holds this task; a
-- composite over 1024 bytes stays as it was. Idempotent. Returns the
-- number rewritten.
local n = 0
for i = 2, #ARGV do
  local sid = fmt(tonumber(ARGV[i]))
  local k = tkey(sid)
  local h = redis.call('HMGET', k, 'unique_key', 'job', 'queue', 'kind')
  local uk = h[1]
  if uk and uk ~= '' and not h[2] and h[3] and h[4] and string.byte(uk, 1) ~= 31 then
    local c = '\31k\31' .. h[3] .. '\31' .. h[4] .. '\31\31\31' .. uk
    if #c <= 1024 then
      redis.call('HSET', k, 'unique_key', c)
      local old = B .. 'uniq:' .. uk
      if redis.call('GET', old) == sid then
        redis.call('SET', B .. 'uniq:' .. c, sid, 'NX')
        redis.call('DEL', old)
      end
      n = n + 1
    end
  end
end
return n
