//! The capped claim of the PostgreSQL backend (`TaskClaim::max_running`
//! and/or `per_key_max_running`, not fair), made by one statement: a call
//! of the PL/pgSQL function `<prefix>capped_claim` the schema step 21 → 22
//! creates ([`function_sql`]).
//!
//! Inside the function, in the caller's transaction (a claim of its own
//! runs in the statement's implicit one): the queue's advisory lock (the
//! one fair and rated-per-key claimers take, so capped claimers take
//! turns), then one claim statement that counts the queue's running
//! tasks (per key under a per-key cap) and claims within the caps. A
//! volatile function's every statement reads a fresh snapshot, so the
//! statement run after the lock counts every claim that committed before
//! it. The lock is held for the server's time only: the claim was
//! `BEGIN`, the lock, the statement, `COMMIT` (4 round trips, 3 of them
//! under the lock), and is one call now.

use super::finish::FinishArgs;
use super::finish_sql::FinishParts;
use super::sql::{claim_stmt, ClaimArgs, PACKED_CLAIM};
use super::{Names, PgBackend};
use crate::error::StoreError;
use crate::store::sql_row::CLAIM_COLS;
use crate::store::{Claim, Finish, Task, TaskClaim};

/// How many parameters the capped claim's call takes (`$1`–`$9`, as
/// [`PgBackend::claim_capped`] binds them); a finish beside it takes the
/// ones after.
pub(super) const CAPPED_PARAMS: usize = 9;

/// The capped claim function's quoted name.
pub(super) fn function_name(n: &Names) -> String {
    format!("\"{}capped_claim\"", n.prefix)
}

/// `CREATE OR REPLACE FUNCTION <prefix>capped_claim(…)`: the capped claim
/// in one call. Arguments: the queue, the worker, the lease in ms, the
/// limit, `max_running` (NULL: none), the per-key cap (NULL: none),
/// `buffered`, the locking walk's length, the advisory lock's text key (hashed
/// as every claimer of the queue hashes it), and the store's clock (the
/// caller's `now`, so the test clock is honoured). Returns the claimed
/// rows ([`RETURNS`], the fair claim's).
pub(super) fn function_sql(n: &Names) -> String {
    let f = function_name(n);
    let now_us = "floor(extract(epoch FROM p_now) * 1000000)::bigint";
    let args = ClaimArgs {
        queue: "p_queue",
        worker: "p_worker",
        lease_ms: "p_lease_ms",
        limit: "p_limit",
        buffered: "p_buffered",
        walk: "p_walk",
        now: "p_now",
        now_us,
    };
    let t = &n.tasks;
    let queue_capped = claim_stmt(
        n,
        &args,
        &format!(
            "greatest(0, least(p_limit, p_max_running - \
                 (SELECT count(*) FROM {t} WHERE state = 'running' AND queue = p_queue)))"
        ),
    );
    let key_capped = keyed(n, now_us);
    format!(
        r#"CREATE OR REPLACE FUNCTION {f}(p_queue text, p_worker text, p_lease_ms int8,
    p_limit int8, p_max_running int8, p_per_key int8, p_buffered int8, p_walk int8,
    p_lock text, p_now timestamptz)
RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_lock, 0));
    IF p_per_key IS NULL THEN
        RETURN QUERY WITH u AS ({queue_capped}) SELECT * FROM u;
    ELSE
        RETURN QUERY WITH u AS ({key_capped}) SELECT * FROM u;
    END IF;
END
$fn$;"#
    )
}

/// The claim under a cap per concurrency key (`p_per_key`), run under the
/// queue's advisory lock, so the running tasks it counts are every
/// claim's that committed before it. The keys already at the cap are
/// left out of the locking walk (a saturated key's backlog is stepped
/// over by the index walk, never locked); among the walked rows the
/// `n`-th of a key in claim order is taken only while `n` plus the key's
/// running tasks stays within the cap. The running tasks are counted from
/// the `tasks_running` index (the queue's running set, bounded by the
/// workers' slots). `p_max_running` is the queue's cap or NULL.
///
/// The buffer's share (`p_buffered`, tasks the worker holds unstarted for
/// at most `store::BUFFER_HOLD`) is granted only when the walked keys have
/// places to spare, at least twice `p_limit` (`room`: each distinct walked
/// key's cap less its running tasks, a task of no key one place): where
/// places are scarce a buffered task would hold one that another worker's
/// free slot could run, so the claim takes the free slots' share only
/// (`Backend::key_capped_claims_spare_places`).
fn keyed(n: &Names, now_us: &str) -> String {
    let (t, q) = (&n.tasks, &n.queues);
    format!(
        "WITH run AS MATERIALIZED ( \
             SELECT concurrency_key AS k, count(*) AS r FROM {t} \
             WHERE state = 'running' AND queue = p_queue AND concurrency_key IS NOT NULL \
             GROUP BY concurrency_key), \
         walk AS ( \
             SELECT id, attempt, max_attempts, priority, run_at, concurrency_key FROM {t} \
             WHERE state = 'pending' AND queue = p_queue AND run_at <= p_now \
                 AND NOT cancel_requested \
                 AND NOT EXISTS (SELECT 1 FROM {q} WHERE name = p_queue AND paused) \
                 AND (concurrency_key IS NULL \
                     OR concurrency_key NOT IN (SELECT k FROM run WHERE r >= p_per_key)) \
             ORDER BY priority, run_at, id \
             LIMIT p_walk FOR UPDATE SKIP LOCKED), \
         ok AS ( \
             SELECT w.id, w.attempt + 1 < w.max_attempts AS spare, \
                 row_number() OVER (ORDER BY w.priority, w.run_at, w.id) AS n \
             FROM (SELECT walk.*, row_number() OVER (PARTITION BY concurrency_key \
                       ORDER BY priority, run_at, id) AS kn FROM walk) AS w \
                 LEFT JOIN run ON run.k = w.concurrency_key \
             WHERE w.concurrency_key IS NULL OR w.kn + coalesce(run.r, 0) <= p_per_key), \
         room AS ( \
             SELECT (SELECT count(*) FROM walk WHERE concurrency_key IS NULL) \
                 + coalesce((SELECT sum(greatest(0, p_per_key - coalesce(run.r, 0))) \
                     FROM (SELECT DISTINCT concurrency_key AS k FROM walk \
                           WHERE concurrency_key IS NOT NULL) AS d \
                     LEFT JOIN run ON run.k = d.k), 0) AS places) \
         UPDATE {t} SET state = 'running', attempt = attempt + 1, \
             started_at = p_now, \
             lease_until = p_now + p_lease_ms * interval '1 millisecond', worker = p_worker, \
             claim_token = greatest(claim_token + 1, {now_us}) \
         WHERE id = ANY(ARRAY( \
             SELECT id FROM ok WHERE spare OR n <= p_limit - p_buffered ORDER BY n \
             LIMIT greatest(0, least( \
                 CASE WHEN (SELECT places FROM room) >= 2 * p_limit THEN p_limit \
                     ELSE p_limit - p_buffered END, \
                 CASE WHEN p_max_running IS NULL THEN p_limit ELSE p_max_running - \
                     (SELECT count(*) FROM {t} WHERE state = 'running' AND queue = p_queue) \
                 END)))) \
         RETURNING {CLAIM_COLS}"
    )
}

/// The capped claim and a batch's finishes `fin` (its parameters after
/// [`CAPPED_PARAMS`]) in one statement: one round trip and one commit for
/// both, where they were two of each. The finishes run first: the
/// function takes, as its walk's length, `$8` plus nothing times the
/// number finished, so it is called after them, and a volatile function's
/// statements see their statement's earlier writes, so the caps count the
/// finished tasks as no longer running (conformance
/// `finish_and_claim_is_per_item_compare_and_set`). One row: the claimed
/// tasks as arrays ([`PACKED_CLAIM`]), then the finished attempts' ids and
/// tokens (`done_ids`, `done_tokens`), even when nothing was claimed.
pub(super) fn finish_claim_capped_sql(n: &Names, fin: &FinishParts) -> String {
    format!(
        "{} SELECT c.*, fd.done_ids, fd.done_tokens FROM fd, \
             LATERAL (SELECT {PACKED_CLAIM} FROM {}($1, $2, $3, $4, $5, $6, $7, \
                 $8 + 0 * fd.done_n, $9, {}) AS f({})) AS c",
        fin.counted(),
        function_name(n),
        n.now,
        super::fair::RETURNS
    )
}

impl PgBackend {
    /// [`claim_capped`](Self::claim_capped) carrying `finish` (each the
    /// compare-and-set `task_finish_many` makes, answered per item), in one
    /// statement ([`finish_claim_capped_sql`]), outside a transaction.
    pub(super) async fn finish_and_claim_capped(
        &self,
        finish: &[(Claim, Finish)],
        req: &TaskClaim<'_>,
    ) -> Result<(Vec<bool>, Vec<Task>), StoreError> {
        let args = FinishArgs::new(finish);
        let query = self
            .claim_call(self.sql.finish_capped_claim(args.succeeded), req)
            .bind(i64::from(capped_walk(req)))
            .bind(self.lock_key(req.queue));
        let rows = self.claim_with_finish(query, &args, finish).await?;
        let row = rows.first().ok_or_else(|| {
            StoreError::Corrupt("the capped claim with finishes answered no row".into())
        })?;
        let mut tasks = super::rows::packed_tasks(row, req.queue)?;
        super::backend::claim_order(&mut tasks);
        Ok((args.answered(row)?, tasks))
    }

    /// A capped claim on `conn` (in a transaction or not): one call of the
    /// capped claim function, which takes the queue's advisory lock itself.
    pub(super) async fn claim_capped<'c, E>(
        &self,
        conn: E,
        req: &TaskClaim<'_>,
    ) -> Result<Vec<Task>, StoreError>
    where
        E: sqlx::Executor<'c, Database = sqlx::Postgres>,
    {
        let sql = self.claim_function_call(&function_name(&self.names), CAPPED_PARAMS);
        let sent = tokio::time::Instant::now();
        let rows = self
            .claim_call(&sql, req)
            .bind(i64::from(capped_walk(req)))
            .bind(self.lock_key(req.queue))
            .fetch_all(conn)
            .await?;
        self.claim_took(sent.elapsed());
        super::backend::claimed(&rows)
    }
}

/// How far a capped claim walks: under a cap per key the
/// [key-limited walk](TaskClaim::key_limited_walk), else the plain one.
fn capped_walk(req: &TaskClaim<'_>) -> u32 {
    match req.per_key_max_running {
        Some(_) => req.key_limited_walk(),
        None => req.plain_walk(),
    }
}
