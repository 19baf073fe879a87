//! PostgreSQL's side of the shared `job_advance` and `task_cancel`
//! (`store::job_advance`): one transaction each, with the job's or the
//! task's row locked, the statements of [`super::sql`]. Due work is
//! announced by the insert statement itself (`pg_notify`).

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::Row;

use super::outbox::insert_tasks;
use super::{dur, PgBackend};
use crate::error::StoreError;
use crate::store::job_advance::{Birth, CancelTx, JobRow, PreviousRun, SlotTx};
use crate::store::jobdefs::{mark_row, mark_sql, DefinitionMark};
use crate::store::{waiting_run_at, Enqueued, JobAdvance, NewTask, TaskState};

/// One transaction of `job_advance` or `task_cancel`.
pub(super) struct Tx<'a> {
    b: &'a PgBackend,
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
}

impl PgBackend {
    /// Begin a [`Tx`].
    pub(super) async fn tx(&self) -> Result<Tx<'_>, StoreError> {
        Ok(Tx {
            b: self,
            tx: self.begin().await?,
        })
    }
}

#[async_trait]
impl SlotTx for Tx<'_> {
    async fn job_row(&mut self, adv: &JobAdvance<'_>) -> Result<Option<JobRow>, StoreError> {
        let row = self
            .b
            .q(&self.b.sql.job_lock)
            .bind(adv.job)
            .bind(adv.expected)
            .fetch_optional(&mut *self.tx)
            .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(JobRow {
            paused: row.try_get("paused")?,
            cursor_matches: row.try_get("matches")?,
            last_slot: row.try_get("last_slot")?,
            now: row.try_get("now")?,
        }))
    }

    async fn definition(&mut self, job: &str) -> Result<Option<DefinitionMark>, StoreError> {
        let sql = mark_sql(&super::jobdefs::table(self.b), "$1");
        let row = self
            .b
            .q(&sql)
            .bind(job)
            .fetch_optional(&mut *self.tx)
            .await?;
        row.as_ref().map(mark_row).transpose()
    }

    async fn previous_runs(
        &mut self,
        adv: &JobAdvance<'_>,
    ) -> Result<Vec<PreviousRun>, StoreError> {
        let rows = self
            .b
            .q(&self.b.sql.job_overlapping)
            .bind(adv.job)
            .bind(adv.batch_after)
            .bind(adv.slot)
            .bind(waiting_run_at())
            .fetch_all(&mut *self.tx)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(PreviousRun {
                    id: r.try_get("id")?,
                    state: TaskState::from_str(r.try_get("state")?)?,
                    waiting: r.try_get("waiting")?,
                })
            })
            .collect()
    }

    async fn release(&mut self, id: i64) -> Result<(), StoreError> {
        self.b
            .q(&self.b.sql.job_release)
            .bind(id)
            .bind(&self.b.names.chan)
            .fetch_optional(&mut *self.tx)
            .await?;
        Ok(())
    }

    async fn set_cursor(&mut self, adv: &JobAdvance<'_>) -> Result<(), StoreError> {
        self.b
            .q(&self.b.sql.job_set_slot)
            .bind(adv.job)
            .bind(adv.slot)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    async fn insert(&mut self, task: &NewTask, birth: Birth<'_>) -> Result<Enqueued, StoreError> {
        let skipped = match birth {
            Birth::Cancelled { reason } => Some(reason),
            _ => None,
        };
        let out = insert_tasks(
            &mut self.tx,
            &self.b.sql.insert,
            &self.b.names.chan,
            std::slice::from_ref(task),
            skipped,
        )
        .await?;
        let e = out
            .first()
            .copied()
            .ok_or_else(|| StoreError::Corrupt("job_advance: no insert result".into()))?;
        if let (Birth::Running { worker, lease }, true) = (birth, e.inserted) {
            // Born running: made the caller's run record in the insert's
            // own transaction (never seen pending).
            self.b
                .q(&self.b.sql.job_run)
                .bind(e.id)
                .bind(dur(lease))
                .bind(worker)
                .execute(&mut *self.tx)
                .await?;
        }
        Ok(e)
    }

    async fn commit(self, _announce: bool) -> Result<(), StoreError> {
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

#[async_trait]
impl CancelTx for Tx<'_> {
    async fn state(&mut self, id: i64) -> Result<Option<TaskState>, StoreError> {
        let state: Option<String> = self
            .b
            .qs(&self.b.sql.task_state)
            .bind(id)
            .fetch_optional(&mut *self.tx)
            .await?;
        state.as_deref().map(TaskState::from_str).transpose()
    }

    async fn cancel_pending(&mut self, id: i64, reason: Option<&str>) -> Result<(), StoreError> {
        self.b
            .q(&self.b.sql.cancel_pending)
            .bind(id)
            .bind(reason)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    async fn request_cancel(&mut self, id: i64) -> Result<(), StoreError> {
        self.b
            .q(&self.b.sql.cancel_running)
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
