//! The fair claim of the PostgreSQL backend (`TaskClaim::fair`, planned by
//! `store::fair`): inside the claim's transaction and under the queue's
//! advisory lock, it reads in one round trip the queue's paused flag and
//! cursor, its running tasks per key, its best due priority and the heads
//! of the group without a key and of the keys running; then the other
//! keys' heads in rotation order, a page at a time, until enough are found
//! (`fair::KeyWalk`: a loose index scan over the distinct keys of the
//! pending tasks, on `tasks_key_pending`), usually one page; then the
//! first tasks of the chosen keys; then in one statement it claims the
//! planned ones and moves the cursor.

use sqlx::Row;

use super::{dur, PgBackend};
use crate::error::StoreError;
use crate::store::fair::{self, Candidate, Head, KeyWalk, Running};
use crate::store::sql_row::{claimed_task, CLAIM_COLS};
use crate::store::{Task, TaskClaim};

impl PgBackend {
    /// A fair claim inside `tx`; the caller holds the queue's advisory lock.
    pub(super) async fn claim_fair(
        &self,
        tx: &mut sqlx::PgConnection,
        req: &TaskClaim<'_>,
    ) -> Result<Vec<Task>, StoreError> {
        let (t, q) = (&self.names.tasks, &self.names.queues);
        let (now, now_us) = (&self.names.now, &self.names.now_us);
        let due = format!(
            "state = 'pending' AND queue = $1 AND run_at <= {now} AND NOT cancel_requested"
        );
        // Within one group (an equality on the key), the order of the
        // index `tasks_key_pending`: spelled with the key so the planner
        // walks that index, not the claim index filtering on the key
        // (which steps over every other key's backlog).
        let order = "ORDER BY concurrency_key, priority, run_at, id";
        // One round trip: the queue's row (`q`: paused as 1, the cursor),
        // its running tasks per key (`r`), its best due priority (`b`) and
        // the heads (`h`) of the group without a key and of the keys with
        // running tasks; the other keys' heads come from the walk below.
        // The casts to int8 stay outside the ordered selects: inside, the
        // ORDER BY would sort by the cast expression instead of walking an
        // index (a sort of every key's backlog).
        let head = format!(
            "(SELECT priority FROM {t} WHERE {due} AND concurrency_key = k.k {order} LIMIT 1)::int8"
        );
        let rows = self
            .q(&format!(
                "SELECT 'q', fair_cursor, paused::int4::int8 FROM {q} WHERE name = $1 \
                 UNION ALL \
                 SELECT 'r', concurrency_key, count(*) FROM {t} \
                     WHERE state = 'running' AND queue = $1 GROUP BY concurrency_key \
                 UNION ALL \
                 SELECT 'b', NULL, (SELECT priority FROM {t} WHERE {due} \
                     ORDER BY priority, run_at, id LIMIT 1)::int8 \
                 UNION ALL \
                 SELECT 'h', NULL, (SELECT priority FROM {t} \
                     WHERE {due} AND concurrency_key IS NULL {order} LIMIT 1)::int8 \
                 UNION ALL \
                 SELECT 'h', k.k, {head} FROM (SELECT DISTINCT concurrency_key AS k FROM {t} \
                     WHERE state = 'running' AND queue = $1 AND concurrency_key IS NOT NULL) AS k"
            ))
            .bind(req.queue)
            .fetch_all(&mut *tx)
            .await?;
        let (mut cursor, mut running, mut heads, mut best) = (None, Vec::new(), Vec::new(), None);
        for r in &rows {
            let (tag, key, n): (String, Option<String>, Option<i64>) =
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
            let priority = || {
                n.map(|n| {
                    i32::try_from(n)
                        .map_err(|_| StoreError::Corrupt(format!("task priority {n} out of range")))
                })
                .transpose()
            };
            match tag.as_str() {
                "q" if n != Some(0) => return Ok(Vec::new()),
                "q" => cursor = key,
                "r" => running.push((key, n.unwrap_or(0))),
                "b" => best = priority()?,
                _ => {
                    if let Some(priority) = priority()? {
                        heads.push(Head { key, priority });
                    }
                }
            }
        }
        let Some(best) = best else {
            return Ok(Vec::new());
        };
        let running = Running::from_rows(running);
        // The keys in rotation order, a page at a time (a loose index scan
        // over the distinct keys of the pending tasks, on
        // `tasks_key_pending`), until enough are found.
        // Part 1: at most $3 keys after $2; part 2 (the wrap): at most $4
        // keys from the first.
        let page = format!(
            "WITH RECURSIVE k(k, n, part) AS ( \
                 (SELECT concurrency_key, 1, 1 FROM {t} WHERE state = 'pending' \
                     AND queue = $1 AND concurrency_key > $2 \
                     ORDER BY concurrency_key LIMIT 1) \
                 UNION ALL \
                 (SELECT concurrency_key, 1, 2 FROM {t} WHERE state = 'pending' \
                     AND queue = $1 AND concurrency_key IS NOT NULL AND $4 > 0 \
                     ORDER BY concurrency_key LIMIT 1) \
                 UNION ALL \
                 SELECT (SELECT concurrency_key FROM {t} WHERE state = 'pending' \
                         AND queue = $1 AND concurrency_key > k.k \
                         ORDER BY concurrency_key LIMIT 1), n + 1, part \
                 FROM k WHERE k.k IS NOT NULL \
                     AND n < CASE part WHEN 1 THEN $3 ELSE $4 END) \
             SELECT k.k, {head}, part FROM k WHERE k.k IS NOT NULL ORDER BY part, n"
        );
        let mut walk = KeyWalk::new(req, &running, cursor.as_deref(), best, &heads);
        while let Some((from, n, wrap)) = walk.next_page() {
            let (mut after, mut first) = (Vec::new(), Vec::new());
            for r in self
                .q(&page)
                .bind(req.queue)
                .bind(from)
                .bind(i64::from(n))
                .bind(i64::from(wrap))
                .fetch_all(&mut *tx)
                .await?
            {
                let p: Option<i64> = r.try_get(1)?;
                let row = (r.try_get(0)?, p.and_then(|p| i32::try_from(p).ok()));
                match r.try_get::<i32, _>(2)? {
                    1 => after.push(row),
                    _ => first.push(row),
                }
            }
            walk.take(after, first, &mut heads, &running);
        }
        let chosen = fair::choose(req, &heads, &running, cursor.as_deref());
        if chosen.is_empty() {
            return Ok(Vec::new());
        }
        let (mut keys, mut takes, mut no_key) = (Vec::new(), Vec::new(), 0i64);
        for c in &chosen {
            match &c.key {
                Some(k) => {
                    keys.push(k.as_str());
                    takes.push(i64::from(c.take));
                }
                None => no_key = i64::from(c.take),
            }
        }
        let cols = "id, concurrency_key, priority, attempt, max_attempts, run_at";
        let candidates = self
            .q(&format!(
                "SELECT * FROM ( \
                     SELECT c.* FROM unnest($2::text[], $3::int8[]) AS g(k, m) \
                         CROSS JOIN LATERAL (SELECT {cols} FROM {t} \
                             WHERE {due} AND concurrency_key = g.k {order} LIMIT g.m) AS c \
                     UNION ALL \
                     (SELECT {cols} FROM {t} WHERE {due} AND concurrency_key IS NULL \
                         {order} LIMIT $4)) AS c \
                 ORDER BY concurrency_key NULLS FIRST, priority, run_at, id"
            ))
            .bind(req.queue)
            .bind(&keys)
            .bind(&takes)
            .bind(no_key)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| {
                Ok(Candidate {
                    id: r.try_get(0)?,
                    key: r.try_get(1)?,
                    priority: r.try_get(2)?,
                    attempt: r.try_get(3)?,
                    max_attempts: r.try_get(4)?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let plan = fair::pick(req, &candidates, &running, cursor.as_deref());
        let Some(cursor) = plan.cursor else {
            return Ok(Vec::new());
        };
        // The claim and the cursor's move, in one statement.
        let rows = self
            .q(&format!(
                "WITH c AS (INSERT INTO {q} (name, fair_cursor) VALUES ($1, $5) \
                     ON CONFLICT (name) DO UPDATE SET fair_cursor = excluded.fair_cursor) \
                 UPDATE {t} SET state = 'running', attempt = attempt + 1, started_at = {now}, \
                     lease_until = {now} + $3 * interval '1 millisecond', worker = $2, \
                     claim_token = greatest(claim_token + 1, {now_us}) \
                 WHERE id = ANY($4::int8[]) AND state = 'pending' AND queue = $1 \
                 RETURNING {CLAIM_COLS}"
            ))
            .bind(req.queue)
            .bind(req.worker)
            .bind(dur(req.lease))
            .bind(&plan.ids)
            .bind(cursor)
            .fetch_all(&mut *tx)
            .await?;
        let tasks = rows.iter().map(claimed_task).collect::<Result<_, _>>()?;
        Ok(fair::in_plan_order(tasks, &plan.ids))
    }
}
