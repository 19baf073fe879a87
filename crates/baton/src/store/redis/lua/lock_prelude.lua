-- Lock helpers: `KEYS` are lock keys, outside the `{baton}` tag. Every
-- string <-> number conversion costs the server more than the hash reads
-- and writes (strtod, and printf's `%.17g` for a number passed to
-- `redis.call`), so the scripts parse what they compare and format
-- integers with `%d`, once each.
local function fmt(n) return string.format('%d', n) end
local t = redis.call('TIME')
local now_s, now_frac = tonumber(t[1]), tonumber(t[2])
local now = now_s * 1000 + math.floor(now_frac / 1000)
