//! The one insert of tasks (enqueue, a schedule slot's task, and
//! [`enqueue_in`], the transactional outbox).

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::sql::InsertSql;
use super::{dur, Names};
use crate::error::StoreError;
use crate::store::{Enqueued, KeySeen, KeyTx, NewTask, RunAt, UniqueHold};

/// Rows per `INSERT … SELECT FROM UNNEST(…)` statement when enqueueing.
pub(super) const INSERT_CHUNK: usize = 10_000;

/// Enqueue tasks on the caller's connection, typically inside the caller's
/// own transaction (the transactional outbox): the tasks, and the
/// notification that wakes workers, become visible at the caller's commit
/// and vanish with a rollback.
///
/// `prefix` must be the table prefix the store was opened with (`None` for
/// the default `baton_`). Unique keys behave as in [`crate::store::Backend::task_insert_many`].
/// Under `REPEATABLE READ` or `SERIALIZABLE` a key taken by a concurrent
/// transaction may surface as [`StoreError::Conflict`].
pub async fn enqueue_in(
    conn: &mut PgConnection,
    prefix: Option<&str>,
    tasks: &[NewTask],
) -> Result<Vec<Enqueued>, StoreError> {
    if let Some(p) = prefix {
        crate::store::validate_prefix(p)?;
    }
    let names = Names::new(prefix);
    insert_tasks(conn, &InsertSql::new(&names), &names.chan, tasks, None).await
}

/// Insert tasks in order on `conn` (the shared code of [`enqueue_in`],
/// [`crate::store::Backend::task_insert_many`] and [`crate::store::Backend::job_advance`]). With `skipped`, the
/// tasks are inserted directly as `cancelled` with that reason.
///
/// Returns one [`Enqueued`] per task. Due work is announced by the insert
/// statement itself. A task with a debounce or throttle
/// (`NewTask::key_policy`) is decided by `store::enqueue_keyed`, on the
/// same connection (the caller's transaction).
pub(super) async fn insert_tasks(
    conn: &mut PgConnection,
    sql: &InsertSql,
    chan: &str,
    tasks: &[NewTask],
    skipped: Option<&str>,
) -> Result<Vec<Enqueued>, StoreError> {
    if tasks.iter().all(|t| t.key_policy.is_none()) {
        return insert_plain(conn, sql, chan, tasks, skipped).await;
    }
    if skipped.is_some() {
        return Err(StoreError::Config(
            "a skipped slot's task cannot be debounced or throttled".into(),
        ));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        let mut tx = KeyedTx {
            conn: &mut *conn,
            sql,
            chan,
        };
        out.push(if task.key_policy.is_some() {
            crate::store::enqueue_keyed(&mut tx, task).await?
        } else {
            tx.key_insert(task).await?
        });
    }
    Ok(out)
}

/// One task of a batch with policies, on the batch's connection.
struct KeyedTx<'a> {
    conn: &'a mut PgConnection,
    sql: &'a InsertSql,
    chan: &'a str,
}

#[async_trait::async_trait]
impl KeyTx for KeyedTx<'_> {
    async fn key_seen(&mut self, key: &str) -> Result<KeySeen, StoreError> {
        let r = sqlx::query(&self.sql.key_seen)
            .persistent(self.sql.persistent)
            .bind(key)
            .fetch_one(&mut *self.conn)
            .await?;
        KeySeen::from_columns(
            (r.try_get(0)?, r.try_get::<Option<String>, _>(1)?.as_deref()),
            (r.try_get(2)?, r.try_get(3)?),
            r.try_get(4)?,
        )
    }

    async fn key_hand_over(&mut self, id: i64) -> Result<(), StoreError> {
        sqlx::query(&self.sql.key_hand_over)
            .persistent(self.sql.persistent)
            .bind(id)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn key_replace(
        &mut self,
        id: i64,
        task: &NewTask,
        run_at_ms: i64,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query(&self.sql.key_replace)
            .persistent(self.sql.persistent)
            .bind(id)
            .bind(&task.payload)
            .bind(task.priority)
            .bind(run_at_ms)
            .bind(self.chan)
            .fetch_optional(&mut *self.conn)
            .await?
            .is_some())
    }

    async fn key_insert(&mut self, task: &NewTask) -> Result<Enqueued, StoreError> {
        insert_plain(
            self.conn,
            self.sql,
            self.chan,
            std::slice::from_ref(task),
            None,
        )
        .await?
        .pop()
        .ok_or_else(|| StoreError::Backend("insert returned no result".into()))
    }
}

/// [`insert_tasks`] for tasks without a policy.
async fn insert_plain(
    conn: &mut PgConnection,
    sql: &InsertSql,
    chan: &str,
    tasks: &[NewTask],
    skipped: Option<&str>,
) -> Result<Vec<Enqueued>, StoreError> {
    let mut out: Vec<Option<Enqueued>> = vec![None; tasks.len()];
    // Indices still to insert; a second round only happens when a key's
    // holder finished between our conflict and our look-up.
    let mut todo: Vec<usize> = (0..tasks.len()).collect();
    // A slot whose task was pruned keeps its key in a tombstone: answered
    // with the pruned task's id, not inserted again (checked once, after
    // the insert, below).
    let slot_keys: Vec<&str> = tasks
        .iter()
        .filter(|t| crate::store::tombstoned_kind(t))
        .filter_map(|t| t.unique_key.as_deref())
        .collect();
    for _round in 0..8 {
        if todo.is_empty() {
            break;
        }
        let mut conflicted: Vec<usize> = Vec::new();
        for chunk in todo.chunks(INSERT_CHUNK) {
            let mut queue = Vec::with_capacity(chunk.len());
            let mut kind = Vec::with_capacity(chunk.len());
            let mut payload = Vec::with_capacity(chunk.len());
            let mut priority = Vec::with_capacity(chunk.len());
            let mut run_at_abs: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(chunk.len());
            let mut delay_ms: Vec<Option<i64>> = Vec::with_capacity(chunk.len());
            let mut max_attempts = Vec::with_capacity(chunk.len());
            let mut timeout_ms: Vec<Option<i64>> = Vec::with_capacity(chunk.len());
            let mut unique_key: Vec<Option<&str>> = Vec::with_capacity(chunk.len());
            let mut unique_forever = Vec::with_capacity(chunk.len());
            let mut unique_until_failed = Vec::with_capacity(chunk.len());
            let mut job: Vec<Option<&str>> = Vec::with_capacity(chunk.len());
            let mut slot: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(chunk.len());
            let mut traceparent: Vec<Option<&str>> = Vec::with_capacity(chunk.len());
            let mut concurrency_key: Vec<Option<&str>> = Vec::with_capacity(chunk.len());
            for &i in chunk {
                let t = &tasks[i];
                queue.push(t.queue.as_str());
                kind.push(t.kind.as_str());
                payload.push(&t.payload);
                priority.push(t.priority);
                match t.run_at {
                    RunAt::Now => {
                        run_at_abs.push(None);
                        delay_ms.push(None);
                    }
                    RunAt::Delay(d) => {
                        run_at_abs.push(None);
                        delay_ms.push(Some(dur(d)));
                    }
                    RunAt::At(at) => {
                        run_at_abs.push(Some(at));
                        delay_ms.push(None);
                    }
                }
                max_attempts.push(i32::try_from(t.max_attempts).unwrap_or(i32::MAX).max(1));
                timeout_ms.push(t.timeout.map(dur));
                unique_key.push(t.unique_key.as_deref());
                unique_forever.push(t.unique_hold == UniqueHold::Forever);
                unique_until_failed.push(t.unique_hold == UniqueHold::UntilFailed);
                job.push(t.job.as_deref());
                slot.push(t.slot);
                traceparent.push(t.traceparent.as_deref());
                concurrency_key.push(t.concurrency_key.as_deref());
            }
            // Speculative insertion (ON CONFLICT) costs, so chunks without
            // keys use a plain INSERT.
            let text = if unique_key.iter().any(Option::is_some) {
                &sql.keyed
            } else {
                &sql.plain
            };
            let rows = sqlx::query(text)
                .persistent(sql.persistent)
                .persistent(sql.persistent)
                .bind(&queue)
                .bind(&kind)
                .bind(&payload)
                .bind(&priority)
                .bind(&run_at_abs)
                .bind(&delay_ms)
                .bind(&max_attempts)
                .bind(&timeout_ms)
                .bind(&unique_key)
                .bind(&unique_forever)
                .bind(&unique_until_failed)
                .bind(&job)
                .bind(&slot)
                .bind(&traceparent)
                .bind(&concurrency_key)
                .bind(skipped.is_some())
                .bind(skipped)
                .bind(chan)
                .fetch_all(&mut *conn)
                .await?;
            if rows.len() != chunk.len() {
                return Err(StoreError::Corrupt(format!(
                    "enqueue: {} rows back for {} tasks",
                    rows.len(),
                    chunk.len()
                )));
            }
            for (row, &i) in rows.iter().zip(chunk) {
                let id: i64 = row.try_get(0)?;
                let inserted: bool = row.try_get(1)?;
                if inserted {
                    out[i] = Some(Enqueued::new(id));
                } else {
                    conflicted.push(i);
                }
            }
        }
        todo.clear();
        if conflicted.is_empty() {
            break;
        }
        // Conflicts: find the tasks that hold the keys (a new statement, so a
        // new snapshot that sees the committed holder under READ COMMITTED).
        let keys: Vec<&str> = conflicted
            .iter()
            .filter_map(|&i| tasks[i].unique_key.as_deref())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let rows = sqlx::query(&sql.key_holders)
            .persistent(sql.persistent)
            .bind(&keys)
            .fetch_all(&mut *conn)
            .await?;
        let mut holders: HashMap<String, i64> = HashMap::with_capacity(rows.len());
        for row in rows {
            holders.insert(row.try_get(0)?, row.try_get(1)?);
        }
        for i in conflicted {
            match tasks[i].unique_key.as_deref().and_then(|k| holders.get(k)) {
                Some(&id) => out[i] = Some(Enqueued::existing(id)),
                None => todo.push(i),
            }
        }
    }
    if !todo.is_empty() {
        return Err(StoreError::Conflict(
            "enqueue: unique keys kept changing hands; try again".into(),
        ));
    }
    if !slot_keys.is_empty() {
        // The slot keys with a tombstone: their inserts are taken back and
        // answered with the pruned task's id. Checked after the insert, so
        // a prune that committed while the insert waited on its row is seen
        // too (a new statement, READ COMMITTED); one round trip, and only
        // for a batch that holds slot tasks.
        let rows = sqlx::query(&sql.tombstones)
            .persistent(sql.persistent)
            .bind(&slot_keys)
            .fetch_all(&mut *conn)
            .await?;
        let mut undo = Vec::new();
        for row in rows {
            let key: String = row.try_get(0)?;
            let old: i64 = row.try_get(1)?;
            for (i, t) in tasks.iter().enumerate() {
                let hit = crate::store::tombstoned_kind(t)
                    && t.unique_key.as_deref() == Some(key.as_str());
                if let (true, Some(e)) = (hit, out[i].as_mut()) {
                    if e.inserted {
                        undo.push(e.id);
                        *e = Enqueued::existing(old);
                    }
                }
            }
        }
        if !undo.is_empty() {
            sqlx::query(&sql.delete_ids)
                .persistent(sql.persistent)
                .bind(&undo)
                .execute(&mut *conn)
                .await?;
        }
    }
    let out = out
        .into_iter()
        .map(|e| e.ok_or_else(|| StoreError::Corrupt("enqueue: task without result".into())))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(out)
}
