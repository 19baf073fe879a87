//! The Redis backend.
//!
//! Every operation is one Lua script (`redis::Script`; `EVALSHA`, and on
//! `NOSCRIPT` a `SCRIPT LOAD` and the send again, up to four sends), so
//! each is atomic on the server, and every "now"
//! is `redis.call('TIME')` inside the script — the client clock is never
//! read for an expiry or due-time decision (DESIGN.md C1).
//!
//! # Keys
//!
//! With `P` the configured prefix (default empty), three kinds of hash tag
//! (schema 8), so a Redis Cluster spreads queues and locks over its shards
//! while every script touches the keys of one tag only (one shard, atomic):
//!
//! - `Q = P{baton:q:<queue>}:` — one tag per queue: everything a queue
//!   script (enqueue, claim, heartbeat, finish, cancel, retry, rescue,
//!   prune, stats, listing) or a job script touches.
//! - `P{baton:lock:<name>}` — one tag per lock: the lock's record.
//! - `B = P{baton}:` — the index keys, read or written by separate
//!   commands and by the index scripts (`ids.lua`, `migrate.lua`), never
//!   by a queue, job or lock script.
//!
//! Per queue (`Q`):
//!
//! - `Q task:<id>` — hash with every task field (timestamps in ms since the
//!   epoch, `errors` a JSON array of `{attempt, at (ms), error}`;
//!   `claim_token`, absent before the first claim of schema 2, counts as 0).
//! - `Q sched` — zset of pending tasks not yet due, score `run_at`.
//! - `Q ready` — zset of due pending tasks, score
//!   `(priority + 128) · 2⁴³ + run_at` (exact in a double: < 2⁵¹), members
//!   zero-padded ids so equal scores order by id.
//! - `Q fk:<key>` — zset of the due pending tasks of one concurrency key
//!   (`Q fk:` those without a key), scored as in `ready`; `Q fkeys` — zset
//!   (score 0) of the keys with a task there; `Q fcursor` — the group the
//!   queue's previous fair claim served last (schema 15: fair claiming,
//!   `lua/fair.lua`). A task enters and leaves its group with `ready`.
//! - `Q running` — zset of running tasks, score `lease_until` (rescue).
//! - `Q done` — zset of terminal tasks, score `finished_at` (prune).
//! - `Q ids` — zset of the queue's task ids (listing, newest first).
//! - `Q counts` — hash state → count (stats); `Q paused` — `"1"` while the
//!   queue is paused (schema 3; the claim script returns nothing then);
//!   `Q pause` — hash `note`, `by`, `at` (ms) of the queue's last pause or
//!   resume (schema 13).
//! - `Q uniq:<key>` — the id holding a unique key. **Unique keys are scoped
//!   by queue** (schema 8; before, store-wide): the check and the take are
//!   one script with the insert only when the key lives with the queue. A
//!   store-wide key on a cluster would take a first step on the key's own
//!   shard and a compensating delete when the insert fails, and a window
//!   (between the two) in which a crashed enqueuer's key looks taken or
//!   free: not sound without leases of its own. So a key's scope
//!   (`UniqueScope`) may be at most its queue here: `Kind` and `Global`
//!   are refused (the SQL stores hold them); the default, kind-in-queue,
//!   and `Queue` are composed into `<key>` (schema 10 rewrote older keys).
//! - `Q kstart` — hash unique key → `<ms>:<id>`, the key's last start,
//!   written by every claim of a task with a key (schema 13) and dropped
//!   with its task: what a throttled enqueue reads (`enqueue.lua`,
//!   `store::key_policy`).
//! - Jobs live in the tag of their *home queue* (the queue their runs go
//!   to), so a slot advance and the task it enqueues are one script:
//!   `Q job:<name>` — hash `last_slot` (ms), `paused`, `queue`, and
//!   (schema 13) `overlap`, `pause_note`, `pause_by`, `pause_at` (ms);
//!   `Q jobactive:<job>` — set of the job's pending/running task ids;
//!   `Q slot:<job|slot>` — the tombstone of a slot whose task was pruned.
//!   A job registered without a queue lives in the empty queue's tag until
//!   its first run names one; when a job's queue changes its record and
//!   unfinished runs move (not atomically: stop the schedulers of the old
//!   queue first), its old tombstones stay behind.
//!
//! Index keys (`B`):
//!
//! - `B seq` — the id counter, one for the whole store: `ids.lua` reserves
//!   the ids of an enqueue (or slot advance) before the insert script runs,
//!   each `max(previous + 1, TIME in µs)`, so ids never repeat, even after a
//!   restart that lost the counter (DESIGN.md I1), nor across shards. An id
//!   reserved but not taken (a held unique key, a slot advance that
//!   recorded nothing) is a gap.
//! - `B where` — hash id → queue, written with the reservation (before the
//!   task exists, so every task has one), so get, cancel and retry by id
//!   find the queue's shard; finish, heartbeat and progress use what this
//!   process's claim returned and ask `B where` only when it forgot.
//!   Entries of unused ids and pruned tasks are deleted (a missed delete
//!   only points at a queue without such a task). An insert that failed
//!   keeps its entries: it may have run (its reply lost, its `WAIT`
//!   unanswered), and a task without one is not found by its id.
//! - `B queues` — set of every queue: stats, listings, rescue and prune
//!   fan out over it, one script per queue. `B paused` — set of paused
//!   queues (listed by the stats even without tasks).
//! - `B jobq` — hash job → home queue (`job_list`, `slot_get`, and the slot
//!   advance of a job without a task).
//! - `B store_id` — the store's identity, a random id set once (`SET NX`)
//!   by `migrate`; read with `B seq` by `store_identity` (DESIGN.md E2).
//! - `B locks` — the lock index (names); `B schema` — the schema version.
//! - `B wake` — the pub/sub channel announcing new pending work: the queue
//!   name (due now), or `queue\n<run_at in µs>` for work due later (a
//!   publish reaches every node of a cluster; the subscription holds one
//!   connection to the first seed node).
//!
//! Locks: `P{baton:lock:<name>}` — hash `holder`, `token`, `locked_at`,
//! `lock_until` (ms). Never deleted by release and never expires (schema
//! 2; before, it had a TTL a day past `lock_until`), so it keeps the last
//! token. A new token is `max(previous + 1, TIME in µs)` so tokens keep
//! rising even after a restart that lost data. Schema 6 moved it from
//! `P lock:<name>` (with the default empty prefix the bare `lock:<name>`
//! that other tools, e.g. ShedLock, write too) to `B lock:<name>`, schema 8
//! to a tag of its own. A value baton did not write at a lock key (another
//! type, a hash without baton's fields) is never changed: it reads as held
//! by something else.
//!
//! One layout and one code path for a single server and a cluster.
//! baton never writes, expires or deletes a key outside `P{baton…`: the
//! upgrade steps that convert older lock keys at `P lock:<name>` touch
//! only those that are baton's by shape.
//!
//! # Cluster
//!
//! `redis+cluster://[USER:PASSWORD@]H1:P1,H2:P2,…` (`rediss+cluster://`
//! with TLS, the same `sslrootcert`/`sslcert`/`sslkey` as `rediss://`)
//! connects through redis-rs's async cluster client (`cluster.rs`), which
//! follows `MOVED`/`ASK`. Each node's `TIME` is its own clock: scripts on
//! different shards read different clocks (keep the nodes' clocks in sync,
//! as for any cluster); a lock's or a queue's decisions all read one node's.

//! # Faults
//!
//! Commands go through one multiplexed connection to the writable server
//! (`conn.rs`) with short connection and response timeouts: a dead server
//! yields [`StoreError::Unavailable`] within a few seconds, a replica (a
//! demoted master, `READONLY`) [`StoreError::ReadOnly`]; either drops the
//! connection and the next call connects anew — through the sentinels
//! for a `redis+sentinel://` URL (`sentinel.rs`), so a failover is followed
//! within seconds. The layer above retries. Idempotent reads are retried
//! once here.
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
//!
//! Files: `scripts.rs` with `lua/*.lua` (one file per script), `schema.rs`
//! (version and `UPGRADES`), `tls.rs` (opening the client), `conn.rs` (the
//! command connection to one server, following the master), `sentinel.rs`
//! (the `redis+sentinel://` URL, asking the sentinels), `cluster.rs`
//! (cluster URLs and the connection kinds), `listener.rs`
//! (pub/sub wake-ups), `decode.rs` (arguments and replies), `backend.rs` (the
//! [`Backend`] impl).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cluster::Conn;
use redis::{FromRedisValue, Script};
use tokio::sync::broadcast;
use tokio_util::sync::DropGuard;

use super::{
    from_ms, redact, Backend, FencingToken, LockInfo, StoreOptions, TaskFilter, TaskInfo, Wake,
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
            Err(e) if e.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                $e
            }
            other => other,
        }
    };
}

mod audit;
mod backend;
mod claim;
mod cluster;
mod conn;
mod decode;
mod enqueue;
mod forget;
mod jobdefs;
mod jobs;
mod listener;
mod lock_history;
mod queue_view;
mod schema;
mod scripts;
mod sentinel;
mod stats;
mod tls;

use conn::MasterConn;

use decode::{opt_arg, parse_i64, parse_u64, task_info};
pub use schema::{CLUSTER_LAYOUT_VERSION, SCHEMA_VERSION};
use scripts::Scripts;

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
const TASK_ARGS: usize = 15;
/// Script sends (each after a load) before a `NOSCRIPT` answer is an
/// error (see `RedisBackend::invoke`).
const NOSCRIPT_TRIES: u32 = 4;

/// The wake-up listener, started by the first `subscribe()`.
struct Listener {
    tx: broadcast::Sender<Wake>,
    /// Stops the listener task when the backend is dropped.
    _stop: DropGuard,
}

/// The Redis implementation of [`Backend`]. Build it with [`connect`].
pub struct RedisBackend {
    /// The client of a cluster's wake-up subscription (its first seed
    /// node: pub/sub messages reach every node); `None` for one server,
    /// whose subscription follows the command connection (`conn.rs`).
    client: Option<redis::Client>,
    conn: Conn,
    /// The configured key prefix `P`.
    prefix: String,
    /// `P{baton}:`, the base of every queue and job key.
    base: String,
    scripts: Scripts,
    wake: tokio::sync::Mutex<Option<Listener>>,
    /// The queue of each task id this process has claimed or enqueued
    /// lately (a task's queue never changes), so finish, heartbeat and
    /// progress find its shard without asking `B where`; bounded by
    /// [`REMEMBERED`].
    task_queues: std::sync::Mutex<HashMap<i64, String>>,
    /// The home queue of each job this process has used (see
    /// [`RedisBackend::job_home`]).
    job_homes: std::sync::Mutex<HashMap<String, String>>,
    /// Lock names this process has added to the lock index (`B locks`),
    /// so each is added once, not on every acquire (see [`INDEXED_LOCKS`]).
    indexed_locks: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// At most this many names are remembered in
/// [`RedisBackend::indexed_locks`]; past it the memory starts over (a name
/// added again is a no-op on the server).
const INDEXED_LOCKS: usize = 65_536;

/// At most this many task ids (and job names) are remembered with their
/// queue; past it the memory starts over.
const REMEMBERED: usize = 65_536;

/// Connect to Redis and return the backend.
///
/// The connection is checked before returning; a server that does not
/// answer gives [`StoreError::Unavailable`] within a few
/// `opts.connect_timeout`s. A command waits `opts.statement_timeout` for its
/// reply, then fails with [`StoreError::Unavailable`] (timed out).
pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Arc<dyn Backend>, StoreError> {
    Ok(Arc::new(RedisBackend::connect(url, opts).await?))
}

impl RedisBackend {
    /// Connect to Redis (see [`connect`]).
    pub async fn connect(url: &str, opts: &StoreOptions) -> Result<RedisBackend, StoreError> {
        let (conn, client) = if cluster::is_cluster_url(url) {
            let (conn, client) = cluster::connect(url, opts).await?;
            (conn, Some(client))
        } else {
            (
                Conn::Single(Box::new(Self::connect_single(url, opts).await?)),
                None,
            )
        };
        let prefix = opts.prefix.clone().unwrap_or_default();
        Ok(RedisBackend {
            client,
            conn,
            base: format!("{prefix}{{baton}}:"),
            prefix,
            scripts: Scripts::new(),
            wake: tokio::sync::Mutex::new(None),
            indexed_locks: std::sync::Mutex::new(std::collections::HashSet::new()),
            task_queues: std::sync::Mutex::new(HashMap::new()),
            job_homes: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// The command connection to one server (`redis://`, `rediss://`, or
    /// the master the sentinels name).
    async fn connect_single(url: &str, opts: &StoreOptions) -> Result<MasterConn, StoreError> {
        let (target, wait_replicas) = conn::Target::from_url(url)?;
        let conn = MasterConn::new(
            target,
            wait_replicas,
            opts.connect_timeout,
            opts.statement_timeout,
        );
        conn.connect_now().await.map_err(|e| {
            // A database index the server lacks is the URL's fault, not an
            // outage: say which and what is accepted.
            if e.to_string()
                .to_ascii_lowercase()
                .contains("db index is out of range")
            {
                StoreError::Config(format!(
                    "store URL {:?}: the Redis server has no database \"{}\" (a server has \
                     `databases` of them, 16 by default: 0 to 15); use an index it has, \
                     e.g. redis://host:6379/0",
                    redact(url),
                    conn.db()
                ))
            } else if e.kind() == redis::ErrorKind::ClientError {
                // The sentinels know no master of the URL's name.
                StoreError::Config(format!(
                    "store URL {:?}: {}",
                    redact(url),
                    e.detail().unwrap_or_default()
                ))
            } else {
                StoreError::from(e)
            }
        })?;
        Ok(conn)
    }

    fn key(&self, what: &str) -> String {
        format!("{}{what}", self.base)
    }

    /// Whether this process has added lock `name` to the lock index.
    fn lock_indexed(&self, name: &str) -> bool {
        self.indexed_locks
            .lock()
            .map(|s| s.contains(name))
            .unwrap_or(false)
    }

    /// Forget that lock `name` is in the lock index.
    fn unmark_lock_indexed(&self, name: &str) {
        if let Ok(mut s) = self.indexed_locks.lock() {
            s.remove(name);
        }
    }

    /// Remember that lock `name` is in the lock index.
    fn mark_lock_indexed(&self, name: &str) {
        if let Ok(mut s) = self.indexed_locks.lock() {
            if s.len() >= INDEXED_LOCKS {
                s.clear();
            }
            s.insert(name.to_string());
        }
    }

    /// Where lock `name` lives: `P{baton:lock:<name>}`, a hash tag of its
    /// own (schema 8; before, `B lock:<name>`, and before schema 6
    /// `P lock:<name>`).
    fn lock_key(&self, name: &str) -> String {
        format!("{}{{baton:lock:{name}}}", self.prefix)
    }

    /// Where schema versions 6 and 7 kept lock `name`: `B lock:<name>`.
    /// Only the upgrade steps use it.
    fn v6_lock_key(&self, name: &str) -> String {
        format!("{}lock:{name}", self.base)
    }

    /// Where versions before schema 6 kept lock `name`: `P lock:<name>`,
    /// outside baton's namespace (with the default empty prefix the bare
    /// `lock:<name>` other tools use too). Only the upgrade steps read it.
    fn legacy_lock_key(&self, name: &str) -> String {
        format!("{}lock:{name}", self.prefix)
    }

    /// The base of every key of `queue` (and of the jobs whose home it
    /// is): `P{baton:q:<queue>}:`, one hash tag per queue.
    fn qbase(&self, queue: &str) -> String {
        format!("{}{{baton:q:{queue}}}:", self.prefix)
    }

    /// Run a script of `queue`'s keys: `KEYS[1]` routes to the queue's
    /// slot and `ARGV[1]` is its key base.
    async fn qs<T: FromRedisValue>(
        &self,
        queue: &str,
        script: &Script,
        args: Vec<String>,
    ) -> Result<T, StoreError> {
        let base = self.qbase(queue);
        let mut inv = script.key(format!("{base}counts"));
        inv.arg(&base);
        for a in args {
            inv.arg(a);
        }
        Ok(self.invoke(&mut inv).await?)
    }

    /// Run a script invocation on the command connection: every script
    /// call goes through here. With the feature `test-clock` (tests only)
    /// the test clock's offset goes with it as its last argument (see
    /// `scripts::test_clock`); without it this is the plain call.
    ///
    /// `EVALSHA` answered `NOSCRIPT` did nothing; redis-rs then loads the
    /// script and sends it once more, which a script cache emptied again
    /// in between (`SCRIPT FLUSH` by another client, a failover to a
    /// replica that never saw the load) answers `NOSCRIPT` again. Such an
    /// answer is tried again here, up to [`NOSCRIPT_TRIES`] times in all.
    async fn invoke<T: FromRedisValue>(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
    ) -> Result<T, redis::RedisError> {
        #[cfg(feature = "test-clock")]
        inv.arg(self.test_clock_arg().await?);
        let mut conn = self.conn.clone();
        let mut tries = 1;
        loop {
            match inv.invoke_async(&mut conn).await {
                Err(e) if e.kind() == redis::ErrorKind::NoScriptError && tries < NOSCRIPT_TRIES => {
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    /// The test clock's offset in µs (feature `test-clock`): the key
    /// `P{baton}:test_clock`, 0 when missing. Read by the client, not by
    /// the scripts, which on a cluster run on other shards than the key's.
    #[cfg(feature = "test-clock")]
    async fn test_clock_offset(&self) -> Result<i64, redis::RedisError> {
        let mut conn = self.conn.clone();
        let offset: Option<i64> = redis::cmd("GET")
            .arg(self.key("test_clock"))
            .query_async(&mut conn)
            .await?;
        Ok(offset.unwrap_or(0))
    }

    /// The test clock's script argument: `baton-test-clock:<µs>`.
    #[cfg(feature = "test-clock")]
    async fn test_clock_arg(&self) -> Result<String, redis::RedisError> {
        Ok(format!(
            "{}{}",
            scripts::TEST_CLOCK_MARK,
            self.test_clock_offset().await?
        ))
    }

    /// Every queue that ever had a task (`B queues`), sorted.
    async fn queues(&self) -> Result<Vec<String>, StoreError> {
        let mut conn = self.conn.clone();
        let mut v: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.key("queues"))
            .query_async(&mut conn)
            .await?;
        v.sort_unstable();
        Ok(v)
    }

    /// Reserve one id per task of `queues` (in that order), recording
    /// where each lives; returns the first (the others follow it).
    async fn reserve_ids(&self, queues: &[&str]) -> Result<i64, StoreError> {
        self.q(
            &self.scripts.ids,
            queues.iter().map(|q| q.to_string()).collect(),
        )
        .await
    }

    /// Forget reserved ids no task took (the enqueue found its unique key
    /// held, or the slot advance recorded nothing): only ids known to be
    /// unused, never those of a call that failed (it may have inserted).
    /// A failure leaves entries pointing at a queue without such a task:
    /// harmless.
    async fn unreserve(&self, ids: &[i64]) {
        if ids.is_empty() {
            return;
        }
        let mut conn = self.conn.clone();
        for chunk in ids.chunks(1000) {
            let r: Result<(), redis::RedisError> = redis::cmd("HDEL")
                .arg(self.key("where"))
                .arg(chunk)
                .query_async(&mut conn)
                .await;
            if let Err(e) = r {
                tracing::debug!(error = %e, "redis: could not forget unused task ids");
            }
        }
    }

    /// Remember that task `id` lives in `queue`.
    fn remember_task(&self, id: i64, queue: &str) {
        if let Ok(mut m) = self.task_queues.lock() {
            if m.len() >= REMEMBERED {
                m.clear();
            }
            m.insert(id, queue.to_string());
        }
    }

    /// The queue task `id` lives in (`None`: no such task was ever
    /// enqueued): remembered, or read from `B where`.
    async fn queue_of(&self, id: i64) -> Result<Option<String>, StoreError> {
        if let Some(q) = self
            .task_queues
            .lock()
            .ok()
            .and_then(|m| m.get(&id).cloned())
        {
            return Ok(Some(q));
        }
        let mut conn = self.conn.clone();
        let q: Option<String> = redis::cmd("HGET")
            .arg(self.key("where"))
            .arg(id)
            .query_async(&mut conn)
            .await?;
        if let Some(q) = &q {
            self.remember_task(id, q);
        }
        Ok(q)
    }

    /// The home queue of `job` (whose tag holds the job's keys: its
    /// cursor, unfinished runs and slot tombstones), from `B jobq`;
    /// `fresh` reads past this process's memory.
    async fn job_home(&self, job: &str, fresh: bool) -> Result<Option<String>, StoreError> {
        if !fresh {
            if let Some(q) = self.job_homes.lock().ok().and_then(|m| m.get(job).cloned()) {
                return Ok(Some(q));
            }
        }
        let mut conn = self.conn.clone();
        let q: Option<String> = redis::cmd("HGET")
            .arg(self.key("jobq"))
            .arg(job)
            .query_async(&mut conn)
            .await?;
        if let (Some(q), Ok(mut m)) = (&q, self.job_homes.lock()) {
            if m.len() >= REMEMBERED {
                m.clear();
            }
            m.insert(job.to_string(), q.clone());
        }
        Ok(q)
    }

    /// Make `to` the home queue of `job`, moving its record and its
    /// unfinished runs from its old home (a job's queue changed, or its
    /// first run names one). Not atomic across the two shards: a move
    /// while schedulers of the old queue still advance the job may lose
    /// their last advance (stop them first when changing a job's queue).
    /// The old home's slot tombstones stay where they are.
    async fn move_job(&self, job: &str, from: Option<&str>, to: &str) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        if let Some(from) = from {
            let old = self.qbase(from);
            let h: Vec<String> = redis::cmd("HGETALL")
                .arg(format!("{old}job:{job}"))
                .query_async(&mut conn)
                .await?;
            let act: Vec<String> = redis::cmd("SMEMBERS")
                .arg(format!("{old}jobactive:{job}"))
                .query_async(&mut conn)
                .await?;
            let mut args = sargs![job, h.len()];
            args.extend(h);
            args.extend(act);
            self.qs::<i64>(to, &self.scripts.job_import, args).await?;
        }
        redis::cmd("HSET")
            .arg(self.key("jobq"))
            .arg(job)
            .arg(to)
            .query_async::<()>(&mut conn)
            .await?;
        if let Ok(mut m) = self.job_homes.lock() {
            m.insert(job.to_string(), to.to_string());
        }
        if let Some(from) = from {
            let old = self.qbase(from);
            for k in [format!("{old}job:{job}"), format!("{old}jobactive:{job}")] {
                redis::cmd("DEL")
                    .arg(k)
                    .query_async::<()>(&mut conn)
                    .await?;
            }
        }
        Ok(())
    }

    /// The home queue of `job`, made `queue` when given and different.
    async fn ensure_job_home(&self, job: &str, queue: Option<&str>) -> Result<String, StoreError> {
        let home = self.job_home(job, false).await?;
        match (home, queue) {
            (Some(h), None) => Ok(h),
            (Some(h), Some(q)) if h == q => Ok(h),
            (home, q) => {
                // The memory may be stale: read again before moving.
                let home = match home {
                    Some(_) => self.job_home(job, true).await?,
                    None => None,
                };
                let to = q
                    .map(str::to_string)
                    .or_else(|| home.clone())
                    .unwrap_or_default();
                if home.as_deref() != Some(to.as_str()) {
                    self.move_job(job, home.as_deref(), &to).await?;
                }
                Ok(to)
            }
        }
    }

    fn wake_channel(&self) -> String {
        self.key("wake")
    }

    /// Run an index script (`B` keys only: the schema version, ids):
    /// `KEYS[1]` routes to the `{baton}` slot and `ARGV[1]` is `B`.
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
        Ok(self.invoke(&mut inv).await?)
    }

    /// Run a lock script on one lock key.
    /// Run a lock script of (token, ms) that answers the lease's new
    /// `lock_until` in ms, or 0 when the lease was not current (extend,
    /// revoke).
    async fn lock_until_after(
        &self,
        script: &Script,
        name: &str,
        token: super::FencingToken,
        d: std::time::Duration,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError> {
        let until: i64 = self
            .l(
                script,
                name,
                vec![token.0.to_string(), super::ms(d).to_string()],
            )
            .await?;
        if until == 0 {
            return Ok(None);
        }
        Ok(Some(super::from_ms(until)?))
    }

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
        Ok(self.invoke(&mut inv).await?)
    }

    /// The records of locks `names`: one script per lock (each lock has
    /// its own hash tag), 16 at a time.
    async fn lock_records(&self, names: &[String]) -> Result<Vec<LockInfo>, StoreError> {
        let mut out = Vec::new();
        for chunk in names.chunks(16) {
            let reads =
                futures_util::future::join_all(chunk.iter().map(|n| self.lock_record(n))).await;
            for r in reads {
                out.extend(r?);
            }
        }
        Ok(out)
    }

    /// The record of lock `name`, if it has one baton wrote.
    async fn lock_record(&self, name: &str) -> Result<Option<LockInfo>, StoreError> {
        let v: Vec<String> = self
            .invoke(&mut self.scripts.lock_get.key(self.lock_key(name)))
            .await?;
        let now_ms = v
            .first()
            .ok_or_else(|| StoreError::Corrupt("lock read: empty reply".into()))
            .and_then(|s| parse_i64(s, "now"))?;
        let rec = &v[1..];
        if rec.len() < 4 || rec[3].is_empty() {
            return Ok(None);
        }
        let until = parse_i64(&rec[3], "lock_until")?;
        Ok(Some(LockInfo {
            name: name.to_string(),
            holder: rec[0].clone(),
            token: FencingToken(parse_u64(&rec[1], "token")?),
            locked_at: from_ms(parse_i64(&rec[2], "locked_at")?)?,
            lock_until: from_ms(until)?,
            held: until > now_ms,
            now: from_ms(now_ms)?,
        }))
    }

    /// One page of the listing: each queue's newest matching tasks
    /// (one queue when the filter names it), merged newest first.
    async fn list_page(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, StoreError> {
        let limit = if filter.limit == 0 { 100 } else { filter.limit } as usize;
        let queues = match &filter.queue {
            Some(q) => vec![q.clone()],
            None => self.queues().await?,
        };
        let mut out = Vec::new();
        for q in &queues {
            out.extend(self.list_queue(q, filter, limit).await?);
        }
        out.sort_by_key(|t| std::cmp::Reverse(t.id));
        out.truncate(limit);
        Ok(out)
    }

    /// The newest `limit` tasks of `queue` that match `filter`.
    async fn list_queue(
        &self,
        queue: &str,
        filter: &TaskFilter,
        limit: usize,
    ) -> Result<Vec<TaskInfo>, StoreError> {
        let state = filter.state.map(|s| s.as_str()).unwrap_or("");
        let job = opt_arg(filter.job.as_deref());
        let ms_arg = |t: Option<chrono::DateTime<chrono::Utc>>| {
            t.map(|t| t.timestamp_millis().to_string())
                .unwrap_or_default()
        };
        let mut before = filter.before_id.map(|b| b.to_string()).unwrap_or_default();
        let mut out = Vec::new();
        loop {
            let want = (limit - out.len()).to_string();
            let (maps, last, exhausted): (Vec<HashMap<String, String>>, String, i64) = self
                .qs(
                    queue,
                    &self.scripts.list,
                    sargs![
                        before,
                        want,
                        state,
                        opt_arg(Some(queue)),
                        job,
                        LIST_SCAN,
                        opt_arg(filter.kind.as_deref()),
                        opt_arg(filter.key.as_deref()),
                        opt_arg(filter.text.as_deref()),
                        ms_arg(filter.created_from),
                        ms_arg(filter.created_to)
                    ],
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
