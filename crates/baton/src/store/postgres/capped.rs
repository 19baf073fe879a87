//! The capped claim of the PostgreSQL backend (`TaskClaim::max_running`
//! and/or `per_key_max_running`, not fair), made by one statement: a call
//! of the PL/pgSQL function `<prefix>capped_claim` the schema step 21 → 22
//! creates ([`function_sql`]).
//!
//! Inside the function, in the caller's transaction (a claim of its own
//! runs in the statement's implicit one), one of two turns
//! ([`function_sql`]): the queue's advisory lock, exclusive (the one fair
//! and rated-per-key claimers take), then one claim statement that counts
//! the queue's running tasks (per key under a per-key cap) and claims
//! within the caps; or, under a per-key cap alone while many keys run,
//! the queue's lock shared and each planned key's own lock. A volatile
//! function's every statement reads a fresh snapshot, so a statement run
//! after the locks counts every claim that committed before it. The locks
//! are held for the server's time only: the claim was `BEGIN`, the lock,
//! the statement, `COMMIT` (4 round trips, 3 of them under the lock), and
//! is one call now.

use super::finish::FinishArgs;
use super::finish_sql::FinishParts;
use super::sql::{claim_set, claim_stmt, ClaimArgs, PACKED_CLAIM};
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
///
/// Two ways, by what the claim must count:
///
/// - *the queue's turn*: the queue's advisory lock, exclusive, then one
///   statement that counts and claims: claimers take turns. Every claim
///   under `max_running`, and a claim under a per-key cap alone while the
///   queue runs tasks of fewer than [`BY_KEY_FROM`] keys.
/// - *the keys' turns*: a claim under a per-key cap alone while the queue
///   runs tasks of [`BY_KEY_FROM`] keys or more needs to count only the
///   running tasks of the keys it starts. It takes the queue's lock
///   *shared* (claims of this kind run at once; a fair, `max_running` or
///   key rated claim, which takes it exclusive, waits for them and they
///   for it), then [`key_planned`]'s plan, then the planned keys' own
///   locks (the ones a rated claim takes per key), then [`key_rechecked`]'s
///   claim. Every claim that starts a key's tasks holds that key's lock
///   from before it counts the key's running tasks to its commit, or holds
///   the queue's lock exclusive, so the claims of one key take turns and
///   each counts the tasks of the ones before; claims of other keys do not
///   wait. Over few keys every claim would want every key's lock, so they
///   would take turns anyway, on plans made before their turn (10 keys:
///   15–24 % slower than the queue's turn, docs/BENCHMARKS.md session 34).
///
/// The keys' turns plan without nested loops (`enable_nestloop` off for
/// their statements, then put back): their plans are generic after a few
/// calls, made while the running set and the walk were estimated at a row
/// each, and joined the walk to the running set as a nested loop
/// rescanning it for every walked row (96 rows against 216 running:
/// 10.5 ms of a 19 ms claim; hashed, well under one).
pub(super) fn function_sql(n: &Names) -> String {
    let f = function_name(n);
    let t = &n.tasks;
    let queue_capped = claim_stmt(
        n,
        &ARGS,
        &format!(
            "greatest(0, least(p_limit, p_max_running - \
                 (SELECT count(*) FROM {t} WHERE state = 'running' AND queue = p_queue)))"
        ),
    );
    let key_capped = keyed(n);
    let planned = key_planned(n);
    let rechecked = key_rechecked(n);
    format!(
        r#"CREATE OR REPLACE FUNCTION {f}(p_queue text, p_worker text, p_lease_ms int8,
    p_limit int8, p_max_running int8, p_per_key int8, p_buffered int8, p_walk int8,
    p_lock text, p_now timestamptz)
RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_ids int8[];
    v_keys text[];
    v_nestloop text;
    v_by_key boolean := false;
BEGIN
    -- The keys' turns, or (over few keys) the queue's, below.
    IF p_per_key IS NOT NULL AND p_max_running IS NULL THEN
        v_by_key := (SELECT count(DISTINCT concurrency_key) FROM {t}
                     WHERE state = 'running' AND queue = p_queue) >= {BY_KEY_FROM};
    END IF;
    IF v_by_key THEN
        v_nestloop := current_setting('enable_nestloop');
        PERFORM set_config('enable_nestloop', 'off', true);
        PERFORM pg_advisory_xact_lock_shared(hashtextextended(p_lock, 0));
        {planned}
        -- The planned keys' locks, held to the commit, in the locks'
        -- order (as every claimer takes them, so no two wait in a circle).
        PERFORM pg_advisory_xact_lock(o.h)
            FROM (SELECT DISTINCT hashtextextended(p_lock || chr(31) || u.k, 0) AS h
                  FROM unnest(v_keys) AS u(k) ORDER BY 1) AS o;
        RETURN QUERY WITH u AS ({rechecked}) SELECT * FROM u;
        PERFORM set_config('enable_nestloop', v_nestloop, true);
        RETURN;
    END IF;
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

/// How many distinct keys the queue's running tasks must have for a claim
/// under a per-key cap alone to take the keys' turns rather than the
/// queue's ([`function_sql`]).
const BY_KEY_FROM: i64 = 32;

/// The function's parameters as its claim statements spell them.
const ARGS: ClaimArgs<'static> = ClaimArgs {
    queue: "p_queue",
    worker: "p_worker",
    lease_ms: "p_lease_ms",
    limit: "p_limit",
    buffered: "p_buffered",
    walk: "p_walk",
    now: "p_now",
    now_us: "floor(extract(epoch FROM p_now) * 1000000)::bigint",
};

/// The walk and choice of a claim under a cap per concurrency key, before
/// its `SELECT` or `UPDATE` of the chosen: the running tasks per key
/// (`run`, from the `tasks_running` index: the queue's running set,
/// bounded by the workers' slots); the locking walk (`walk`), which
/// leaves out the keys already at the cap (a saturated key's backlog is
/// stepped over by the index walk, never locked); the walked rows a key's
/// cap leaves room for (`ok`: the `n`-th of a key in claim order while `n`
/// plus the key's running tasks stays within the cap); and the places the
/// walked keys have (`room`). Then [`key_take`] picks from `ok`.
fn keyed_walk(n: &Names) -> String {
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
                     LEFT JOIN run ON run.k = d.k), 0) AS places) "
    )
}

/// The ids [`keyed_walk`]'s claim takes from `ok`, in claim order: the free
/// slots' share, and the buffer's share (`p_buffered`, tasks the worker
/// holds unstarted for at most `store::BUFFER_HOLD`) only when the walked
/// keys have places to spare, at least twice `p_limit` (`room`: each
/// distinct walked key's cap less its running tasks, a task of no key one
/// place): where places are scarce a buffered task would hold one that
/// another worker's free slot could run, so the claim takes the free
/// slots' share only (`Backend::key_capped_claims_spare_places`). At most
/// `max_room` (an expression: the places `max_running` leaves).
fn key_take(max_room: &str) -> String {
    format!(
        "SELECT id FROM ok WHERE spare OR n <= p_limit - p_buffered ORDER BY n \
         LIMIT greatest(0, least( \
             CASE WHEN (SELECT places FROM room) >= 2 * p_limit THEN p_limit \
                 ELSE p_limit - p_buffered END, \
             {max_room}))"
    )
}

/// The claim under a cap per concurrency key and `max_running`
/// (`p_max_running`, or NULL: a per-key cap alone over fewer than
/// [`BY_KEY_FROM`] running keys), run under the queue's exclusive advisory lock, so the
/// running tasks it counts are every claim's that committed before it:
/// [`keyed_walk`], then the update of [`key_take`]'s ids.
fn keyed(n: &Names) -> String {
    let t = &n.tasks;
    format!(
        "{} UPDATE {t} {} WHERE id = ANY(ARRAY({})) RETURNING {CLAIM_COLS}",
        keyed_walk(n),
        claim_set(&ARGS),
        key_take(&format!(
            "CASE WHEN p_max_running IS NULL THEN p_limit ELSE p_max_running - \
                 (SELECT count(*) FROM {t} WHERE state = 'running' AND queue = p_queue) END"
        ))
    )
}

/// The plan of a claim under a cap per key alone, under the queue's
/// shared lock: [`keyed_walk`] and [`key_take`] as [`keyed`] runs them,
/// their ids into `v_ids` (locked by the walk, claimed by no one else
/// meanwhile) and their distinct keys into `v_keys`, claiming nothing.
/// The counts it planned by may be stale by the time it holds the keys'
/// locks (a claim of the same key committed since): [`key_rechecked`]
/// counts again.
fn key_planned(n: &Names) -> String {
    format!(
        "{}, pick AS ({}) \
         SELECT coalesce(array_agg(walk.id), '{{}}'), \
             coalesce(array_agg(DISTINCT walk.concurrency_key) \
                 FILTER (WHERE walk.concurrency_key IS NOT NULL), '{{}}') \
         INTO v_ids, v_keys FROM pick JOIN walk ON walk.id = pick.id;",
        keyed_walk(n),
        key_take("p_limit")
    )
}

/// The claim of a plan ([`key_planned`]'s `v_ids`, their keys `v_keys`)
/// once the keys' locks are held: the statement's snapshot, taken after
/// them, counts every claim of these keys that committed before, and the
/// `n`-th planned task of a key in claim order is claimed only while `n`
/// plus the key's running tasks stays within the cap (a plan made on
/// stale counts comes back short, never over). The keys' running tasks
/// from the queue's running set, matched by a hash of the planned keys
/// (`= ANY` would compare each running task with every key).
fn key_rechecked(n: &Names) -> String {
    let t = &n.tasks;
    format!(
        "WITH run AS MATERIALIZED ( \
             SELECT concurrency_key AS k, count(*) AS r FROM {t} \
             WHERE state = 'running' AND queue = p_queue \
                 AND concurrency_key IN (SELECT u.k FROM unnest(v_keys) AS u(k)) \
             GROUP BY concurrency_key), \
         p AS ( \
             SELECT id, concurrency_key, row_number() OVER (PARTITION BY concurrency_key \
                 ORDER BY priority, run_at, id) AS kn \
             FROM {t} WHERE id = ANY(v_ids) AND state || '' = 'pending') \
         UPDATE {t} {} \
         WHERE id = ANY(ARRAY( \
             SELECT p.id FROM p LEFT JOIN run ON run.k = p.concurrency_key \
             WHERE p.concurrency_key IS NULL OR p.kn + coalesce(run.r, 0) <= p_per_key)) \
         RETURNING {CLAIM_COLS}",
        claim_set(&ARGS)
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
