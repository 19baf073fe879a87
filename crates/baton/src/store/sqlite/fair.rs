//! The fair claim of the SQLite backend (`TaskClaim::fair`, planned by
//! `store::fair`): inside one `BEGIN IMMEDIATE` transaction (so no other
//! claim interleaves), it reads the queue's paused flag and cursor, its
//! running tasks per key, its best due priority, the heads of the group
//! without a key and of the keys running, the other keys' heads in
//! rotation order until enough are found (`fair::KeyWalk`: a loose index
//! scan over the distinct keys of the pending tasks, on
//! `tasks_key_pending`), the first tasks of the chosen keys, then claims
//! the planned ones and moves the cursor.

use sqlx::sqlite::SqliteConnection;
use sqlx::Row;

use super::rows::claim_answer as claim_answer_row;
use super::sql::{claim_answer, claim_update, spare_params, CLAIMED_RESET};
use super::{SqliteBackend, NOW};
use crate::error::StoreError;
use crate::store::fair::{self, Candidate, Head, KeyWalk, Running};
use crate::store::{ms, Task, TaskClaim};

/// The pick of the planned ids (`?4`, a JSON array) still pending in
/// queue `?1`, into the connection's `temp.baton_claimed`. Only the
/// primary key can serve it (`+` makes the state and queue terms
/// unindexable): SQLite took `tasks_key_pending` on the queue and walked
/// its whole backlog for the ids (22 ms a fair claim behind 100,000 tasks,
/// against under 1 ms by id).
pub(super) fn pick_sql(t: &str) -> String {
    format!(
        "INSERT OR IGNORE INTO temp.baton_claimed (id) SELECT id FROM {t} \
         WHERE id IN (SELECT value FROM json_each(?4)) AND +state = 'pending' \
             AND +queue = ?1"
    )
}

/// The claim of the planned ids (`?4`) in queue `?1` by worker `?2` with
/// a lease of `?3` ms, answered in one row as every SQLite claim is
/// ([`super::sql::ClaimSql`]), with `started_us`: the claim's start (one
/// statement's clock, the same for every task it claimed).
fn claim_sql(t: &str) -> String {
    format!(
        "{CLAIMED_RESET}; {}; {}; {}",
        pick_sql(t),
        claim_update(t),
        claim_answer(t, ", max(started_at) * 1000 AS started_us")
    )
}

/// Claim `ids` (a JSON array) for `req` on `tx` with [`claim_sql`]: the
/// tasks, and their start (µs; `None` when none was claimed).
pub(super) async fn claim_ids(
    tx: &mut SqliteConnection,
    t: &str,
    req: &TaskClaim<'_>,
    ids: String,
) -> Result<(Vec<Task>, Option<i64>), StoreError> {
    let sql = claim_sql(t);
    let q = sqlx::query(&sql)
        .bind(req.queue)
        .bind(req.worker)
        .bind(ms(req.lease))
        .bind(ids);
    let rows = spare_params(q).fetch_all(&mut *tx).await?;
    let [row] = rows.as_slice() else {
        return Err(StoreError::Backend(format!(
            "a claim answered {} rows, not one",
            rows.len()
        )));
    };
    Ok((
        claim_answer_row(row, req.queue)?,
        row.try_get("started_us")?,
    ))
}

impl SqliteBackend {
    /// A fair claim on `tx`, a connection inside `BEGIN IMMEDIATE`.
    pub(super) async fn claim_fair(
        &self,
        tx: &mut SqliteConnection,
        req: &TaskClaim<'_>,
    ) -> Result<Vec<Task>, StoreError> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let (t, q) = (&self.t.tasks, &self.t.queues);
        let queue_row = sqlx::query(&format!(
            "SELECT paused, fair_cursor FROM {q} WHERE name = ?1"
        ))
        .bind(req.queue)
        .fetch_optional(&mut *tx)
        .await?;
        let cursor: Option<String> = match queue_row {
            Some(row) if row.try_get::<bool, _>(0)? => return Ok(Vec::new()),
            Some(row) => row.try_get(1)?,
            None => None,
        };
        let running = Running::from_rows(
            sqlx::query(&format!(
                "SELECT concurrency_key, count(*) FROM {t} \
                 WHERE state = 'running' AND queue = ?1 GROUP BY concurrency_key"
            ))
            .bind(req.queue)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<Vec<_>, StoreError>>()?,
        );
        let due = format!(
            "state = 'pending' AND queue = ?1 AND run_at <= {NOW} AND NOT cancel_requested"
        );
        // Within one group (an equality on the key), the order of the
        // index `tasks_key_pending`, spelled with the key so the planner
        // walks that index.
        let order = "ORDER BY concurrency_key, priority, run_at, id";
        let head = format!(
            "(SELECT priority FROM {t} WHERE {due} AND concurrency_key = k.k {order} LIMIT 1)"
        );
        // The queue's best due priority (on the claim index).
        let best: Option<i32> = sqlx::query_scalar(&format!(
            "SELECT priority FROM {t} WHERE {due} ORDER BY priority, run_at, id LIMIT 1"
        ))
        .bind(req.queue)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(best) = best else {
            return Ok(Vec::new());
        };
        // The heads of the group without a key and of the keys with
        // running tasks; the other keys' heads come from the walk below.
        let mut heads: Vec<Head> = sqlx::query(&format!(
            "SELECT NULL, (SELECT priority FROM {t} WHERE {due} AND concurrency_key IS NULL \
                 {order} LIMIT 1) \
             UNION ALL \
             SELECT k.k, {head} FROM (SELECT DISTINCT concurrency_key AS k FROM {t} \
                 WHERE state = 'running' AND queue = ?1 AND concurrency_key IS NOT NULL) AS k"
        ))
        .bind(req.queue)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .filter_map(|r| match r.try_get::<Option<i32>, _>(1) {
            Ok(Some(priority)) => Some(r.try_get(0).map(|key| Head { key, priority })),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        })
        .collect::<Result<Vec<_>, _>>()?;
        // The keys in rotation order, a page at a time (a loose index scan
        // over the distinct keys of the pending tasks, on
        // `tasks_key_pending`), until enough are found.
        let page = format!(
            "WITH RECURSIVE k(k, n) AS ( \
                 SELECT (SELECT concurrency_key FROM {t} WHERE state = 'pending' AND queue = ?1 \
                     AND concurrency_key > ?2 ORDER BY concurrency_key LIMIT 1), 1 \
                 UNION ALL \
                 SELECT (SELECT concurrency_key FROM {t} WHERE state = 'pending' \
                         AND queue = ?1 AND concurrency_key > k.k \
                         ORDER BY concurrency_key LIMIT 1), n + 1 \
                 FROM k WHERE k.k IS NOT NULL AND n < ?3) \
             SELECT k.k, {head} FROM k WHERE k.k IS NOT NULL ORDER BY n"
        );
        let mut walk = KeyWalk::new(req, &running, cursor.as_deref(), best, &heads);
        while let Some((from, n, wrap)) = walk.next_page() {
            let mut read = async |from: &str, n: u32| -> Result<Vec<_>, StoreError> {
                if n == 0 {
                    return Ok(Vec::new());
                }
                sqlx::query(&page)
                    .bind(req.queue)
                    .bind(from)
                    .bind(i64::from(n))
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                    .collect()
            };
            let after = read(from, n).await?;
            let first = read(fair::NO_KEY, wrap).await?;
            walk.take(after, first, &mut heads, &running);
        }
        let chosen = fair::choose(req, &heads, &running, cursor.as_deref());
        let mut candidates = Vec::new();
        for c in &chosen {
            let group = if c.key.is_some() {
                "concurrency_key = ?2"
            } else {
                "concurrency_key IS NULL"
            };
            let rows = sqlx::query(&format!(
                "SELECT id, concurrency_key, priority, attempt, max_attempts FROM {t} \
                 WHERE {due} AND {group} {order} LIMIT ?3"
            ))
            .bind(req.queue)
            .bind(c.key.as_deref())
            .bind(i64::from(c.take))
            .fetch_all(&mut *tx)
            .await?;
            for r in &rows {
                candidates.push(Candidate {
                    id: r.try_get(0)?,
                    key: r.try_get(1)?,
                    priority: r.try_get(2)?,
                    attempt: r.try_get(3)?,
                    max_attempts: r.try_get(4)?,
                });
            }
        }
        let plan = fair::pick(req, &candidates, &running, cursor.as_deref());
        let Some(cursor) = plan.cursor else {
            return Ok(Vec::new());
        };
        let ids = serde_json::Value::from(plan.ids.clone()).to_string();
        let (tasks, _) = claim_ids(tx, t, req, ids).await?;
        sqlx::query(&format!(
            "INSERT INTO {q} (name, fair_cursor) VALUES (?1, ?2) \
             ON CONFLICT (name) DO UPDATE SET fair_cursor = excluded.fair_cursor"
        ))
        .bind(req.queue)
        .bind(cursor)
        .execute(&mut *tx)
        .await?;
        Ok(fair::in_plan_order(tasks, &plan.ids))
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Row;

    use super::{pick_sql, SqliteBackend, CLAIMED_RESET};
    use crate::store::{Backend, StoreOptions};

    /// The claim's pick finds its rows by id, so its cost does not
    /// grow with the queue's backlog (mutation: without the `+` SQLite
    /// plans it on `tasks_key_pending`).
    #[tokio::test]
    async fn the_claim_pick_takes_its_rows_by_id() {
        let b = SqliteBackend::connect("sqlite::memory:", &StoreOptions::default())
            .await
            .unwrap();
        b.migrate().await.unwrap();
        sqlx::raw_sql(CLAIMED_RESET)
            .execute(&*b.pool)
            .await
            .unwrap();
        let plan: Vec<String> =
            sqlx::query(&format!("EXPLAIN QUERY PLAN {}", pick_sql(&b.t.tasks)))
                .bind("q")
                .bind("w")
                .bind(1000_i64)
                .bind("[1, 2]")
                .fetch_all(&*b.pool)
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<String, _>("detail"))
                .collect();
        assert!(
            plan.iter().any(|d| d.contains("INTEGER PRIMARY KEY"))
                && !plan.iter().any(|d| d.contains("key_pending")),
            "{plan:?}"
        );
    }
}
