//! The Redis "schema": no DDL, but a recorded version (`B schema`) and the
//! numbered upgrade steps ([`UPGRADES`]) that convert keys from one version
//! to the next.

use std::collections::{BTreeMap, BTreeSet};

use super::RedisBackend;
use crate::error::StoreError;
use crate::store::migrate::Dialect;
use crate::store::SchemaStatus;

/// The version a store without a recorded version is taken to have: the
/// first one (it had no keys needing conversion).
const BASE_VERSION: i64 = 1;

/// The schema version recorded by [`crate::store::Backend::migrate`]: the base plus one
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
    /// token forever); only keys that are baton's by shape (see
    /// `lua/lock_upgrade.lua`), never a key another tool wrote there. Claim tokens need no conversion: a task hash
    /// without `claim_token` counts as 0, and a pending task whose cancel
    /// was requested is cancelled by the next claim that meets it.
    PersistLocks,
    /// 2 → 3: queues can be paused (`B paused`, a set read by the claim).
    /// Nothing to convert (no set: nothing paused); the step marks the
    /// version, so a build that would ignore a pause refuses the store.
    QueuePause,
    /// 3 → 4: tasks may carry the enqueuer's trace context (the hash
    /// field `traceparent`). Nothing to convert; the step marks the
    /// version, so an older build (which would drop the field from the
    /// tasks it enqueues, and pass 12 arguments per task to scripts that
    /// read 13) refuses the store.
    Traceparent,
    /// 4 → 5: the lock index (`B locks`, a set of lock names), which
    /// `lock_list` reads instead of scanning the whole keyspace for lock
    /// keys. The step adds the names of the lock keys found by one scan
    /// that are baton's by shape; from then on each process adds a name
    /// with its first acquire of it.
    LockIndex,
    /// 5 → 6: lock keys move into baton's namespace, from `P lock:<name>`
    /// (with the default empty prefix the bare `lock:<name>` of other
    /// tools, e.g. ShedLock) to `B lock:<name>`. Each key found by one
    /// scan that is baton's by shape is copied to its new place (unless a
    /// record is already there) and deleted; every other key is left as
    /// it is, value and TTL, and its name is taken out of the lock index
    /// (where step 4 → 5 of earlier builds put it). Self-contained: it
    /// needs nothing from other steps.
    OwnLockKeys,
    /// 6 → 7: slot tombstones (`B slot:<job|slot>`, a hash written by the
    /// prune that deletes a slot's task, keeping the slot's key taken) and
    /// each job's queue (the `queue` field of `B job:<name>`). Nothing to
    /// convert; the step marks the version, so an older build (whose prune
    /// would free a slot's key) refuses the store.
    SlotTombstones,
    /// 7 → 8: one hash tag per queue and per lock, so a Redis Cluster
    /// spreads queues and locks over its shards (see the key layout in
    /// the module doc of `super`). Every task moves from `B task:<id>` to
    /// its queue's `Q task:<id>` (indexed again by its state, counted,
    /// its id recorded in `B where`), unique keys, jobs (with their
    /// unfinished runs) and slot tombstones to their queue's tag, each
    /// paused queue gets its flag, locks move from `B lock:<name>` to
    /// `P{baton:lock:<name>}` (only records baton wrote), and the old
    /// indexes are deleted. Key by key, each copy before its delete, so an
    /// interrupted upgrade resumes; but not atomic against older processes:
    /// **stop every older baton process on the store first** (they would
    /// keep writing the old keys; `baton migrate` says so).
    ClusterLayout,
    /// 8 → 9: tasks may carry a concurrency key (the hash field
    /// `concurrency_key`, the 14th script argument per task), counted
    /// while running in `B krun` and parked in `B kpark:<key>` by a claim
    /// with a cap per key. Nothing to convert (no task has a key yet); the
    /// step marks the version, so an older build (which would pass 13
    /// arguments per task, and neither count nor unpark keys) refuses the
    /// store.
    ConcurrencyKey,
    /// 9 → 10: unique keys scoped by kind and queue (issue 29). The key of
    /// every task that is no job's run and has a key from before scopes
    /// is rewritten into the default scope's composite
    /// (`store::UniqueKey::upgraded`, spelled the same in
    /// `lua/unique_upgrade.lua`), and `Q uniq:<key>` moves with it when it
    /// holds that task; a composite over 1024 bytes leaves the key as it
    /// was. One script per 500 tasks of a queue, each atomic and
    /// idempotent (a composite starts with the separator and is left
    /// alone), so it is safe while other processes run: an older process
    /// finishing or pruning a task reads the key from the task's hash.
    UniqueScopes,
    /// 10 → 11: rate limits (a queue's start log `Q rate`, a named limit's
    /// `B rate:<name>`: sorted sets written by a rated claim). Nothing to
    /// convert; the step marks the version, so an older build (whose
    /// claims would not log their starts) refuses the store.
    RateLimits,
    /// 11 → 12: a third unique hold, `UniqueHold::UntilFailed` (issue
    /// 29): a task may carry the hash field `unique_until_failed` (`1`),
    /// and a script ending it as succeeded keeps its `Q uniq:<key>`.
    /// Nothing to convert (no task has the field: each keeps its hold,
    /// `unique_forever` forever, the rest unfinished); the step marks the
    /// version, so an older build (whose finish would free such a key)
    /// refuses the store.
    UniqueUntilFailed,
    /// 12 → 13: a job's hash may carry `overlap` (its policy, which a
    /// worker ending a run reads to skip `job_release` under `skip` and
    /// `allow`) and `pause_note`, `pause_by`, `pause_at` (its last pause
    /// or resume); a queue's last pause or resume is the hash `Q pause`
    /// (`note`, `by`, `at`). Nothing to convert; the step marks the
    /// version (issue 26).
    PauseNotes,
    /// 13 → 14: debounce and throttle (issue 25): every claim of a task
    /// with a unique key records the key's last start in `Q kstart`
    /// (`<ms>:<id>` per key; a deleted task's entry goes with it), which a
    /// throttled enqueue reads; the 15th script argument per task is the
    /// policy. Nothing to convert (starts before it are not known, so a
    /// key's first throttle after the upgrade is accepted); the step marks
    /// the version, so an older build (whose claims would not record
    /// starts) refuses the store.
    KeyStarts,
    /// 14 → 15: fair claiming (`TaskClaim::fair`, `lua/fair.lua`): each
    /// queue's due tasks are indexed by group, `Q fk:<key>` (`Q fk:` for
    /// the tasks without a key) a zset scored as `Q ready`, and `Q fkeys`
    /// the keys with a task there (score 0, in key order); `Q fcursor` is
    /// the group the queue's previous fair claim served last. Every
    /// script that moves a task into or out of `ready` keeps the index.
    /// The step indexes each queue's `ready` with one script per queue
    /// (`lua/fair_upgrade.lua`, atomic and idempotent). An older process
    /// still running would not keep the index (a task it makes due is
    /// claimed by plain claims, but a fair claim does not see it): stop
    /// older processes first, as the version check makes them stop after.
    FairGroups,
    /// 15 → 16: job definitions kept in the store (the hash `B jobdefs`,
    /// issue 26). Nothing to convert; the step marks the version, so an
    /// older build (which would run its config's jobs however the store
    /// defines them) refuses the store.
    JobDefs,
}

/// The store's identity: the key `B store_id`, a random id set once.
pub(super) const STORE_ID: &str = "store_id";

/// The lock index: the set `B locks` of every lock name acquired (lock
/// records are kept for ever, so names are never removed).
pub(super) const LOCK_INDEX: &str = "locks";

/// The upgrade steps, in order. Add a variant and an entry at the end (and
/// nothing else: [`SCHEMA_VERSION`] follows).
const UPGRADES: &[Upgrade] = &[
    Upgrade::PersistLocks,
    Upgrade::QueuePause,
    Upgrade::Traceparent,
    Upgrade::LockIndex,
    Upgrade::OwnLockKeys,
    Upgrade::SlotTombstones,
    Upgrade::ClusterLayout,
    Upgrade::ConcurrencyKey,
    Upgrade::UniqueScopes,
    Upgrade::RateLimits,
    Upgrade::UniqueUntilFailed,
    Upgrade::PauseNotes,
    Upgrade::KeyStarts,
    Upgrade::FairGroups,
    Upgrade::JobDefs,
];

/// The first version with one hash tag per queue (step 7 → 8), whose
/// upgrade needs older processes stopped.
pub const CLUSTER_LAYOUT_VERSION: i64 = 8;

/// The recorded version against [`SCHEMA_VERSION`] (a read: the migrate
/// script with no version to record).
pub(super) async fn status(b: &RedisBackend) -> Result<SchemaStatus, StoreError> {
    let found: i64 = b.q(&b.scripts.migrate, sargs![""]).await?;
    Ok(SchemaStatus {
        found: (found != 0).then_some(found),
        expected: SCHEMA_VERSION,
    })
}

/// Delete every key of the prefix — `P{baton}:…`, `P{baton:lock:…}` and
/// `P{baton:q:…}:…`, all starting `P{baton` — found by `SCAN` (on a
/// cluster, on every master), in pipelines of `UNLINK`s, one pipeline per
/// hash tag (a cluster refuses a pipeline across slots).
pub(super) async fn remove(b: &RedisBackend) -> Result<(), StoreError> {
    let keys = b.conn.scan(&format!("{}{{baton*", b.prefix)).await?;
    let mut by_tag: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for k in &keys {
        by_tag.entry(hash_tag(k)).or_default().push(k);
    }
    let mut conn = b.conn.clone();
    for group in by_tag.values() {
        for chunk in group.chunks(500) {
            let mut pipe = redis::pipe();
            for k in chunk {
                pipe.cmd("UNLINK").arg(*k).ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
        }
    }
    Ok(())
}

/// The hash tag of `key` (what a cluster hashes: the text inside its first
/// `{…}`, or the whole key without one).
fn hash_tag(key: &str) -> &str {
    key.split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map_or(key, |(tag, _)| tag)
}

/// Record the schema version of a new store, or run the upgrade steps from
/// the recorded one, recording each as it completes, through the shared
/// runner (`store::migrate`).
pub(super) async fn migrate(b: &RedisBackend) -> Result<(), StoreError> {
    crate::store::migrate::run(&mut Migration { b }).await
}

/// The Redis side of the shared migration runner. Redis has no migration
/// lock: each step is idempotent and safe while other processes use the
/// keys (see [`Upgrade`]).
struct Migration<'a> {
    b: &'a RedisBackend,
}

impl Migration<'_> {
    /// The recorded version (`None`: nothing recorded), read by the
    /// migrate script with no version to record.
    async fn read(&self) -> Result<Option<i64>, StoreError> {
        let found: i64 = self.b.q(&self.b.scripts.migrate, sargs![""]).await?;
        Ok((found != 0).then_some(found))
    }
}

#[async_trait::async_trait]
impl Dialect for Migration<'_> {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn prefix(&self) -> &str {
        &self.b.prefix
    }

    fn base_version(&self) -> i64 {
        BASE_VERSION
    }

    fn step_count(&self) -> usize {
        UPGRADES.len()
    }

    async fn peek_version(&mut self) -> Result<Option<i64>, StoreError> {
        self.read().await
    }

    async fn lock(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn recorded_version(&mut self) -> Result<Option<i64>, StoreError> {
        self.read().await
    }

    /// Nothing recorded: a new store (every version records itself at
    /// connect), with nothing to convert.
    async fn create(&mut self) -> Result<i64, StoreError> {
        self.record_version(SCHEMA_VERSION).await?;
        Ok(SCHEMA_VERSION)
    }

    async fn run_step(&mut self, index: usize) -> Result<(), StoreError> {
        let step = UPGRADES
            .get(index)
            .ok_or_else(|| StoreError::Corrupt(format!("redis schema upgrade step {index}")))?;
        upgrade(self.b, *step).await
    }

    /// Recorded step by step, so an interrupted upgrade resumes.
    async fn record_version(&mut self, version: i64) -> Result<(), StoreError> {
        self.b
            .q::<i64>(&self.b.scripts.migrate, sargs![version])
            .await?;
        Ok(())
    }

    async fn unlock(&mut self, _commit: bool) -> Result<(), StoreError> {
        Ok(())
    }

    /// The store's identity, written once (see `StoreIdentity`).
    async fn write_identity(&mut self) -> Result<(), StoreError> {
        let mut conn = self.b.conn.clone();
        redis::cmd("SET")
            .arg(self.b.key(STORE_ID))
            .arg(crate::store::new_store_id())
            .arg("NX")
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }
}

/// Run one upgrade step (idempotent).
async fn upgrade(b: &RedisBackend, step: Upgrade) -> Result<(), StoreError> {
    match step {
        Upgrade::QueuePause
        | Upgrade::Traceparent
        | Upgrade::SlotTombstones
        | Upgrade::ConcurrencyKey
        | Upgrade::RateLimits
        | Upgrade::UniqueUntilFailed
        | Upgrade::PauseNotes
        | Upgrade::KeyStarts
        | Upgrade::JobDefs => Ok(()),
        Upgrade::PersistLocks | Upgrade::LockIndex | Upgrade::OwnLockKeys => {
            legacy_locks(b, step).await
        }
        Upgrade::ClusterLayout => cluster_layout(b).await,
        Upgrade::UniqueScopes => unique_scopes(b).await,
        Upgrade::FairGroups => fair_groups(b).await,
    }
}

/// Step 14 → 15 (see [`Upgrade::FairGroups`]): each queue's `ready`
/// through `fair_upgrade.lua`.
async fn fair_groups(b: &RedisBackend) -> Result<(), StoreError> {
    let mut indexed = 0i64;
    for queue in b.queues().await? {
        indexed += b
            .qs::<i64>(&queue, &b.scripts.fair_upgrade, Vec::new())
            .await?;
    }
    if indexed > 0 {
        tracing::info!(prefix = %b.prefix, indexed, "redis: due tasks indexed for fair claiming");
    }
    Ok(())
}

/// Step 9 → 10 (see [`Upgrade::UniqueScopes`]): each queue's tasks, 500
/// ids at a time in id order, through `unique_upgrade.lua`.
async fn unique_scopes(b: &RedisBackend) -> Result<(), StoreError> {
    let mut conn = b.conn.clone();
    let mut rewritten = 0i64;
    for queue in b.queues().await? {
        let ids_key = format!("{}ids", b.qbase(&queue));
        let mut from = "-inf".to_string();
        loop {
            let ids: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                .arg(&ids_key)
                .arg(&from)
                .arg("+inf")
                .arg("LIMIT")
                .arg(0)
                .arg(500)
                .query_async(&mut conn)
                .await?;
            let Some(last) = ids.last() else {
                break;
            };
            let last: i64 = last
                .parse()
                .map_err(|_| StoreError::Corrupt(format!("task id {last:?} in {ids_key}")))?;
            from = format!("({last}");
            rewritten += b.qs::<i64>(&queue, &b.scripts.unique_upgrade, ids).await?;
        }
    }
    if rewritten > 0 {
        tracing::info!(prefix = %b.prefix, rewritten, "redis: unique keys rewritten into the kind-in-queue scope");
    }
    Ok(())
}

/// Steps 1 → 2, 4 → 5 and 5 → 6 on the lock keys at `P lock:<name>`.
async fn legacy_locks(b: &RedisBackend, step: Upgrade) -> Result<(), StoreError> {
    let mut moved = 0usize;
    let mut foreign = 0usize;
    let mut conn = b.conn.clone();
    for name in scan_lock_names(b).await? {
        let legacy = b.legacy_lock_key(&name);
        let persist = matches!(step, Upgrade::PersistLocks);
        let rec = read_lock(b, &legacy, persist).await?;
        let converted = match (step, rec) {
            (Upgrade::LockIndex, Some(_)) => {
                index_lock(b, &name).await?;
                true
            }
            (Upgrade::OwnLockKeys, Some(rec)) => {
                let done = move_lock(b, &legacy, &b.v6_lock_key(&name), &rec).await?;
                if done {
                    index_lock(b, &name).await?;
                }
                done
            }
            (Upgrade::OwnLockKeys, None) => {
                // A name an older upgrade step indexed from a key baton
                // did not write.
                let exists = |k: String| redis::cmd("EXISTS").arg(k).clone();
                let old: i64 = exists(legacy.clone()).query_async(&mut conn).await?;
                let new: i64 = exists(b.v6_lock_key(&name)).query_async(&mut conn).await?;
                if old == 1 && new == 0 {
                    redis::cmd("SREM")
                        .arg(b.key(LOCK_INDEX))
                        .arg(&name)
                        .query_async::<()>(&mut conn)
                        .await?;
                }
                false
            }
            (_, rec) => rec.is_some(),
        };
        if converted {
            moved += 1;
        } else {
            foreign += 1;
        }
    }
    if foreign > 0 {
        tracing::info!(
            prefix = %b.prefix,
            step = ?step,
            converted = moved,
            left_alone = foreign,
            "redis: schema upgrade left keys baton did not write as they are"
        );
    }
    Ok(())
}

/// Add `name` to the lock index.
async fn index_lock(b: &RedisBackend, name: &str) -> Result<(), StoreError> {
    let mut conn = b.conn.clone();
    Ok(redis::cmd("SADD")
        .arg(b.key(LOCK_INDEX))
        .arg(name)
        .query_async::<()>(&mut conn)
        .await?)
}

/// The lock record at `key` when baton wrote it (holder, token,
/// locked_at, lock_until), its TTL removed with `persist`.
async fn read_lock(
    b: &RedisBackend,
    key: &str,
    persist: bool,
) -> Result<Option<Vec<String>>, StoreError> {
    let mut inv = b.scripts.lock_upgrade.key(key);
    inv.arg(if persist { "persist" } else { "read" });
    let v: Vec<redis::Value> = b.invoke(&mut inv).await?;
    let mine = v
        .first()
        .and_then(|x| redis::from_redis_value::<i64>(x).ok())
        == Some(1);
    if !mine {
        return Ok(None);
    }
    let rec = v[1..]
        .iter()
        .map(redis::from_redis_value::<String>)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(rec))
}

/// Move baton's lock record `rec` from `from` to `to` (unless `to` holds
/// one already: a record a newer process wrote stands, its token floored
/// at the clock above the old one), then delete `from`. A key baton did
/// not write at `to` leaves both as they are: `false`.
async fn move_lock(
    b: &RedisBackend,
    from: &str,
    to: &str,
    rec: &[String],
) -> Result<bool, StoreError> {
    let mut conn = b.conn.clone();
    let exists: i64 = redis::cmd("EXISTS").arg(to).query_async(&mut conn).await?;
    if exists == 1 {
        if read_lock(b, to, false).await?.is_none() {
            return Ok(false);
        }
    } else {
        let [holder, token, locked_at, lock_until] = rec else {
            return Err(StoreError::Corrupt(format!("lock record {from}: {rec:?}")));
        };
        redis::cmd("HSET")
            .arg(to)
            .arg(&["holder", holder, "token", token])
            .arg(&["locked_at", locked_at, "lock_until", lock_until])
            .query_async::<()>(&mut conn)
            .await?;
    }
    redis::cmd("DEL")
        .arg(from)
        .query_async::<()>(&mut conn)
        .await?;
    Ok(true)
}

/// Step 7 → 8 (see [`Upgrade::ClusterLayout`]).
async fn cluster_layout(b: &RedisBackend) -> Result<(), StoreError> {
    let mut conn = b.conn.clone();
    let old = |what: &str| b.key(what);
    // Locks: each to a tag of its own.
    let mut names: BTreeSet<String> = lock_names(b).await?.into_iter().collect();
    let head = old("lock:");
    for k in b.conn.scan(&format!("{head}*")).await? {
        if let Some(n) = k.strip_prefix(&head) {
            names.insert(n.to_string());
        }
    }
    for name in &names {
        let from = b.v6_lock_key(name);
        if let Some(rec) = read_lock(b, &from, false).await? {
            move_lock(b, &from, &b.lock_key(name), &rec).await?;
        }
    }
    // Tasks: each to its queue's tag, its id recorded in `B where`.
    let ids: Vec<String> = redis::cmd("ZRANGE")
        .arg(old("ids"))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await?;
    for p in &ids {
        let id = p.trim_start_matches('0');
        let key = old(&format!("task:{id}"));
        let h: Vec<String> = redis::cmd("HGETALL")
            .arg(&key)
            .query_async(&mut conn)
            .await?;
        let Some(queue) = h
            .chunks(2)
            .find(|kv| kv[0] == "queue")
            .and_then(|kv| kv.get(1))
            .cloned()
        else {
            continue;
        };
        redis::cmd("HSET")
            .arg(old("where"))
            .arg(id)
            .arg(&queue)
            .query_async::<()>(&mut conn)
            .await?;
        b.qs::<i64>(&queue, &b.scripts.task_import, h).await?;
        redis::cmd("DEL")
            .arg(&key)
            .query_async::<()>(&mut conn)
            .await?;
    }
    // Unique keys: to the holder's queue.
    let head = old("uniq:");
    for k in b.conn.scan(&format!("{head}*")).await? {
        let Some(uk) = k.strip_prefix(&head) else {
            continue;
        };
        let holder: Option<String> = redis::cmd("GET").arg(&k).query_async(&mut conn).await?;
        let queue: Option<String> = match &holder {
            Some(h) => {
                redis::cmd("HGET")
                    .arg(old("where"))
                    .arg(h)
                    .query_async(&mut conn)
                    .await?
            }
            None => None,
        };
        if let (Some(h), Some(q)) = (holder, queue) {
            redis::cmd("SET")
                .arg(format!("{}uniq:{uk}", b.qbase(&q)))
                .arg(h)
                .arg("NX")
                .query_async::<()>(&mut conn)
                .await?;
        }
        redis::cmd("DEL")
            .arg(&k)
            .query_async::<()>(&mut conn)
            .await?;
    }
    // Jobs: each to its queue's tag (a job without a recorded queue to
    // the empty queue's, until its first run names one).
    let jobs: Vec<String> = redis::cmd("SMEMBERS")
        .arg(old("jobs"))
        .query_async(&mut conn)
        .await?;
    for job in &jobs {
        let h: Vec<String> = redis::cmd("HGETALL")
            .arg(old(&format!("job:{job}")))
            .query_async(&mut conn)
            .await?;
        let act: Vec<String> = redis::cmd("SMEMBERS")
            .arg(old(&format!("jobactive:{job}")))
            .query_async(&mut conn)
            .await?;
        let home = h
            .chunks(2)
            .find(|kv| kv[0] == "queue")
            .and_then(|kv| kv.get(1))
            .cloned()
            .unwrap_or_default();
        let mut args = sargs![job, h.len()];
        args.extend(h);
        args.extend(act);
        b.qs::<i64>(&home, &b.scripts.job_import, args).await?;
        redis::cmd("HSET")
            .arg(old("jobq"))
            .arg(job)
            .arg(&home)
            .query_async::<()>(&mut conn)
            .await?;
        for k in [old(&format!("job:{job}")), old(&format!("jobactive:{job}"))] {
            redis::cmd("DEL")
                .arg(k)
                .query_async::<()>(&mut conn)
                .await?;
        }
    }
    // Slot tombstones: to their job's home.
    let head = old("slot:");
    for k in b.conn.scan(&format!("{head}*")).await? {
        let Some(slot_key) = k.strip_prefix(&head) else {
            continue;
        };
        let job = slot_key
            .rsplit_once('|')
            .map(|(j, _)| j)
            .unwrap_or(slot_key);
        let home: Option<String> = redis::cmd("HGET")
            .arg(old("jobq"))
            .arg(job)
            .query_async(&mut conn)
            .await?;
        let h: Vec<String> = redis::cmd("HGETALL").arg(&k).query_async(&mut conn).await?;
        if !h.is_empty() {
            redis::cmd("HSET")
                .arg(format!(
                    "{}slot:{slot_key}",
                    b.qbase(&home.unwrap_or_default())
                ))
                .arg(&h)
                .query_async::<()>(&mut conn)
                .await?;
        }
        redis::cmd("DEL")
            .arg(&k)
            .query_async::<()>(&mut conn)
            .await?;
    }
    // Paused queues: each its flag (`B paused` stays: the index).
    let paused: Vec<String> = redis::cmd("SMEMBERS")
        .arg(old("paused"))
        .query_async(&mut conn)
        .await?;
    for q in &paused {
        redis::cmd("SET")
            .arg(format!("{}paused", b.qbase(q)))
            .arg("1")
            .query_async::<()>(&mut conn)
            .await?;
    }
    // The old indexes.
    let mut gone = vec![old("running"), old("done"), old("ids"), old("jobs")];
    for q in b.queues().await? {
        gone.extend([
            old(&format!("counts:{q}")),
            old(&format!("q:{q}:sched")),
            old(&format!("q:{q}:ready")),
        ]);
    }
    for k in gone {
        redis::cmd("DEL")
            .arg(k)
            .query_async::<()>(&mut conn)
            .await?;
    }
    Ok(())
}

/// Every lock name in the lock index, sorted.
pub(super) async fn lock_names(b: &RedisBackend) -> Result<Vec<String>, StoreError> {
    let mut conn = b.conn.clone();
    let mut names: Vec<String> = redis::cmd("SMEMBERS")
        .arg(b.key(LOCK_INDEX))
        .query_async(&mut conn)
        .await?;
    names.sort_unstable();
    Ok(names)
}

/// The names under `P lock:` (where schema versions before 6 kept lock
/// keys), found by scanning the keyspace: what the upgrade steps look at,
/// each key checked for baton's shape before it is touched. (`lock_list`
/// reads the index instead.)
async fn scan_lock_names(b: &RedisBackend) -> Result<Vec<String>, StoreError> {
    let head = format!("{}lock:", b.prefix);
    let mut names = BTreeSet::new();
    for k in b.conn.scan(&format!("{head}*")).await? {
        if let Some(n) = k.strip_prefix(&head) {
            names.insert(n.to_string());
        }
    }
    Ok(names.into_iter().collect())
}
