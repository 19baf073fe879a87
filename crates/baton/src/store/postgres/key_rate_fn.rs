//! The SQL text of the PL/pgSQL function `<prefix>key_rated_claim`: the
//! claim under a rate per concurrency key (`store::key_rate`'s rules) as
//! one call, created by the schema step 21 → 22 and called from
//! `key_rate.rs`.
//!
//! Inside the function, in the caller's transaction (a claim of its own
//! runs in the statement's implicit one), each statement reading a fresh
//! snapshot (a volatile function):
//!
//! 1. with a cap or `max_running`, the queue's advisory lock (the one
//!    capped and fair claimers take) and the queue's running tasks per key;
//! 2. the walk of due candidates in claim order (`FOR UPDATE SKIP
//!    LOCKED`), past keys whose log says they are used up (`free_at >
//!    now`) and keys at their cap;
//! 3. each walked key's advisory lock, in the locks' order, held to commit
//!    (the claims that start a key's tasks take turns; claims of other
//!    keys run at once), then, in a statement after them, each key's
//!    logged starts in the window;
//! 4. `key_rate::pick`'s rule in a loop over the candidates;
//! 5. one statement that claims the picked tasks and upserts their keys'
//!    logs with `key_rate::logs_after`'s rule (the `max` latest starts, a
//!    buffered task logged at now + the hold, `free_at`, `idle_at`), less
//!    the starts a period older than the claim's instant: that instant
//!    is read after the keys' locks (3), so a key's claims take
//!    non-decreasing instants and such a start counts in no later
//!    claim's window. A log holds a period's starts, not `max` (a log of
//!    `1000/100ms` kept 1,000 starts as ~300 runs when claims were small,
//!    and every claim of the key read and rewrote it: a 20,000-task drain
//!    fell from ~15k to 185 tasks a second, docs/BENCHMARKS.md session
//!    31);
//! 6. the prune of idle logs and, when the claim came back short, the
//!    earliest `free_at` of a used-up key with pending tasks.
//!
//! A key's log is the column `log int8[]`: runs of `store::rate::StartLog`
//! as pairs, instant (µs) then count, latest first, `max` starts in all at
//! most (step 21 → 22 turned the text the other SQL stores keep into an
//! array of instants, step 23 → 24 into runs): a claim logs all its tasks
//! at one or two instants, so a log of 1,000 starts is a few dozen numbers
//! (as 1,000 instants, ten such logs written back cost ~8 ms a claim under
//! the lock, each stored compressed out of line).

use super::fair::RETURNS;
use super::Names;
use crate::store::sql_row::CLAIM_COLS;

/// The key rated claim function's quoted name.
pub(super) fn function_name(n: &Names) -> String {
    format!("\"{}key_rated_claim\"", n.prefix)
}

/// The function's rows: [`RETURNS`] (the claimed tasks, `key_next` and
/// `now_us` NULL), then one row with every task column NULL carrying
/// `key_next` (the earliest `free_at` in µs when the claim came back
/// short, else NULL) and `now_us` (the claim's now in µs).
pub(super) fn returns() -> String {
    format!("{RETURNS}, key_next bigint, now_us bigint")
}

/// `CREATE OR REPLACE FUNCTION <prefix>key_rated_claim(…)`. Arguments: the
/// queue, the worker, the lease in ms, the limit, `max_running` (NULL:
/// none), the per-key cap (NULL: none), `buffered`, the walk's length
/// (`key_rate::walk_len`), the rate's `max` and `per` (µs), the buffer's
/// hold (µs, `BUFFER_HOLD`), the prune's grace (µs, `PRUNE_GRACE`) and
/// batch (`PRUNE_BATCH`), the advisory lock's text key, and the store's
/// clock (the caller's `now`, so the test clock is honoured). Returns
/// [`returns`].
pub(super) fn function_sql(n: &Names) -> String {
    let (t, q, kr, f) = (&n.tasks, &n.queues, &n.key_rates, function_name(n));
    let u_cols = CLAIM_COLS
        .split(", ")
        .map(|c| format!("u.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    // The trailing row's task columns: NULLs of their types.
    let nulls = RETURNS
        .split(", ")
        .filter_map(|c| c.split_once(' '))
        .map(|(_, ty)| format!("NULL::{ty}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"CREATE OR REPLACE FUNCTION {f}(p_queue text, p_worker text, p_lease_ms int8,
    p_limit int8, p_max_running int8, p_per_key int8, p_buffered int8, p_walk int8,
    p_rate_max int8, p_rate_per int8, p_hold int8, p_grace int8, p_prune int8, p_lock text,
    p_now timestamptz)
RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_now int8 := floor(extract(epoch FROM p_now) * 1000000)::bigint;
    v_ts timestamptz := p_now;
    v_at_once int8 := p_limit - least(p_buffered, p_limit);
    v_rk text[] := '{{}}';
    v_rn int8[] := '{{}}';
    v_running int8 := 0;
    v_size int8 := p_limit;
    v_full text[] := '{{}}';
    v_cid int8[];
    v_ckx int8[];
    v_cspare boolean[];
    v_lu int8[];
    v_kn int8[];
    v_keys text[];
    v_tn int8[];
    v_ids int8[] := '{{}}';
    v_at int8[] := '{{}}';
    v_pos int8 := 0;
    v_x int8;
    v_n int8 := 0;
    v_next int8;
BEGIN
    -- A cap or `max_running` counts the queue's running tasks: the
    -- queue's turn (the lock capped and fair claimers take). A rate per
    -- key alone needs no turn of the queue: each key's advisory lock,
    -- below, orders the claims that start its tasks.
    IF p_max_running IS NOT NULL OR p_per_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(p_lock, 0));
    END IF;
    IF p_limit > 0 THEN
        IF p_max_running IS NOT NULL OR p_per_key IS NOT NULL THEN
            SELECT coalesce(array_agg(k), '{{}}'), coalesce(array_agg(c), '{{}}'),
                   coalesce(sum(c), 0)
                INTO v_rk, v_rn, v_running
                FROM (SELECT concurrency_key AS k, count(*) AS c FROM {t}
                      WHERE state = 'running' AND queue = p_queue GROUP BY 1) r;
        END IF;
        IF p_per_key IS NOT NULL THEN
            SELECT coalesce(array_agg(k), '{{}}') INTO v_full
                FROM unnest(v_rk, v_rn) AS r(k, c) WHERE k IS NOT NULL AND c >= p_per_key;
        END IF;
        IF p_max_running IS NOT NULL THEN
            v_size := least(v_size, greatest(0, p_max_running - v_running));
        END IF;
        -- The walk, each candidate with its key's index (`v_ckx`, 1-based,
        -- NULL for a task of no key) into the walked keys' arrays: the
        -- keys, with a cap their running tasks, and (below) the starts
        -- each key's log has in the window. The loop below reads them by
        -- index (looking each key up by value cost O(keys) a candidate).
        WITH c AS (
            SELECT w.id, w.concurrency_key, w.attempt, w.max_attempts, w.priority, w.run_at
            FROM {t} AS w
            WHERE w.state = 'pending' AND w.queue = p_queue AND w.run_at <= p_now
                AND NOT w.cancel_requested
                AND NOT EXISTS (SELECT 1 FROM {q} WHERE name = p_queue AND paused)
                AND (w.concurrency_key IS NULL OR (
                    NOT EXISTS (SELECT 1 FROM {kr} AS r WHERE r.queue = p_queue
                        AND r.ckey = w.concurrency_key AND r.free_at > 0
                        AND r.free_at > v_now)
                    AND w.concurrency_key <> ALL(v_full)))
            ORDER BY w.priority, w.run_at, w.id
            LIMIT p_walk FOR UPDATE SKIP LOCKED),
        k AS (
            SELECT d.k, row_number() OVER (ORDER BY d.k) AS x
            FROM (SELECT DISTINCT concurrency_key AS k FROM c
                  WHERE concurrency_key IS NOT NULL) AS d)
        SELECT array_agg(c.id ORDER BY c.priority, c.run_at, c.id),
               array_agg(k.x ORDER BY c.priority, c.run_at, c.id),
               array_agg(c.attempt + 1 < c.max_attempts ORDER BY c.priority, c.run_at, c.id),
               (SELECT coalesce(array_agg(k.k ORDER BY k.x), '{{}}') FROM k),
               (SELECT coalesce(array_agg(coalesce(r.c, 0) ORDER BY k.x), '{{}}')
                    FROM k LEFT JOIN unnest(v_rk, v_rn) AS r(k, c) ON r.k = k.k)
            INTO v_cid, v_ckx, v_cspare, v_keys, v_kn
            FROM c LEFT JOIN k ON k.k = c.concurrency_key;
        -- Each walked key's own lock (its text: the queue's, a unit
        -- separator, the key), held to the commit, so the claims that
        -- start a key's tasks take turns, each reading the log the one
        -- before wrote: T6's argument, per key. Taken in the order of the
        -- locks' ids, as every claim takes them, so claims that wait for
        -- each other's keys cannot wait in a circle (one waiting for the
        -- queue's turn holds no key). Tried without waiting instead,
        -- claims of few keys left each other's keys out: 10 keys ran 20 %
        -- slower than under the queue's turn (docs/BENCHMARKS.md session
        -- 30).
        PERFORM pg_advisory_xact_lock(o.h)
            FROM (SELECT DISTINCT hashtextextended(p_lock || chr(31) || u.k, 0) AS h
                  FROM unnest(v_keys) AS u(k) ORDER BY 1) AS o;
        -- The claim's instant, read once its keys' locks are held (the
        -- store's clock, moved by the test clock's offset as `p_now` is):
        -- the claims of a key take their instants in the order they take
        -- its lock, so no later claim of the key counts from an earlier
        -- instant, and a start a period before this instant is in no
        -- later claim's window. Its tasks start, and its starts are
        -- logged, at this instant.
        v_ts := p_now + (clock_timestamp() - now());
        v_now := floor(extract(epoch FROM v_ts) * 1000000)::bigint;
        -- A statement after the locks, so its snapshot holds every claim
        -- of these keys that committed before: each key's starts in the
        -- window (its log read by its primary key: a generic plan of
        -- `ckey = ANY(…)`, cached while the table was empty, scanned it
        -- whole).
        SELECT coalesce(array_agg((SELECT coalesce(sum(r.log[i + 1]), 0)::int8
                    FROM {kr} AS r, generate_series(1, cardinality(r.log), 2) AS i
                    WHERE r.queue = p_queue AND r.ckey = u.k AND r.log[i] > v_now - p_rate_per)
                   ORDER BY u.x), '{{}}')
            INTO v_lu FROM unnest(v_keys) WITH ORDINALITY AS u(k, x);
        v_tn := array_fill(0::int8, ARRAY[cardinality(v_lu)]);
        -- `key_rate::pick`: each key while its log and its cap leave room,
        -- at most the claim's size; past the first `limit - buffered`
        -- places only tasks with an attempt to spare.
        FOR i IN 1 .. coalesce(array_length(v_cid, 1), 0) LOOP
            EXIT WHEN v_n >= v_size;
            v_x := v_ckx[i];
            IF v_x IS NOT NULL THEN
                CONTINUE WHEN v_lu[v_x] + v_tn[v_x] >= p_rate_max;
                CONTINUE WHEN p_per_key IS NOT NULL AND v_kn[v_x] + v_tn[v_x] >= p_per_key;
            END IF;
            v_pos := v_pos + 1;
            CONTINUE WHEN v_pos > v_at_once AND NOT v_cspare[i];
            IF v_x IS NOT NULL THEN
                v_tn[v_x] := v_tn[v_x] + 1;
            END IF;
            -- `array_append` grows the array in place (`v := v || x`
            -- copied it whole each time: 1.5 ms for 536 ids, 0.3 ms so).
            v_ids := array_append(v_ids, v_cid[i]);
            -- `key_rate::logged_start`: a buffered task at its hold's end.
            v_at := array_append(v_at,
                CASE WHEN v_n >= v_at_once THEN v_now + p_hold ELSE v_now END);
            v_n := v_n + 1;
        END LOOP;
        IF v_n > 0 THEN
            -- Claim, then `key_rate::logs_after`: each claimed key's log
            -- keeps its `max` latest starts, is free from its `max`-th
            -- latest + `per`, idle from its latest + `per` + the grace
            -- rounded up to a whole grace (`key_rate::idle_at`).
            -- Only the primary key can serve the UPDATE (`|| ''` hides
            -- the other columns from the planner).
            RETURN QUERY WITH u AS (
                UPDATE {t} SET state = 'running', attempt = attempt + 1, started_at = v_ts,
                    lease_until = p_now + p_lease_ms * interval '1 millisecond',
                    worker = p_worker, claim_token = greatest(claim_token + 1, v_now)
                WHERE id = ANY(v_ids) AND state || '' = 'pending' AND queue || '' = p_queue
                RETURNING {CLAIM_COLS}, concurrency_key AS ckey),
            -- The claim's starts per key and instant (at most two: now,
            -- and a buffered task's hold's end), merged with the key's old
            -- runs (its log read by its primary key: a join let the
            -- planner scan the queue's every log), latest first; the runs
            -- in the window kept while the count before them is under
            -- `max`, the last cut to what is left (a run a period old
            -- counts in no later claim's window, see `v_ts`).
            n AS (SELECT u.ckey AS k, p.at AS t, count(*) AS c
                  FROM u JOIN unnest(v_ids, v_at) AS p(id, at) ON p.id = u.id
                  WHERE u.ckey IS NOT NULL GROUP BY u.ckey, p.at),
            m AS (SELECT a.k, a.t, sum(a.c)::int8 AS c FROM (
                      SELECT n.k, n.t, n.c FROM n
                      UNION ALL
                      SELECT d.k, o.log[i], o.log[i + 1]
                      FROM (SELECT DISTINCT n.k FROM n) AS d
                      CROSS JOIN LATERAL (SELECT log FROM {kr}
                          WHERE queue = p_queue AND ckey = d.k) AS o
                      CROSS JOIN LATERAL generate_series(1, cardinality(o.log), 2) AS i) AS a
                  GROUP BY a.k, a.t),
            r AS (SELECT m.k, m.t, m.c, coalesce(sum(m.c) OVER (PARTITION BY m.k
                      ORDER BY m.t DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                      0)::int8 AS before
                  FROM m),
            kept AS (SELECT r.k, r.t, least(r.c, p_rate_max - r.before) AS c FROM r
                     WHERE r.before < p_rate_max AND r.t > v_now - p_rate_per),
            agg AS (SELECT kept.k, sum(kept.c) AS total, min(kept.t) AS oldest,
                           max(kept.t) AS latest
                    FROM kept GROUP BY kept.k),
            l AS (SELECT kept.k, array_agg(e.v ORDER BY kept.t DESC, e.j) AS log
                  FROM kept CROSS JOIN LATERAL (VALUES (1, kept.t), (2, kept.c)) AS e(j, v)
                  GROUP BY kept.k),
            w AS (INSERT INTO {kr} (queue, ckey, log, free_at, idle_at)
                  SELECT p_queue, l.k, l.log,
                         CASE WHEN a.total >= p_rate_max THEN a.oldest + p_rate_per ELSE 0 END,
                         ((a.latest + p_rate_per + p_grace) / p_grace + 1) * p_grace
                  FROM l JOIN agg AS a ON a.k = l.k
                  ON CONFLICT (queue, ckey) DO UPDATE SET log = excluded.log,
                      free_at = excluded.free_at, idle_at = excluded.idle_at)
            SELECT {u_cols}, NULL::int8, NULL::int8 FROM u;
            GET DIAGNOSTICS v_n = ROW_COUNT;
        END IF;
    END IF;
    -- Claims of one queue may prune at once (a rate per key alone takes
    -- no turn of the queue): rows another holds are skipped, not waited
    -- for, and a row a claim rewrote since is no longer idle (rechecked
    -- on its latest version).
    DELETE FROM {kr} WHERE queue = p_queue AND idle_at < v_now AND ckey IN (
        SELECT ckey FROM {kr} WHERE queue = p_queue AND idle_at < v_now
        LIMIT p_prune FOR UPDATE SKIP LOCKED);
    IF v_n < p_limit THEN
        SELECT r.free_at INTO v_next FROM {kr} AS r
            WHERE r.queue = p_queue AND r.free_at > 0 AND r.free_at > v_now
                AND EXISTS (SELECT 1 FROM {t} WHERE state = 'pending' AND queue = p_queue
                    AND concurrency_key = r.ckey)
            ORDER BY r.free_at LIMIT 1;
    END IF;
    RETURN QUERY SELECT {nulls}, v_next, v_now;
END
$fn$;"#
    )
}
