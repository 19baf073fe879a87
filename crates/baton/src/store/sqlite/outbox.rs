//! The one insert of tasks (enqueue, a schedule slot's task, and
//! [`enqueue_in`], the transactional outbox).

use std::collections::HashMap;

use sqlx::sqlite::SqliteConnection;
use sqlx::Row;

use super::rows::json_text;
use super::sql::InsertSql;
use super::Tables;
use crate::error::StoreError;
use crate::store::{ms, Enqueued, KeySeen, KeyTx, NewTask, RunAt, UniqueHold};

/// Rows per multi-row `INSERT` (18 bound values each, well inside SQLite's
/// limit of 32766 variables per statement).
const INSERT_CHUNK: usize = 1000;

/// What inserting tasks produced: one result per task, plus the inserted
/// tasks already due and those due later with their `run_at` (for wake-ups).
pub(super) struct Inserted {
    pub results: Vec<Enqueued>,
    pub due_queues: Vec<usize>,
    pub later: Vec<(usize, i64)>,
}

/// Insert `tasks` in order on `conn`, which the caller has put inside a
/// transaction. Tasks without a unique key are always inserted; a task whose
/// key is taken yields the holder's id with `inserted = false`, and so does
/// a slot's task whose slot was pruned (its tombstone keeps the key). With
/// `skipped`, the tasks are born `cancelled` with that reason (a skipped
/// schedule slot, `state::Op::AdvanceSkip`), else `pending`. A task with
/// a debounce or throttle (`NewTask::key_policy`) is decided by
/// `store::enqueue_keyed` in the same transaction.
pub(super) async fn insert_tasks(
    conn: &mut SqliteConnection,
    sql: &InsertSql,
    tasks: &[NewTask],
    skipped: Option<&str>,
) -> Result<Inserted, StoreError> {
    if tasks.iter().all(|t| t.key_policy.is_none()) {
        return insert_plain(conn, sql, tasks, skipped).await;
    }
    if skipped.is_some() {
        return Err(StoreError::Config(
            "a skipped slot's task cannot be debounced or throttled".into(),
        ));
    }
    let mut out = Inserted {
        results: Vec::with_capacity(tasks.len()),
        due_queues: Vec::new(),
        later: Vec::new(),
    };
    for (i, task) in tasks.iter().enumerate() {
        let mut tx = KeyedTx {
            conn: &mut *conn,
            sql,
            due: false,
            later: None,
        };
        let e = if task.key_policy.is_some() {
            crate::store::enqueue_keyed(&mut tx, task).await?
        } else {
            tx.key_insert(task).await?
        };
        if tx.due {
            out.due_queues.push(i);
        }
        if let Some(at) = tx.later {
            out.later.push((i, at));
        }
        out.results.push(e);
    }
    Ok(out)
}

/// One task of a batch with policies, on the batch's transaction, with
/// its wake-up.
struct KeyedTx<'a> {
    conn: &'a mut SqliteConnection,
    sql: &'a InsertSql,
    /// Inserted due now.
    due: bool,
    /// Inserted or debounced, due then (ms).
    later: Option<i64>,
}

#[async_trait::async_trait]
impl crate::store::KeyTx for KeyedTx<'_> {
    async fn key_seen(&mut self, key: &str) -> Result<KeySeen, StoreError> {
        let r = sqlx::query(&self.sql.key_seen)
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
        let done = sqlx::query(&self.sql.key_replace)
            .bind(id)
            .bind(json_text(&task.payload)?)
            .bind(i64::from(task.priority))
            .bind(run_at_ms)
            .fetch_optional(&mut *self.conn)
            .await?
            .is_some();
        if done {
            self.later = Some(run_at_ms);
        }
        Ok(done)
    }

    async fn key_insert(&mut self, task: &NewTask) -> Result<Enqueued, StoreError> {
        let one = insert_plain(self.conn, self.sql, std::slice::from_ref(task), None).await?;
        self.due = !one.due_queues.is_empty();
        self.later = one.later.first().map(|&(_, at)| at);
        one.results
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Backend("insert returned no result".into()))
    }
}

/// [`insert_tasks`] for tasks without a policy.
async fn insert_plain(
    conn: &mut SqliteConnection,
    sql: &InsertSql,
    tasks: &[NewTask],
    skipped: Option<&str>,
) -> Result<Inserted, StoreError> {
    let keys: Vec<&str> = tasks
        .iter()
        .filter(|t| crate::store::tombstoned_kind(t))
        .filter_map(|t| t.unique_key.as_deref())
        .collect();
    if keys.is_empty() {
        return insert_live(conn, sql, tasks, skipped).await;
    }
    let list = serde_json::Value::Array(keys.iter().map(|&k| k.into()).collect());
    let found: HashMap<String, i64> = sqlx::query(&sql.tombstones)
        .bind(json_text(&list)?)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_, StoreError>>()?;
    if found.is_empty() {
        return insert_live(conn, sql, tasks, skipped).await;
    }
    let split = Tombstoned::split(tasks, &found);
    let live = insert_live(conn, sql, &split.rest, skipped).await?;
    Ok(Inserted {
        due_queues: live.due_queues.iter().map(|&i| split.index[i]).collect(),
        later: live
            .later
            .iter()
            .map(|&(i, at)| (split.index[i], at))
            .collect(),
        results: split.merge(live.results)?,
    })
}

/// [`insert_tasks`] without the tombstone check.
async fn insert_live(
    conn: &mut SqliteConnection,
    sql: &InsertSql,
    tasks: &[NewTask],
    skipped: Option<&str>,
) -> Result<Inserted, StoreError> {
    let mut results = Vec::with_capacity(tasks.len());
    let mut due_queues = Vec::new();
    let mut later = Vec::new();
    let mut taken: Vec<(usize, &str)> = Vec::new();
    for (chunk_no, chunk) in tasks.chunks(INSERT_CHUNK).enumerate() {
        let base = chunk_no * INSERT_CHUNK;
        let mut text = String::with_capacity(
            sql.head.len() + chunk.len() * (sql.row.len() + 2) + sql.tail.len(),
        );
        text.push_str(&sql.head);
        for i in 0..chunk.len() {
            if i > 0 {
                text.push_str(", ");
            }
            text.push_str(&sql.row);
        }
        text.push_str(&sql.tail);
        let mut q = sqlx::query(&text);
        for task in chunk {
            let (abs, rel) = match task.run_at {
                RunAt::Now => (None, 0),
                RunAt::Delay(d) => (None, ms(d)),
                RunAt::At(at) => (Some(at.timestamp_millis()), 0),
            };
            q = q
                .bind(task.queue.as_str())
                .bind(task.kind.as_str())
                .bind(json_text(&task.payload)?)
                .bind(skipped)
                .bind(i64::from(task.priority))
                .bind(i64::from(task.max_attempts))
                .bind(task.timeout.map(ms))
                .bind(abs)
                .bind(rel)
                .bind(task.unique_key.as_deref())
                .bind(task.unique_hold == UniqueHold::Forever)
                .bind(task.unique_hold == UniqueHold::UntilFailed)
                .bind(task.job.as_deref())
                .bind(task.slot.map(|s| s.timestamp_millis()))
                .bind(task.traceparent.as_deref())
                .bind(task.concurrency_key.as_deref())
                .bind(skipped)
                .bind(skipped);
        }
        let mut rows: Vec<(i64, Option<String>, bool, i64)> = q
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)))
            .collect::<Result<_, StoreError>>()?;
        // Rows are inserted in VALUES order with rising ids; RETURNING's own
        // order is unspecified, so sort by id and walk both lists together.
        rows.sort_unstable_by_key(|r| r.0);
        let mut next = rows.into_iter().peekable();
        for (i, task) in chunk.iter().enumerate() {
            let inserted = match (&task.unique_key, next.peek()) {
                (None, Some(_)) => true,
                (None, None) => {
                    return Err(StoreError::Backend(
                        "insert returned fewer rows than tasks without a unique key".into(),
                    ))
                }
                (Some(key), Some((_, Some(got), _, _))) => got == key,
                (Some(_), _) => false,
            };
            if inserted {
                let Some((id, _, due, run_at)) = next.next() else {
                    return Err(StoreError::Backend("insert result vanished".into()));
                };
                if due {
                    due_queues.push(base + i);
                } else {
                    later.push((base + i, run_at));
                }
                results.push(Enqueued::new(id));
            } else {
                // The key is taken: by an existing task, or by an earlier
                // task of this very batch. Look the holders up below.
                taken.push((
                    results.len(),
                    task.unique_key.as_deref().unwrap_or_default(),
                ));
                results.push(Enqueued::existing(0));
            }
        }
        if !taken.is_empty() {
            let keys = serde_json::Value::Array(
                taken
                    .iter()
                    .map(|(_, k)| serde_json::Value::from(*k))
                    .collect(),
            );
            let holders: HashMap<String, i64> = sqlx::query_as(&sql.key_holders)
                .bind(json_text(&keys)?)
                .fetch_all(&mut *conn)
                .await?
                .into_iter()
                .collect();
            for (at, key) in taken.drain(..) {
                let id = holders.get(key).copied().ok_or_else(|| {
                    StoreError::Backend(format!(
                        "unique key {key:?} conflicted but no unfinished task holds it"
                    ))
                })?;
                results[at].id = id;
            }
        }
        if next.next().is_some() {
            return Err(StoreError::Backend(
                "insert returned more rows than expected".into(),
            ));
        }
    }
    Ok(Inserted {
        results,
        due_queues,
        later,
    })
}

/// Enqueue `tasks` on a connection inside the caller's own transaction (the
/// transactional outbox): the tasks exist if and only if the caller commits.
///
/// The caller owns `BEGIN` / `COMMIT` (use `BEGIN IMMEDIATE`, e.g.
/// `pool.begin_with("BEGIN IMMEDIATE")`, if the transaction reads before it
/// writes). `prefix` must match the store's table prefix (`None` for the
/// default `baton_`). Semantics are those of [`crate::store::Backend::task_insert_many`], except
/// that no wake-up is sent: workers pick the tasks up at their next poll.
///
/// ```no_run
/// # async fn demo(tasks: Vec<baton::store::NewTask>) -> Result<(), Box<dyn std::error::Error>> {
/// use baton::store::sqlite::{enqueue_in, SqliteBackend};
///
/// let backend = SqliteBackend::connect("sqlite://app.db", &Default::default()).await?;
/// let mut tx = backend.pool().begin_with("BEGIN IMMEDIATE").await?;
/// sqlx::query("UPDATE orders SET state = 'paid' WHERE id = 7")
///     .execute(&mut *tx)
///     .await?;
/// enqueue_in(&mut tx, None, &tasks).await?; // same transaction
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn enqueue_in(
    conn: &mut SqliteConnection,
    prefix: Option<&str>,
    tasks: &[NewTask],
) -> Result<Vec<Enqueued>, StoreError> {
    let t = Tables::new(prefix)?;
    Ok(insert_tasks(conn, &InsertSql::new(&t), tasks, None)
        .await?
        .results)
}

/// A batch of tasks split by the SQLite insert around the slots that have
/// tombstones: those are answered with the pruned task's id (`inserted =
/// false`), the rest are inserted.
struct Tombstoned {
    /// The tasks to insert.
    rest: Vec<NewTask>,
    /// For each of `rest`, its index in the batch.
    index: Vec<usize>,
    /// One answer per task of the batch; `None` for those in `rest`.
    answers: Vec<Option<Enqueued>>,
}

impl Tombstoned {
    /// Split `tasks` by `found` (slot key → the pruned task's id).
    fn split(tasks: &[NewTask], found: &std::collections::HashMap<String, i64>) -> Tombstoned {
        let mut out = Tombstoned {
            rest: Vec::new(),
            index: Vec::new(),
            answers: Vec::with_capacity(tasks.len()),
        };
        for (i, t) in tasks.iter().enumerate() {
            let pruned = t
                .unique_key
                .as_ref()
                .filter(|_| crate::store::tombstoned_kind(t))
                .and_then(|k| found.get(k));
            match pruned {
                Some(&id) => out.answers.push(Some(Enqueued::existing(id))),
                None => {
                    out.answers.push(None);
                    out.index.push(i);
                    out.rest.push(t.clone());
                }
            }
        }
        out
    }

    /// The batch's answers, given those for `rest`, in order.
    fn merge(self, live: Vec<Enqueued>) -> Result<Vec<Enqueued>, StoreError> {
        let mut live = live.into_iter();
        self.answers
            .into_iter()
            .map(|a| match a {
                Some(a) => Ok(a),
                None => live
                    .next()
                    .ok_or_else(|| StoreError::Backend("insert returned too few results".into())),
            })
            .collect()
    }
}
