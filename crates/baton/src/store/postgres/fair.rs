//! The fair claim of the PostgreSQL backend (`TaskClaim::fair`, the rule of
//! `store::fair`), made by one statement: a call of the PL/pgSQL function
//! `<prefix>fair_claim` the schema step 19 → 20 creates ([`function_sql`]).
//!
//! Inside the function, in the caller's transaction (a claim of its own
//! runs in the statement's implicit one): the queue's advisory lock (the
//! one capped claimers take, so fair claimers take turns and each reads the
//! running tasks after the previous one committed: a volatile function's
//! every statement reads a fresh snapshot), the queue's paused flag and
//! cursor, its running tasks per group, its best due priority, the heads of
//! the group without a key and of the keys running, then a walk over the
//! other keys in rotation order from the cursor (`fair::KeyWalk`'s rule:
//! one index probe a key on `tasks_key_pending`, stopping once it has found
//! as many keys as the claim takes whose head is at the best priority with
//! nothing running), then one statement that ranks the chosen groups'
//! first tasks (`fair::choose` and `fair::pick`), and one that claims them
//! and moves the cursor. The lock is held for the server's time only, not
//! for round trips: five round trips before (four of them under the lock),
//! one now.

use super::Names;
use super::PgBackend;
use crate::error::StoreError;
use crate::store::sql_row::{claimed_task, CLAIM_COLS};
use crate::store::{Task, TaskClaim};

/// The rows the fair claim function returns ([`CLAIM_COLS`] with their
/// types): a record, not the tasks table's row type, so the function
/// depends on no table (a table dropped on its own is not held back).
pub(super) const RETURNS: &str =
    "id bigint, queue text, kind text, payload jsonb, priority integer, \
     attempt integer, claim_token bigint, max_attempts integer, timeout_ms bigint, \
     run_at timestamptz, lease_until timestamptz, job text, slot timestamptz, traceparent text";

/// The fair claim function's quoted name.
pub(super) fn function_name(n: &Names) -> String {
    format!("\"{}fair_claim\"", n.prefix)
}

/// `CREATE OR REPLACE FUNCTION <prefix>fair_claim(…)`: the whole fair
/// claim in one call. Arguments: the queue, the worker, the lease in ms,
/// the limit, `max_running` (NULL: none), the per-key cap (NULL: none),
/// `buffered`, the advisory lock's text key (hashed as the capped claims
/// hash it), and the store's clock (the caller's `now`, so the test clock
/// is honoured). Returns the claimed rows ([`RETURNS`]) in plan order
/// (best first).
///
/// The group without a key goes by `''` (`fair::NO_KEY`), which no
/// concurrency key can be; keys compare in the column's collation, the
/// order the walk reads them in.
pub(super) fn function_sql(n: &Names) -> String {
    let (t, q, f) = (&n.tasks, &n.queues, function_name(n));
    let due = "state = 'pending' AND queue = p_queue AND run_at <= p_now AND NOT cancel_requested";
    let order = "ORDER BY concurrency_key, priority, run_at, id";
    let ret = CLAIM_COLS
        .split(", ")
        .map(|c| format!("t.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"CREATE OR REPLACE FUNCTION {f}(p_queue text, p_worker text, p_lease_ms int8,
    p_limit int8, p_max_running int8, p_per_key int8, p_buffered int8, p_lock text,
    p_now timestamptz)
RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_paused boolean;
    v_cur text;
    v_rk text[];
    v_rn int8[];
    v_running int8;
    v_total int8;
    v_best int4;
    v_hk text[] := '{{}}';
    v_hp int4[] := '{{}}';
    v_p int4;
    v_k text;
    v_next text;
    v_wrapped boolean := false;
    v_found int8 := 0;
    v_ids int8[];
    v_last text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_lock, 0));
    SELECT paused, fair_cursor INTO v_paused, v_cur FROM {q} WHERE name = p_queue;
    IF coalesce(v_paused, false) THEN RETURN; END IF;
    v_cur := coalesce(v_cur, '');
    SELECT coalesce(array_agg(g), '{{}}'), coalesce(array_agg(c), '{{}}'), coalesce(sum(c), 0)
        INTO v_rk, v_rn, v_running
        FROM (SELECT coalesce(concurrency_key, '') AS g, count(*) AS c FROM {t}
              WHERE state = 'running' AND queue = p_queue GROUP BY 1) r;
    v_total := p_limit;
    IF p_max_running IS NOT NULL THEN
        v_total := least(v_total, p_max_running - v_running);
    END IF;
    IF v_total <= 0 THEN RETURN; END IF;
    SELECT priority INTO v_best FROM {t} WHERE {due} ORDER BY priority, run_at, id LIMIT 1;
    IF v_best IS NULL THEN RETURN; END IF;
    -- The heads read apart: the group without a key, the keys running.
    SELECT priority INTO v_p FROM {t} WHERE {due} AND concurrency_key IS NULL {order} LIMIT 1;
    IF v_p IS NOT NULL THEN
        v_hk := v_hk || ''::text; v_hp := v_hp || v_p;
    END IF;
    FOREACH v_k IN ARRAY v_rk LOOP
        CONTINUE WHEN v_k = '';
        v_p := NULL;
        SELECT priority INTO v_p FROM {t} WHERE {due} AND concurrency_key = v_k {order} LIMIT 1;
        IF v_p IS NOT NULL THEN
            v_hk := v_hk || v_k; v_hp := v_hp || v_p;
        END IF;
    END LOOP;
    -- The walk: the keys after the cursor, then from the first key up to
    -- the cursor, until enough keys at the best priority with nothing
    -- running are found (every key not walked ranks after them).
    v_k := v_cur;
    LOOP
        v_next := NULL;
        SELECT concurrency_key INTO v_next FROM {t}
            WHERE state = 'pending' AND queue = p_queue AND concurrency_key > v_k
            ORDER BY concurrency_key LIMIT 1;
        IF v_next IS NULL THEN
            EXIT WHEN v_wrapped OR v_cur = '';
            v_wrapped := true;
            v_k := '';
            CONTINUE;
        END IF;
        EXIT WHEN v_wrapped AND v_next > v_cur;
        v_k := v_next;
        CONTINUE WHEN v_k = ANY(v_hk);
        v_p := NULL;
        SELECT priority INTO v_p FROM {t} WHERE {due} AND concurrency_key = v_k {order} LIMIT 1;
        CONTINUE WHEN v_p IS NULL;
        v_hk := v_hk || v_k; v_hp := v_hp || v_p;
        IF v_p = v_best AND NOT (v_k = ANY(v_rk)) THEN
            v_found := v_found + 1;
            EXIT WHEN v_found >= v_total;
        END IF;
    END LOOP;
    -- Choose the groups (their heads' rank, room under the per-key cap),
    -- read their first tasks, rank them all, take the claim's share.
    WITH r AS (SELECT * FROM unnest(v_rk, v_rn) AS r(g, n)),
    h AS (SELECT h.g, h.p, coalesce(r.n, 0) AS run,
                 CASE WHEN h.g <> '' AND p_per_key IS NOT NULL
                      THEN p_per_key - coalesce(r.n, 0) END AS room
          FROM unnest(v_hk, v_hp) AS h(g, p) LEFT JOIN r ON r.g = h.g),
    chosen AS (SELECT g, run,
                      least(coalesce(room, v_total + least(p_buffered, p_limit)),
                            v_total + least(p_buffered, p_limit)) AS take
               FROM h WHERE room IS NULL OR room > 0
               ORDER BY p, 1 + run, NOT (g > v_cur), g LIMIT v_total),
    cand AS (SELECT c.id, c.priority, c.attempt, c.max_attempts, chosen.g, chosen.run,
                    row_number() OVER (PARTITION BY chosen.g
                                       ORDER BY c.priority, c.run_at, c.id) AS n
             FROM chosen CROSS JOIN LATERAL (
                 (SELECT id, priority, run_at, attempt, max_attempts FROM {t}
                  WHERE {due} AND chosen.g <> '' AND concurrency_key = chosen.g
                  {order} LIMIT chosen.take)
                 UNION ALL
                 (SELECT id, priority, run_at, attempt, max_attempts FROM {t}
                  WHERE {due} AND chosen.g = '' AND concurrency_key IS NULL
                  {order} LIMIT chosen.take)) AS c),
    ranked AS (SELECT id, g, attempt, max_attempts,
                      row_number() OVER (ORDER BY priority, n + run, NOT (g > v_cur), g) AS i
               FROM cand),
    taken AS (SELECT id, g, i FROM ranked
              WHERE i <= p_limit - p_buffered OR attempt + 1 < max_attempts
              ORDER BY i LIMIT v_total)
    SELECT array_agg(id ORDER BY i), (array_agg(g ORDER BY i DESC))[1]
        INTO v_ids, v_last FROM taken;
    IF v_ids IS NULL THEN RETURN; END IF;
    INSERT INTO {q} (name, fair_cursor) VALUES (p_queue, v_last)
        ON CONFLICT (name) DO UPDATE SET fair_cursor = excluded.fair_cursor;
    RETURN QUERY WITH u AS (
        UPDATE {t} AS t SET state = 'running', attempt = t.attempt + 1, started_at = p_now,
            lease_until = p_now + p_lease_ms * interval '1 millisecond', worker = p_worker,
            claim_token = greatest(t.claim_token + 1,
                                   floor(extract(epoch FROM p_now) * 1000000)::bigint)
        -- Only the primary key can serve this (the other terms are
        -- expressions): with no statistics the planner took the pending
        -- index and walked the queue's whole backlog for the ids.
        WHERE t.id = ANY(v_ids) AND t.state || '' = 'pending' AND t.queue || '' = p_queue
        RETURNING {ret})
    SELECT * FROM u ORDER BY array_position(v_ids, u.id);
END
$fn$;"#
    )
}

impl PgBackend {
    /// A fair claim on `conn` (in a transaction or not): one call of the
    /// fair claim function, which takes the queue's advisory lock itself.
    pub(super) async fn claim_fair<'c, E>(
        &self,
        conn: E,
        req: &TaskClaim<'_>,
    ) -> Result<Vec<Task>, StoreError>
    where
        E: sqlx::Executor<'c, Database = sqlx::Postgres>,
    {
        let sql = self.claim_function_call(&function_name(&self.names), 8);
        let sent = tokio::time::Instant::now();
        let rows = self
            .claim_call(&sql, req)
            .bind(self.lock_key(req.queue))
            .fetch_all(conn)
            .await?;
        self.claim_took(sent.elapsed());
        rows.iter().map(claimed_task).collect()
    }
}
