-- Fair claiming (`TaskClaim::fair`, DESIGN.md T7) inside the claim
-- script: the plan of `store::fair` (its rule, and its walk over the keys
-- in rotation order from the cursor), written again here so that the
-- plan and the claim are one atomic script. The groups are read from the
-- index `B fk:<key>` / `B fkeys` (prelude), the queue's cursor is
-- `B fcursor` (the group its previous fair claim served last; '' or
-- absent: the group without a key, or none).
local function prio_of(score) return math.floor(score / SHIFT) - 128 end
-- A pending task whose cancel was requested while it ran: cancelled when
-- a fair claim meets it, as the plain claim does.
local function cancel_met(p, ck, c)
  local sid = fmt(tonumber(p))
  local k = tkey(sid)
  local f = redis.call('HMGET', k, 'unique_key', 'unique_forever', 'job')
  ready_del(p, ck)
  redis.call('HSET', k, 'last_error', c.reason)
  terminal(sid, c.queue, 'pending', 'cancelled', c.now, f[1], f[2], f[3])
end
-- Up to `n` due tasks of group `name` ('' for the tasks without a key) in
-- claim order, as {member, score}; an entry no longer in `ready` is
-- dropped, a task whose cancel was requested cancelled.
local function group_read(name, n, c)
  local ck = nil
  if name ~= '' then ck = name end
  local g = group_key(ck)
  local out, drop, cancel = {}, {}, {}
  local from = 0
  while #out < n do
    local r = redis.call('ZRANGE', g, from, from + (n - #out) - 1, 'WITHSCORES')
    if #r == 0 then break end
    for j = 1, #r, 2 do
      local p = r[j]
      if not redis.call('ZSCORE', B .. 'ready', p) then
        drop[#drop + 1] = p
      elseif redis.call('HGET', tkey(fmt(tonumber(p))), 'cancel_requested') == '1' then
        cancel[#cancel + 1] = p
      else
        out[#out + 1] = {p, tonumber(r[j + 1])}
      end
    end
    from = from + #r / 2
  end
  for _, p in ipairs(drop) do group_del(p, ck) end
  for _, p in ipairs(cancel) do cancel_met(p, ck, c) end
  return out
end
-- The rank `(priority, n + running, after the cursor, name)`: smaller
-- first (`after` is true for the groups after the cursor: they go first).
local function rank_less(a, b)
  if a.prio ~= b.prio then return a.prio < b.prio end
  if a.n ~= b.n then return a.n < b.n end
  if a.after ~= b.after then return a.after end
  return a.name < b.name
end
-- The fair plan of a claim of at most `c.total` tasks: the members to
-- claim, best first, each {member, group name}; moves the cursor.
-- `c.per_key`: the cap per key (or nil); `c.share`: how many start at
-- once (the rest need an attempt to spare); `c.extra`: the buffer share.
local function fair_plan(c)
  local total = c.total
  if total <= 0 then return {} end
  -- Running tasks per group: `B krun` per key, the rest without one.
  local running = {}
  local kr = redis.call('HGETALL', B .. 'krun')
  local keyed = 0
  for j = 1, #kr - 1, 2 do
    local n = tonumber(kr[j + 1])
    running[kr[j]] = n
    keyed = keyed + n
  end
  local all = tonumber(redis.call('HGET', B .. 'counts', 'running') or '0')
  if all - keyed > 0 then running[''] = all - keyed end
  local function run_of(name) return running[name] or 0 end
  local function room(name)
    if name ~= '' and c.per_key then return c.per_key - run_of(name) end
    return total + c.extra
  end
  local cursor = redis.call('GET', B .. 'fcursor') or ''
  -- The queue's best due priority (the head of `ready`).
  local best = nil
  while not best do
    local r = redis.call('ZRANGE', B .. 'ready', 0, 0, 'WITHSCORES')
    if #r == 0 then return {} end
    local h = redis.call('HMGET', tkey(fmt(tonumber(r[1]))), 'cancel_requested', 'concurrency_key')
    if h[1] == '1' then cancel_met(r[1], h[2], c) else best = prio_of(tonumber(r[2])) end
  end
  -- The heads of the group without a key and of the keys running.
  local heads, seen = {}, {}
  local function head(name)
    local r = group_read(name, 1, c)
    if #r == 0 then return nil end
    heads[#heads + 1] = {name = name, prio = prio_of(r[1][2])}
    return heads[#heads]
  end
  head('')
  for name, _ in pairs(running) do
    if name ~= '' then
      seen[name] = true
      head(name)
    end
  end
  -- The other keys in rotation order (after the cursor, then from the
  -- first up to it), until `total` keys have a head at the best priority
  -- and nothing running: every key not walked ranks after each of them.
  local found = 0
  local function walk(lo, hi)
    while found < total do
      local ks = redis.call('ZRANGEBYLEX', B .. 'fkeys', lo, hi, 'LIMIT', 0, total + 8)
      if #ks == 0 then return end
      for _, k in ipairs(ks) do
        if not seen[k] then
          seen[k] = true
          local h = head(k)
          if h and h.prio == best then found = found + 1 end
          if found >= total then return end
        end
      end
      lo = '(' .. ks[#ks]
    end
  end
  if cursor == '' then
    walk('-', '+')
  else
    walk('(' .. cursor, '+')
    walk('-', '[' .. cursor)
  end
  -- The at most `total` groups whose heads rank first (not at their cap),
  -- then their first tasks ranked: a group's n-th task ranks after its
  -- head, so no other task can make the cut.
  local open = {}
  for _, h in ipairs(heads) do
    local rm = room(h.name)
    if rm > 0 then
      open[#open + 1] = {prio = h.prio, n = 1 + run_of(h.name), after = h.name > cursor,
        name = h.name, room = rm}
    end
  end
  table.sort(open, rank_less)
  local cands = {}
  for i = 1, math.min(total, #open) do
    local g = open[i]
    for n, r in ipairs(group_read(g.name, math.min(g.room, total + c.extra), c)) do
      cands[#cands + 1] = {p = r[1], prio = prio_of(r[2]), n = n + run_of(g.name),
        after = g.after, name = g.name}
    end
  end
  table.sort(cands, rank_less)
  local plan = {}
  for i, cd in ipairs(cands) do
    if #plan >= total then break end
    local ok = i - 1 < c.share
    if not ok then
      local a = redis.call('HMGET', tkey(fmt(tonumber(cd.p))), 'attempt', 'max_attempts')
      ok = tonumber(a[1]) + 1 < tonumber(a[2])
    end
    if ok then plan[#plan + 1] = cd end
  end
  if #plan > 0 then redis.call('SET', B .. 'fcursor', plan[#plan].name) end
  return plan
end
