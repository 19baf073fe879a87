-- An index script (B = `P{baton}:`). ARGV: B, then the queue of each
-- task to come. Reserves one id per task from the one counter `B seq`
-- (each id `max(previous + 1, TIME in µs)`, so ids never repeat, even
-- after a restart that lost the counter, nor across shards), records
-- where each lives (`B where`, id -> queue: what get, cancel and retry by
-- id alone look up) and adds the queues to `B queues`. Returns the first
-- id; the rest follow it.
local n = #ARGV - 1
local first = tonumber(redis.call('GET', B .. 'seq') or '0') + 1
local floor = now_us()
if first < floor then first = floor end
redis.call('SET', B .. 'seq', fmt(first + n - 1))
local w, qs = {}, {}
for i = 1, n do
  w[#w + 1] = fmt(first + i - 1)
  w[#w + 1] = ARGV[i + 1]
  qs[ARGV[i + 1]] = true
  if #w >= 1000 then redis.call('HSET', B .. 'where', unpack(w)); w = {} end
end
if #w > 0 then redis.call('HSET', B .. 'where', unpack(w)) end
local names = {}
for q, _ in pairs(qs) do names[#names + 1] = q end
if #names > 0 then redis.call('SADD', B .. 'queues', unpack(names)) end
return first
