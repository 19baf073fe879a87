//! The queue's maintenance and inspection on MySQL: rescue, retry,
//! listing, stats.

use sqlx::Row;

use super::rows::attempt_of;
use super::{marks, MyBackend};
use crate::error::StoreError;
use crate::store::sql_row::{self, task_info, SqlRow, TASK_COLS};
use crate::store::task_search::{self, SearchArg, SearchDialect};
use crate::store::{QueueStats, Rescued, TaskFilter, TaskInfo, Wake, LEASE_EXPIRED};

/// Expired leases rescued per transaction.
const RESCUE_BATCH: usize = 1000;

/// Rescue in batches: lock expired running rows (`SKIP LOCKED`: a row
/// locked right now is being finished or heartbeated, and the next pass
/// sees it), move them on as the state table says, count by outcome.
pub(super) async fn task_rescue_many(b: &MyBackend) -> Result<Rescued, StoreError> {
    let (append_error, now) = (&b.names.append_error, &b.names.now);
    let t = &b.names.tasks;
    let mut total = Rescued::default();
    let mut wakes: Vec<Wake> = Vec::new();
    loop {
        let mut tx = b.begin().await?;
        let rows = sqlx::query(&format!(
            "SELECT id, queue, cancel_requested, attempt, max_attempts FROM {t} \
             WHERE state = 'running' AND lease_until < {now} \
             ORDER BY lease_until LIMIT {RESCUE_BATCH} FOR UPDATE SKIP LOCKED"
        ))
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            tx.rollback().await?;
            break;
        }
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            ids.push(row.try_get::<i64, _>("id")?);
            let cancel: bool = row.try_get("cancel_requested")?;
            if cancel {
                total.cancelled += 1;
            } else if attempt_of(row, "attempt")? >= attempt_of(row, "max_attempts")? {
                total.failed += 1;
            } else {
                total.requeued += 1;
                let q = row.text("queue")?;
                if !wakes.iter().any(|w| w.queue == q) {
                    wakes.push(Wake::now(q));
                }
            }
        }
        // `state` is assigned last: the other assignments read the row
        // as it was (MySQL assigns left to right).
        let sql = format!(
            "UPDATE {t} SET \
                 finished_at = CASE WHEN cancel_requested = 1 OR attempt >= max_attempts \
                     THEN {now} END, \
                 lease_until = NULL, last_error = ?, errors = {append_error}, \
                 state = CASE WHEN cancel_requested = 1 THEN 'cancelled' \
                              WHEN attempt >= max_attempts THEN 'failed' \
                              ELSE 'pending' END \
             WHERE id IN ({})",
            marks(ids.len())
        );
        let mut u = sqlx::query(&sql).bind(LEASE_EXPIRED).bind(LEASE_EXPIRED);
        for id in &ids {
            u = u.bind(id);
        }
        u.execute(&mut *tx).await?;
        tx.commit().await?;
        if rows.len() < RESCUE_BATCH {
            break;
        }
    }
    b.announce(wakes);
    Ok(total)
}

pub(super) async fn task_retry(b: &MyBackend, id: i64) -> Result<bool, StoreError> {
    let now = &b.names.now;
    let t = &b.names.tasks;
    // `state` last: `max_attempts` reads `attempt`, which stays.
    let r = sqlx::query(&format!(
        "UPDATE {t} SET run_at = {now}, finished_at = NULL, lease_until = NULL, \
             cancel_requested = 0, max_attempts = GREATEST(max_attempts, attempt + 1), \
             state = 'pending' \
         WHERE id = ? AND state IN ('failed', 'cancelled')"
    ))
    .bind(id)
    .execute(&b.pool)
    .await
    .map_err(|e| match StoreError::from(e) {
        StoreError::Conflict(_) => StoreError::Conflict(format!(
            "task {id}: its unique key is taken by another unfinished task"
        )),
        other => other,
    })?;
    if r.rows_affected() != 1 {
        return Ok(false);
    }
    let queue: Option<Vec<u8>> = sqlx::query_scalar(&format!("SELECT queue FROM {t} WHERE id = ?"))
        .bind(id)
        .fetch_optional(&b.pool)
        .await?;
    if let Some(q) = queue.and_then(|q| String::from_utf8(q).ok()) {
        b.announce(vec![Wake::now(q)]);
    }
    Ok(true)
}

/// MySQL's spelling of a task search (the payload is `utf8mb4_bin` text, so
/// `LOCATE` is case-sensitive, as on the other stores).
struct Search;

impl SearchDialect for Search {
    fn ph(_: usize) -> String {
        "?".into()
    }
    fn contains(col: &str, p: &str) -> String {
        format!("LOCATE({p}, {col}) > 0")
    }
    fn ends_with(col: &str, p: &str, q: &str) -> String {
        format!("RIGHT({col}, LENGTH({p})) = {q}")
    }
}

/// A page of tasks, or (with `id`) the one task.
pub(super) async fn task_list(
    b: &MyBackend,
    filter: &TaskFilter,
    id: Option<i64>,
) -> Result<Vec<TaskInfo>, StoreError> {
    let (mut wh, args) = task_search::where_clause::<Search>(filter);
    if id.is_some() {
        wh = if wh.is_empty() {
            "WHERE id = ?".into()
        } else {
            format!("WHERE id = ? AND {}", &wh["WHERE ".len()..])
        };
    }
    let limit = task_search::page_size(filter);
    let sql = format!(
        "SELECT {TASK_COLS} FROM {} {wh} ORDER BY id DESC LIMIT {limit}",
        b.names.tasks
    );
    let mut q = sqlx::query(&sql);
    if let Some(id) = id {
        q = q.bind(id);
    }
    for a in args {
        q = match a {
            SearchArg::Text(v) => q.bind(v),
            SearchArg::Int(v) => q.bind(v),
            SearchArg::Time(t) => q.bind(t),
        };
    }
    let rows = q.fetch_all(&b.pool).await?;
    rows.iter().map(task_info).collect()
}

pub(super) async fn queue_stats(b: &MyBackend) -> Result<Vec<QueueStats>, StoreError> {
    let now = &b.names.now;
    let rows = sqlx::query(&format!(
        "SELECT queue, \
             CAST(SUM(state = 'pending') AS SIGNED) AS pending, \
             CAST(SUM(state = 'running') AS SIGNED) AS running, \
             CAST(SUM(state = 'succeeded') AS SIGNED) AS succeeded, \
             CAST(SUM(state = 'failed') AS SIGNED) AS failed, \
             CAST(SUM(state = 'cancelled') AS SIGNED) AS cancelled, \
             CAST(TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN state = 'pending' \
                 AND run_at <= {now} THEN run_at END), {now}) DIV 1000 \
                 AS SIGNED) AS oldest_ms \
         FROM {} GROUP BY queue ORDER BY queue",
        b.names.tasks
    ))
    .fetch_all(&b.pool)
    .await?;
    let mut out = rows
        .iter()
        .map(sql_row::queue_stats)
        .collect::<Result<Vec<_>, _>>()?;
    let paused = sqlx::query(&format!(
        "SELECT queue AS name, paused, pause_note, pause_by, pause_at FROM {} \
         WHERE paused = 1 OR pause_at IS NOT NULL ORDER BY queue",
        b.names.queues
    ))
    .fetch_all(&b.pool)
    .await?
    .iter()
    .map(sql_row::queue_row)
    .collect::<Result<Vec<_>, _>>()?;
    crate::store::mark_paused(&mut out, paused);
    Ok(out)
}
