-- Lock helpers: `KEYS` are lock keys (`B lock:<name>`). Every
-- string <-> number conversion costs the server more than the hash reads
-- and writes (strtod, and printf's `%.17g` for a number passed to
-- `redis.call`), so the scripts parse what they compare and format
-- integers with `%d`, once each.
local function fmt(n) return string.format('%d', n) end
local t = redis.call('TIME')
local now_s, now_frac = tonumber(t[1]), tonumber(t[2])
local now = now_s * 1000 + math.floor(now_frac / 1000)
-- A lock record is a hash with exactly baton's four fields, the three
-- times and the token integers. `h` is HMGET's reply for holder, token,
-- locked_at, lock_until (taken with `redis.pcall`: a key of another type
-- answers an error table instead of raising WRONGTYPE).
local function ours(h)
  return (not h.err) and h[1] and tonumber(h[2]) and tonumber(h[3]) and tonumber(h[4]) and true or false
end
