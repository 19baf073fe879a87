//! Every statement of the SQLite backend, formatted once with the table
//! names when a handle is built (not on every call).
//!
//! Parameters are numbered (`?1`, `?2`, …); each statement's comment says
//! what they are. Every "now" is [`NOW`] inside the statement.

use super::rows::CLAIM_ANSWER_COLS;
use super::{Tables, NOW, NOW_US};
use crate::store::sql_row::{JOB_COLS, QUEUE_COLS, TASK_COLS};
use crate::store::CANCEL_REQUESTED;

/// The condition under which a task's unique key is taken (its
/// `UniqueHold`: `unique_forever`, `unique_until_failed` or neither); the
/// same text as the partial unique index's `WHERE` (since schema 9), so
/// lookups use that index.
pub(super) const KEY_TAKEN: &str = "(unique_forever OR state IN ('pending', 'running') \
     OR (unique_until_failed AND state = 'succeeded'))";

/// The statements of one table prefix.
#[derive(Debug)]
pub(super) struct Sql {
    /// `?1` name, `?2` holder, `?3` at_most ms → token, locked_at, lock_until.
    pub lock_acquire: String,
    /// `?1` name → the lock row with `now`.
    pub lock_get: String,
    /// Every lock row with `now`, by name.
    pub lock_list: String,
    /// `?1` name, `?2` token, `?3` at_most ms → lock_until.
    pub lock_extend: String,
    /// `?1` name, `?2` token, `?3` at_least ms.
    pub lock_release: String,
    /// [`Sql::lock_release`] recording the release in lock history: an
    /// insert from the lock's row whose trigger ends the lease.
    pub lock_release_recorded: String,
    /// Revoke a lease (operator's force-release).
    pub lock_revoke: String,
    /// The tasks' inserts (shared with [`super::enqueue_in`]).
    pub insert: InsertSql,
    /// `?1` queue, `?2` worker, `?3` lease ms, `?4` limit, `?5` max_running,
    /// `?6` buffered. Claims nothing while the queue is paused.
    pub claim: ClaimSql,
    /// [`Sql::claim`] under a per-key cap, `?7` (`TaskClaim::per_key_max_running`),
    /// counting the queue's running tasks per key once.
    pub claim_keyed: ClaimSql,
    /// [`Sql::claim_keyed`] for a cap of at most [`KEY_PROBE_MAX`]: each
    /// walked task's key's running tasks counted by a bounded probe.
    pub claim_keyed_probe: ClaimSql,
    /// `?1` JSON `[[id, token], …]`, `?2` lease ms → id, claim_token,
    /// cancel_requested.
    pub heartbeat: String,
    /// `?1` JSON `[[id, token], …]` → (id, claim_token) of each that
    /// succeeded.
    pub succeed_many: String,
    /// [`Sql::succeed_many`] all or nothing, without a row per task: `?1`
    /// JSON `[[id, token], …]` of distinct ids; every pair's task succeeds
    /// if every pair names a running task with that claim token, else none
    /// does (0 rows changed). The count is a non-correlated subquery,
    /// evaluated once, at the first row's test, before any row is written.
    pub succeed_all: String,
    /// [`succeed_sql`] for `?1`, then one row: `done`, the JSON
    /// `[[id, token], …]` of the pairs that held ([`SUCCEEDED_PAIRS`]).
    /// Inside the caller's write transaction.
    pub succeed_answered: String,
    /// The compare-and-set UPDATEs that end an attempt: `?1` id, `?2` claim
    /// token, `?3` error text, `?4` retry delay ms → queue, state, run_at.
    pub finish: FinishSql,
    /// `?1` id, `?2` claim token, `?3` progress JSON.
    pub progress: String,
    /// `?1` the error text, `?2` the clock-step grace (ms) → queue, state
    /// of each rescued task.
    pub rescue: String,
    /// `?1` id → state.
    pub task_state: String,
    /// `?1` id, `?2` reason or NULL: a pending task cancelled now.
    pub cancel_pending: String,
    /// `?1` id: a running task asked to stop.
    pub cancel_running: String,
    /// `?1` id → queue.
    pub retry: String,
    /// `?1` id → [`TASK_COLS`].
    pub task: String,
    /// [`TASK_COLS`] from the tasks table; `tasks()` adds its conditions.
    pub tasks_select: String,
    /// `?1` queue, `?2` paused (0/1).
    pub queue_set_paused: String,
    /// The names of the paused queues.
    pub queues_paused: String,
    /// Per queue and state: count and the oldest due pending `run_at` age.
    pub stats: String,
    /// `?1` older_than ms.
    pub prune: String,
    /// `?1` cutoff (ms): the tombstones of the slot tasks [`Sql::prune`]
    /// deletes with the same cutoff.
    pub prune_tombstones: String,
    /// `?1` JSON array of ids → the finished ones deleted (their ids).
    pub delete: String,
    /// `?1` JSON array of ids: the tombstones of the slot tasks
    /// [`Sql::delete`] deletes.
    pub delete_tombstones: String,
    /// `?1` slot key → its tombstone.
    pub slot_get: String,
    /// `?1` job → name, last_slot, paused.
    pub job_register: String,
    /// `?1` job → last_slot, paused, now.
    pub job_get: String,
    /// `?1` job, `?2` slot ms.
    pub job_set_slot: String,
    /// `?1` job, `?2` batch_after ms, `?3` slot ms, `?4` the waiting
    /// `run_at` → the unfinished earlier runs (id, state, waiting).
    pub job_overlapping: String,
    /// `?1` id: a waiting slot's task made due now → queue.
    pub job_release: String,
    /// `?1` id, `?2` lease ms, `?3` worker: an inserted slot task made the
    /// caller's running run record (claim token 1).
    pub job_run: String,
    /// `?1` job, `?2` paused.
    pub job_set_paused: String,
    /// Every job row, by name.
    pub job_list: String,
    /// `?1` job → [`JOB_COLS`] of that job.
    pub job_one: String,
    /// The store's clock.
    pub now: String,
    /// The claim under a rate per concurrency key.
    pub key_rated: super::key_rate::KeyRatedSql,
}

/// The statements that end an attempt, one per [`crate::store::Finish`].
#[derive(Debug)]
pub(super) struct FinishSql {
    pub succeeded: String,
    pub failed: String,
    pub cancelled: String,
    /// A hand-back (`?4` NULL: `run_at` kept) or a snooze (`?4` its delay
    /// in ms: due that long after now).
    pub hand_back: String,
}

/// The insert, in parts: a multi-row `INSERT` is `head`, then `row` once
/// per task joined by `, `, then `tail`.
#[derive(Debug)]
pub(super) struct InsertSql {
    pub head: String,
    pub row: String,
    pub tail: String,
    /// `?1` JSON array of keys → unique_key, id of the tasks holding them.
    pub key_holders: String,
    /// `?1` JSON array of keys → unique_key, task_id of the pruned slot
    /// tasks that held them (tombstones keep a slot's key taken).
    pub tombstones: String,
    /// `?1` key → holder id, holder state, id and `started_at` of the
    /// key's last start, now (one row; `store::KeySeen`).
    pub key_seen: String,
    /// `?1` id: its unique key passes on (debounce's hand-over).
    pub key_hand_over: String,
    /// `?1` id, `?2` payload, `?3` priority, `?4` run_at (ms): a pending
    /// task debounced → id.
    pub key_replace: String,
}

impl InsertSql {
    pub(super) fn new(t: &Tables) -> InsertSql {
        let tasks = &t.tasks;
        InsertSql {
            head: format!(
                "INSERT INTO {tasks} (queue, kind, payload, state, priority, attempt, \
                 max_attempts, timeout_ms, run_at, created_at, unique_key, unique_forever, \
                 unique_until_failed, job, slot, traceparent, concurrency_key, last_error, \
                 finished_at) VALUES "
            ),
            row: format!(
                "(?, ?, ?, CASE WHEN ? IS NULL THEN 'pending' ELSE 'cancelled' END, ?, 0, ?, ?, \
                 COALESCE(?, {NOW} + ?), {NOW}, ?, ?, ?, ?, ?, ?, ?, ?, \
                 CASE WHEN ? IS NULL THEN NULL ELSE {NOW} END)"
            ),
            tail: format!(
                " ON CONFLICT DO NOTHING RETURNING id, unique_key, run_at <= {NOW} AS due, run_at"
            ),
            key_holders: format!(
                "SELECT unique_key, id FROM {tasks} \
                 WHERE unique_key IN (SELECT value FROM json_each(?1)) \
                   AND unique_key IS NOT NULL AND {KEY_TAKEN}"
            ),
            tombstones: format!(
                "SELECT unique_key, task_id FROM {} \
                 WHERE unique_key IN (SELECT value FROM json_each(?1))",
                t.slots
            ),
            key_seen: format!(
                "SELECT h.id, h.state, s.id, s.started_at, {NOW} FROM (SELECT 1) \
                 LEFT JOIN (SELECT id, state FROM {tasks} \
                     WHERE unique_key = ?1 AND {KEY_TAKEN}) h ON 1 \
                 LEFT JOIN (SELECT id, started_at FROM {tasks} \
                     WHERE unique_key = ?1 AND started_at IS NOT NULL \
                     ORDER BY started_at DESC LIMIT 1) s ON 1"
            ),
            key_hand_over: format!(
                "UPDATE {tasks} SET unique_key = NULL, unique_forever = 0, \
                 unique_until_failed = 0 WHERE id = ?1"
            ),
            key_replace: format!(
                "UPDATE {tasks} SET payload = ?2, priority = ?3, run_at = ?4 \
                 WHERE id = ?1 AND state = 'pending' RETURNING id"
            ),
        }
    }
}

/// The record a failed attempt appends to `errors` (error text in `e`):
/// its number, when it failed and started (ms), its worker.
fn attempt_record(e: &str) -> String {
    format!(
        "json_object('attempt', attempt, 'at', {NOW}, 'error', {e}, 'worker', worker, \
         'started_at', started_at)"
    )
}

impl FinishSql {
    fn new(t: &Tables) -> FinishSql {
        let tasks = &t.tasks;
        // Every transition out of `running` clears the lease.
        let cas = |set: String| {
            format!(
                "UPDATE {tasks} SET {set}, lease_until = NULL \
                 WHERE id = ?1 AND claim_token = ?2 AND state = 'running' \
                 RETURNING queue, state, run_at"
            )
        };
        // A retry whose cancellation was requested is not retried.
        let again = "?4 IS NOT NULL AND attempt < max_attempts AND NOT cancel_requested";
        let stop = "?4 IS NOT NULL AND attempt < max_attempts AND cancel_requested";
        let record = attempt_record("?3");
        FinishSql {
            succeeded: cas(format!("state = 'succeeded', finished_at = {NOW}")),
            failed: cas(format!(
                "errors = json_insert(errors, '$[#]', {record}), \
                 last_error = CASE WHEN {stop} THEN '{CANCEL_REQUESTED}: ' || ?3 \
                     ELSE ?3 END, \
                 state = CASE WHEN {again} THEN 'pending' \
                     WHEN {stop} THEN 'cancelled' ELSE 'failed' END, \
                 run_at = CASE WHEN {again} THEN {NOW} + ?4 ELSE run_at END, \
                 finished_at = CASE WHEN {again} THEN NULL ELSE {NOW} END"
            )),
            cancelled: cas(format!(
                "state = 'cancelled', last_error = ?3, finished_at = {NOW}"
            )),
            // Keep run_at: a handed-back task keeps its place in line. The
            // attempt is not counted; a requested cancel ends it.
            hand_back: cas(format!(
                "state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'pending' END, \
                 attempt = attempt - 1, \
                 run_at = CASE WHEN ?4 IS NULL OR cancel_requested THEN run_at \
                     ELSE {NOW} + ?4 END, \
                 last_error = CASE WHEN cancel_requested THEN ?3 ELSE last_error END, \
                 finished_at = CASE WHEN cancel_requested THEN {NOW} ELSE NULL END"
            )),
        }
    }
}

impl Sql {
    pub(super) fn new(t: &Tables) -> Sql {
        let Tables {
            locks,
            tasks,
            jobs,
            queues,
            slots,
            ..
        } = t;
        let lock_cols = format!("name, holder, token, locked_at, lock_until, {NOW} AS now");
        let ends = "cancel_requested OR attempt >= max_attempts";
        // The compare-and-set that ends attempts with success, for the
        // (id, claim token) pairs of the JSON array `?1`.
        let succeed = format!(
            "UPDATE {tasks} SET state = 'succeeded', finished_at = {NOW}, lease_until = NULL \
             FROM (SELECT value ->> 0 AS cid, value ->> 1 AS ctok FROM json_each(?1)) AS c \
             WHERE {tasks}.id = c.cid AND {tasks}.claim_token = c.ctok \
                 AND {tasks}.state = 'running'"
        );
        // Written by `claim`'s block, from the same conditions.
        let claim_keyed;
        let claim_keyed_probe;
        Sql {
            lock_acquire: format!(
                "INSERT INTO {locks} (name, holder, token, locked_at, lock_until) \
                 VALUES (?1, ?2, {NOW_US}, {NOW}, {NOW} + ?3) \
                 ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
                     token = MAX({locks}.token + 1, excluded.token), \
                     locked_at = excluded.locked_at, \
                     lock_until = excluded.lock_until \
                 WHERE {locks}.lock_until <= excluded.locked_at - ?4 \
                 RETURNING token, locked_at, lock_until"
            ),
            lock_get: format!("SELECT {lock_cols} FROM {locks} WHERE name = ?1"),
            lock_list: format!("SELECT {lock_cols} FROM {locks} ORDER BY name"),
            lock_extend: format!(
                "UPDATE {locks} SET lock_until = {NOW} + ?3 \
                 WHERE name = ?1 AND token = ?2 AND lock_until > {NOW} \
                 RETURNING lock_until"
            ),
            lock_revoke: format!(
                "UPDATE {locks} SET token = token + 1, holder = 'revoked:' || holder, \
                     lock_until = MIN(lock_until, {NOW} + ?3) \
                 WHERE name = ?1 AND token = ?2 AND lock_until > {NOW} \
                 RETURNING lock_until"
            ),
            lock_release: format!(
                "UPDATE {locks} SET lock_until = MAX({NOW}, locked_at + ?3) \
                 WHERE name = ?1 AND token = ?2 AND lock_until > {NOW}"
            ),
            lock_release_recorded: format!(
                "INSERT INTO {} (name, holder, token, acquired_at, released_at, release_to) \
                 SELECT name, holder, token, locked_at, {NOW}, MAX({NOW}, locked_at + ?3) \
                 FROM {locks} WHERE name = ?1 AND token = ?2 AND lock_until > {NOW}",
                t.lock_history
            ),
            insert: InsertSql::new(t),
            claim: {
                let due = format!(
                    "state = 'pending' AND queue = ?1 AND run_at <= {NOW} \
                     AND NOT cancel_requested \
                     AND NOT EXISTS (SELECT 1 FROM {queues} WHERE name = ?1 AND paused)"
                );
                // The claim's size: the limit, or under a cap what it leaves.
                let total = format!(
                    "(CASE WHEN ?5 IS NULL THEN ?4 ELSE max(0, min(?4, ?5 - ( \
                         SELECT count(*) FROM {tasks} WHERE state = 'running' AND queue = ?1))) \
                     END)"
                );
                // The first tasks in order start at once; the buffer's
                // share comes after them, among tasks with an attempt to
                // spare (`TaskClaim::buffered`), in a walk that steps
                // over at most as many as the buffer's share. The share
                // takes the walk's first rows as the walk yields them (a
                // subquery with a LIMIT keeps its ORDER BY, and its
                // co-routine yields in it): sorting them again cost a
                // temporary B-tree a claim, ~6 % of a drain (conformance
                // `claim_buffer_share_takes_the_first_in_order`;
                // docs/BENCHMARKS.md session 37).
                let now_share = format!("min({total}, max(0, ?4 - ?6))");
                claim_keyed = claim_keyed_sql(tasks, &due, &total);
                claim_keyed_probe = claim_keyed_probe_sql(tasks, &due, &total);
                claim_sql(
                    tasks,
                    &format!(
                        "now_share AS MATERIALIZED (SELECT id FROM {tasks} WHERE {due} \
                             ORDER BY priority, run_at, id LIMIT {now_share})"
                    ),
                    &format!(
                        "SELECT id FROM now_share UNION ALL \
                         SELECT id FROM (SELECT id FROM ( \
                                 SELECT id, attempt, max_attempts, priority, run_at \
                                 FROM {tasks} WHERE {due} \
                                 ORDER BY priority, run_at, id \
                                 LIMIT {total} + min(?6, ?4)) \
                             WHERE attempt + 1 < max_attempts \
                                 AND id NOT IN (SELECT id FROM now_share) \
                             LIMIT {total} - (SELECT count(*) FROM now_share))"
                    ),
                )
            },
            claim_keyed,
            claim_keyed_probe,
            heartbeat: format!(
                "UPDATE {tasks} SET lease_until = {NOW} + ?2 \
                 FROM (SELECT value ->> 0 AS cid, value ->> 1 AS ctok FROM json_each(?1)) AS c \
                 WHERE {tasks}.id = c.cid AND {tasks}.claim_token = c.ctok \
                     AND {tasks}.state = 'running' \
                 RETURNING {tasks}.id, {tasks}.claim_token, {tasks}.cancel_requested"
            ),
            succeed_many: format!("{succeed} RETURNING {tasks}.id, {tasks}.claim_token"),
            succeed_all: format!(
                "{succeed} AND (SELECT count(*) FROM {tasks} AS t, json_each(?1) AS c \
                     WHERE t.id = c.value ->> 0 AND t.claim_token = c.value ->> 1 \
                         AND t.state = 'running') = json_array_length(?1)"
            ),
            succeed_answered: format!(
                "{}; SELECT {SUCCEEDED_PAIRS} AS done",
                succeed_sql(tasks, "?1")
            ),
            finish: FinishSql::new(t),
            progress: format!(
                "UPDATE {tasks} SET progress = ?3 \
                 WHERE id = ?1 AND claim_token = ?2 AND state = 'running'"
            ),
            rescue: format!(
                "UPDATE {tasks} SET \
                     state = CASE WHEN cancel_requested THEN 'cancelled' \
                                  WHEN attempt >= max_attempts THEN 'failed' \
                                  ELSE 'pending' END, \
                     finished_at = CASE WHEN {ends} THEN {NOW} ELSE NULL END, \
                     errors = json_insert(errors, '$[#]', {}), \
                     last_error = ?1, \
                     lease_until = NULL \
                 WHERE state = 'running' AND lease_until < {NOW} - ?2 \
                 RETURNING queue, state",
                attempt_record("?1")
            ),
            task_state: format!("SELECT state FROM {tasks} WHERE id = ?1"),
            cancel_pending: format!(
                "UPDATE {tasks} SET state = 'cancelled', finished_at = {NOW}, \
                 last_error = coalesce(?2, last_error) WHERE id = ?1"
            ),
            cancel_running: format!("UPDATE {tasks} SET cancel_requested = 1 WHERE id = ?1"),
            retry: format!(
                "UPDATE {tasks} SET state = 'pending', run_at = {NOW}, finished_at = NULL, \
                     cancel_requested = 0, max_attempts = MAX(max_attempts, attempt + 1) \
                 WHERE id = ?1 AND state IN ('failed', 'cancelled') \
                 RETURNING queue"
            ),
            task: format!("SELECT {TASK_COLS} FROM {tasks} WHERE id = ?1"),
            tasks_select: format!("SELECT {TASK_COLS} FROM {tasks}"),
            queue_set_paused: format!(
                "INSERT INTO {queues} (name, paused, pause_note, pause_by, pause_at) \
                 VALUES (?1, ?2, ?3, ?4, {NOW}) \
                 ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, \
                     pause_note = excluded.pause_note, pause_by = excluded.pause_by, \
                     pause_at = excluded.pause_at"
            ),
            queues_paused: format!(
                "SELECT {QUEUE_COLS} FROM {queues} WHERE paused OR pause_at IS NOT NULL \
                 ORDER BY name"
            ),
            stats: format!(
                "WITH n(now) AS (SELECT {NOW}) \
                 SELECT queue, state, COUNT(*) AS count, \
                     n.now - MIN(CASE WHEN state = 'pending' AND run_at <= n.now \
                         THEN run_at END) AS oldest \
                 FROM {tasks}, n GROUP BY queue, state ORDER BY queue"
            ),
            prune: format!("DELETE FROM {tasks} WHERE {FINISHED} AND finished_at < ?1"),
            prune_tombstones: tombstones(tasks, slots, "finished_at < ?1"),
            delete: format!(
                "DELETE FROM {tasks} WHERE {FINISHED} AND id IN (SELECT value FROM json_each(?1)) \
                 RETURNING id"
            ),
            delete_tombstones: tombstones(tasks, slots, "id IN (SELECT value FROM json_each(?1))"),
            slot_get: format!(
                "SELECT unique_key, job, slot, task_id, state, last_error, finished_at \
                 FROM {slots} WHERE unique_key = ?1"
            ),
            // The no-op DO UPDATE makes RETURNING answer for an existing row
            // too.
            job_register: format!(
                "INSERT INTO {jobs} (name, last_slot, paused, queue, overlap, fingerprint) \
                 VALUES (?1, {NOW}, 0, ?2, ?3, ?4) \
                 ON CONFLICT (name) DO UPDATE SET queue = COALESCE(?2, {jobs}.queue), \
                     overlap = COALESCE(?3, {jobs}.overlap), \
                     fingerprint = COALESCE(?4, {jobs}.fingerprint) \
                 RETURNING {JOB_COLS}"
            ),
            job_get: format!("SELECT last_slot, paused, {NOW} AS now FROM {jobs} WHERE name = ?1"),
            job_set_slot: format!("UPDATE {jobs} SET last_slot = ?2 WHERE name = ?1"),
            job_overlapping: format!(
                "SELECT id, state, run_at >= ?4 AS waiting FROM {tasks} \
                 WHERE job = ?1 AND state IN ('pending', 'running') \
                 AND (?2 IS NULL OR slot IS NULL OR slot <= ?2) AND created_at < ?3 \
                 ORDER BY id LIMIT 100"
            ),
            job_release: format!(
                "UPDATE {tasks} SET run_at = {NOW} WHERE id = ?1 AND state = 'pending' \
                 RETURNING queue"
            ),
            job_run: format!(
                "UPDATE {tasks} SET state = 'running', attempt = 1, started_at = {NOW}, \
                 lease_until = {NOW} + ?2, worker = ?3, claim_token = 1 WHERE id = ?1"
            ),
            job_set_paused: format!(
                "UPDATE {jobs} SET paused = ?2, pause_note = ?3, pause_by = ?4, \
                 pause_at = {NOW} WHERE name = ?1"
            ),
            job_list: format!("SELECT {JOB_COLS} FROM {jobs} ORDER BY name"),
            job_one: format!("SELECT {JOB_COLS} FROM {jobs} WHERE name = ?1"),
            now: format!("SELECT {NOW}"),
            key_rated: super::key_rate::KeyRatedSql::new(t),
        }
    }
}

/// The claim under a per-key cap (`?7`): the claim's rule of
/// `TaskClaim::per_key_max_running`, in the claim's one write
/// transaction ([`claim_sql`]: racing claimers cannot overshoot). `due` is the claimable condition and `total` the claim's
/// size (the limit, or under `max_running` what it leaves), as in
/// [`Sql::claim`].
///
/// The keys already at the cap are left out by the walk itself (so a long
/// backlog of one saturated key is stepped over, not taken as the walk's
/// rows); among the walked rows, the `n`-th of a key in claim order is
/// taken only while `n` plus the key's running tasks stays within the cap.
/// The walk takes the claim's bound and three times the free slots' share
/// more, so keys with one place left do not fill it on their own
/// (`TaskClaim::key_limited_walk`). The buffer's share (`?6`) is granted
/// only when the walked keys have places to spare, at least twice the
/// limit (`room`, as PostgreSQL's capped claim counts it;
/// `Backend::key_capped_claims_spare_places`).
fn claim_keyed_sql(tasks: &str, due: &str, total: &str) -> ClaimSql {
    let walk = format!(
        "run AS MATERIALIZED ( \
             SELECT concurrency_key AS k, count(*) AS r FROM {tasks} \
             WHERE state = 'running' AND queue = ?1 AND concurrency_key IS NOT NULL \
             GROUP BY concurrency_key), \
         walk AS MATERIALIZED ( \
             SELECT w.*, coalesce(run.r, 0) AS rn, \
                 row_number() OVER (PARTITION BY concurrency_key \
                     ORDER BY priority, run_at, id) AS kn \
             FROM (SELECT id, attempt, max_attempts, priority, run_at, concurrency_key \
                 FROM {tasks} WHERE {due} \
                     AND (concurrency_key IS NULL OR concurrency_key NOT IN \
                         (SELECT k FROM run WHERE r >= ?7)) \
                 ORDER BY priority, run_at, id \
                 LIMIT {total} + min(?6, ?4) + 3 * max(0, {total} - ?6)) AS w \
             LEFT JOIN run ON run.k = w.concurrency_key)"
    );
    claim_walked_sql(tasks, total, &walk)
}

/// The largest per-key cap [`Sql::claim_keyed_probe`] serves: its probe
/// of a walked task's key steps over the key's running tasks (at most
/// the cap), so a walk of ~550 rows costs at most ~4,400 index steps; a
/// larger cap is better served by counting the running set once
/// ([`Sql::claim_keyed`]: 10 keys at cap 1000 fell from 41k to 23k jobs/s
/// with the probe).
pub(super) const KEY_PROBE_MAX: u32 = 8;

/// [`claim_keyed_sql`]'s rule with each walked task's key's running tasks
/// counted where the walk meets it: a probe of `tasks_key_running`, which
/// steps over the key's running tasks, at most the cap unless the cap was
/// lowered under them (bounding the count with a `LIMIT` subquery cost
/// more than it saved). For small caps: counting the queue's whole
/// running set by key and joining it cost ~2 ms a claim behind 2,000
/// running tasks (10,000 keys at cap 1, docs/BENCHMARKS.md session 33),
/// ten times the walk; with a large cap and few keys the probe would
/// step over each key's many running tasks for every walked row.
fn claim_keyed_probe_sql(tasks: &str, due: &str, total: &str) -> ClaimSql {
    let running = format!(
        "(SELECT count(*) FROM {tasks} AS r WHERE r.state = 'running' AND r.queue = ?1 \
             AND r.concurrency_key = w.concurrency_key)"
    );
    let walk = format!(
        "walk AS MATERIALIZED ( \
             SELECT id, attempt, max_attempts, priority, run_at, concurrency_key, rn, \
                 row_number() OVER (PARTITION BY concurrency_key \
                     ORDER BY priority, run_at, id) AS kn \
             FROM (SELECT id, attempt, max_attempts, priority, run_at, concurrency_key, \
                     CASE WHEN concurrency_key IS NULL THEN 0 ELSE {running} END AS rn \
                 FROM {tasks} AS w WHERE {due} \
                     AND (concurrency_key IS NULL OR {running} < ?7) \
                 ORDER BY priority, run_at, id \
                 LIMIT {total} + min(?6, ?4) + 3 * max(0, {total} - ?6)))"
    );
    claim_walked_sql(tasks, total, &walk)
}

/// The claim under a per-key cap (`?7`) after `walk`, CTEs ending in
/// `walk`: the walked due tasks in claim order, each with its key's
/// running tasks (`rn`) and its place among its key's walked tasks
/// (`kn`). A task is taken while `kn + rn` stays within the cap; the
/// buffer's share only where the walked keys have places to spare
/// (`room`).
fn claim_walked_sql(tasks: &str, total: &str, walk: &str) -> ClaimSql {
    claim_sql(
        tasks,
        &format!(
            "{walk}, \
             ok AS MATERIALIZED ( \
                 SELECT id, attempt, max_attempts, priority, run_at, \
                     row_number() OVER (ORDER BY priority, run_at, id) AS n \
                 FROM walk WHERE concurrency_key IS NULL OR kn + rn <= ?7), \
             room AS ( \
                 SELECT (SELECT count(*) FROM walk WHERE concurrency_key IS NULL) \
                     + coalesce((SELECT sum(max(0, ?7 - rn)) \
                         FROM (SELECT DISTINCT concurrency_key, rn FROM walk \
                               WHERE concurrency_key IS NOT NULL)), 0) AS places)"
        ),
        &format!(
            "SELECT id FROM ok \
             WHERE n <= max(0, ?4 - ?6) OR attempt + 1 < max_attempts \
             ORDER BY priority, run_at, id \
             LIMIT min({total}, CASE WHEN (SELECT places FROM room) >= 2 * ?4 THEN ?4 \
                 ELSE max(0, ?4 - ?6) END)"
        ),
    )
}

/// A claim's statements, from `with` (CTEs) and `ids` (the SELECT of the
/// ids it claims, which may use them), answering in one row
/// ([`CLAIM_ANSWER_COLS`]) rather than a row per task: each row is a
/// hand-off from SQLite's thread to the caller's, and an `UPDATE …
/// RETURNING` holds the write lock until its last row is taken. The picked
/// ids go through a temporary table of the connection's own
/// (`temp.baton_claimed`, emptied first); SQLite has no `UPDATE` inside a
/// `WITH`, and `RETURNING` takes no aggregate. Run them inside one write
/// transaction: [`ClaimSql::alone`] is its own, [`ClaimSql::within`]
/// joins the caller's.
fn claim_sql(tasks: &str, with: &str, ids: &str) -> ClaimSql {
    let pick = format!(
        "{CLAIMED_RESET}; \
         WITH {with} INSERT OR IGNORE INTO temp.baton_claimed (id) {ids}; \
         {}",
        claim_update(tasks)
    );
    let answer = |more: &str| claim_answer(tasks, more);
    let within = format!("{pick}; {}", answer(""));
    let succeed = succeed_sql(tasks, "?8");
    ClaimSql {
        alone: format!("BEGIN IMMEDIATE; {within}; COMMIT"),
        after_successes: format!(
            "BEGIN IMMEDIATE; {succeed}; {pick}; {}; COMMIT",
            answer(&format!(", {SUCCEEDED_PAIRS} AS done"))
        ),
        within,
    }
}

/// Spare arguments after a claim's own (see [`spare_params`]).
const SKIPPED_PARAMS: usize = 16;

/// `q` with spare NULL arguments after its own, for a query of several
/// statements ([`claim_sql`]). sqlx binds a numbered parameter by its
/// number, but an index a statement skips (`?4` used, `?2` not) to the
/// next argument in turn, counted across the statements of one query,
/// and stops binding that statement at the first it has no argument for,
/// leaving its later numbered parameters NULL. The spare NULLs take those
/// turns (a claim's statements skip at most 10).
pub(super) fn spare_params<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    for _ in 0..SKIPPED_PARAMS {
        q = q.bind(None::<i64>);
    }
    q
}

/// Creates the connection's temporary table of a claim's picked ids
/// ([`claim_sql`]) if need be, and empties it.
pub(super) const CLAIMED_RESET: &str =
    "CREATE TEMP TABLE IF NOT EXISTS baton_claimed (id INTEGER PRIMARY KEY); \
     DELETE FROM temp.baton_claimed";

/// Claims the tasks picked into `temp.baton_claimed` for worker `?2`
/// with a lease of `?3` ms: new attempt, fencing token and lease.
pub(super) fn claim_update(tasks: &str) -> String {
    claim_update_at(tasks, NOW)
}

/// [`claim_update`] with `started_at` (ms) the SQL expression `started`.
pub(super) fn claim_update_at(tasks: &str, started: &str) -> String {
    format!(
        "UPDATE {tasks} SET state = 'running', attempt = attempt + 1, \
             started_at = {started}, lease_until = {NOW} + ?3, worker = ?2, \
             claim_token = MAX(claim_token + 1, {NOW_US}) \
         WHERE id IN (SELECT id FROM temp.baton_claimed)"
    )
}

/// The one row answering a claim ([`CLAIM_ANSWER_COLS`], then `more`).
pub(super) fn claim_answer(tasks: &str, more: &str) -> String {
    format!(
        "SELECT {CLAIM_ANSWER_COLS}{more} FROM {tasks} \
         WHERE id IN (SELECT id FROM temp.baton_claimed)"
    )
}

/// The compare-and-set that ends attempts with success, for the
/// (id, claim token) pairs of the JSON array `list` (a parameter), each
/// task at most once: the pairs that hold go into the connection's
/// `temp.baton_done` (emptied first), so an answer can tell each apart
/// ([`SUCCEEDED_PAIRS`]).
pub(super) fn succeed_sql(tasks: &str, list: &str) -> String {
    format!(
        "CREATE TEMP TABLE IF NOT EXISTS baton_done \
             (id INTEGER PRIMARY KEY, token INTEGER NOT NULL); \
         DELETE FROM temp.baton_done; \
         INSERT OR IGNORE INTO temp.baton_done (id, token) \
             SELECT t.id, t.claim_token FROM json_each({list}) AS c, {tasks} AS t \
             WHERE t.id = c.value ->> 0 AND t.claim_token = c.value ->> 1 \
                 AND t.state = 'running'; \
         UPDATE {tasks} SET state = 'succeeded', finished_at = {NOW}, lease_until = NULL \
         WHERE id IN (SELECT id FROM temp.baton_done)"
    )
}

/// The JSON `[[id, token], …]` of the pairs [`succeed_sql`] ended.
pub(super) const SUCCEEDED_PAIRS: &str =
    "(SELECT json_group_array(json_array(id, token)) FROM temp.baton_done)";

/// A claim's statements ([`claim_sql`]).
#[derive(Debug)]
pub(super) struct ClaimSql {
    /// In a write transaction of their own (`BEGIN IMMEDIATE` … `COMMIT`),
    /// for a connection outside any.
    pub alone: String,
    /// Inside the caller's write transaction.
    pub within: String,
    /// [`ClaimSql::alone`] after ending attempts with success in the same
    /// transaction (one write lock and one commit for both): `?8` JSON
    /// `[[id, token], …]`, each task at most once; the answer's `done`
    /// column is the JSON `[[id, token], …]` of those that held.
    pub after_successes: String,
}

/// A finished task (the tasks [`Sql::prune`] and [`Sql::delete`] may take).
const FINISHED: &str = "state IN ('succeeded', 'failed', 'cancelled')";

/// The tombstones of the finished slot tasks of `tasks` matching `pred`,
/// into `slots` (before they are deleted, in the same transaction).
fn tombstones(tasks: &str, slots: &str, pred: &str) -> String {
    format!(
        "INSERT OR IGNORE INTO {slots} \
             (unique_key, job, slot, task_id, state, last_error, finished_at) \
         SELECT unique_key, job, slot, id, state, substr(last_error, 1, 1000), finished_at \
         FROM {tasks} WHERE {FINISHED} AND {pred} \
             AND unique_forever AND unique_key IS NOT NULL AND job IS NOT NULL"
    )
}
