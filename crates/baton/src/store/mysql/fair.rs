//! The fair claim of the MySQL / MariaDB backend (`TaskClaim::fair`, the
//! rule of `store::fair`), made by one round trip: `BEGIN`, a `CALL` of the
//! stored procedure `<prefix>fair_claim` ([`procedure_sql`]) and `COMMIT`,
//! sent as one batch.
//!
//! The procedure is created by a handle's first fair claim ([`ready`]), not
//! by the migration: creating it needs `CREATE ROUTINE`, which a user that
//! never claims fairly need not have. A user without it gets a fair claim
//! error naming the grant; once any user with it has made one fair claim,
//! the others (with `EXECUTE`) call it. A build whose procedure body
//! changes drops the old one in a schema step, and the next fair claim
//! creates the new one.
//!
//! Inside the procedure, in the caller's transaction: the queue's row in
//! `<p>queues` locked (the turn lock capped claims take, so fair claimers
//! take turns and, at `READ COMMITTED`, each reads the running tasks after
//! the previous one committed), the queue's paused flag and cursor, its
//! running tasks per group, its best due priority, the heads of the group
//! without a key and of the keys running, then a walk over the other keys
//! in rotation order from the cursor (`fair::KeyWalk`'s rule: one probe a
//! key on `tasks_key_pending`, stopping once it has found as many keys as
//! the claim takes whose head is at the best priority with nothing
//! running), then the chosen groups' first tasks locked (`FOR UPDATE SKIP
//! LOCKED`: a claimer that is not fair does not take turns on the queue's
//! row), ranked (`fair::choose` and `fair::pick`), claimed, the cursor
//! moved, and the claimed rows returned in plan order. The lock is held for
//! the server's work only: before, a fair claim was five round trips of
//! text statements, four of them under the lock.
//!
//! Its working sets are session temporary tables (`<prefix>fc_*`, created
//! on a connection's first fair claim, emptied by each: `CREATE` and
//! `DELETE` of a temporary table commit nothing), as MariaDB has no
//! `LATERAL` and neither server has arrays.

use sqlx::Executor;

use super::claim::OpenTx;
use super::{batch_on, hex_lit, text_lit, us, MyBackend, Names, BEGIN};
use crate::error::StoreError;
use crate::store::sql_row::{claimed_task, CLAIM_COLS};
use crate::store::{Task, TaskClaim};

/// The fair claim procedure's quoted name.
pub(super) fn procedure_name(n: &Names) -> String {
    format!("`{}fair_claim`", n.prefix)
}

/// The schema step that (re)creates `<prefix>fair_claim`: each statement
/// idempotent (MySQL has no `CREATE OR REPLACE PROCEDURE`). Arguments: the
/// queue, the worker, the lease in µs, the limit, `max_running` (NULL:
/// none), the per-key cap (NULL: none), `buffered`, and the store's clock
/// (the caller's `now`, so the test clock is honoured). Its one result set:
/// the claimed rows ([`CLAIM_COLS`]) in plan order (best first).
///
/// The group without a key goes by `X''` (`fair::NO_KEY`), which no
/// concurrency key can be; keys are `VARBINARY`, compared byte by byte as
/// the walk reads them and as `store::fair` compares them.
pub(super) fn procedure_sql(n: &Names) -> Vec<String> {
    let (t, q, f, p) = (&n.tasks, &n.queues, procedure_name(n), &n.prefix);
    let (run, heads, cand, take) = (
        format!("`{p}fc_run`"),
        format!("`{p}fc_heads`"),
        format!("`{p}fc_cand`"),
        format!("`{p}fc_take`"),
    );
    // The index of one group's due tasks in claim order, and of the
    // distinct keys of the pending tasks (see `add_fair`): left to itself
    // the optimizer takes the claim index, stepping over other keys.
    let tk = format!("{t} FORCE INDEX (tasks_key_pending)");
    let due = "queue = p_queue AND state = 'pending' AND run_at <= p_now AND cancel_requested = 0";
    let order = "ORDER BY priority, run_at, id";
    let cols = CLAIM_COLS
        .split(", ")
        .map(|c| format!("t.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let head = |group: &str| {
        format!("(SELECT priority FROM {tk} WHERE {due} AND {group} {order} LIMIT 1)")
    };
    let (head_none, head_of_k, head_of_g) = (
        head("concurrency_key IS NULL"),
        head("concurrency_key = v_k"),
        head("concurrency_key = r.g"),
    );
    vec![format!(
        r#"CREATE PROCEDURE {f}(p_queue VARBINARY(255),
    p_worker VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, p_lease_us BIGINT,
    p_limit BIGINT, p_max_running BIGINT, p_per_key BIGINT, p_buffered BIGINT,
    p_now DATETIME(6))
MODIFIES SQL DATA
fc: BEGIN
    DECLARE v_paused BIGINT;
    DECLARE v_cur VARBINARY(255);
    DECLARE v_total BIGINT;
    DECLARE v_share BIGINT;
    DECLARE v_best INT;
    DECLARE v_p INT;
    DECLARE v_k VARBINARY(255);
    DECLARE v_next VARBINARY(255);
    DECLARE v_last VARBINARY(255);
    DECLARE v_wrapped INT DEFAULT 0;
    DECLARE v_found BIGINT DEFAULT 0;
    DECLARE v_done INT DEFAULT 0;
    DECLARE c_g VARBINARY(255);
    DECLARE c_run BIGINT;
    DECLARE c_take BIGINT;
    -- The groups to read the candidates of (`fair::choose`): the heads
    -- ranked, at most the claim's size, leaving out the keys at their cap.
    DECLARE chosen CURSOR FOR
        SELECT h.g, COALESCE(r.n, 0),
               LEAST(COALESCE(CASE WHEN h.g <> X'' AND p_per_key IS NOT NULL
                                   THEN p_per_key - COALESCE(r.n, 0) END, v_share), v_share)
        FROM {heads} h LEFT JOIN {run} r ON r.g = h.g
        WHERE NOT (h.g <> X'' AND p_per_key IS NOT NULL AND p_per_key - COALESCE(r.n, 0) <= 0)
        ORDER BY h.p, 1 + COALESCE(r.n, 0), NOT (h.g > v_cur), h.g
        LIMIT v_total;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
    -- Claimers of the queue take turns on its row.
    INSERT INTO {q} (queue) VALUES (p_queue) ON DUPLICATE KEY UPDATE queue = queue;
    SET v_paused = (SELECT paused FROM {q} WHERE queue = p_queue);
    IF COALESCE(v_paused, 0) <> 0 THEN LEAVE fc; END IF;
    SET v_cur = COALESCE((SELECT fair_cursor FROM {q} WHERE queue = p_queue), X'');
    CREATE TEMPORARY TABLE IF NOT EXISTS {run}
        (g VARBINARY(255) NOT NULL PRIMARY KEY, n BIGINT NOT NULL) ENGINE=MEMORY;
    CREATE TEMPORARY TABLE IF NOT EXISTS {heads}
        (g VARBINARY(255) NOT NULL PRIMARY KEY, p INT NOT NULL) ENGINE=MEMORY;
    CREATE TEMPORARY TABLE IF NOT EXISTS {cand}
        (id BIGINT NOT NULL PRIMARY KEY, g VARBINARY(255) NOT NULL, run BIGINT NOT NULL,
         priority INT NOT NULL, run_at DATETIME(6) NOT NULL, attempt INT NOT NULL,
         max_attempts INT NOT NULL) ENGINE=MEMORY;
    CREATE TEMPORARY TABLE IF NOT EXISTS {take}
        (i BIGINT NOT NULL PRIMARY KEY, id BIGINT NOT NULL, g VARBINARY(255) NOT NULL)
        ENGINE=MEMORY;
    DELETE FROM {run};
    DELETE FROM {heads};
    DELETE FROM {cand};
    DELETE FROM {take};
    INSERT INTO {run} (g, n)
        SELECT COALESCE(concurrency_key, X''), COUNT(*) FROM {t}
        WHERE queue = p_queue AND state = 'running' GROUP BY 1;
    SET v_total = p_limit;
    IF p_max_running IS NOT NULL THEN
        SET v_total = LEAST(v_total, p_max_running - (SELECT COALESCE(SUM(n), 0) FROM {run}));
    END IF;
    IF v_total <= 0 THEN LEAVE fc; END IF;
    SET v_share = v_total + LEAST(p_buffered, p_limit);
    SET v_best = (SELECT priority FROM {t} WHERE {due} {order} LIMIT 1);
    IF v_best IS NULL THEN LEAVE fc; END IF;
    -- The heads read apart: the group without a key, the keys running.
    SET v_p = {head_none};
    IF v_p IS NOT NULL THEN INSERT INTO {heads} (g, p) VALUES (X'', v_p); END IF;
    INSERT INTO {heads} (g, p)
        SELECT g, p FROM (SELECT r.g, {head_of_g} AS p FROM {run} r WHERE r.g <> X'') AS x
        WHERE p IS NOT NULL;
    -- The walk: the keys after the cursor, then from the first key up to
    -- the cursor, until enough keys at the best priority with nothing
    -- running are found (every key not walked ranks after them).
    SET v_k = v_cur;
    walk: LOOP
        SET v_next = (SELECT concurrency_key FROM {tk}
            WHERE queue = p_queue AND state = 'pending' AND concurrency_key > v_k
            ORDER BY concurrency_key LIMIT 1);
        IF v_next IS NULL THEN
            IF v_wrapped = 1 OR v_cur = X'' THEN LEAVE walk; END IF;
            SET v_wrapped = 1;
            SET v_k = X'';
            ITERATE walk;
        END IF;
        IF v_wrapped = 1 AND v_next > v_cur THEN LEAVE walk; END IF;
        SET v_k = v_next;
        IF EXISTS (SELECT 1 FROM {heads} WHERE g = v_k) THEN ITERATE walk; END IF;
        SET v_p = {head_of_k};
        IF v_p IS NULL THEN ITERATE walk; END IF;
        INSERT INTO {heads} (g, p) VALUES (v_k, v_p);
        IF v_p = v_best AND NOT EXISTS (SELECT 1 FROM {run} WHERE g = v_k) THEN
            SET v_found = v_found + 1;
            IF v_found >= v_total THEN LEAVE walk; END IF;
        END IF;
    END LOOP;
    -- The chosen groups' first tasks, locked.
    OPEN chosen;
    cands: LOOP
        FETCH chosen INTO c_g, c_run, c_take;
        IF v_done = 1 THEN LEAVE cands; END IF;
        IF c_g = X'' THEN
            INSERT INTO {cand} (id, g, run, priority, run_at, attempt, max_attempts)
                SELECT id, X'', c_run, priority, run_at, attempt, max_attempts FROM {tk}
                WHERE {due} AND concurrency_key IS NULL {order} LIMIT c_take
                FOR UPDATE SKIP LOCKED;
        ELSE
            INSERT INTO {cand} (id, g, run, priority, run_at, attempt, max_attempts)
                SELECT id, c_g, c_run, priority, run_at, attempt, max_attempts FROM {tk}
                WHERE {due} AND concurrency_key = c_g {order} LIMIT c_take
                FOR UPDATE SKIP LOCKED;
        END IF;
    END LOOP;
    CLOSE chosen;
    -- Rank them all (`fair::pick`): the first `limit - buffered` at once,
    -- the rest only with an attempt to spare, at most the claim's size.
    INSERT INTO {take} (i, id, g)
        SELECT i, id, g FROM (
            SELECT id, g, attempt, max_attempts,
                   ROW_NUMBER() OVER (ORDER BY priority, n + run, NOT (g > v_cur), g) AS i
            FROM (SELECT id, g, run, priority, attempt, max_attempts,
                         ROW_NUMBER() OVER (PARTITION BY g ORDER BY priority, run_at, id) AS n
                  FROM {cand}) AS c) AS r
        WHERE i <= p_limit - p_buffered OR attempt + 1 < max_attempts
        ORDER BY i LIMIT v_total;
    SET v_last = (SELECT g FROM {take} ORDER BY i DESC LIMIT 1);
    IF v_last IS NULL THEN LEAVE fc; END IF;
    UPDATE {q} SET fair_cursor = v_last WHERE queue = p_queue;
    UPDATE {take} k STRAIGHT_JOIN {t} t ON t.id = k.id
        SET t.state = 'running', t.attempt = t.attempt + 1, t.started_at = p_now,
            t.lease_until = p_now + INTERVAL p_lease_us MICROSECOND, t.worker = p_worker,
            t.claim_token = GREATEST(t.claim_token + 1,
                TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', p_now));
    SELECT {cols} FROM {take} k STRAIGHT_JOIN {t} t ON t.id = k.id ORDER BY k.i;
END fc"#
    )]
}

/// MySQL's "already exists" for a stored routine (`ER_SP_ALREADY_EXISTS`).
const SP_ALREADY_EXISTS: u16 = 1304;
/// MySQL's "does not exist" for a stored routine (`ER_SP_DOES_NOT_EXIST`).
const SP_DOES_NOT_EXIST: u16 = 1305;

/// The MySQL error number of `e`, if the server answered one.
fn server_error(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()?
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|m| m.number())
}

/// Make sure `<prefix>fair_claim` exists before this handle's first fair
/// claim: `CREATE PROCEDURE` (not inside a transaction: DDL commits it),
/// "already exists" being as good (another process made it first). A
/// refusal (no `CREATE ROUTINE`) is left for the `CALL` to tell: the
/// procedure may exist all the same, made by a user who may.
pub(super) async fn ready(b: &MyBackend) -> Result<(), StoreError> {
    use std::sync::atomic::Ordering;
    if b.fair_ready.load(Ordering::Relaxed) {
        return Ok(());
    }
    let mut conn = b.pool.acquire().await?;
    for stmt in procedure_sql(&b.names) {
        match conn.execute(stmt.as_str()).await {
            Ok(_) => {}
            Err(e) if server_error(&e) == Some(SP_ALREADY_EXISTS) => {}
            Err(e) if server_error(&e).is_some() => {
                tracing::debug!(error = %e, "creating the fair claim procedure failed; calling it all the same");
            }
            Err(e) => return Err(e.into()),
        }
    }
    b.fair_ready.store(true, Ordering::Relaxed);
    Ok(())
}

/// A fair claim's error: a missing procedure (this user could not create
/// it, or a schema removal dropped it) says which grant makes it, and the
/// next fair claim tries to create it again.
fn call_error(b: &MyBackend, e: StoreError) -> StoreError {
    let missing = match &e {
        StoreError::Driver { source, .. } => source
            .downcast_ref::<sqlx::Error>()
            .is_some_and(|e| server_error(e) == Some(SP_DOES_NOT_EXIST)),
        _ => false,
    };
    if !missing {
        return e;
    }
    b.fair_ready
        .store(false, std::sync::atomic::Ordering::Relaxed);
    StoreError::Config(format!(
        "fair claims on MySQL/MariaDB call the stored procedure {}, which is missing \
         and this user could not create: grant it CREATE ROUTINE (the first fair claim \
         creates the procedure; after that EXECUTE is enough)",
        procedure_name(&b.names)
    ))
}

/// The procedure's `CALL` for `req`, every value a literal.
fn call_sql(b: &MyBackend, req: &TaskClaim<'_>) -> String {
    let opt = |n: Option<u32>| n.map_or_else(|| "NULL".to_string(), |n| n.to_string());
    format!(
        "CALL {}({}, {}, {}, {}, {}, {}, {}, {})",
        procedure_name(&b.names),
        hex_lit(req.queue.as_bytes()),
        text_lit(req.worker),
        us(req.lease),
        req.limit,
        opt(req.max_running),
        opt(req.per_key_max_running),
        req.buffered,
        b.names.now,
    )
}

/// A fair claim (of at least one task: `claim::task_claim` answers a
/// limit of 0): one batch (`BEGIN`, the procedure's `CALL`, `COMMIT`) on a
/// connection of its own; a failed batch is rolled back (or the connection
/// closed).
pub(super) async fn task_claim(
    b: &MyBackend,
    req: &TaskClaim<'_>,
) -> Result<Vec<Task>, StoreError> {
    ready(b).await?;
    let mut open = OpenTx {
        conn: b.pool.acquire().await?,
        open: true,
    };
    let sql = format!("{BEGIN}; {}; COMMIT", call_sql(b, req));
    let rows = batch_on(&mut open.conn, &sql)
        .await
        .map_err(|e| call_error(b, e))?;
    open.open = false;
    rows.iter().map(claimed_task).collect()
}

/// A fair claim inside `tx` (a claim under a rate limit), committed by the
/// caller: the procedure's `CALL` (the caller made it [`ready`] before
/// the transaction began).
pub(super) async fn claim_in(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    b: &MyBackend,
    req: &TaskClaim<'_>,
) -> Result<Vec<Task>, StoreError> {
    if req.limit == 0 {
        return Ok(Vec::new());
    }
    let rows = (&mut **tx)
        .fetch_all(sqlx::raw_sql(&call_sql(b, req)))
        .await
        .map_err(|e| call_error(b, e.into()))?;
    rows.iter().map(claimed_task).collect()
}
