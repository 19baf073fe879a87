-- ARGV: B, version or ''. Records the version if it is higher than the
-- recorded one (none: only reads). Returns the version found before (0
-- when none).
local cur = tonumber(redis.call('GET', B .. 'schema') or '0')
if ARGV[2] ~= '' and cur < tonumber(ARGV[2]) then redis.call('SET', B .. 'schema', ARGV[2]) end
return cur
