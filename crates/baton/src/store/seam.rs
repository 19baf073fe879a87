//! The seam: the one list of store operations ([`seam_methods!`](crate::seam_methods)),
//! written once, and the [`Backend`] trait generated from it. Every
//! backend implements it; the call-deadline wrapper and the conformance
//! suite's counting backend are generated from the same list.

#[allow(unused_imports)]
use super::*;

/// Names the seam's method list uses, reachable from any crate that
/// expands [`seam_methods!`](crate::seam_methods).
#[doc(hidden)]
pub mod seam_types {
    pub use chrono::{DateTime, Utc};
    pub use std::time::Duration;
    pub use tokio::sync::broadcast::Receiver;
}

/// The seam's method list, written once: `seam_methods!(m)` expands to
/// `m! { …one `fn name(args) -> Ok type;` per method, with its doc… }`.
/// [`Backend`] itself, the call-deadline wrapper ([`Store::connect_with`]
/// wraps every backend in it) and the conformance suite's counting backend
/// are each generated from it, so a new method is added here and in each
/// backend, nowhere else. `kind()` (not async, no store call) is not in
/// the list: each generator writes it.
#[doc(hidden)]
#[macro_export]
macro_rules! seam_methods {
    ($callback:ident) => {
        $callback! {
            /// Create or upgrade the schema, idempotently; safe when many processes
            /// call it at once.
            fn migrate() -> ();

            /// The store's clock.
            fn now() -> $crate::store::seam_types::DateTime<$crate::store::seam_types::Utc>;

            /// The schema version recorded at this prefix against this build's
            /// (a read only: nothing is created or upgraded). Readiness checks use
            /// it: a store another build migrated, or whose schema is gone, is not
            /// one this process can serve.
            fn schema_status() -> $crate::store::SchemaStatus;

            /// Remove baton's schema at this prefix with all its data: every
            /// table and sequence (SQL) or key (Redis) baton made there; the
            /// application's own objects, and other prefixes', are untouched.
            /// Idempotent (nothing there is not an error). Not safe while a
            /// baton process uses the prefix: stop them first.
            fn schema_remove() -> ();

            /// The store's identity and task id counter (a read only: the id is
            /// written by [`Backend::migrate`], once). See [`StoreIdentity`].
            fn store_identity() -> $crate::store::StoreIdentity;

            /// Raise the task id counter to the store's clock in µs when it is
            /// more than [`ID_FLOOR_SLACK_US`] behind it (never lower it), so the
            /// next task id is above every id handed out before a restore of an
            /// older backup set the counter back (DESIGN.md I1). Safe while other
            /// processes insert tasks. [`Store::check_identity`] calls it at
            /// connect and after each change it finds. A backend that floors
            /// every new id itself (Redis) does nothing here.
            fn task_id_floor() -> ();

            /// A write that changes nothing, to learn whether the store takes
            /// writes: [`StoreError::ReadOnly`] from a read-only server (see
            /// [`Store::check_writable`]). A store whose writes are never
            /// refused (or that has no probe) answers `Ok`.
            fn store_write_probe() -> ();

            /// Warnings about the store's configuration (e.g. Redis without AOF).
            fn warnings() -> Vec<String>;

            // ---- locks -------------------------------------------------------------

            /// Grant a lease if the name is free or its lease has lapsed; the token
            /// is `max(previous + 1, store clock in µs)`, so it rises with every
            /// grant, forever, even after the record was lost.
            fn lock_acquire(req: &$crate::store::LockAcquire<'_>) -> $crate::store::Acquire;

            /// Extend a lease we hold to `now + at_most`. `None` when the token is
            /// no longer the current one or the lease already lapsed.
            fn lock_extend(params: &$crate::store::LockExtend<'_>) -> Option<$crate::store::seam_types::DateTime<$crate::store::seam_types::Utc>>;

            /// Release a lease we hold: it ends at `max(now, locked_at + at_least)`.
            /// False when the token is no longer current or the lease lapsed.
            fn lock_release(params: &$crate::store::LockRelease<'_>) -> bool;

            /// Revoke the lease `token` holds (an operator's force-release): in one
            /// atomic step, if `token` is current and the lease unexpired, the
            /// record's token becomes `token + 1` (granted to no one: the holder's
            /// extensions and release are refused from then on, and the next
            /// grant's token is still higher), its holder `revoked:<holder>`, and
            /// its `lock_until` `min(lock_until, now + within)`. The new
            /// `lock_until` (when the name is free); `None` when `token` is not
            /// current or its lease lapsed (nothing changed).
            fn lock_revoke(params: &$crate::store::LockRevoke<'_>) -> Option<$crate::store::seam_types::DateTime<$crate::store::seam_types::Utc>>;

            /// One lock's record.
            fn lock_get(name: &str) -> Option<$crate::store::LockInfo>;

            /// Every lock record, by name.
            fn lock_list() -> Vec<$crate::store::LockInfo>;

            /// Released leases, newest first ([`LockHistoryQuery`]); each
            /// release records one.
            fn lock_history_list(q: &$crate::store::LockHistoryQuery) -> Vec<$crate::store::LockRecord>;

            /// Delete releases older than [`LOCK_HISTORY_RETENTION`] (store
            /// time) and beyond the newest [`LOCK_HISTORY_PER_LOCK`] of a
            /// lock; how many.
            fn lock_history_prune_many() -> u64;

            // ---- tasks -------------------------------------------------------------

            /// Insert tasks (idempotently per unique key), in order; one result each.
            fn task_insert_many(tasks: &[$crate::store::NewTask]) -> Vec<$crate::store::Enqueued>;

            /// Lease up to `limit` due pending tasks whose cancellation was not
            /// requested, none while the queue is paused
            /// ([`Backend::queue_set_paused`]), ordered by priority, run_at, id; each claimed task's
            /// attempt goes up by one and its token to `max(previous + 1, store
            /// clock in µs)`.
            fn task_claim(req: &$crate::store::TaskClaim<'_>) -> Vec<$crate::store::Task>;

            /// [`Backend::task_claim`] under a rate limit: at most `max` starts
            /// of the limit ([`TaskClaimRated::key`]) in any window of `per` of
            /// the store's clock, counting every claimer's starts, decided
            /// atomically with the claim (docs/STORE.md, "Rate limits"). Answers
            /// the store's clock and, when the limit is used up, the instant it
            /// next allows a start.
            fn task_claim_rated(req: &$crate::store::TaskClaimRated<'_>) -> $crate::store::RatedClaim;

            /// [`Backend::task_claim`] under a rate per concurrency key (and
            /// the queue's or a named limit when `rate` is set): no key starts
            /// more than `key_rate.max` tasks in any window of `key_rate.per`
            /// of the store's clock, counting every claimer's starts, decided
            /// atomically with the claim; a used-up key's tasks stay pending
            /// while other keys' are claimed (docs/STORE.md, "Rate limits per
            /// key"). Answers as [`Backend::task_claim_rated`], plus, when
            /// the claim came back short, when the earliest held-back key
            /// may start again ([`RatedClaim::key_next`]).
            fn task_claim_key_rated(req: &$crate::store::TaskClaimKeyRated<'_>) -> $crate::store::RatedClaim;

            /// Extend the leases of running claims to `now + lease`, in one round
            /// trip; one answer per claim, in order.
            fn task_heartbeat_many(params: &$crate::store::TaskHeartbeatMany<'_>) -> Vec<$crate::store::Heartbeat>;

            /// End attempts: one answer per item, in order. Each is a
            /// compare-and-set on (id, token, running): false means the claim was
            /// lost and nothing changed for that item. The transitions are the table
            /// in `state.rs` ([`TRANSITIONS`]; DESIGN.md "Task states"). Workers send
            /// every completion through this, so a backend does a batch in one
            /// transaction or round trip; a single finish is a batch of one. A
            /// batch names each task at most once (backends group a batch by kind
            /// of finish, so two items for one task would not be answered in
            /// order); [`Store::task_finish_many`] splits a batch that repeats one.
            fn task_finish_many(items: &[($crate::store::Claim, $crate::store::Finish)]) -> Vec<bool>;

            /// Finish `req.finish` as [`Backend::task_finish_many`] does (each
            /// item the same compare-and-set on its claim, answered per item)
            /// and claim as [`Backend::task_claim`] does with `req.claim`, in
            /// one round trip where the store can: a busy worker sends the
            /// results it holds with its next claim. Without caps or fair
            /// claiming the claim need not see the finishes (they may run as
            /// one statement); under a cap it does (finished tasks no longer
            /// count as running). A store without a one-round-trip form runs
            /// [`finish_then_claim`]. An error means neither answer is known.
            fn task_finish_and_claim(req: &$crate::store::TaskFinishAndClaim<'_>) -> $crate::store::FinishedAndClaimed;

            /// Store a progress report on a running claim. False if the claim is lost.
            fn task_set_progress(params: &$crate::store::TaskSetProgress<'_>) -> bool;

            /// Return every running task whose lease lapsed to pending (or to failed
            /// with [`LEASE_EXPIRED`] when out of attempts, or to cancelled when
            /// cancellation was requested). Any instance may call it any time.
            fn task_rescue_many() -> $crate::store::Rescued;

            /// Cancel a task (see [`CancelOutcome`]).
            fn task_cancel(id: i64) -> $crate::store::CancelOutcome;

            /// Move a failed or cancelled task back to pending now, allowing at least
            /// one more attempt. False when the task is not failed or cancelled.
            fn task_retry(id: i64) -> bool;

            /// One task.
            fn task_get(id: i64) -> Option<$crate::store::TaskInfo>;

            /// A page of tasks (see [`TaskFilter`]).
            fn task_list(filter: &$crate::store::TaskFilter) -> Vec<$crate::store::TaskInfo>;

            /// Pause or resume claiming from a queue, cluster-wide: while paused,
            /// [`Backend::task_claim`] on it returns nothing (checked in the claim's
            /// own statement or script), running tasks finish normally and inserts
            /// are still accepted. Resuming publishes a wake-up for the queue. Any
            /// name may be paused, including one with no tasks yet.
            fn queue_set_paused(params: &$crate::store::QueueSetPaused<'_>) -> ();

            /// Counts per queue and state, sorted by queue, with each queue's
            /// paused flag (a paused queue without tasks is listed too).
            fn queue_stats() -> Vec<$crate::store::QueueStats>;

            /// Record the limits a worker claims a queue with, at the
            /// store's now (the latest declaration wins); the one it
            /// replaced, if any.
            fn queue_declare(params: &$crate::store::QueueDeclare<'_>) -> Option<$crate::store::DeclaredLimits>;

            /// Every queue's declared limits, by queue.
            fn queue_limits_list() -> Vec<$crate::store::DeclaredLimits>;

            /// The load of a queue's concurrency keys (see [`QueueKeys`]).
            fn queue_keys(query: &$crate::store::QueueKeysQuery<'_>) -> $crate::store::QueueKeys;

            /// Delete terminal tasks that finished more than `older_than` ago. A
            /// schedule slot's task (a forever key and a job) leaves a tombstone
            /// ([`PrunedSlot`]) in the same transaction or script, and its key stays
            /// taken: inserting a task with that key, or advancing a job onto the
            /// slot, answers with the pruned task's id and `inserted = false`.
            fn task_prune_many(older_than: $crate::store::seam_types::Duration) -> u64;

            /// Delete those of `ids` that are finished (succeeded, failed or
            /// cancelled) at once, whatever their age, as
            /// [`Backend::task_prune_many`] deletes (a slot's task leaves its
            /// tombstone, in the same transaction or script). Pending and
            /// running tasks and unknown ids are left alone. The ids deleted.
            fn task_delete_many(ids: &[i64]) -> Vec<i64>;

            /// Record one operator action in the audit log, at the store's
            /// now (fields already cut to [`MAX_AUDIT_FIELD`]).
            fn audit_append(entry: &$crate::store::AuditAppend<'_>) -> ();

            /// A page of the audit log, newest first.
            fn audit_list(page: &$crate::store::AuditPage) -> Vec<$crate::store::AuditRecord>;

            /// Delete the audit records older than `older_than` (store time);
            /// how many.
            fn audit_prune_many(older_than: $crate::store::seam_types::Duration) -> u64;

            /// Add each row's counts to its bucket (an additive upsert:
            /// counts summed, maxima kept), in one statement or script.
            fn stats_add(rows: &[$crate::store::StatsRow]) -> ();

            /// The rollup's rows of one resolution from `since` on, by bucket.
            fn stats_read(q: &$crate::store::StatsQuery) -> Vec<$crate::store::StatsRow>;

            /// Delete each resolution's buckets older than it keeps them
            /// ([`STATS_RESOLUTIONS`], store time); how many rows.
            fn stats_prune_many() -> u64;

            /// A stream of [`Wake`]s: queues that got new pending work, due now or
            /// at a later `run_at` (enqueue, retry with backoff, hand-back, rescue,
            /// [`Backend::task_retry`]). A hint only: it may miss some, so workers poll
            /// as well. Writes of job definitions ([`Backend::jobdef_put`],
            /// [`Backend::jobdef_delete`]) are announced on it too, as a wake-up
            /// for the name `"\u{1}definitions"`, which no queue can have.
            fn wake_subscribe() -> $crate::store::seam_types::Receiver<$crate::store::Wake>;

            // ---- schedules ---------------------------------------------------------

            /// Create the job's cursor if absent, at the store's now, and record
            /// its queue when given; return its state.
            fn job_register(params: &$crate::store::JobRegister<'_>) -> $crate::store::JobState;

            /// The tombstone of a slot whose task was pruned (see [`PrunedSlot`]),
            /// by the slot's unique key (`job|RFC3339`); `None` when the slot has
            /// no tombstone (never run, or its task is still kept).
            fn slot_get(key: &str) -> Option<$crate::store::PrunedSlot>;

            /// Move the cursor and record the slot's task, atomically (see
            /// [`JobAdvance`] and docs/STORE.md).
            fn job_advance(adv: &$crate::store::JobAdvance<'_>) -> $crate::store::Advanced;

            /// Start the job's earliest slot waiting for its previous run
            /// ([`Advanced::Waiting`]) once no other run of the job is pending
            /// or running: its `run_at` becomes the store's now and its queue
            /// is woken. Decided under the job's row lock (or in one script),
            /// so two callers release it once. Answers the released task's id,
            /// `None` when nothing was released.
            fn job_release(job: &str) -> Option<i64>;

            /// Pause or resume a job cluster-wide. False if the job is unknown.
            fn job_set_paused(params: &$crate::store::JobSetPaused<'_>) -> bool;

            /// Every job's state, by name.
            fn job_list() -> Vec<$crate::store::JobState>;

            /// One job's state (a read only), `None` when the job is
            /// unknown. The scheduler reads the cursor with it before a
            /// compare-and-set that another instance may have won already.
            /// A backend without a one-row read answers with
            /// [`job_from_list`].
            fn job_get(job: &str) -> Option<$crate::store::JobState>;

            /// Create or replace a job's definition, a compare-and-set on its
            /// version ([`JobDefPut`]; docs/STORE.md "Job definitions").
            fn jobdef_put(params: &$crate::store::JobDefPut<'_>) -> $crate::store::JobDefWrite;

            /// Make a job's live definition a tombstone (version + 1).
            fn jobdef_delete(params: &$crate::store::JobDefDelete<'_>) -> $crate::store::JobDefWrite;

            /// Every definition, tombstones too, by name.
            fn jobdef_list() -> Vec<$crate::store::JobDef>;

            /// Delete the tombstones written more than `older_than` ago
            /// (store time), keeping [`Backend::jobdef_revision`] where it
            /// was; how many. A name whose tombstone is gone starts again
            /// at version 1 when re-created.
            fn jobdef_prune_many(older_than: $crate::store::seam_types::Duration) -> u64;

            /// A number that rises with every definition write (the sum of
            /// the versions; Redis: a counter): a reload reads it first.
            fn jobdef_revision() -> i64;
        }
    };
}

/// Generates [`Backend`] from [`seam_methods!`](crate::seam_methods).
macro_rules! backend_trait {
    ($($(#[$m:meta])* fn $name:ident($($arg:ident : $ty:ty),*) -> $out:ty;)*) => {
        /// One backend's operations. Implemented by `sqlite`, `postgres`, `mysql`
        /// and `redis`.
        ///
        /// Every method is atomic on its own and uses store time for every
        /// comparison. Durations are relative to the store's `now()` at the moment
        /// the operation runs.
        ///
        /// Naming (docs/STORE.md, "Naming"): entity, then verb, then `_many` for a
        /// batch (`task_claim`, `task_finish_many`, `lock_extend`, `queue_stats`,
        /// `wake_subscribe`); a call with more than one value takes one params
        /// struct named after it ([`LockExtend`], [`TaskHeartbeatMany`], …); where
        /// a batch form exists it is the only form (one item is a batch of one).
        #[async_trait]
        pub trait Backend: Send + Sync + 'static {
            /// A short name for messages: `sqlite`, `postgres`, `redis`.
            fn kind(&self) -> &'static str;

            /// Drop the pooled connections open now (each at its next acquire),
            /// so later calls connect again: called after a read-only refusal, as
            /// a connection may still be on a server that was demoted while the
            /// URL now leads to a writable one. The default does nothing (no pool,
            /// or one the application owns).
            fn pool_recycle(&self) {}

            /// Whether [`wake_subscribe`](Backend::wake_subscribe) hears work
            /// that other processes add (PostgreSQL's `LISTEN`, Redis
            /// pub/sub), so a worker's poll is only a safety net for a lost
            /// wake-up and may be slower. The default: no (an in-process
            /// channel; other processes' work is found by polling).
            fn wakes_across_processes(&self) -> bool {
                false
            }

            /// Whether [`task_finish_and_claim`](Backend::task_finish_and_claim)
            /// writes the finishes within an uncapped claim's own round trips
            /// (PostgreSQL: one statement; MySQL: the claim's two batches), so
            /// a busy worker gains by holding its results for its next claim.
            /// The default: no (it is [`finish_then_claim`], two calls).
            fn claims_carry_finishes(&self) -> bool {
                false
            }

            /// Whether a claim under a cap per concurrency key (and no other
            /// limit) grants its [`buffered`](crate::store::TaskClaim::buffered)
            /// share only where the keys it walked have places to spare (at
            /// least twice the claim's limit), so a worker may prefetch under
            /// such a cap: where places are scarce the claim takes the free
            /// slots' share only, and buffered tasks never hold places other
            /// workers' free slots could run. The default: no (a capped
            /// worker then buffers nothing).
            fn key_capped_claims_spare_places(&self) -> bool {
                false
            }
            $(
                $(#[$m])*
                async fn $name(&self, $($arg: $ty),*) -> Result<$out, StoreError>;
            )*
        }
    };
}

crate::seam_methods!(backend_trait);
