-- KEYS: lock, its history list. ARGV: token, at_least ms, how many
-- releases the history keeps (0: the store records no
-- history, `LockRelease::record`). Returns 1, or 0 when the
-- lock was not held by this token any more (or the key holds a value
-- baton did not write: it is left alone). A release pushes its record
-- onto the history, newest first, as plain text: `<token> \31 <acquired
-- at ms> \31 <released at ms> \31 <holder>` (no JSON to encode; the
-- holder last, so it may hold anything), and trims the list only once it
-- is longer than it keeps.
local h = redis.pcall('HMGET', KEYS[1], 'token', 'lock_until', 'locked_at', 'holder')
if h.err or h[1] ~= ARGV[1] or (not tonumber(h[2])) or tonumber(h[2]) <= now then return 0 end
local lu = now
if ARGV[2] ~= '0' and tonumber(h[3]) then
  local least = tonumber(h[3]) + tonumber(ARGV[2])
  if least > lu then lu = least end
end
redis.call('HSET', KEYS[1], 'lock_until', fmt(lu))
if ARGV[3] ~= '0' then
  local keep = tonumber(ARGV[3])
  if redis.call('LPUSH', KEYS[2], h[1] .. '\31' .. (h[3] or '0') .. '\31' .. fmt(now) .. '\31' .. (h[4] or '')) > keep then
    redis.call('LTRIM', KEYS[2], 0, keep - 1)
  end
end
return 1
