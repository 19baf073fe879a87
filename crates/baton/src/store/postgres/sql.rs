//! Every statement of the PostgreSQL backend, formatted once with the
//! table names when the backend is built (not on every call).
//!
//! Parameters are `$1`, `$2`, …; each statement's comment says what they
//! are. Durations travel as milliseconds (`$n * interval '1 millisecond'`).

use std::sync::OnceLock;

use super::finish_sql::{self, FinishParts};
use super::Names;
use crate::store::sql_row::{CLAIM_COLS, JOB_COLS, QUEUE_COLS, TASK_COLS};

/// The partial-index predicate under which a unique key is taken (its
/// `UniqueHold`: `unique_forever`, `unique_until_failed` or neither; the
/// index's since schema 10).
pub(super) const UNIQUE_PRED: &str = "unique_key IS NOT NULL AND (unique_forever \
     OR state IN ('pending', 'running') OR (unique_until_failed AND state = 'succeeded'))";

/// A wake-up's due time for a row's `run_at` (see [`crate::store::Wake`]):
/// microseconds since the epoch, rounded up so a timer armed for it never
/// fires before the row is due.
pub(super) const WAKE_AT: &str = "ceil(extract(epoch FROM run_at) * 1000000)::int8";

/// The statements of one table prefix.
#[derive(Debug)]
pub(super) struct Sql {
    /// `$1` name, `$2` holder, `$3` at_most ms → granted + the lock row.
    pub lock_acquire: String,
    /// `$1` name, `$2` token, `$3` at_most ms → lock_until.
    pub lock_extend: String,
    /// `$1` name, `$2` token, `$3` at_least ms (committed asynchronously).
    pub lock_release: String,
    /// `lock_release` recording the release in the lock history, in the
    /// same statement (`StoreOptions::lock_history`).
    pub lock_release_recorded: String,
    /// Revoke a lease (operator's force-release).
    pub lock_revoke: String,
    /// `$1` name → the lock row.
    pub lock_get: String,
    /// Every lock row, by name.
    pub lock_list: String,
    /// The store's clock (`Backend::now`).
    pub now: String,
    /// The inserts of tasks (shared with [`super::enqueue_in`]).
    pub insert: InsertSql,
    /// The uncapped claim statements by limit bucket (see
    /// [`Sql::claim`]), for limits up to `1 << i`. Capped claims are one
    /// call of a function (`capped.rs`).
    claims: Vec<String>,
    /// The finishes a combined statement runs beside a claim
    /// ([`Sql::finish_claim`]): every kind, then successes only, their
    /// parameters from `$6`.
    finish_parts: [FinishParts; 2],
    /// The combined statements, built on first use, by limit bucket and
    /// finish (as `finish_parts`).
    finish_claims: Vec<[OnceLock<String>; 2]>,
    /// The claims answering in one row of arrays ([`Sql::claim_packed`]),
    /// built on first use, by limit bucket.
    packed_claims: Vec<OnceLock<String>>,
    /// The claim under a rate per key carrying a batch's finishes
    /// ([`Sql::finish_key_claim`]): every kind, then successes only.
    finish_key_claims: [String; 2],
    /// The capped claim and a finish ([`Sql::finish_capped_claim`]):
    /// every kind, then successes only.
    finish_capped_claims: [String; 2],
    /// `$1` ids, `$2` tokens, `$3` lease ms → id, claim_token,
    /// cancel_requested.
    pub heartbeat: String,
    /// Every kind of finish in one statement: `$1` ids, `$2` tokens,
    /// `$3` kinds (see [`FinishKind`]), `$4` texts (a failure's error or a
    /// cancel's reason), `$5` delays ms (a failure's retry, a
    /// snooze's, or NULL),
    /// `$6` channel, `$7` the reason a requested cancel ends a hand-back
    /// → (id, claim_token) of the attempts it finished. A success deletes
    /// the task instead when the backend does not keep succeeded tasks
    /// (see [`Sql::new`]).
    pub finish_many: String,
    /// A batch of successes only: `$1` ids, `$2` tokens → (id,
    /// claim_token) of the attempts it finished; the same compare-and-set
    /// and end state as [`finish_many`](Self::finish_many)'s `s` rows,
    /// without its other kinds' work (see [`finish_succeeded_sql`](finish_sql::finish_succeeded_sql)).
    pub finish_succeeded: String,
    /// `$1` id, `$2` token, `$3` progress.
    pub progress: String,
    /// `$1` error text, `$2` channel → requeued, failed, cancelled.
    pub rescue: String,
    /// `$1` id → state, row locked.
    pub task_state: String,
    /// `$1` id, `$2` reason or NULL.
    pub cancel_pending: String,
    /// `$1` id.
    pub cancel_running: String,
    /// `$1` id, `$2` channel.
    pub retry: String,
    /// `$1` id → [`TASK_COLS`].
    pub task: String,
    /// The task columns, for a search to add its `WHERE` and page to.
    pub tasks: String,
    /// Per queue: counts per state and the oldest due pending age.
    pub stats: String,
    /// `$1` queue, `$2` paused, `$3` channel: set the flag; a resume
    /// announces the queue (sent at commit).
    pub queue_set_paused: String,
    /// The names of the paused queues.
    pub queues_paused: String,
    /// `$1` older_than ms.
    pub prune: String,
    /// `$1` ids → the ids deleted (the finished ones).
    pub delete: String,
    /// `$1` slot key → its tombstone.
    pub slot_get: String,
    /// `$1` job, `$2` queue (or null) → the job row, created if new, its
    /// queue recorded when given.
    pub job_insert: String,
    /// `$1` job, `$2` expected → last_slot, paused, matches, now; locked.
    pub job_lock: String,
    /// `$1` job, `$2` slot.
    pub job_set_slot: String,
    /// `$1` job, `$2` batch_after, `$3` slot, `$4` the waiting `run_at` →
    /// the unfinished earlier runs (id, state, waiting).
    pub job_overlapping: String,
    /// `$1` id, `$2` channel: a waiting slot's task made due now, its queue
    /// notified.
    pub job_release: String,
    /// `$1` id, `$2` lease ms, `$3` worker: the caller's run record.
    pub job_run: String,
    /// `$1` job, `$2` paused.
    pub job_set_paused: String,
    /// Every job row, by name.
    pub job_list: String,
    /// `$1` job: its row.
    pub job_get: String,
    /// The schema version in the meta table.
    pub schema_version: String,
}

/// The two inserts of tasks: with and without `ON CONFLICT` on the unique
/// key (speculative insertion costs, so chunks without keys use the plain
/// one), and the look-up of the tasks holding keys.
#[derive(Debug)]
pub(super) struct InsertSql {
    pub keyed: String,
    pub plain: String,
    /// `$1` keys → unique_key, id.
    pub key_holders: String,
    /// `$1` keys → unique_key, task_id of the pruned slot tasks that held
    /// them (their tombstones keep the keys taken).
    pub tombstones: String,
    /// `$1` ids → deleted (an insert taken back).
    pub delete_ids: String,
    /// `$1` key → holder id, holder state (its row locked), id and
    /// `started_at` (ms) of the key's last start, now (ms); one row
    /// (`store::KeySeen`).
    pub key_seen: String,
    /// `$1` id: its unique key passes on (debounce's hand-over).
    pub key_hand_over: String,
    /// `$1` id, `$2` payload, `$3` priority, `$4` run_at (ms), `$5` the
    /// wake-up channel: a pending task debounced, its new due time
    /// announced → one row when it was pending.
    pub key_replace: String,
    /// Whether the statements are prepared once per connection (false
    /// behind a transaction pooler: each is sent unnamed).
    pub persistent: bool,
}

impl InsertSql {
    pub(super) fn new(n: &Names) -> InsertSql {
        InsertSql {
            keyed: insert_sql(n, true),
            plain: insert_sql(n, false),
            persistent: true,
            key_holders: format!(
                "SELECT unique_key, id FROM {} WHERE unique_key = ANY($1) AND {UNIQUE_PRED}",
                n.tasks
            ),
            tombstones: format!(
                "SELECT unique_key, task_id FROM {} WHERE unique_key = ANY($1)",
                n.slots
            ),
            delete_ids: format!("DELETE FROM {} WHERE id = ANY($1)", n.tasks),
            key_seen: format!(
                "SELECT h.id, h.state, s.id, \
                     floor(extract(epoch FROM s.started_at) * 1000)::int8, \
                     floor(extract(epoch FROM {now}) * 1000)::int8 \
                 FROM (SELECT 1) AS o \
                 LEFT JOIN LATERAL (SELECT id, state FROM {t} \
                     WHERE unique_key = $1 AND {UNIQUE_PRED} FOR UPDATE) AS h ON true \
                 LEFT JOIN LATERAL (SELECT id, started_at FROM {t} \
                     WHERE unique_key = $1 AND started_at IS NOT NULL \
                     ORDER BY started_at DESC LIMIT 1) AS s ON true",
                t = n.tasks,
                now = n.now
            ),
            key_hand_over: format!(
                "UPDATE {} SET unique_key = NULL, unique_forever = false, \
                 unique_until_failed = false WHERE id = $1",
                n.tasks
            ),
            key_replace: format!(
                "WITH u AS (UPDATE {} SET payload = $2, priority = $3, \
                     run_at = timestamptz 'epoch' + $4 * interval '1 millisecond' \
                     WHERE id = $1 AND state = 'pending' RETURNING queue, run_at) \
                 SELECT pg_notify($5, u.queue || chr(10) || {WAKE_AT}) FROM u",
                n.tasks
            ),
        }
    }
}

/// The SQL fragment that appends `{attempt, at, error, worker,
/// started_at}` (error text in `$e`) to `errors`, with the times as RFC
/// 3339 UTC.
pub(super) fn append_error(now: &str, e: &str) -> String {
    let rfc3339 =
        |t: &str| format!("to_char({t} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')");
    format!(
        "errors || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', {}, \
         'error', {e}, 'worker', worker, 'started_at', {}))",
        rfc3339(now),
        rfc3339("started_at")
    )
}

impl Sql {
    /// The statements of one prefix; `keep_succeeded: false` makes a
    /// success delete the task (see [`crate::StoreOptions::keep_succeeded`]).
    pub(super) fn new(n: &Names, keep_succeeded: bool) -> Sql {
        let (l, t, j, q) = (&n.locks, &n.tasks, &n.jobs, &n.queues);
        let (now, now_us) = (&n.now, &n.now_us);
        // The lock columns with `now` (see [`crate::store::sql_row::lock_info`]).
        let lock_cols = format!("name, holder, token, locked_at, lock_until, {now} AS now");
        let gone = "(cancel_requested OR attempt >= max_attempts)";
        Sql {
            // A live lease in the statement's snapshot answers Busy with a
            // pure read. Otherwise the grant is an UPDATE of a row we could
            // lock without waiting (`FOR UPDATE SKIP LOCKED`, rechecked on
            // the latest version under that lock: that is what makes it
            // exclusive), or the `INSERT … ON CONFLICT DO NOTHING` of a new
            // name. Contenders never queue behind each other's row locks.
            lock_acquire: format!(
                "WITH cur AS ( \
                     SELECT name, holder, token, locked_at, lock_until FROM {l} WHERE name = $1), \
                 up AS ( \
                     UPDATE {l} AS l SET holder = $2, token = greatest(l.token + 1, {now_us}), \
                         locked_at = {now}, \
                         lock_until = {now} + $3 * interval '1 millisecond' \
                     WHERE l.name = $1 AND l.name IN ( \
                         SELECT name FROM {l} WHERE name = $1 AND lock_until <= {now} \
                         FOR UPDATE SKIP LOCKED) \
                     RETURNING name, holder, token, locked_at, lock_until), \
                 ins AS ( \
                     INSERT INTO {l} (name, holder, token, locked_at, lock_until) \
                     SELECT $1, $2, {now_us}, {now}, {now} + $3 * interval '1 millisecond' \
                     WHERE NOT EXISTS (SELECT 1 FROM cur) \
                     ON CONFLICT (name) DO NOTHING \
                     RETURNING name, holder, token, locked_at, lock_until), \
                 g AS (SELECT * FROM up UNION ALL SELECT * FROM ins) \
                 SELECT true AS granted, name, holder, token, locked_at, lock_until, \
                     {now} AS now FROM g \
                 UNION ALL \
                 SELECT false, name, holder, token, locked_at, lock_until, {now} \
                     FROM cur WHERE NOT EXISTS (SELECT 1 FROM g)"
            ),
            lock_extend: format!(
                "UPDATE {l} SET lock_until = {now} + $3 * interval '1 millisecond' \
                 WHERE name = $1 AND token = $2 AND lock_until > {now} RETURNING lock_until"
            ),
            // Committed with `synchronous_commit = off` for this one
            // transaction: see `lock_release` for why that is safe.
            // The release records itself in the lock history in the same
            // statement (the insert's row count is the release's).
            lock_release: format!(
                "UPDATE {l} AS l \
                 SET lock_until = greatest({now}, l.locked_at + $3 * interval '1 millisecond') \
                 FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit \
                 WHERE l.name = $1 AND l.token = $2 AND l.lock_until > {now}"
            ),
            lock_release_recorded: format!(
                "WITH r AS ( \
                     UPDATE {l} AS l \
                     SET lock_until = greatest({now}, l.locked_at + $3 * interval '1 millisecond') \
                     FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit \
                     WHERE l.name = $1 AND l.token = $2 AND l.lock_until > {now} \
                     RETURNING l.name, l.holder, l.token, l.locked_at) \
                 INSERT INTO {h} (name, holder, token, acquired_at, released_at) \
                 SELECT name, holder, token, locked_at, {now} FROM r",
                h = n.lock_history
            ),
            lock_revoke: format!(
                "UPDATE {l} SET token = token + 1, holder = 'revoked:' || holder, \
                     lock_until = least(lock_until, {now} + $3 * interval '1 millisecond') \
                 WHERE name = $1 AND token = $2 AND lock_until > {now} RETURNING lock_until"
            ),
            lock_get: format!("SELECT {lock_cols} FROM {l} WHERE name = $1"),
            lock_list: format!("SELECT {lock_cols} FROM {l} ORDER BY name"),
            now: format!("SELECT {now}"),
            insert: InsertSql::new(n),
            claims: (0..=u32::BITS).map(|i| claim_sql(n, 1u64 << i)).collect(),
            finish_parts: [false, true]
                .map(|ok| finish_sql::finish_parts(t, now, keep_succeeded, CLAIM_PARAMS, ok)),
            finish_claims: (0..=u32::BITS).map(|_| Default::default()).collect(),
            finish_key_claims: [false, true].map(|ok| {
                let base = super::key_rate::KEY_CLAIM_PARAMS;
                let fin = finish_sql::finish_parts(t, now, keep_succeeded, base, ok);
                super::key_rate::finish_claim_keys_sql(n, &fin)
            }),
            finish_capped_claims: [false, true].map(|ok| {
                let base = super::capped::CAPPED_PARAMS;
                let fin = finish_sql::finish_parts(t, now, keep_succeeded, base, ok);
                super::capped::finish_claim_capped_sql(n, &fin)
            }),
            packed_claims: (0..=u32::BITS).map(|_| Default::default()).collect(),
            heartbeat: format!(
                "UPDATE {t} AS t SET lease_until = {now} + $3 * interval '1 millisecond' \
                 FROM (SELECT DISTINCT id, token \
                       FROM UNNEST($1::int8[], $2::int8[]) AS u(id, token)) AS c \
                 WHERE t.id = c.id AND t.claim_token = c.token AND t.state = 'running' \
                 RETURNING t.id, t.claim_token, t.cancel_requested"
            ),
            finish_many: finish_sql::finish_many_sql(t, now, keep_succeeded),
            finish_succeeded: finish_sql::finish_succeeded_sql(t, now, keep_succeeded),
            progress: format!(
                "UPDATE {t} SET progress = $3 \
                 WHERE id = $1 AND claim_token = $2 AND state = 'running'"
            ),
            rescue: format!(
                "WITH r AS ( \
                     UPDATE {t} SET \
                         state = CASE WHEN cancel_requested THEN 'cancelled' \
                                      WHEN attempt >= max_attempts THEN 'failed' \
                                      ELSE 'pending' END, \
                         finished_at = CASE WHEN {gone} THEN {now} END, \
                         lease_until = NULL, \
                         last_error = $1, \
                         errors = {errs} \
                     WHERE state = 'running' AND lease_until < {now} \
                     RETURNING state, queue), \
                 n AS (SELECT pg_notify($2, q.queue) FROM (SELECT DISTINCT queue FROM r \
                       WHERE state = 'pending') AS q) \
                 SELECT count(*) FILTER (WHERE state = 'pending') AS requeued, \
                        count(*) FILTER (WHERE state = 'failed') AS failed, \
                        count(*) FILTER (WHERE state = 'cancelled') AS cancelled, \
                        (SELECT count(*) FROM n) AS notified \
                 FROM r",
                errs = append_error(now, "$1::text")
            ),
            task_state: format!("SELECT state FROM {t} WHERE id = $1 FOR UPDATE"),
            cancel_pending: format!(
                "UPDATE {t} SET state = 'cancelled', finished_at = {now}, lease_until = NULL, \
                 last_error = coalesce($2, last_error) WHERE id = $1"
            ),
            cancel_running: format!("UPDATE {t} SET cancel_requested = true WHERE id = $1"),
            retry: format!(
                "WITH u AS (UPDATE {t} SET state = 'pending', run_at = {now}, \
                     finished_at = NULL, lease_until = NULL, cancel_requested = false, \
                     max_attempts = greatest(max_attempts, attempt + 1) \
                 WHERE id = $1 AND state IN ('failed', 'cancelled') RETURNING id, queue) \
                 SELECT id FROM u, LATERAL (SELECT pg_notify($2, u.queue)) AS n"
            ),
            task: format!("SELECT {TASK_COLS} FROM {t} WHERE id = $1"),
            tasks: format!("SELECT {TASK_COLS} FROM {t}"),
            stats: format!(
                "SELECT queue, \
                     count(*) FILTER (WHERE state = 'pending') AS pending, \
                     count(*) FILTER (WHERE state = 'running') AS running, \
                     count(*) FILTER (WHERE state = 'succeeded') AS succeeded, \
                     count(*) FILTER (WHERE state = 'failed') AS failed, \
                     count(*) FILTER (WHERE state = 'cancelled') AS cancelled, \
                     floor(extract(epoch FROM {now} - min(run_at) \
                         FILTER (WHERE state = 'pending' AND run_at <= {now})) * 1000)::int8 \
                         AS oldest_ms \
                 FROM {t} GROUP BY queue ORDER BY queue"
            ),
            queue_set_paused: format!(
                "WITH u AS (INSERT INTO {q} (name, paused, pause_note, pause_by, pause_at) \
                     VALUES ($1, $2, $4, $5, {now}) \
                     ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, \
                         pause_note = excluded.pause_note, pause_by = excluded.pause_by, \
                         pause_at = excluded.pause_at \
                     RETURNING name, paused) \
                 SELECT name FROM u LEFT JOIN LATERAL \
                     (SELECT pg_notify($3, u.name) WHERE NOT u.paused) AS n ON true"
            ),
            queues_paused: format!(
                "SELECT {QUEUE_COLS} FROM {q} WHERE paused OR pause_at IS NOT NULL ORDER BY name"
            ),
            // The slot tasks deleted leave their tombstones in the same
            // statement.
            prune: forget(
                t,
                &n.slots,
                &format!("finished_at < {now} - $1 * interval '1 millisecond'"),
                "count(*)",
            ),
            delete: forget(t, &n.slots, "id = ANY($1)", "id"),
            slot_get: format!(
                "SELECT unique_key, job, slot, task_id, state, last_error, finished_at \
                 FROM {} WHERE unique_key = $1",
                n.slots
            ),
            job_insert: format!(
                "INSERT INTO {j} (name, last_slot, paused, queue, overlap, fingerprint) \
                 VALUES ($1, {now}, false, $2, $3, $4) \
                 ON CONFLICT (name) DO UPDATE SET queue = COALESCE($2, {j}.queue), \
                     overlap = COALESCE($3, {j}.overlap), \
                     fingerprint = COALESCE($4, {j}.fingerprint) \
                 RETURNING {JOB_COLS}"
            ),
            job_lock: format!(
                "SELECT last_slot, paused, last_slot IS NOT DISTINCT FROM $2 AS matches, \
                 {now} AS now FROM {j} WHERE name = $1 FOR UPDATE"
            ),
            job_set_slot: format!("UPDATE {j} SET last_slot = $2 WHERE name = $1"),
            job_overlapping: format!(
                "SELECT id, state::text AS state, run_at >= $4 AS waiting FROM {t} WHERE job = $1 \
                 AND state IN ('pending', 'running') \
                 AND ($2::timestamptz IS NULL OR slot IS NULL OR slot <= $2) \
                 AND created_at < $3 ORDER BY id LIMIT 100"
            ),
            job_release: format!(
                "WITH u AS (UPDATE {t} SET run_at = {now} WHERE id = $1 AND state = 'pending' \
                 RETURNING queue) SELECT pg_notify($2, u.queue) FROM u"
            ),
            job_run: format!(
                "UPDATE {t} SET state = 'running', attempt = 1, started_at = {now}, \
                 lease_until = {now} + $2 * interval '1 millisecond', worker = $3, \
                 claim_token = 1 WHERE id = $1"
            ),
            job_set_paused: format!(
                "UPDATE {j} SET paused = $2, pause_note = $3, pause_by = $4, pause_at = {now} \
                 WHERE name = $1"
            ),
            job_list: format!("SELECT {JOB_COLS} FROM {j} ORDER BY name"),
            job_get: format!("SELECT {JOB_COLS} FROM {j} WHERE name = $1"),
            schema_version: format!("SELECT value FROM {} WHERE key = 'schema_version'", n.meta),
        }
    }

    /// The uncapped claim statement: `$1` queue, `$2` worker, `$3` lease
    /// ms, `$4` the limit, `$5` `buffered` (`TaskClaim::buffered`).
    ///
    /// `walk` is how many rows the locking walk may pull: the limit, plus
    /// as many more as a buffer share may step over. The text depends on it
    /// only through its bucket (the next power of two), so a connection
    /// prepares at most a few dozen claim statements and reuses them. The
    /// bucket is a literal `LIMIT` on the index walk: with a `$n` there, a
    /// generic plan assumes it fetches 10% of the table and can prefer a
    /// sequential scan plus sort. The exact limit `$4` is applied above
    /// the row locks, which are taken as rows are pulled, so no more rows
    /// are locked than `$4` and those the buffer's share stepped over.
    pub(super) fn claim(&self, walk: u32) -> &str {
        &self.claims[self.bucket(walk)]
    }

    /// The uncapped claim ([`Sql::claim`], `$1`–`$5`) answering in one
    /// row of arrays ([`PACKED_CLAIM`]).
    pub(super) fn claim_packed(&self, walk: u32) -> &str {
        let i = self.bucket(walk);
        self.packed_claims[i].get_or_init(|| {
            format!(
                "WITH cl AS ({}) SELECT {PACKED_CLAIM} FROM cl",
                self.claims[i]
            )
        })
    }

    /// The uncapped claim ([`Sql::claim`], `$1`–`$5`)
    /// and a finish of a batch (`$6` on: every kind as
    /// [`Sql::finish_many`] binds them from `$1`, or with `succeeded`
    /// the ids and tokens of a batch of successes) in one statement; see
    /// [`finish_claim_sql`].
    pub(super) fn finish_claim(&self, walk: u32, succeeded: bool) -> &str {
        let i = self.bucket(walk);
        let k = usize::from(succeeded);
        self.finish_claims[i][k]
            .get_or_init(|| finish_claim_sql(&self.claims[i], &self.finish_parts[k]))
    }

    /// The claim under a rate per key (`$1`–`$14`, as
    /// `key_rate::claim_keys` binds them) and a finish of a batch (`$15`
    /// on: every kind as [`Sql::finish_many`] binds them from `$1`, or
    /// with `succeeded` the ids and tokens of a batch of successes) in one
    /// statement; see `key_rate::finish_claim_keys_sql`.
    pub(super) fn finish_key_claim(&self, succeeded: bool) -> &str {
        &self.finish_key_claims[usize::from(succeeded)]
    }

    /// The capped claim (`$1`–`$9`, as `capped::claim_capped` binds them)
    /// and a finish of a batch (`$10` on, as [`Sql::finish_key_claim`]'s)
    /// in one statement; see `capped::finish_claim_capped_sql`.
    pub(super) fn finish_capped_claim(&self, succeeded: bool) -> &str {
        &self.finish_capped_claims[usize::from(succeeded)]
    }

    /// The limit bucket of a walk: bucket i serves limits up to 2^i; the
    /// last (2^32) anything above 2^31.
    fn bucket(&self, walk: u32) -> usize {
        let i = walk
            .max(1)
            .checked_next_power_of_two()
            .map_or(u32::BITS, u32::trailing_zeros) as usize;
        i.min(self.claims.len() - 1)
    }
}

/// How many parameters the uncapped claim takes (`$1`–`$5`).
const CLAIM_PARAMS: usize = 5;

/// The uncapped claim `claim` and the finish `fin` in one statement (one
/// round trip, one commit). The finish's rows are `running` rows this
/// worker holds and the claim takes `pending` ones, so the two never touch
/// one row; the claim does not see the finish (one snapshot), so a
/// finished task is not counted out nor claimed again by it, which an
/// uncapped claim does not need. One row: the claimed tasks' columns as
/// arrays ([`PACKED_CLAIM`], read by `rows::packed_tasks`), then the
/// finished attempts' ids and claim tokens (`done_ids`, `done_tokens`).
/// One row of arrays instead of a row per task: the client reads each
/// column's type once, and no row framing or column lookup per task
/// (the largest share of a worker's CPU per task, measured).
fn finish_claim_sql(claim: &str, fin: &FinishParts) -> String {
    format!(
        "WITH {}, cl AS ({claim}), f AS ({}) \
         SELECT c.*, d.* FROM (SELECT {PACKED_CLAIM} FROM cl) AS c, \
           (SELECT array_agg(id) AS done_ids, array_agg(token) AS done_tokens FROM f) AS d",
        fin.ctes, fin.answer
    )
}

/// The claimed rows' [`CLAIM_COLS`] as one array each, in one order (every
/// aggregate of one query level sees the rows in the same order); `queue`
/// is left out (the claim's own). NULL arrays when nothing was claimed.
pub(super) const PACKED_CLAIM: &str = "array_agg(id) AS ids, array_agg(kind) AS kinds, \
     array_agg(payload::text) AS payloads, array_agg(priority) AS priorities, \
     array_agg(attempt) AS attempts, array_agg(claim_token) AS tokens, \
     array_agg(max_attempts) AS max_attempts, array_agg(timeout_ms) AS timeouts, \
     array_agg(run_at) AS run_ats, array_agg(lease_until) AS lease_untils, \
     array_agg(job) AS jobs, array_agg(slot) AS slots, array_agg(traceparent) AS traceparents";

/// The uncapped claim statement of one limit bucket ([`Sql::claim`]).
fn claim_sql(n: &Names, bucket: u64) -> String {
    let args = ClaimArgs {
        queue: "$1",
        worker: "$2",
        lease_ms: "$3",
        limit: "$4",
        buffered: "$5",
        walk: &bucket.to_string(),
        now: &n.now,
        now_us: &n.now_us,
    };
    claim_stmt(n, &args, "$4")
}

/// How a claim statement spells its inputs: a prepared statement's
/// placeholders ([`Sql::claim`]) or a claim function's parameters
/// (`capped.rs`).
pub(super) struct ClaimArgs<'a> {
    /// The queue.
    pub(super) queue: &'a str,
    /// The worker's name.
    pub(super) worker: &'a str,
    /// The lease in ms.
    pub(super) lease_ms: &'a str,
    /// `TaskClaim::limit`.
    pub(super) limit: &'a str,
    /// `TaskClaim::buffered`.
    pub(super) buffered: &'a str,
    /// How many rows the locking walk may pull.
    pub(super) walk: &'a str,
    /// The store's clock.
    pub(super) now: &'a str,
    /// The store's clock in µs.
    pub(super) now_us: &'a str,
}

/// A claim of at most `take` tasks (an expression). The rows are numbered
/// as the locking walk yields them: the first `limit - buffered` start at
/// once, the later ones only with an attempt to spare. Rows stepped over
/// stay locked (unchanged) until the commit. The picked rows are updated
/// where the walk locked them, by their tuple ids (`ctid = ANY(ARRAY(…))`,
/// a TID scan): a row this statement locked cannot move before it ends,
/// and no index is searched again (by `id = ANY(…)` each picked row was a
/// descent of the primary key, on the pages every claim and finish is
/// inserting into; as `id IN (…)` a custom plan could hash the picked ids
/// and scan the whole table). A row the walk locked in a version newer
/// than the statement's snapshot (changed and pending again since the
/// statement began) is not seen by the TID scan: it stays pending,
/// unclaimed, and is unlocked at the commit.
pub(super) fn claim_stmt(n: &Names, a: &ClaimArgs<'_>, take: &str) -> String {
    let (t, q) = (&n.tasks, &n.queues);
    let ClaimArgs {
        queue,
        limit,
        buffered,
        walk,
        now,
        ..
    } = a;
    format!(
        "UPDATE {t} {} \
         WHERE ctid = ANY(ARRAY( \
             SELECT ctid FROM ( \
                 SELECT ctid, attempt + 1 < max_attempts AS spare, \
                     row_number() OVER () AS n \
                 FROM ( \
                     SELECT ctid, attempt, max_attempts FROM {t} \
                     WHERE state = 'pending' AND queue = {queue} AND run_at <= {now} \
                         AND NOT cancel_requested \
                         AND NOT EXISTS (SELECT 1 FROM {q} WHERE name = {queue} AND paused) \
                     ORDER BY priority, run_at, id \
                     LIMIT {walk} FOR UPDATE SKIP LOCKED) AS c) AS d \
             WHERE spare OR n <= {limit} - {buffered} \
             LIMIT {take})) \
         RETURNING {CLAIM_COLS}",
        claim_set(a)
    )
}

/// The `SET` of every claim statement: running, an attempt counted,
/// started and leased now, held by the worker, a new claim token (at least
/// the store's clock in µs, above the task's last).
pub(super) fn claim_set(a: &ClaimArgs<'_>) -> String {
    let ClaimArgs {
        worker,
        lease_ms,
        now,
        now_us,
        ..
    } = a;
    format!(
        "SET state = 'running', attempt = attempt + 1, started_at = {now}, \
             lease_until = {now} + {lease_ms} * interval '1 millisecond', worker = {worker}, \
             claim_token = greatest(claim_token + 1, {now_us})"
    )
}

/// The chunked insert: ids are drawn from the sequence in input order inside
/// a materialized CTE, so each result row maps back to its input by
/// ordinality whether it was inserted or met a unique key. The same
/// statement announces new pending work with `pg_notify` (sent at commit, so
/// inside a caller's transaction it waits for that commit): per queue once
/// for rows due now, and once with the earliest `run_at` of rows due later.
fn insert_sql(n: &Names, keyed: bool) -> String {
    let (tasks, seq) = (&n.tasks, &n.seq_lit);
    let now = &n.now;
    // `created_at` is the column's default, `now()`, except on the test
    // clock (a default cannot read its offset).
    let (created_col, created_val) = if cfg!(feature = "test-clock") {
        (", created_at", format!(", {now}"))
    } else {
        ("", String::new())
    };
    let on_conflict = if keyed {
        format!("ON CONFLICT (unique_key) WHERE {UNIQUE_PRED} DO NOTHING")
    } else {
        String::new()
    };
    format!(
        r#"WITH input AS MATERIALIZED (
    SELECT nextval({seq}) AS id, t.*
    FROM UNNEST($1::text[], $2::text[], $3::jsonb[], $4::int4[], $5::timestamptz[],
                $6::int8[], $7::int4[], $8::int8[], $9::text[], $10::bool[], $11::bool[],
                $12::text[], $13::timestamptz[], $14::text[], $15::text[])
         WITH ORDINALITY AS t(queue, kind, payload, priority, run_at_abs, delay_ms,
                              max_attempts, timeout_ms, unique_key, unique_forever,
                              unique_until_failed, job, slot, traceparent,
                              concurrency_key, ord)
),
ins AS (
    INSERT INTO {tasks} (id, queue, kind, payload, state, priority, run_at, max_attempts,
                         timeout_ms, unique_key, unique_forever, unique_until_failed, job,
                         slot, traceparent, concurrency_key, last_error, finished_at{created_col})
    SELECT id, queue, kind, payload,
           CASE WHEN $16::bool THEN 'cancelled' ELSE 'pending' END,
           priority,
           coalesce(run_at_abs, {now} + coalesce(delay_ms, 0) * interval '1 millisecond'),
           max_attempts, timeout_ms, unique_key, unique_forever, unique_until_failed, job,
           slot, traceparent, concurrency_key,
           CASE WHEN $16::bool THEN $17::text END,
           CASE WHEN $16::bool THEN {now} END{created_val}
    FROM input
    ORDER BY ord
    {on_conflict}
    RETURNING id, queue, state = 'pending' AS pending, run_at,
              (state = 'pending' AND run_at <= {now}) AS due
),
woke AS (
    SELECT count(pg_notify($18::text, q.msg)) AS n
    FROM (SELECT queue AS msg FROM ins WHERE due GROUP BY queue
          UNION ALL
          SELECT queue || chr(10) || {WAKE_AT}
          FROM (SELECT queue, min(run_at) AS run_at FROM ins
                WHERE pending AND NOT due GROUP BY queue) AS f) AS q
)
SELECT input.id, ins.id IS NOT NULL AS inserted
FROM input LEFT JOIN ins ON ins.id = input.id CROSS JOIN woke
ORDER BY input.ord"#
    )
}

/// Delete the finished tasks of `{t}` matching `pred`, the slot tasks among
/// them leaving their tombstones in `slots` in the same statement, and
/// select `answer` over the deleted rows (`d`).
fn forget(t: &str, slots: &str, pred: &str, answer: &str) -> String {
    format!(
        "WITH d AS (DELETE FROM {t} WHERE state IN ('succeeded', 'failed', 'cancelled') \
             AND {pred} \
             RETURNING id, state, unique_key, unique_forever, job, slot, last_error, \
                 finished_at), \
         k AS (INSERT INTO {slots} \
             (unique_key, job, slot, task_id, state, last_error, finished_at) \
             SELECT unique_key, job, slot, id, state, left(last_error, 1000), finished_at \
             FROM d WHERE unique_forever AND unique_key IS NOT NULL AND job IS NOT NULL \
             ON CONFLICT (unique_key) DO NOTHING) \
         SELECT {answer} FROM d"
    )
}
