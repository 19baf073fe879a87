//! The Redis backend.
//!
//! Every operation is one Lua script (`redis::Script`; `EVALSHA` with a
//! fallback on `NOSCRIPT`), so each is atomic on the server, and every "now"
//! is `redis.call('TIME')` inside the script — the client clock is never
//! read for an expiry or due-time decision (DESIGN.md C1).
//!
//! # Keys
//!
//! With `P` the configured prefix (default empty) and `B = P{baton}:`:
//!
//! - `P lock:<name>` — hash `holder`, `token`, `locked_at`, `lock_until`
//!   (ms). Never deleted by release and never expires (schema 2; before, it
//!   had a TTL a day past `lock_until`), so it keeps the last token. A new
//!   token is `max(previous + 1, TIME in µs)` so tokens keep rising even
//!   after a restart that lost data.
//! - `B task:<id>` — hash with every task field (timestamps in ms since the
//!   epoch, `errors` a JSON array of `{attempt, at (ms), error}`;
//!   `claim_token`, absent before the first claim of schema 2, counts as 0).
//! - `B seq` — the id counter (`INCR`).
//! - `B q:<queue>:sched` — zset of pending tasks not yet due, score `run_at`.
//! - `B q:<queue>:ready` — zset of due pending tasks, score
//!   `(priority + 128) · 2⁴³ + run_at` (exact in a double: < 2⁵¹), members
//!   zero-padded ids so equal scores order by id.
//! - `B running` — zset of running tasks, score `lease_until` (rescue).
//! - `B done` — zset of terminal tasks, score `finished_at` (prune).
//! - `B ids` — zset of every task id (listing, newest first).
//! - `B uniq:<key>` — the id holding a unique key.
//! - `B counts:<queue>` — hash state → count (stats); `B queues` — set.
//! - `B jobactive:<job>` — set of the job's pending/running task ids.
//! - `B job:<name>` — hash `last_slot` (ms), `paused`; `B jobs` — set.
//! - `B wake` — the pub/sub channel announcing new pending work: the queue
//!   name (due now), or `queue\n<run_at in µs>` for work due later.
//! - `B schema` — the schema version.
//!
//! All queue and job keys share the `{baton}` hash tag, so a Redis Cluster
//! could run every script on one slot; the lock keys are independent.
//!
//! # Faults
//!
//! Commands go through a [`ConnectionManager`] with short connection and
//! response timeouts: a dead server yields [`StoreError::Unavailable`]
//! within a few seconds while the manager reconnects in the background;
//! the layer above retries. Idempotent reads are retried once here.
//!
//! An enqueue of more than 500 tasks is several scripts, pipelined 8 at a
//! time: each script (500 tasks) is atomic, the whole batch is not. If the
//! connection breaks mid-batch the call fails although earlier chunks may
//! be stored; a retry is safe for tasks with a unique key.
//!
//! A claim moves at most 10 000 due tasks from `sched` to `ready` per call,
//! oldest first, so after a very large backlog falls due at once the
//! priority order holds across the moved part and settles within a few
//! claims.
//!
//! The lock, queue and schedule guarantees hold only as far as Redis keeps
//! its data; [`Backend::warnings`] says so when AOF is off.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, Script};
use serde::Deserialize;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::SlotRecord;
use super::{
    from_ms, ms, redact, Acquire, Advanced, AttemptError, Backend, CancelOutcome, Claim,
    ClaimRequest, Enqueued, FencingToken, Finish, Heartbeat, JobState, LockInfo, LockRequest,
    NewTask, Overlap, QueueStats, Rescued, RunAt, SlotAdvance, StoreOptions, Task, TaskFilter,
    TaskInfo, TaskState, Wake, CANCEL_REQUESTED, LEASE_EXPIRED, OVERLAP_SKIPPED,
};
use crate::error::StoreError;

/// Script arguments as strings.
macro_rules! sargs {
    ($($a:expr),* $(,)?) => {
        vec![$($a.to_string()),*]
    };
}

/// Retry an idempotent read once when the connection was broken.
macro_rules! read_retry {
    ($e:expr) => {
        match $e {
            Err(StoreError::Unavailable(_)) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                $e
            }
            other => other,
        }
    };
}

/// The version a store without a recorded version is taken to have: the
/// first one (it had no keys needing conversion).
const BASE_VERSION: i64 = 1;

/// The schema version recorded by [`Backend::migrate`]: the base plus one
/// per upgrade step.
pub const SCHEMA_VERSION: i64 = BASE_VERSION + UPGRADES.len() as i64;

/// One schema upgrade step, taking the keys from version `n` to `n + 1`,
/// where `n - BASE_VERSION` is the step's index in [`UPGRADES`]. Redis has
/// no migration lock: a step must be idempotent and safe while other
/// processes (of either version) use the keys; what cannot be converted
/// at once is converted lazily by the scripts.
#[derive(Debug, Clone, Copy)]
enum Upgrade {
    /// 1 → 2: lock hashes lose their TTL (they keep the last fencing
    /// token forever). Claim tokens need no conversion: a task hash
    /// without `claim_token` counts as 0, and a pending task whose cancel
    /// was requested is cancelled by the next claim that meets it.
    PersistLocks,
}

/// The upgrade steps, in order. Add a variant and an entry at the end (and
/// nothing else: [`SCHEMA_VERSION`] follows).
const UPGRADES: &[Upgrade] = &[Upgrade::PersistLocks];

/// How long one connection attempt of the wake-up (pub/sub) connection may
/// take; the command connection uses `StoreOptions::connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Tasks per enqueue script call.
const ENQUEUE_CHUNK: usize = 500;
/// Enqueue script calls per pipelined round trip.
const ENQUEUE_PIPELINE: usize = 8;
/// Finished attempts per finish script call.
const FINISH_CHUNK: usize = 256;
/// Tasks handled per rescue / prune script call (they loop until done).
const BATCH: usize = 1000;
/// Ids examined per listing script call.
const LIST_SCAN: usize = 2000;
/// Fields per task in the flattened enqueue arguments.
const TASK_ARGS: usize = 12;

// ---------------------------------------------------------------------------
// Lua
// ---------------------------------------------------------------------------

/// Shared helpers for the queue and job scripts. `ARGV[1]` is always the
/// key base `P{baton}:`; `KEYS[1]` is a key in the same slot for routing.
const PRELUDE: &str = r#"
local B = ARGV[1]
local SHIFT = 8796093022208
local NF = 12
local function fmt(n) return string.format('%d', n) end
local function pad(id) return string.format('%016d', tonumber(id)) end
local function tkey(sid) return B .. 'task:' .. sid end
local function qkey(queue, what) return B .. 'q:' .. queue .. ':' .. what end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function rscore(prio, run_at)
  local r = run_at
  if r < 0 then r = 0 end
  if r >= SHIFT then r = SHIFT - 1 end
  return (prio + 128) * SHIFT + r
end
local function count(queue, state, d)
  redis.call('HINCRBY', B .. 'counts:' .. queue, state, d)
end
local function opt(s)
  if s == nil or s == false or s == '' then return nil end
  return string.sub(s, 2)
end
local function append_error(sid, attempt, now, err)
  local item = '{"attempt":' .. fmt(attempt) .. ',"at":' .. fmt(now) .. ',"error":' .. cjson.encode(err) .. '}'
  local k = tkey(sid)
  local cur = redis.call('HGET', k, 'errors')
  local v
  if (not cur) or cur == '' or cur == '[]' then
    v = '[' .. item .. ']'
  else
    v = string.sub(cur, 1, -2) .. ',' .. item .. ']'
  end
  redis.call('HSET', k, 'errors', v, 'last_error', err)
end
local function place(sid, queue, prio, run_at, now)
  if run_at <= now then
    redis.call('ZADD', qkey(queue, 'ready'), rscore(prio, run_at), pad(sid))
    return 1
  end
  redis.call('ZADD', qkey(queue, 'sched'), run_at, pad(sid))
  return 0
end
-- Batched writes: many tasks' index updates become one call per key.
local acc_z, acc_c, acc_q = {}, {}, {}
local function zacc(key, score, member)
  local t = acc_z[key]
  if not t then t = {}; acc_z[key] = t end
  t[#t + 1] = score
  t[#t + 1] = member
end
local function cacc(queue, state, d)
  local k = B .. 'counts:' .. queue
  local t = acc_c[k]
  if not t then t = {}; acc_c[k] = t end
  t[state] = (t[state] or 0) + d
end
local function flush()
  for k, t in pairs(acc_z) do
    for j = 1, #t, 1000 do
      redis.call('ZADD', k, unpack(t, j, math.min(j + 999, #t)))
    end
  end
  for k, t in pairs(acc_c) do
    for st, n in pairs(t) do
      if n ~= 0 then redis.call('HINCRBY', k, st, n) end
    end
  end
  local qs = {}
  for q, _ in pairs(acc_q) do qs[#qs + 1] = q end
  if #qs > 0 then redis.call('SADD', B .. 'queues', unpack(qs)) end
  acc_z, acc_c, acc_q = {}, {}, {}
end
local function release_uniq(sid, uk, forever)
  if uk and forever ~= '1' then
    local k = B .. 'uniq:' .. uk
    if redis.call('GET', k) == sid then redis.call('DEL', k) end
  end
end
local function terminal(sid, queue, from, state, now, uk, forever, job)
  local k = tkey(sid)
  local p = pad(sid)
  redis.call('HSET', k, 'state', state, 'finished_at', fmt(now))
  redis.call('HDEL', k, 'lease_until')
  redis.call('ZREM', B .. 'running', p)
  redis.call('ZADD', B .. 'done', now, p)
  count(queue, from, -1)
  count(queue, state, 1)
  release_uniq(sid, uk, forever)
  if job then redis.call('SREM', B .. 'jobactive:' .. job, sid) end
end
local function running_to_pending(sid, queue, prio, run_at, now, extra)
  local k = tkey(sid)
  redis.call('HSET', k, 'state', 'pending', 'run_at', fmt(run_at))
  if extra then redis.call('HSET', k, unpack(extra)) end
  redis.call('HDEL', k, 'lease_until')
  redis.call('ZREM', B .. 'running', pad(sid))
  count(queue, 'running', -1)
  count(queue, 'pending', 1)
  return place(sid, queue, prio, run_at, now)
end
-- Insert the task whose NF arguments start at ARGV[i]. With skipped set,
-- insert it directly as cancelled with that reason.
local function insert(now, i, skipped)
  local queue = ARGV[i]
  local prio = tonumber(ARGV[i + 3])
  local mode = ARGV[i + 4]
  local run_at = now
  if mode == 'd' then run_at = now + tonumber(ARGV[i + 5])
  elseif mode == 'a' then run_at = tonumber(ARGV[i + 5]) end
  local uk = opt(ARGV[i + 8])
  local forever = ARGV[i + 9]
  local job = opt(ARGV[i + 10])
  if uk and not skipped then
    local ex = redis.call('GET', B .. 'uniq:' .. uk)
    if ex and redis.call('EXISTS', tkey(ex)) == 1 then return tonumber(ex), 0, 0 end
  end
  local id = redis.call('INCR', B .. 'seq')
  local sid = fmt(id)
  local f = {'id', sid, 'queue', queue, 'kind', ARGV[i + 1], 'payload', ARGV[i + 2],
    'priority', ARGV[i + 3], 'attempt', '0', 'max_attempts', ARGV[i + 6],
    'run_at', fmt(run_at), 'created_at', fmt(now), 'cancel_requested', '0'}
  local function add(k, v) f[#f + 1] = k; f[#f + 1] = v end
  if ARGV[i + 7] ~= '' then add('timeout_ms', ARGV[i + 7]) end
  if uk then add('unique_key', uk); add('unique_forever', forever) end
  if job then add('job', job) end
  if ARGV[i + 11] ~= '' then add('slot', ARGV[i + 11]) end
  local state = 'pending'
  if skipped then
    state = 'cancelled'
    add('finished_at', fmt(now))
    add('last_error', skipped)
  end
  add('state', state)
  redis.call('HSET', tkey(sid), unpack(f))
  local p = pad(sid)
  zacc(B .. 'ids', id, p)
  acc_q[queue] = true
  cacc(queue, state, 1)
  local due = 0
  if skipped then
    zacc(B .. 'done', now, p)
    if uk and forever == '1' then redis.call('SET', B .. 'uniq:' .. uk, sid, 'NX') end
  else
    if run_at <= now then
      zacc(qkey(queue, 'ready'), rscore(prio, run_at), p)
      due = 1
    else
      zacc(qkey(queue, 'sched'), run_at, p)
    end
    if job then redis.call('SADD', B .. 'jobactive:' .. job, sid) end
    if uk then redis.call('SET', B .. 'uniq:' .. uk, sid) end
  end
  return id, 1, due, run_at
end
-- Announce work due later: `queue\n<run_at in µs>` (see Wake::parse).
local function wake_at(queue, run_at)
  redis.call('PUBLISH', B .. 'wake', queue .. '\n' .. fmt(run_at * 1000))
end
-- Keep the earliest future run_at per queue in `t`.
local function keep_min(t, queue, run_at)
  if (not t[queue]) or run_at < t[queue] then t[queue] = run_at end
end
"#;

/// ARGV: B, publish flag, then NF arguments per task.
const ENQUEUE: &str = r#"
local now = now_ms()
local out = {}
local wake = {}
local later = {}
local i = 3
while i + NF - 1 <= #ARGV do
  local id, ins, due, run_at = insert(now, i, nil)
  out[#out + 1] = id
  out[#out + 1] = ins
  out[#out + 1] = due
  if ins == 1 and due == 1 then wake[ARGV[i]] = true end
  if ins == 1 and due == 0 then keep_min(later, ARGV[i], run_at) end
  i = i + NF
end
flush()
if ARGV[2] == '1' then
  for q, _ in pairs(wake) do redis.call('PUBLISH', B .. 'wake', q) end
end
-- Work due later is announced by every chunk (the caller publishes only
-- the due queues of a multi-chunk batch).
for q, at in pairs(later) do wake_at(q, at) end
return out
"#;

/// ARGV: B, queue, worker, limit, lease ms, cluster-wide cap on running (or
/// ''), the `last_error` of a pending task found with its cancel requested.
const CLAIM: &str = r#"
local now = now_ms()
local queue = ARGV[2]
local sched = qkey(queue, 'sched')
local ready = qkey(queue, 'ready')
-- Move due scheduled tasks into ready, oldest first; at most 10000 per
-- claim so one call stays short (a larger backlog moves over a few claims).
for _ = 1, 20 do
  local due = redis.call('ZRANGEBYSCORE', sched, '-inf', now, 'LIMIT', 0, 500)
  if #due == 0 then break end
  local add = {}
  for _, p in ipairs(due) do
    local h = redis.call('HMGET', tkey(fmt(tonumber(p))), 'priority', 'run_at', 'state')
    if h[3] == 'pending' then
      add[#add + 1] = rscore(tonumber(h[1]), tonumber(h[2]))
      add[#add + 1] = p
    end
  end
  if #add > 0 then redis.call('ZADD', ready, unpack(add)) end
  redis.call('ZREM', sched, unpack(due))
end
local out = {}
local us = now_us()
local CANCEL_REQUESTED = ARGV[7]
local limit = tonumber(ARGV[4])
local lu = now + tonumber(ARGV[5])
-- A cluster-wide cap on the queue's running tasks (ARGV[6], '' for none).
if ARGV[6] ~= '' then
  local running = tonumber(redis.call('HGET', B .. 'counts:' .. queue, 'running') or '0')
  local room = tonumber(ARGV[6]) - running
  if room < limit then limit = room end
end
while #out < limit do
  local popped = redis.call('ZPOPMIN', ready, limit - #out)
  if #popped == 0 then break end
  for j = 1, #popped, 2 do
    local p = popped[j]
    local sid = fmt(tonumber(p))
    local k = tkey(sid)
    local h = redis.call('HGETALL', k)
    local f = {}
    for j = 1, #h - 1, 2 do f[h[j]] = h[j + 1] end
    if f.state == 'pending' and f.cancel_requested == '1' then
      -- Its cancel was requested while it ran: never claim it again.
      redis.call('HSET', k, 'last_error', CANCEL_REQUESTED)
      terminal(sid, queue, 'pending', 'cancelled', now, f.unique_key, f.unique_forever, f.job)
    elseif f.state == 'pending' then
      -- The claim token only rises: max(previous + 1, store clock in µs).
      local tok = tonumber(f.claim_token or '0') + 1
      if us > tok then tok = us end
      local set = {state = 'running', attempt = fmt(tonumber(f.attempt) + 1), started_at = fmt(now),
        lease_until = fmt(lu), worker = ARGV[3], claim_token = fmt(tok)}
      redis.call('HSET', k, 'state', set.state, 'attempt', set.attempt,
        'started_at', set.started_at, 'lease_until', set.lease_until, 'worker', set.worker,
        'claim_token', set.claim_token)
      -- Answer with the updated record without reading it again.
      for j = 1, #h - 1, 2 do
        local v = set[h[j]]
        if v then h[j + 1] = v; set[h[j]] = nil end
      end
      for f, v in pairs(set) do h[#h + 1] = f; h[#h + 1] = v end
      zacc(B .. 'running', lu, p)
      cacc(queue, 'pending', -1)
      cacc(queue, 'running', 1)
      out[#out + 1] = h
    end
  end
end
flush()
return out
"#;

/// ARGV: B, lease ms, then (id, claim token) pairs. 0 lost, 1 extended, 2 cancel requested.
const HEARTBEAT: &str = r#"
local now = now_ms()
local lu = now + tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV - 1, 2 do
  local sid = ARGV[i]
  local k = tkey(sid)
  local h = redis.call('HMGET', k, 'state', 'claim_token', 'cancel_requested')
  if h[1] == 'running' and h[2] == ARGV[i + 1] then
    redis.call('HSET', k, 'lease_until', fmt(lu))
    redis.call('ZADD', B .. 'running', lu, pad(sid))
    if h[3] == '1' then out[#out + 1] = 2 else out[#out + 1] = 1 end
  else
    out[#out + 1] = 0
  end
end
return out
"#;

/// ARGV: B, the cancel-requested text, then per item: id, claim token,
/// kind (s/f/c/h), text, retry ms or ''. Returns 1 or 0 per item (0: the
/// claim is no longer current). Transitions: DESIGN.md's task state table.
const FINISH: &str = r#"
local now = now_ms()
local CANCEL_REQUESTED = ARGV[2]
local later = {}
local function finish_one(sid, tok, kind, text, retry)
  local k = tkey(sid)
  local h = redis.call('HMGET', k, 'state', 'claim_token', 'queue', 'unique_key', 'unique_forever', 'job', 'max_attempts', 'priority', 'run_at', 'attempt', 'cancel_requested')
  if h[1] ~= 'running' or h[2] ~= tok then return 0 end
  local queue = h[3]
  local uk = h[4]
  local forever = h[5]
  local job = h[6]
  local attempt = tonumber(h[10])
  local cancel = h[11] == '1'
  if kind == 's' then
    terminal(sid, queue, 'running', 'succeeded', now, uk, forever, job)
  elseif kind == 'f' then
    append_error(sid, attempt, now, text)
    if retry ~= '' and attempt < tonumber(h[7]) and cancel then
      redis.call('HSET', k, 'last_error', CANCEL_REQUESTED .. ': ' .. text)
      terminal(sid, queue, 'running', 'cancelled', now, uk, forever, job)
    elseif retry ~= '' and attempt < tonumber(h[7]) then
      local at = now + tonumber(retry)
      if running_to_pending(sid, queue, tonumber(h[8]), at, now, nil) == 1 then
        redis.call('PUBLISH', B .. 'wake', queue)
      else
        keep_min(later, queue, at)
      end
    else
      terminal(sid, queue, 'running', 'failed', now, uk, forever, job)
    end
  elseif kind == 'c' then
    redis.call('HSET', k, 'last_error', text)
    terminal(sid, queue, 'running', 'cancelled', now, uk, forever, job)
  elseif cancel then
    -- Handed back after its cancel was requested: cancelled, uncounted.
    redis.call('HSET', k, 'attempt', fmt(attempt - 1), 'last_error', CANCEL_REQUESTED)
    terminal(sid, queue, 'running', 'cancelled', now, uk, forever, job)
  else
    -- Handed back: keep its place in line (its run_at), resume at once.
    running_to_pending(sid, queue, tonumber(h[8]), tonumber(h[9] or '') or now, now, {'attempt', fmt(attempt - 1)})
    redis.call('PUBLISH', B .. 'wake', queue)
  end
  return 1
end
local out = {}
for i = 3, #ARGV - 4, 5 do
  out[#out + 1] = finish_one(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
end
for q, at in pairs(later) do wake_at(q, at) end
return out
"#;

/// ARGV: B, id, claim token, progress JSON.
const PROGRESS: &str = r#"
local k = tkey(ARGV[2])
local h = redis.call('HMGET', k, 'state', 'claim_token')
if h[1] ~= 'running' or h[2] ~= ARGV[3] then return 0 end
redis.call('HSET', k, 'progress', ARGV[4])
return 1
"#;

/// ARGV: B, batch size, lease-expired text. Returns {requeued, failed, cancelled, examined}.
const RESCUE: &str = r#"
local now = now_ms()
local exp = redis.call('ZRANGEBYSCORE', B .. 'running', '-inf', '(' .. fmt(now), 'LIMIT', 0, tonumber(ARGV[2]))
local rq, fl, cn = 0, 0, 0
local wake = {}
for _, p in ipairs(exp) do
  local sid = fmt(tonumber(p))
  local h = redis.call('HMGET', tkey(sid), 'state', 'attempt', 'max_attempts', 'cancel_requested',
    'queue', 'unique_key', 'unique_forever', 'job', 'priority', 'lease_until', 'run_at')
  if h[1] ~= 'running' then
    redis.call('ZREM', B .. 'running', p)
  elseif tonumber(h[10] or '0') < now then
    local attempt = tonumber(h[2])
    local queue = h[5]
    append_error(sid, attempt, now, ARGV[3])
    if h[4] == '1' then
      terminal(sid, queue, 'running', 'cancelled', now, h[6], h[7], h[8])
      cn = cn + 1
    elseif attempt >= tonumber(h[3]) then
      terminal(sid, queue, 'running', 'failed', now, h[6], h[7], h[8])
      fl = fl + 1
    else
      -- Keep its place in line (its run_at): a rescued task resumes first.
      running_to_pending(sid, queue, tonumber(h[9]), tonumber(h[11] or '') or now, now, nil)
      rq = rq + 1
      wake[queue] = true
    end
  end
end
for q, _ in pairs(wake) do redis.call('PUBLISH', B .. 'wake', q) end
return {rq, fl, cn, #exp}
"#;

/// ARGV: B, id. Returns {outcome, state}.
const CANCEL: &str = r#"
local now = now_ms()
local sid = ARGV[2]
local h = redis.call('HMGET', tkey(sid), 'state', 'queue', 'unique_key', 'unique_forever', 'job')
if not h[1] then return {'notfound', ''} end
if h[1] == 'pending' then
  local p = pad(sid)
  redis.call('ZREM', qkey(h[2], 'ready'), p)
  redis.call('ZREM', qkey(h[2], 'sched'), p)
  terminal(sid, h[2], 'pending', 'cancelled', now, h[3], h[4], h[5])
  return {'cancelled', ''}
elseif h[1] == 'running' then
  redis.call('HSET', tkey(sid), 'cancel_requested', '1')
  return {'requested', ''}
end
return {'finished', h[1]}
"#;

/// ARGV: B, id. Returns 1 retried, 0 not failed/cancelled, -1 unique key conflict.
const RETRY: &str = r#"
local now = now_ms()
local sid = ARGV[2]
local k = tkey(sid)
local h = redis.call('HMGET', k, 'state', 'queue', 'unique_key', 'unique_forever', 'job', 'attempt', 'max_attempts', 'priority')
if h[1] ~= 'failed' and h[1] ~= 'cancelled' then return 0 end
local queue = h[2]
local uk = h[3]
if uk then
  local ukey = B .. 'uniq:' .. uk
  local ex = redis.call('GET', ukey)
  if ex and ex ~= sid then
    local o = redis.call('HMGET', tkey(ex), 'state', 'unique_forever')
    if o[1] == 'pending' or o[1] == 'running' or (o[1] and o[2] == '1') then return -1 end
  end
  redis.call('SET', ukey, sid)
end
local maxa = tonumber(h[7])
local need = tonumber(h[6]) + 1
if need > maxa then maxa = need end
redis.call('HSET', k, 'state', 'pending', 'run_at', fmt(now), 'cancel_requested', '0', 'max_attempts', fmt(maxa))
redis.call('HDEL', k, 'finished_at', 'lease_until')
redis.call('ZREM', B .. 'done', pad(sid))
count(queue, h[1], -1)
count(queue, 'pending', 1)
place(sid, queue, tonumber(h[8]), now, now)
if h[5] then redis.call('SADD', B .. 'jobactive:' .. h[5], sid) end
redis.call('PUBLISH', B .. 'wake', queue)
return 1
"#;

/// ARGV: B, before id or '', limit, state or '', queue (opt), job (opt).
/// Returns {tasks, last id examined, exhausted}.
const LIST: &str = r#"
local hi = '+inf'
if ARGV[2] ~= '' then hi = '(' .. ARGV[2] end
local limit = tonumber(ARGV[3])
local st = ARGV[4]
local q = opt(ARGV[5])
local job = opt(ARGV[6])
local scan = tonumber(ARGV[7])
local ids = redis.call('ZREVRANGEBYSCORE', B .. 'ids', hi, '-inf', 'LIMIT', 0, scan)
local out = {}
local last = ''
for _, p in ipairs(ids) do
  local sid = fmt(tonumber(p))
  last = sid
  local h = redis.call('HMGET', tkey(sid), 'state', 'queue', 'job')
  if h[1] and (st == '' or h[1] == st) and ((not q) or h[2] == q) and ((not job) or h[3] == job) then
    out[#out + 1] = redis.call('HGETALL', tkey(sid))
    if #out >= limit then break end
  end
end
local exhausted = 0
if #ids < scan then exhausted = 1 end
return {out, last, exhausted}
"#;

/// ARGV: B. Returns per queue {name, flat counts, oldest due pending age ms or ''}.
const STATS: &str = r#"
local now = now_ms()
local out = {}
for _, q in ipairs(redis.call('SMEMBERS', B .. 'queues')) do
  local c = redis.call('HGETALL', B .. 'counts:' .. q)
  local oldest = nil
  local s = redis.call('ZRANGEBYSCORE', qkey(q, 'sched'), '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
  if #s >= 2 then oldest = tonumber(s[2]) end
  local lo = '-inf'
  while true do
    local r = redis.call('ZRANGEBYSCORE', qkey(q, 'ready'), lo, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if #r < 2 then break end
    local sc = tonumber(r[2])
    local band = math.floor(sc / SHIFT)
    local ra = sc - band * SHIFT
    if (not oldest) or ra < oldest then oldest = ra end
    lo = '(' .. fmt((band + 1) * SHIFT - 1)
  end
  local age = ''
  if oldest then
    local a = now - oldest
    if a < 0 then a = 0 end
    age = fmt(a)
  end
  out[#out + 1] = {q, c, age}
end
return out
"#;

/// ARGV: B, older than ms, batch. Returns {deleted, examined}.
const PRUNE: &str = r#"
local now = now_ms()
local cutoff = now - tonumber(ARGV[2])
local ps = redis.call('ZRANGEBYSCORE', B .. 'done', '-inf', '(' .. fmt(cutoff), 'LIMIT', 0, tonumber(ARGV[3]))
local n = 0
for _, p in ipairs(ps) do
  local sid = fmt(tonumber(p))
  local k = tkey(sid)
  local h = redis.call('HMGET', k, 'state', 'queue', 'unique_key', 'job', 'finished_at')
  if (h[1] == 'succeeded' or h[1] == 'failed' or h[1] == 'cancelled') and tonumber(h[5] or '0') < cutoff then
    redis.call('DEL', k)
    count(h[2], h[1], -1)
    redis.call('ZREM', B .. 'ids', p)
    if h[3] then
      local ukey = B .. 'uniq:' .. h[3]
      if redis.call('GET', ukey) == sid then redis.call('DEL', ukey) end
    end
    if h[4] then redis.call('SREM', B .. 'jobactive:' .. h[4], sid) end
    n = n + 1
  end
  redis.call('ZREM', B .. 'done', p)
end
return {n, #ps}
"#;

/// ARGV: B, job. Returns {last_slot or '', paused}.
const JOB_REGISTER: &str = r#"
local now = now_ms()
local k = B .. 'job:' .. ARGV[2]
if redis.call('EXISTS', k) == 0 then
  redis.call('HSET', k, 'last_slot', fmt(now), 'paused', '0')
  redis.call('SADD', B .. 'jobs', ARGV[2])
end
local h = redis.call('HMGET', k, 'last_slot', 'paused')
return {h[1] or '', h[2] or '0'}
"#;

/// ARGV: B, job, expected or '', slot, overlap (f/a), skip reason, record
/// (e enqueue / r run / s skip), lease ms, worker, batch_after or '',
/// due_only (0/1), until or '', has task (0/1), then NF task args.
const JOB_ADVANCE: &str = r#"
local now = now_ms()
local job = ARGV[2]
local k = B .. 'job:' .. job
if redis.call('EXISTS', k) == 0 then return {'unknown', '', 0} end
local h = redis.call('HMGET', k, 'last_slot', 'paused')
if h[2] == '1' then return {'paused', '', 0} end
local cur = h[1] or ''
if cur ~= ARGV[3] then return {'moved', cur, 0} end
if (ARGV[11] == '1' and tonumber(ARGV[4]) > now) or (ARGV[12] ~= '' and now >= tonumber(ARGV[12])) then
  return {'notdue', fmt(now), 0}
end
redis.call('HSET', k, 'last_slot', ARGV[4])
if ARGV[13] ~= '1' then return {'enqueued', '0', 0} end
local T = 14
-- The slot's own run may exist already (a trigger made it): that run is
-- this slot's, not a previous one, so it is returned, never "skipped".
local uk = opt(ARGV[T + 8])
local held = uk and redis.call('GET', B .. 'uniq:' .. uk)
if held and redis.call('EXISTS', tkey(held)) == 1 then
  return {'enqueued', held, 0}
end
local rec = ARGV[7]
local skip = rec == 's'
if rec == 'e' and ARGV[5] == 'f' then
  local akey = B .. 'jobactive:' .. job
  local after = tonumber(ARGV[10])
  for _, sid in ipairs(redis.call('SMEMBERS', akey)) do
    local t = redis.call('HMGET', tkey(sid), 'state', 'slot')
    if t[1] == 'pending' or t[1] == 'running' then
      -- Tasks of the same catch-up batch (slot after ARGV[10]) do not count.
      if (not after) or (not t[2]) or tonumber(t[2]) <= after then skip = true end
    else
      redis.call('SREM', akey, sid)
    end
  end
end
if skip then
  local id = insert(now, T, ARGV[6])
  flush()
  return {'skipped', fmt(id), 1}
end
local id, ins, due, run_at = insert(now, T, nil)
flush()
if rec == 'r' and ins == 1 then
  local sid = fmt(id)
  local p = pad(sid)
  local queue = ARGV[T]
  local lu = now + tonumber(ARGV[8])
  redis.call('ZREM', qkey(queue, 'ready'), p)
  redis.call('ZREM', qkey(queue, 'sched'), p)
  redis.call('HSET', tkey(sid), 'state', 'running', 'attempt', '1', 'started_at', fmt(now),
    'lease_until', fmt(lu), 'worker', ARGV[9], 'claim_token', '1')
  redis.call('ZADD', B .. 'running', lu, p)
  count(queue, 'pending', -1)
  count(queue, 'running', 1)
  return {'enqueued', sid, 1}
end
if ins == 1 and due == 1 then redis.call('PUBLISH', B .. 'wake', ARGV[T]) end
if ins == 1 and due == 0 then wake_at(ARGV[T], run_at) end
return {'enqueued', fmt(id), ins}
"#;

/// ARGV: B, job, paused (0/1).
const JOB_SET_PAUSED: &str = r#"
local k = B .. 'job:' .. ARGV[2]
if redis.call('EXISTS', k) == 0 then return 0 end
redis.call('HSET', k, 'paused', ARGV[3])
return 1
"#;

/// ARGV: B. Returns {name, last_slot or '', paused} per job.
const JOB_LIST: &str = r#"
local out = {}
for _, name in ipairs(redis.call('SMEMBERS', B .. 'jobs')) do
  local h = redis.call('HMGET', B .. 'job:' .. name, 'last_slot', 'paused')
  if h[2] then out[#out + 1] = {name, h[1] or '', h[2]} end
end
return out
"#;

/// ARGV: B, version or ''. Records the version if it is higher than the
/// recorded one (none: only reads). Returns the version found before (0
/// when none).
const MIGRATE: &str = r#"
local cur = tonumber(redis.call('GET', B .. 'schema') or '0')
if ARGV[2] ~= '' and cur < tonumber(ARGV[2]) then redis.call('SET', B .. 'schema', ARGV[2]) end
return cur
"#;

/// Lock helpers: `KEYS` are lock keys, outside the `{baton}` tag.
const LOCK_PRELUDE: &str = r#"
local function fmt(n) return string.format('%d', n) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
"#;

/// KEYS: lock. ARGV: holder, at_most ms.
const LOCK_ACQUIRE: &str = r#"
local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'locked_at', 'lock_until')
if h[4] and tonumber(h[4]) > now then
  return {'0', h[1] or '', h[2] or '0', h[3] or '0', h[4], fmt(now)}
end
local token = tonumber(h[2] or '0') + 1
if now_us > token then token = now_us end
local lu = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', fmt(token), 'locked_at', fmt(now), 'lock_until', fmt(lu))
-- The record keeps the last token forever: no TTL (a key of schema 1 had one).
redis.call('PERSIST', KEYS[1])
return {'1', fmt(token), fmt(now), fmt(lu)}
"#;

/// KEYS: lock. ARGV: token, at_most ms. Returns the new lock_until or ''.
const LOCK_EXTEND: &str = r#"
local h = redis.call('HMGET', KEYS[1], 'token', 'lock_until')
if h[1] ~= ARGV[1] or (not h[2]) or tonumber(h[2]) <= now then return '' end
local lu = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lock_until', fmt(lu))
return fmt(lu)
"#;

/// KEYS: lock. ARGV: token, at_least ms.
const LOCK_RELEASE: &str = r#"
local h = redis.call('HMGET', KEYS[1], 'token', 'locked_at', 'lock_until')
if h[1] ~= ARGV[1] or (not h[3]) or tonumber(h[3]) <= now then return 0 end
local lu = tonumber(h[2]) + tonumber(ARGV[2])
if lu < now then lu = now end
redis.call('HSET', KEYS[1], 'lock_until', fmt(lu))
return 1
"#;

/// KEYS: locks. Returns {now, then holder, token, locked_at, lock_until per key ('' when absent)}.
const LOCK_GET: &str = r#"
local out = {fmt(now)}
for _, k in ipairs(KEYS) do
  local h = {false, false, false, false}
  if redis.call('TYPE', k).ok == 'hash' then
    h = redis.call('HMGET', k, 'holder', 'token', 'locked_at', 'lock_until')
  end
  for j = 1, 4 do out[#out + 1] = h[j] or '' end
end
return out
"#;

struct Scripts {
    enqueue_code: String,
    enqueue: Script,
    claim: Script,
    heartbeat: Script,
    finish: Script,
    progress: Script,
    rescue: Script,
    cancel: Script,
    retry: Script,
    list: Script,
    stats: Script,
    prune: Script,
    job_register: Script,
    job_advance: Script,
    job_set_paused: Script,
    job_list: Script,
    migrate: Script,
    lock_acquire: Script,
    lock_extend: Script,
    lock_release: Script,
    lock_get: Script,
}

impl Scripts {
    fn new() -> Scripts {
        let q = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        let l = |body: &str| Script::new(&format!("{LOCK_PRELUDE}{body}"));
        let enqueue_code = format!("{PRELUDE}{ENQUEUE}");
        Scripts {
            enqueue: Script::new(&enqueue_code),
            enqueue_code,
            claim: q(CLAIM),
            heartbeat: q(HEARTBEAT),
            finish: q(FINISH),
            progress: q(PROGRESS),
            rescue: q(RESCUE),
            cancel: q(CANCEL),
            retry: q(RETRY),
            list: q(LIST),
            stats: q(STATS),
            prune: q(PRUNE),
            job_register: q(JOB_REGISTER),
            job_advance: q(JOB_ADVANCE),
            job_set_paused: q(JOB_SET_PAUSED),
            job_list: q(JOB_LIST),
            migrate: q(MIGRATE),
            lock_acquire: l(LOCK_ACQUIRE),
            lock_extend: l(LOCK_EXTEND),
            lock_release: l(LOCK_RELEASE),
            lock_get: l(LOCK_GET),
        }
    }
}

// ---------------------------------------------------------------------------
// Backend
// ---------------------------------------------------------------------------

/// The wake-up listener, started by the first `subscribe()`.
struct Listener {
    tx: broadcast::Sender<Wake>,
    /// Stops the listener task when the backend is dropped.
    _stop: DropGuard,
}

/// The Redis implementation of [`Backend`]. Build it with [`connect`].
pub struct RedisBackend {
    client: redis::Client,
    conn: ConnectionManager,
    /// The configured key prefix `P`.
    prefix: String,
    /// `P{baton}:`, the base of every queue and job key.
    base: String,
    scripts: Scripts,
    wake: tokio::sync::Mutex<Option<Listener>>,
}

/// Connect to Redis and return the backend.
///
/// The connection is checked before returning; a server that does not
/// answer gives [`StoreError::Unavailable`] within a few
/// `opts.connect_timeout`s. A command waits `opts.statement_timeout` for its
/// reply, then fails with [`StoreError::Unavailable`] (timed out).
pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Arc<dyn Backend>, StoreError> {
    Ok(Arc::new(RedisBackend::connect(url, opts).await?))
}

/// Files a `rediss://` URL may name in its query, as PostgreSQL URLs do:
/// a CA to trust instead of the system's roots, and a client certificate
/// with its key (mutual TLS). Paths are read when connecting.
const TLS_PARAMS: [&str; 3] = ["sslrootcert", "sslcert", "sslkey"];

/// Open a client for `url`, taking [`TLS_PARAMS`] out of its query.
fn open_client(url: &str) -> Result<redis::Client, StoreError> {
    let bad =
        |e: &dyn std::fmt::Display| StoreError::Config(format!("redis URL {:?}: {e}", redact(url)));
    let mut parsed = url::Url::parse(url).map_err(|e| bad(&e))?;
    let mut files: HashMap<&str, String> = HashMap::new();
    let mut rest: Vec<(String, String)> = Vec::new();
    for (k, v) in parsed.query_pairs() {
        match TLS_PARAMS.iter().find(|p| **p == k) {
            Some(p) => {
                files.insert(p, v.into_owned());
            }
            None => rest.push((k.into_owned(), v.into_owned())),
        }
    }
    if files.is_empty() {
        return redis::Client::open(url).map_err(|e| bad(&e));
    }
    if parsed.scheme() != "rediss" {
        return Err(bad(&"sslrootcert, sslcert and sslkey need a rediss:// URL"));
    }
    if rest.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(&rest);
    }
    open_tls_client(parsed.as_str(), &files).map_err(|e| bad(&e))
}

#[cfg(feature = "tls")]
fn open_tls_client(url: &str, files: &HashMap<&str, String>) -> Result<redis::Client, String> {
    let read = |param: &str| -> Result<Option<Vec<u8>>, String> {
        files
            .get(param)
            .map(|path| std::fs::read(path).map_err(|e| format!("{param}={path}: {e}")))
            .transpose()
    };
    let client_tls = match (read("sslcert")?, read("sslkey")?) {
        (Some(client_cert), Some(client_key)) => Some(redis::ClientTlsConfig {
            client_cert,
            client_key,
        }),
        (None, None) => None,
        _ => {
            return Err("sslcert and sslkey go together (a client certificate and its key)".into())
        }
    };
    let certs = redis::TlsCertificates {
        client_tls,
        root_cert: read("sslrootcert")?,
    };
    redis::Client::build_with_tls(url, certs).map_err(|e| e.to_string())
}

#[cfg(not(feature = "tls"))]
fn open_tls_client(_url: &str, _files: &HashMap<&str, String>) -> Result<redis::Client, String> {
    Err("this build of baton has no TLS (cargo feature `tls`)".into())
}

impl RedisBackend {
    /// Connect to Redis (see [`connect`]).
    pub async fn connect(url: &str, opts: &StoreOptions) -> Result<RedisBackend, StoreError> {
        let client = open_client(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(opts.connect_timeout)
            .set_response_timeout(opts.statement_timeout)
            .set_number_of_retries(1)
            .set_factor(2)
            .set_max_delay(200);
        let conn = tokio::time::timeout(
            opts.connect_timeout * 3,
            ConnectionManager::new_with_config(client.clone(), config),
        )
        .await
        .map_err(|_| {
            StoreError::Unavailable(format!("redis {}: connect timed out", redact(url)))
        })??;
        let prefix = opts.prefix.clone().unwrap_or_default();
        Ok(RedisBackend {
            client,
            conn,
            base: format!("{prefix}{{baton}}:"),
            prefix,
            scripts: Scripts::new(),
            wake: tokio::sync::Mutex::new(None),
        })
    }

    fn key(&self, what: &str) -> String {
        format!("{}{what}", self.base)
    }

    fn lock_key(&self, name: &str) -> String {
        format!("{}lock:{name}", self.prefix)
    }

    fn wake_channel(&self) -> String {
        self.key("wake")
    }

    /// Run a queue/job script: `KEYS[1]` routes to the `{baton}` slot and
    /// `ARGV[1]` is the key base.
    async fn q<T: FromRedisValue>(
        &self,
        script: &Script,
        args: Vec<String>,
    ) -> Result<T, StoreError> {
        let mut inv = script.key(self.key("seq"));
        inv.arg(&self.base);
        for a in args {
            inv.arg(a);
        }
        let mut conn = self.conn.clone();
        Ok(inv.invoke_async(&mut conn).await?)
    }

    /// Run a lock script on one lock key.
    async fn l<T: FromRedisValue>(
        &self,
        script: &Script,
        name: &str,
        args: Vec<String>,
    ) -> Result<T, StoreError> {
        let mut inv = script.key(self.lock_key(name));
        for a in args {
            inv.arg(a);
        }
        let mut conn = self.conn.clone();
        Ok(inv.invoke_async(&mut conn).await?)
    }

    async fn lock_records(&self, names: &[String]) -> Result<Vec<LockInfo>, StoreError> {
        let mut inv = self.scripts.lock_get.prepare_invoke();
        for n in names {
            inv.key(self.lock_key(n));
        }
        let mut conn = self.conn.clone();
        let v: Vec<String> = inv.invoke_async(&mut conn).await?;
        let now_ms = v
            .first()
            .ok_or_else(|| StoreError::Corrupt("lock read: empty reply".into()))
            .and_then(|s| parse_i64(s, "now"))?;
        let now = from_ms(now_ms)?;
        let mut out = Vec::new();
        for (name, rec) in names.iter().zip(v[1..].chunks(4)) {
            if rec.len() < 4 || rec[3].is_empty() {
                continue;
            }
            let until = parse_i64(&rec[3], "lock_until")?;
            out.push(LockInfo {
                name: name.clone(),
                holder: rec[0].clone(),
                token: FencingToken(parse_u64(&rec[1], "token")?),
                locked_at: from_ms(parse_i64(&rec[2], "locked_at")?)?,
                lock_until: from_ms(until)?,
                held: until > now_ms,
                now,
            });
        }
        Ok(out)
    }

    /// Run one upgrade step (idempotent).
    async fn upgrade(&self, step: Upgrade) -> Result<(), StoreError> {
        match step {
            Upgrade::PersistLocks => {
                let names = self.lock_names().await?;
                let mut conn = self.conn.clone();
                for chunk in names.chunks(500) {
                    let mut pipe = redis::pipe();
                    for n in chunk {
                        pipe.cmd("PERSIST").arg(self.lock_key(n)).ignore();
                    }
                    pipe.query_async::<()>(&mut conn).await?;
                }
            }
        }
        Ok(())
    }

    async fn lock_names(&self) -> Result<Vec<String>, StoreError> {
        let head = format!("{}lock:", self.prefix);
        let pattern = format!("{head}*");
        let mut conn = self.conn.clone();
        let mut cursor: u64 = 0;
        let mut names = BTreeSet::new();
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            for k in keys {
                if let Some(n) = k.strip_prefix(&head) {
                    names.insert(n.to_string());
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok(names.into_iter().collect())
    }

    async fn list_page(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, StoreError> {
        let limit = if filter.limit == 0 { 100 } else { filter.limit } as usize;
        let state = filter.state.map(|s| s.as_str()).unwrap_or("");
        let queue = opt_arg(filter.queue.as_deref());
        let job = opt_arg(filter.job.as_deref());
        let mut before = filter.before_id.map(|b| b.to_string()).unwrap_or_default();
        let mut out = Vec::new();
        loop {
            let want = (limit - out.len()).to_string();
            let (maps, last, exhausted): (Vec<HashMap<String, String>>, String, i64) = self
                .q(
                    &self.scripts.list,
                    sargs![before, want, state, queue, job, LIST_SCAN],
                )
                .await?;
            for m in &maps {
                out.push(task_info(m)?);
            }
            if out.len() >= limit || exhausted == 1 || last.is_empty() {
                break;
            }
            before = last;
        }
        Ok(out)
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let found: i64 = self.q(&self.scripts.migrate, sargs![""]).await?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::Config(format!(
                "redis schema version {found} is newer than this baton's ({SCHEMA_VERSION})"
            )));
        }
        if found == SCHEMA_VERSION {
            return Ok(());
        }
        if found == 0 {
            // Nothing recorded: a new store (every version records itself
            // at connect), with nothing to convert.
            self.q::<i64>(&self.scripts.migrate, sargs![SCHEMA_VERSION])
                .await?;
            return Ok(());
        }
        for from in found.max(BASE_VERSION)..SCHEMA_VERSION {
            let step = usize::try_from(from - BASE_VERSION)
                .ok()
                .and_then(|i| UPGRADES.get(i))
                .ok_or_else(|| StoreError::Corrupt(format!("redis schema version {from}")))?;
            self.upgrade(*step).await?;
            // Recorded step by step, so an interrupted upgrade resumes.
            self.q::<i64>(&self.scripts.migrate, sargs![from + 1])
                .await?;
            tracing::info!(
                prefix = %self.prefix,
                "redis: upgraded the baton schema from version {from} to {}",
                from + 1
            );
        }
        Ok(())
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        let (s, us): (i64, i64) = read_retry!({
            let mut conn = self.conn.clone();
            redis::cmd("TIME")
                .query_async::<(i64, i64)>(&mut conn)
                .await
                .map_err(StoreError::from)
        })?;
        from_ms(s * 1000 + us / 1000)
    }

    async fn warnings(&self) -> Result<Vec<String>, StoreError> {
        let mut conn = self.conn.clone();
        let reply: Result<Vec<String>, redis::RedisError> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendonly")
            .query_async(&mut conn)
            .await;
        match reply {
            Ok(v) => {
                if v.get(1).is_some_and(|s| s.eq_ignore_ascii_case("no")) {
                    Ok(vec![
                        "redis persistence: appendonly is off, so the lock, queue and schedule \
                         guarantees hold only as far as Redis keeps its data (a restart can lose \
                         locks, tasks and schedule cursors); set `appendonly yes` (AOF)"
                            .to_string(),
                    ])
                } else {
                    Ok(Vec::new())
                }
            }
            Err(e) => {
                let err = StoreError::from(e);
                if err.is_retryable() {
                    return Err(err);
                }
                // CONFIG is often disabled on managed Redis: nothing to check.
                tracing::debug!("redis: cannot read appendonly: {err}");
                Ok(Vec::new())
            }
        }
    }

    // ---- locks -------------------------------------------------------------

    async fn lock_acquire(&self, req: &LockRequest<'_>) -> Result<Acquire, StoreError> {
        let v: Vec<String> = self
            .l(
                &self.scripts.lock_acquire,
                req.name,
                sargs![req.holder, ms(req.at_most)],
            )
            .await?;
        match v.first().map(String::as_str) {
            Some("1") if v.len() >= 4 => Ok(Acquire::Granted {
                token: FencingToken(parse_u64(&v[1], "token")?),
                locked_at: from_ms(parse_i64(&v[2], "locked_at")?)?,
                lock_until: from_ms(parse_i64(&v[3], "lock_until")?)?,
            }),
            Some("0") if v.len() >= 6 => {
                let until = parse_i64(&v[4], "lock_until")?;
                let now = parse_i64(&v[5], "now")?;
                Ok(Acquire::Busy(LockInfo {
                    name: req.name.to_string(),
                    holder: v[1].clone(),
                    token: FencingToken(parse_u64(&v[2], "token")?),
                    locked_at: from_ms(parse_i64(&v[3], "locked_at")?)?,
                    lock_until: from_ms(until)?,
                    held: until > now,
                    now: from_ms(now)?,
                }))
            }
            _ => Err(StoreError::Corrupt(format!(
                "lock acquire: unexpected reply {v:?}"
            ))),
        }
    }

    async fn lock_extend(
        &self,
        name: &str,
        token: FencingToken,
        at_most: Duration,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let v: String = self
            .l(
                &self.scripts.lock_extend,
                name,
                sargs![token.0.to_string(), ms(at_most)],
            )
            .await?;
        if v.is_empty() {
            return Ok(None);
        }
        Ok(Some(from_ms(parse_i64(&v, "lock_until")?)?))
    }

    async fn lock_release(
        &self,
        name: &str,
        token: FencingToken,
        at_least: Duration,
    ) -> Result<bool, StoreError> {
        let v: i64 = self
            .l(
                &self.scripts.lock_release,
                name,
                sargs![token.0.to_string(), ms(at_least)],
            )
            .await?;
        Ok(v == 1)
    }

    async fn lock_get(&self, name: &str) -> Result<Option<LockInfo>, StoreError> {
        let names = [name.to_string()];
        let v = read_retry!(self.lock_records(&names).await)?;
        Ok(v.into_iter().next())
    }

    async fn lock_list(&self) -> Result<Vec<LockInfo>, StoreError> {
        let names = read_retry!(self.lock_names().await)?;
        let mut out = Vec::with_capacity(names.len());
        for chunk in names.chunks(500) {
            out.extend(read_retry!(self.lock_records(chunk).await)?);
        }
        Ok(out)
    }

    // ---- tasks -------------------------------------------------------------

    async fn enqueue(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let chunks: Vec<&[NewTask]> = tasks.chunks(ENQUEUE_CHUNK).collect();
        let single = chunks.len() == 1;
        let seq = self.key("seq");
        let hash = self.scripts.enqueue.get_hash().to_string();
        let mut out = Vec::with_capacity(tasks.len());
        let mut wake: BTreeSet<&str> = BTreeSet::new();
        let mut conn = self.conn.clone();
        for group in chunks.chunks(ENQUEUE_PIPELINE) {
            let mut pipe = redis::pipe();
            // Loading is idempotent and cheap; it spares a NOSCRIPT round trip.
            pipe.cmd("SCRIPT")
                .arg("LOAD")
                .arg(&self.scripts.enqueue_code)
                .ignore();
            for chunk in group {
                pipe.cmd("EVALSHA")
                    .arg(&hash)
                    .arg(1)
                    .arg(&seq)
                    .arg(&self.base)
                    .arg(if single { "1" } else { "0" });
                for t in *chunk {
                    push_task_args(&mut pipe, t)?;
                }
            }
            let replies: Vec<Vec<i64>> = pipe.query_async(&mut conn).await?;
            if replies.len() != group.len() {
                return Err(StoreError::Corrupt(format!(
                    "enqueue: {} replies for {} scripts",
                    replies.len(),
                    group.len()
                )));
            }
            for (chunk, reply) in group.iter().zip(replies) {
                if reply.len() != chunk.len() * 3 {
                    return Err(StoreError::Corrupt(format!(
                        "enqueue: reply of {} values for {} tasks",
                        reply.len(),
                        chunk.len()
                    )));
                }
                for (t, r) in chunk.iter().zip(reply.chunks(3)) {
                    let inserted = r[1] == 1;
                    if inserted && r[2] == 1 {
                        wake.insert(t.queue.as_str());
                    }
                    out.push(Enqueued { id: r[0], inserted });
                }
            }
        }
        if !single && !wake.is_empty() {
            let chan = self.wake_channel();
            let mut pipe = redis::pipe();
            for q in &wake {
                pipe.cmd("PUBLISH").arg(&chan).arg(*q).ignore();
            }
            // The tasks are stored; a lost wake-up only delays them until
            // the workers poll, so this must not fail the call.
            if let Err(e) = pipe.query_async::<()>(&mut conn).await {
                tracing::warn!("redis: publishing wake-ups failed: {e}");
            }
        }
        Ok(out)
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<Task>, StoreError> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let maps: Vec<HashMap<String, String>> = self
            .q(
                &self.scripts.claim,
                sargs![
                    req.queue,
                    req.worker,
                    req.limit,
                    ms(req.lease),
                    req.max_running.map(|m| m.to_string()).unwrap_or_default(),
                    CANCEL_REQUESTED
                ],
            )
            .await?;
        maps.iter().map(task).collect()
    }

    async fn heartbeat(
        &self,
        claims: &[Claim],
        lease: Duration,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = self.scripts.heartbeat.key(self.key("seq"));
        inv.arg(&self.base).arg(ms(lease));
        for c in claims {
            inv.arg(c.id).arg(c.token.0);
        }
        let mut conn = self.conn.clone();
        let v: Vec<i64> = inv.invoke_async(&mut conn).await?;
        if v.len() != claims.len() {
            return Err(StoreError::Corrupt(format!(
                "heartbeat: {} answers for {} claims",
                v.len(),
                claims.len()
            )));
        }
        Ok(v.into_iter()
            .map(|x| match x {
                1 => Heartbeat::Extended,
                2 => Heartbeat::CancelRequested,
                _ => Heartbeat::Lost,
            })
            .collect())
    }

    async fn finish(&self, claim: Claim, finish: &Finish) -> Result<bool, StoreError> {
        Ok(self.finish_many(&[(claim, finish.clone())]).await?.first() == Some(&true))
    }

    async fn finish_many(&self, items: &[(Claim, Finish)]) -> Result<Vec<bool>, StoreError> {
        // One script call per chunk: every item is its own compare-and-set.
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(FINISH_CHUNK) {
            let mut args = Vec::with_capacity(chunk.len() * 5 + 1);
            args.push(CANCEL_REQUESTED.to_string());
            for (claim, finish) in chunk {
                let (kind, text, retry) = match finish {
                    Finish::Succeeded => ("s", "", String::new()),
                    Finish::Failed { error, retry_in } => (
                        "f",
                        error.as_str(),
                        retry_in.map(|d| ms(d).to_string()).unwrap_or_default(),
                    ),
                    Finish::Cancelled { reason } => ("c", reason.as_str(), String::new()),
                    Finish::HandBack => ("h", "", String::new()),
                };
                args.extend(sargs![claim.id, claim.token.0, kind, text, retry]);
            }
            let done: Vec<i64> = self.q(&self.scripts.finish, args).await?;
            if done.len() != chunk.len() {
                return Err(StoreError::Corrupt(format!(
                    "finish: {} answers for {} items",
                    done.len(),
                    chunk.len()
                )));
            }
            out.extend(done.into_iter().map(|v| v == 1));
        }
        Ok(out)
    }

    async fn progress(
        &self,
        claim: Claim,
        progress: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        let json = serde_json::to_string(progress)
            .map_err(|e| StoreError::Backend(format!("progress to JSON: {e}")))?;
        let v: i64 = self
            .q(
                &self.scripts.progress,
                sargs![claim.id, claim.token.0, json],
            )
            .await?;
        Ok(v == 1)
    }

    async fn rescue(&self) -> Result<Rescued, StoreError> {
        let mut total = Rescued::default();
        loop {
            let v: Vec<i64> = self
                .q(&self.scripts.rescue, sargs![BATCH, LEASE_EXPIRED])
                .await?;
            if v.len() != 4 {
                return Err(StoreError::Corrupt(format!("rescue: reply {v:?}")));
            }
            total.requeued += v[0].max(0) as u64;
            total.failed += v[1].max(0) as u64;
            total.cancelled += v[2].max(0) as u64;
            if (v[3] as usize) < BATCH {
                return Ok(total);
            }
        }
    }

    async fn cancel(&self, id: i64) -> Result<CancelOutcome, StoreError> {
        let (outcome, state): (String, String) = self.q(&self.scripts.cancel, sargs![id]).await?;
        match outcome.as_str() {
            "cancelled" => Ok(CancelOutcome::Cancelled),
            "requested" => Ok(CancelOutcome::Requested),
            "notfound" => Ok(CancelOutcome::NotFound),
            _ => Ok(CancelOutcome::AlreadyFinished(state.parse()?)),
        }
    }

    async fn retry(&self, id: i64) -> Result<bool, StoreError> {
        let v: i64 = self.q(&self.scripts.retry, sargs![id]).await?;
        match v {
            1 => Ok(true),
            -1 => Err(StoreError::Conflict(format!(
                "task {id}: its unique key is taken by another unfinished task"
            ))),
            _ => Ok(false),
        }
    }

    async fn task(&self, id: i64) -> Result<Option<TaskInfo>, StoreError> {
        let key = self.key(&format!("task:{id}"));
        let m: HashMap<String, String> = read_retry!({
            let mut conn = self.conn.clone();
            redis::cmd("HGETALL")
                .arg(&key)
                .query_async::<HashMap<String, String>>(&mut conn)
                .await
                .map_err(StoreError::from)
        })?;
        if m.is_empty() {
            return Ok(None);
        }
        task_info(&m).map(Some)
    }

    async fn tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, StoreError> {
        read_retry!(self.list_page(filter).await)
    }

    async fn stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        type Row = (String, HashMap<String, i64>, String);
        let rows: Vec<Row> = read_retry!(self.q(&self.scripts.stats, sargs![]).await)?;
        let mut out = Vec::new();
        for (queue, counts, age) in rows {
            let c = |s: TaskState| counts.get(s.as_str()).copied().unwrap_or(0).max(0) as u64;
            let st = QueueStats {
                pending: c(TaskState::Pending),
                running: c(TaskState::Running),
                succeeded: c(TaskState::Succeeded),
                failed: c(TaskState::Failed),
                cancelled: c(TaskState::Cancelled),
                oldest_pending_ms: if age.is_empty() {
                    None
                } else {
                    Some(parse_u64(&age, "oldest pending age")?)
                },
                queue,
            };
            if st.pending + st.running + st.succeeded + st.failed + st.cancelled > 0 {
                out.push(st);
            }
        }
        out.sort_by(|a, b| a.queue.cmp(&b.queue));
        Ok(out)
    }

    async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        let mut total = 0u64;
        loop {
            let v: Vec<i64> = self
                .q(&self.scripts.prune, sargs![ms(older_than), BATCH])
                .await?;
            if v.len() != 2 {
                return Err(StoreError::Corrupt(format!("prune: reply {v:?}")));
            }
            total += v[0].max(0) as u64;
            if (v[1] as usize) < BATCH {
                return Ok(total);
            }
        }
    }

    async fn subscribe(&self) -> Result<broadcast::Receiver<Wake>, StoreError> {
        let mut guard = self.wake.lock().await;
        if let Some(w) = guard.as_ref() {
            return Ok(w.tx.subscribe());
        }
        let (tx, rx) = broadcast::channel(1024);
        let stop = CancellationToken::new();
        let (ready_tx, mut ready_rx) = watch::channel(false);
        tokio::spawn(listen(
            self.client.clone(),
            self.wake_channel(),
            tx.clone(),
            stop.clone(),
            ready_tx,
        ));
        *guard = Some(Listener {
            tx,
            _stop: stop.drop_guard(),
        });
        drop(guard);
        // Give the listener a moment to subscribe so a wake-up sent right
        // after this returns is not missed; it is only a hint either way.
        let _ = tokio::time::timeout(CONNECT_TIMEOUT, ready_rx.wait_for(|r| *r)).await;
        Ok(rx)
    }

    // ---- schedules ---------------------------------------------------------

    async fn job_register(&self, job: &str) -> Result<JobState, StoreError> {
        let (slot, paused): (String, String) =
            self.q(&self.scripts.job_register, sargs![job]).await?;
        Ok(JobState {
            name: job.to_string(),
            last_slot: opt_ts(&slot, "last_slot")?,
            paused: paused == "1",
        })
    }

    async fn job_advance(&self, adv: &SlotAdvance<'_>) -> Result<Advanced, StoreError> {
        let opt_ms = |t: Option<DateTime<Utc>>| {
            t.map(|t| t.timestamp_millis().to_string())
                .unwrap_or_default()
        };
        let (record, lease, worker, reason) = match adv.record {
            SlotRecord::Enqueue => ("e", 0, "", OVERLAP_SKIPPED),
            SlotRecord::Run { worker, lease } => ("r", ms(lease), worker, OVERLAP_SKIPPED),
            SlotRecord::Skip { reason } => ("s", 0, "", reason),
        };
        let mut inv = self.scripts.job_advance.key(self.key("seq"));
        inv.arg(&self.base)
            .arg(adv.job)
            .arg(opt_ms(adv.expected))
            .arg(adv.slot.timestamp_millis())
            .arg(match adv.overlap {
                Overlap::Forbid => "f",
                Overlap::Allow => "a",
            })
            .arg(reason)
            .arg(record)
            .arg(lease)
            .arg(worker)
            .arg(opt_ms(adv.batch_after))
            .arg(if adv.due_only { "1" } else { "0" })
            .arg(opt_ms(adv.until))
            .arg(if adv.task.is_some() { "1" } else { "0" });
        if let Some(task) = adv.task {
            for a in task_args(task)? {
                inv.arg(a);
            }
        }
        let mut conn = self.conn.clone();
        let (what, val, ins): (String, String, i64) = inv.invoke_async(&mut conn).await?;
        match what.as_str() {
            "unknown" => Ok(Advanced::UnknownJob),
            "paused" => Ok(Advanced::Paused),
            "moved" => Ok(Advanced::Moved(opt_ts(&val, "last_slot")?)),
            "notdue" => Ok(Advanced::NotDue {
                now: opt_ts(&val, "now")?
                    .ok_or_else(|| StoreError::Corrupt("job advance: no store time".into()))?,
            }),
            "skipped" => Ok(Advanced::Skipped(Enqueued {
                id: parse_i64(&val, "id")?,
                inserted: true,
            })),
            "enqueued" => Ok(Advanced::Enqueued(Enqueued {
                id: parse_i64(&val, "id")?,
                inserted: ins == 1,
            })),
            other => Err(StoreError::Corrupt(format!(
                "job advance: unexpected reply {other:?}"
            ))),
        }
    }

    async fn job_set_paused(&self, job: &str, paused: bool) -> Result<bool, StoreError> {
        let v: i64 = self
            .q(
                &self.scripts.job_set_paused,
                sargs![job, if paused { "1" } else { "0" }],
            )
            .await?;
        Ok(v == 1)
    }

    async fn job_list(&self) -> Result<Vec<JobState>, StoreError> {
        let rows: Vec<(String, String, String)> =
            read_retry!(self.q(&self.scripts.job_list, sargs![]).await)?;
        let mut out = rows
            .into_iter()
            .map(|(name, slot, paused)| {
                Ok(JobState {
                    last_slot: opt_ts(&slot, "last_slot")?,
                    paused: paused == "1",
                    name,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

// ---------------------------------------------------------------------------
// Wake-ups
// ---------------------------------------------------------------------------

/// Hold a pub/sub connection subscribed to the wake channel and forward its
/// messages, reconnecting with backoff until `stop` fires.
async fn listen(
    client: redis::Client,
    channel: String,
    tx: broadcast::Sender<Wake>,
    stop: CancellationToken,
    ready: watch::Sender<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let res = tokio::select! {
            _ = stop.cancelled() => return,
            r = listen_once(&client, &channel, &tx, &ready, &mut backoff) => r,
        };
        ready.send_replace(false);
        match res {
            Ok(()) => tracing::warn!("redis: wake-up subscription ended; reconnecting"),
            Err(e) => {
                tracing::warn!("redis: wake-up subscription failed: {e}; retrying in {backoff:?}")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn listen_once(
    client: &redis::Client,
    channel: &str,
    tx: &broadcast::Sender<Wake>,
    ready: &watch::Sender<bool>,
    backoff: &mut Duration,
) -> Result<(), redis::RedisError> {
    let mut pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
        .await
        .map_err(|_| {
            redis::RedisError::from((redis::ErrorKind::IoError, "pub/sub connect timed out"))
        })??;
    pubsub.subscribe(channel).await?;
    ready.send_replace(true);
    *backoff = Duration::from_millis(100);
    let mut stream = pubsub.on_message();
    while let Some(msg) = stream.next().await {
        if let Ok(payload) = msg.get_payload::<String>() {
            // No receivers is fine: nobody is waiting right now.
            let _ = tx.send(Wake::parse(&payload));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Arguments and parsing
// ---------------------------------------------------------------------------

fn opt_arg(s: Option<&str>) -> String {
    s.map(|s| format!("={s}")).unwrap_or_default()
}

/// The `TASK_ARGS` script arguments describing one new task.
fn task_args(t: &NewTask) -> Result<[String; TASK_ARGS], StoreError> {
    let payload = serde_json::to_string(&t.payload)
        .map_err(|e| StoreError::Backend(format!("payload to JSON: {e}")))?;
    let (mode, val) = match t.run_at {
        RunAt::Now => ("n", 0),
        RunAt::Delay(d) => ("d", ms(d)),
        RunAt::At(at) => ("a", at.timestamp_millis()),
    };
    Ok([
        t.queue.clone(),
        t.kind.clone(),
        payload,
        t.priority.to_string(),
        mode.to_string(),
        val.to_string(),
        t.max_attempts.to_string(),
        t.timeout.map(|d| ms(d).to_string()).unwrap_or_default(),
        opt_arg(t.unique_key.as_deref()),
        if t.unique_forever { "1" } else { "0" }.to_string(),
        opt_arg(t.job.as_deref()),
        t.slot
            .map(|s| s.timestamp_millis().to_string())
            .unwrap_or_default(),
    ])
}

fn push_task_args(pipe: &mut redis::Pipeline, t: &NewTask) -> Result<(), StoreError> {
    for a in task_args(t)? {
        pipe.arg(a);
    }
    Ok(())
}

fn parse_i64(s: &str, what: &str) -> Result<i64, StoreError> {
    s.parse()
        .map_err(|_| StoreError::Corrupt(format!("{what}: not an integer: {s:?}")))
}

fn parse_u64(s: &str, what: &str) -> Result<u64, StoreError> {
    s.parse()
        .map_err(|_| StoreError::Corrupt(format!("{what}: not an unsigned integer: {s:?}")))
}

fn opt_ts(s: &str, what: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
    if s.is_empty() {
        Ok(None)
    } else {
        Ok(Some(from_ms(parse_i64(s, what)?)?))
    }
}

struct Fields<'a>(&'a HashMap<String, String>);

impl Fields<'_> {
    fn opt(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str).filter(|s| !s.is_empty())
    }
    fn str(&self, k: &str) -> Result<&str, StoreError> {
        self.0
            .get(k)
            .map(String::as_str)
            .ok_or_else(|| StoreError::Corrupt(format!("task field {k} missing")))
    }
    fn i64(&self, k: &str) -> Result<i64, StoreError> {
        parse_i64(self.str(k)?, k)
    }
    fn u32(&self, k: &str) -> Result<u32, StoreError> {
        let v = self.i64(k)?;
        u32::try_from(v)
            .map_err(|_| StoreError::Corrupt(format!("task field {k}: {v} out of range")))
    }
    fn i32(&self, k: &str) -> Result<i32, StoreError> {
        let v = self.i64(k)?;
        i32::try_from(v)
            .map_err(|_| StoreError::Corrupt(format!("task field {k}: {v} out of range")))
    }
    fn ts(&self, k: &str) -> Result<DateTime<Utc>, StoreError> {
        from_ms(self.i64(k)?)
    }
    fn opt_ts(&self, k: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.opt(k).map(|s| from_ms(parse_i64(s, k)?)).transpose()
    }
    fn opt_duration(&self, k: &str) -> Result<Option<Duration>, StoreError> {
        self.opt(k)
            .map(|s| parse_u64(s, k).map(Duration::from_millis))
            .transpose()
    }
    fn json(&self, k: &str) -> Result<serde_json::Value, StoreError> {
        serde_json::from_str(self.str(k)?)
            .map_err(|e| StoreError::Corrupt(format!("task field {k}: bad JSON: {e}")))
    }
    fn opt_string(&self, k: &str) -> Option<String> {
        self.0.get(k).cloned()
    }
}

/// A claimed task from its hash.
fn task(m: &HashMap<String, String>) -> Result<Task, StoreError> {
    let f = Fields(m);
    Ok(Task {
        id: f.i64("id")?,
        queue: f.str("queue")?.to_string(),
        kind: f.str("kind")?.to_string(),
        payload: f.json("payload")?,
        priority: f.i32("priority")?,
        attempt: f.u32("attempt")?,
        token: FencingToken(parse_u64(f.str("claim_token")?, "claim_token")?),
        max_attempts: f.u32("max_attempts")?,
        timeout: f.opt_duration("timeout_ms")?,
        run_at: f.ts("run_at")?,
        lease_until: f.ts("lease_until")?,
        job: f.opt_string("job"),
        slot: f.opt_ts("slot")?,
    })
}

#[derive(Deserialize)]
struct RawAttemptError {
    attempt: u32,
    at: i64,
    error: String,
}

/// Everything about a task from its hash.
fn task_info(m: &HashMap<String, String>) -> Result<TaskInfo, StoreError> {
    let f = Fields(m);
    let errors = match f.opt("errors") {
        None => Vec::new(),
        Some(s) => serde_json::from_str::<Vec<RawAttemptError>>(s)
            .map_err(|e| StoreError::Corrupt(format!("task errors: bad JSON: {e}")))?
            .into_iter()
            .map(|r| {
                Ok(AttemptError {
                    attempt: r.attempt,
                    at: from_ms(r.at)?,
                    error: r.error,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?,
    };
    let progress = match f.opt("progress") {
        None => None,
        Some(_) => Some(f.json("progress")?),
    };
    Ok(TaskInfo {
        id: f.i64("id")?,
        queue: f.str("queue")?.to_string(),
        kind: f.str("kind")?.to_string(),
        payload: f.json("payload")?,
        state: f.str("state")?.parse()?,
        priority: f.i32("priority")?,
        attempt: f.u32("attempt")?,
        max_attempts: f.u32("max_attempts")?,
        timeout: f.opt_duration("timeout_ms")?,
        run_at: f.ts("run_at")?,
        created_at: f.ts("created_at")?,
        started_at: f.opt_ts("started_at")?,
        finished_at: f.opt_ts("finished_at")?,
        lease_until: f.opt_ts("lease_until")?,
        worker: f.opt_string("worker"),
        unique_key: f.opt_string("unique_key"),
        cancel_requested: f.opt("cancel_requested") == Some("1"),
        last_error: f.opt_string("last_error"),
        errors,
        progress,
        job: f.opt_string("job"),
        slot: f.opt_ts("slot")?,
    })
}
