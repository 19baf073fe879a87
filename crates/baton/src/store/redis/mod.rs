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
//! - `B lock:<name>` — hash `holder`, `token`, `locked_at`, `lock_until`
//!   (ms). Never deleted by release and never expires (schema 2; before, it
//!   had a TTL a day past `lock_until`), so it keeps the last token. A new
//!   token is `max(previous + 1, TIME in µs)` so tokens keep rising even
//!   after a restart that lost data. Schema 6 moved it here from
//!   `P lock:<name>` (with the default empty prefix the bare
//!   `lock:<name>` that other tools, e.g. ShedLock, write too). A value
//!   baton did not write at a lock key (another type, a hash without
//!   baton's fields) is never changed: it reads as held by something else.
//! - `B task:<id>` — hash with every task field (timestamps in ms since the
//!   epoch, `errors` a JSON array of `{attempt, at (ms), error}`;
//!   `claim_token`, absent before the first claim of schema 2, counts as 0).
//! - `B seq` — the id counter: each new id is `max(INCR, TIME in µs)`
//!   (the clock read once per script), so ids never repeat even after a
//!   restart that lost the counter (DESIGN.md I1).
//! - `B store_id` — the store's identity, a random id set once (`SET NX`)
//!   by `migrate`; read with `B seq` by `store_identity` (DESIGN.md E2).
//! - `B q:<queue>:sched` — zset of pending tasks not yet due, score `run_at`.
//! - `B q:<queue>:ready` — zset of due pending tasks, score
//!   `(priority + 128) · 2⁴³ + run_at` (exact in a double: < 2⁵¹), members
//!   zero-padded ids so equal scores order by id.
//! - `B running` — zset of running tasks, score `lease_until` (rescue).
//! - `B done` — zset of terminal tasks, score `finished_at` (prune).
//! - `B ids` — zset of every task id (listing, newest first).
//! - `B uniq:<key>` — the id holding a unique key.
//! - `B counts:<queue>` — hash state → count (stats); `B queues` — set.
//! - `B paused` — set of paused queues (schema 3): the claim script returns
//!   nothing for a queue in it.
//! - `B jobactive:<job>` — set of the job's pending/running task ids.
//! - `B job:<name>` — hash `last_slot` (ms), `paused`; `B jobs` — set.
//! - `B wake` — the pub/sub channel announcing new pending work: the queue
//!   name (due now), or `queue\n<run_at in µs>` for work due later.
//! - `B schema` — the schema version.
//!
//! All keys share the `{baton}` hash tag, so a Redis Cluster could run
//! every script on one slot. baton never writes, expires or deletes a key
//! outside `B`: the upgrade steps that convert older lock keys at
//! `P lock:<name>` touch only those that are baton's by shape.
//!
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
//! command connection, following the master), `sentinel.rs` (the
//! `redis+sentinel://` URL, asking the sentinels), `listener.rs`
//! (pub/sub wake-ups), `decode.rs` (arguments and replies), `backend.rs` (the
//! [`Backend`] impl).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

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

mod backend;
mod conn;
mod decode;
mod listener;
mod schema;
mod scripts;
mod sentinel;
mod tls;

use conn::Conn;

use decode::{opt_arg, parse_i64, parse_u64, task_info};
pub use schema::SCHEMA_VERSION;
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
const TASK_ARGS: usize = 13;

/// The wake-up listener, started by the first `subscribe()`.
struct Listener {
    tx: broadcast::Sender<Wake>,
    /// Stops the listener task when the backend is dropped.
    _stop: DropGuard,
}

/// The Redis implementation of [`Backend`]. Build it with [`connect`].
pub struct RedisBackend {
    /// The command connection (to the master; see `conn.rs`).
    conn: Conn,
    /// The configured key prefix `P`.
    prefix: String,
    /// `P{baton}:`, the base of every queue and job key.
    base: String,
    scripts: Scripts,
    wake: tokio::sync::Mutex<Option<Listener>>,
    /// Lock names this process has added to the lock index (`B locks`),
    /// so each is added once, not on every acquire (see [`INDEXED_LOCKS`]).
    indexed_locks: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// At most this many names are remembered in
/// [`RedisBackend::indexed_locks`]; past it the memory starts over (a name
/// added again is a no-op on the server).
const INDEXED_LOCKS: usize = 65_536;

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
        let (target, wait_replicas) = conn::Target::from_url(url)?;
        let conn = Conn::new(
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
        let prefix = opts.prefix.clone().unwrap_or_default();
        Ok(RedisBackend {
            conn,
            base: format!("{prefix}{{baton}}:"),
            prefix,
            scripts: Scripts::new(),
            wake: tokio::sync::Mutex::new(None),
            indexed_locks: std::sync::Mutex::new(std::collections::HashSet::new()),
        })
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

    /// Where lock `name` lives: `B lock:<name>`, in baton's own
    /// namespace (schema 6; before, `P lock:<name>`, see
    /// [`RedisBackend::legacy_lock_key`]).
    fn lock_key(&self, name: &str) -> String {
        format!("{}lock:{name}", self.base)
    }

    /// Where versions before schema 6 kept lock `name`: `P lock:<name>`,
    /// outside baton's namespace (with the default empty prefix the bare
    /// `lock:<name>` other tools use too). Only the upgrade steps read it.
    fn legacy_lock_key(&self, name: &str) -> String {
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
