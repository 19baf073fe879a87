-- Schema upgrades of lock keys, one key per call; a key is touched only
-- when it is baton's by shape (a hash of exactly holder, token, locked_at
-- and lock_until, the last three integers): any other key is left as it
-- is, value and TTL.
-- KEYS: the lock key where versions before 6 kept it (`P lock:<name>`),
-- the lock key now (`B lock:<name>`), the lock index (`B locks`).
-- ARGV: op ('persist', 'index' or 'move'), name.
-- Returns 1 when the key was baton's (and converted), 0 otherwise.
local h = redis.pcall('HMGET', KEYS[1], 'holder', 'token', 'locked_at', 'lock_until')
local mine = ours(h) and redis.call('HLEN', KEYS[1]) == 4
local op = ARGV[1]
if not mine then
  -- A name an older upgrade step indexed from a key baton did not write.
  if op == 'move' and redis.call('EXISTS', KEYS[1]) == 1 and redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('SREM', KEYS[3], ARGV[2])
  end
  return 0
end
if op == 'persist' then
  redis.call('PERSIST', KEYS[1])
elseif op == 'index' then
  redis.call('SADD', KEYS[3], ARGV[2])
elseif op == 'move' then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('HSET', KEYS[2], 'holder', h[1], 'token', h[2], 'locked_at', h[3], 'lock_until', h[4])
  elseif not ours(redis.pcall('HMGET', KEYS[2], 'holder', 'token', 'locked_at', 'lock_until')) then
    -- A key baton did not write where the lock now lives: leave both.
    return 0
  end
  -- (When a process of this version already wrote the new record, it
  -- stands: its token, floored at the clock, is above the old one.)
  redis.call('DEL', KEYS[1])
  redis.call('SADD', KEYS[3], ARGV[2])
end
return 1
