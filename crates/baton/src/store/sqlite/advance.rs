//! SQLite's side of the shared `job_advance` and `task_cancel`
//! (`store::job_advance`): one `BEGIN IMMEDIATE` transaction each, the
//! statements of [`super::sql`].

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::Row;

use super::outbox::{insert_tasks, Inserted};
use super::rows::opt_time;
use super::SqliteBackend;
use crate::error::StoreError;
use crate::store::job_advance::{Birth, CancelTx, JobRow, PreviousRun, SlotTx};
use crate::store::jobdefs::{mark_row, mark_sql, DefinitionMark};
use crate::store::{from_ms, ms, Enqueued, JobAdvance, NewTask, TaskState, WAITING_RUN_AT_MS};

/// One transaction of `job_advance` or `task_cancel`.
pub(super) struct Tx<'a> {
    b: &'a SqliteBackend,
    tx: sqlx::Transaction<'static, sqlx::Sqlite>,
    /// The queue and what the insert of a slot's task produced (for its
    /// wake-ups after the commit).
    inserted: Option<(String, Inserted)>,
    /// The queue of a waiting task made due (`release`).
    released: Option<String>,
}

impl SqliteBackend {
    /// Begin a [`Tx`].
    pub(super) async fn tx(&self) -> Result<Tx<'_>, StoreError> {
        Ok(Tx {
            b: self,
            tx: self.immediate().await?,
            inserted: None,
            released: None,
        })
    }
}

#[async_trait]
impl SlotTx for Tx<'_> {
    async fn job_row(&mut self, adv: &JobAdvance<'_>) -> Result<Option<JobRow>, StoreError> {
        let row = sqlx::query(&self.b.sql.job_get)
            .bind(adv.job)
            .fetch_optional(&mut *self.tx)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let last: Option<i64> = row.try_get("last_slot")?;
        Ok(Some(JobRow {
            paused: row.try_get::<i64, _>("paused")? != 0,
            cursor_matches: last == adv.expected.map(|e| e.timestamp_millis()),
            last_slot: opt_time(last)?,
            now: from_ms(row.try_get("now")?)?,
        }))
    }

    async fn definition(&mut self, job: &str) -> Result<Option<DefinitionMark>, StoreError> {
        let sql = mark_sql(&super::jobdefs::table(self.b), "?1");
        let row = sqlx::query(&sql)
            .bind(job)
            .fetch_optional(&mut *self.tx)
            .await?;
        row.as_ref().map(mark_row).transpose()
    }

    async fn previous_runs(
        &mut self,
        adv: &JobAdvance<'_>,
    ) -> Result<Vec<PreviousRun>, StoreError> {
        let rows = sqlx::query(&self.b.sql.job_overlapping)
            .bind(adv.job)
            .bind(adv.batch_after.map(|t| t.timestamp_millis()))
            .bind(adv.slot.timestamp_millis())
            .bind(WAITING_RUN_AT_MS)
            .fetch_all(&mut *self.tx)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(PreviousRun {
                    id: r.try_get("id")?,
                    state: TaskState::from_str(r.try_get("state")?)?,
                    waiting: r.try_get::<i64, _>("waiting")? != 0,
                })
            })
            .collect()
    }

    async fn release(&mut self, id: i64) -> Result<(), StoreError> {
        self.released = sqlx::query_scalar(&self.b.sql.job_release)
            .bind(id)
            .fetch_optional(&mut *self.tx)
            .await?;
        Ok(())
    }

    async fn set_cursor(&mut self, adv: &JobAdvance<'_>) -> Result<(), StoreError> {
        sqlx::query(&self.b.sql.job_set_slot)
            .bind(adv.job)
            .bind(adv.slot.timestamp_millis())
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    async fn insert(&mut self, task: &NewTask, birth: Birth<'_>) -> Result<Enqueued, StoreError> {
        let skipped = match birth {
            Birth::Cancelled { reason } => Some(reason),
            _ => None,
        };
        let inserted = insert_tasks(
            &mut self.tx,
            &self.b.sql.insert,
            std::slice::from_ref(task),
            skipped,
        )
        .await?;
        let e = inserted
            .results
            .first()
            .copied()
            .ok_or_else(|| StoreError::Backend("insert returned no result".into()))?;
        if let (Birth::Running { worker, lease }, true) = (birth, e.inserted) {
            // Born running: made the caller's run record in the insert's
            // own transaction (never seen pending).
            sqlx::query(&self.b.sql.job_run)
                .bind(e.id)
                .bind(ms(lease))
                .bind(worker)
                .execute(&mut *self.tx)
                .await?;
        }
        self.inserted = Some((task.queue.clone(), inserted));
        Ok(e)
    }

    async fn commit(self, announce: bool) -> Result<(), StoreError> {
        self.tx.commit().await?;
        if let (true, Some(queue)) = (announce, &self.released) {
            self.b.wake([queue.as_str()]);
        }
        if let (true, Some((queue, inserted))) = (announce, &self.inserted) {
            if !inserted.due_queues.is_empty() {
                self.b.wake([queue.as_str()]);
            }
            self.b
                .wake_later(inserted.later.iter().map(|&(_, at)| (queue.as_str(), at)));
        }
        Ok(())
    }

    /// Dropped: sqlx rolls the transaction back as the connection goes
    /// back to the pool, without the caller waiting for it (as before the
    /// shared decision).
    async fn rollback(self) -> Result<(), StoreError> {
        drop(self.tx);
        Ok(())
    }
}

#[async_trait]
impl CancelTx for Tx<'_> {
    async fn state(&mut self, id: i64) -> Result<Option<TaskState>, StoreError> {
        let state: Option<String> = sqlx::query_scalar(&self.b.sql.task_state)
            .bind(id)
            .fetch_optional(&mut *self.tx)
            .await?;
        state.as_deref().map(TaskState::from_str).transpose()
    }

    async fn cancel_pending(&mut self, id: i64, reason: Option<&str>) -> Result<(), StoreError> {
        sqlx::query(&self.b.sql.cancel_pending)
            .bind(id)
            .bind(reason)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    async fn request_cancel(&mut self, id: i64) -> Result<(), StoreError> {
        sqlx::query(&self.b.sql.cancel_running)
            .bind(id)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    async fn commit(self) -> Result<(), StoreError> {
        Ok(self.tx.commit().await?)
    }

    /// Dropped: sqlx rolls the transaction back as the connection goes
    /// back to the pool, without the caller waiting for it (as before the
    /// shared decision).
    async fn rollback(self) -> Result<(), StoreError> {
        drop(self.tx);
        Ok(())
    }
}
