//! The Redis "schema": no DDL, but a recorded version (`B schema`) and the
//! numbered upgrade steps ([`UPGRADES`]) that convert keys from one version
//! to the next.

use std::collections::BTreeSet;

use super::RedisBackend;
use crate::error::StoreError;
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
];

/// The recorded version against [`SCHEMA_VERSION`] (a read: the migrate
/// script with no version to record).
pub(super) async fn status(b: &RedisBackend) -> Result<SchemaStatus, StoreError> {
    let found: i64 = b.q(&b.scripts.migrate, sargs![""]).await?;
    Ok(SchemaStatus {
        found: (found != 0).then_some(found),
        expected: SCHEMA_VERSION,
    })
}

/// Record the schema version of a new store, or run the upgrade steps from
/// the recorded one, recording each as it completes.
pub(super) async fn migrate(b: &RedisBackend) -> Result<(), StoreError> {
    let found: i64 = b.q(&b.scripts.migrate, sargs![""]).await?;
    if found <= SCHEMA_VERSION {
        // The store's identity, written once (see `StoreIdentity`).
        let mut conn = b.conn.clone();
        redis::cmd("SET")
            .arg(b.key(STORE_ID))
            .arg(crate::store::new_store_id())
            .arg("NX")
            .query_async::<()>(&mut conn)
            .await?;
    }
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
        b.q::<i64>(&b.scripts.migrate, sargs![SCHEMA_VERSION])
            .await?;
        return Ok(());
    }
    for from in found.max(BASE_VERSION)..SCHEMA_VERSION {
        let step = usize::try_from(from - BASE_VERSION)
            .ok()
            .and_then(|i| UPGRADES.get(i))
            .ok_or_else(|| StoreError::Corrupt(format!("redis schema version {from}")))?;
        upgrade(b, *step).await?;
        // Recorded step by step, so an interrupted upgrade resumes.
        b.q::<i64>(&b.scripts.migrate, sargs![from + 1]).await?;
        tracing::info!(
            prefix = %b.prefix,
            "redis: upgraded the baton schema from version {from} to {}",
            from + 1
        );
    }
    Ok(())
}

/// Run one upgrade step (idempotent).
async fn upgrade(b: &RedisBackend, step: Upgrade) -> Result<(), StoreError> {
    let op = match step {
        Upgrade::PersistLocks => "persist",
        Upgrade::LockIndex => "index",
        Upgrade::OwnLockKeys => "move",
        Upgrade::QueuePause | Upgrade::Traceparent | Upgrade::SlotTombstones => return Ok(()),
    };
    let mut moved = 0usize;
    let mut foreign = 0usize;
    for name in scan_lock_names(b).await? {
        let mut inv = b.scripts.lock_upgrade.prepare_invoke();
        inv.key(b.legacy_lock_key(&name))
            .key(b.lock_key(&name))
            .key(b.key(LOCK_INDEX))
            .arg(op)
            .arg(&name);
        let mut conn = b.conn.clone();
        let converted: i64 = inv.invoke_async(&mut conn).await?;
        if converted == 1 {
            moved += 1;
        } else {
            foreign += 1;
        }
    }
    if foreign > 0 {
        tracing::info!(
            prefix = %b.prefix,
            step = op,
            converted = moved,
            left_alone = foreign,
            "redis: schema upgrade left keys baton did not write as they are"
        );
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
