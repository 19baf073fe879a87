//! MySQL's side of the shared `job_advance` and `task_cancel`
//! (`store::job_advance`): one transaction each that locks the row it
//! decides on (`SELECT … FOR UPDATE`), then writes. Wake-ups are sent
//! after the commit.

use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;

use super::tasks::insert_tasks;
use super::{us, MyBackend};
use crate::error::StoreError;
use crate::store::job_advance::{Birth, CancelTx, JobRow, PreviousRun, SlotTx};
use crate::store::jobdefs::{mark_row, mark_sql, DefinitionMark};
use crate::store::sql_row::corrupt;
use crate::store::{
    waiting_run_at, Enqueued, JobAdvance, NewTask, TaskState, Wake, RUN_RECORD_TOKEN,
};

/// One transaction of `job_advance` or `task_cancel`.
pub(super) struct Tx<'a> {
    b: &'a MyBackend,
    tx: sqlx::Transaction<'static, sqlx::MySql>,
    /// Wake-ups for the slot's task, sent after the commit.
    wakes: Vec<Wake>,
}

impl MyBackend {
    /// Begin a [`Tx`] (at `READ COMMITTED`).
    pub(super) async fn tx(&self) -> Result<Tx<'_>, StoreError> {
        Ok(Tx {
            b: self,
            tx: self.begin().await?,
            wakes: Vec::new(),
        })
    }
}

#[async_trait]
impl SlotTx for Tx<'_> {
    async fn job_row(&mut self, adv: &JobAdvance<'_>) -> Result<Option<JobRow>, StoreError> {
        let now = &self.b.names.now;
        let row = sqlx::query(&format!(
            "SELECT last_slot, paused, last_slot <=> ? AS matches, {now} AS now \
             FROM {} WHERE name = ? FOR UPDATE",
            self.b.names.jobs
        ))
        .bind(adv.expected)
        .bind(adv.job)
        .fetch_optional(&mut *self.tx)
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(JobRow {
            paused: row.try_get("paused")?,
            cursor_matches: row.try_get("matches")?,
            last_slot: row.try_get::<Option<DateTime<Utc>>, _>("last_slot")?,
            now: row.try_get("now")?,
        }))
    }

    async fn definition(&mut self, job: &str) -> Result<Option<DefinitionMark>, StoreError> {
        let sql = mark_sql(&super::jobdefs::table(self.b), "?");
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
        let rows = sqlx::query(&format!(
            "SELECT id, state, run_at >= ? AS waiting FROM {} WHERE job = ? \
             AND state IN ('pending', 'running') \
             AND (? IS NULL OR slot IS NULL OR slot <= ?) AND created_at < ? \
             ORDER BY id LIMIT 100",
            self.b.names.tasks
        ))
        .bind(waiting_run_at())
        .bind(adv.job)
        .bind(adv.batch_after)
        .bind(adv.batch_after)
        .bind(adv.slot)
        .fetch_all(&mut *self.tx)
        .await?;
        rows.iter()
            .map(|r| {
                let state = String::from_utf8(r.try_get::<Vec<u8>, _>("state")?)
                    .map_err(|e| corrupt("state", e))?;
                Ok(PreviousRun {
                    id: r.try_get("id")?,
                    state: TaskState::from_str(&state)?,
                    waiting: r.try_get::<i64, _>("waiting")? != 0,
                })
            })
            .collect()
    }

    async fn release(&mut self, id: i64) -> Result<(), StoreError> {
        let queue: Option<Vec<u8>> = sqlx::query_scalar(&format!(
            "SELECT queue FROM {} WHERE id = ? AND state = 'pending' FOR UPDATE",
            self.b.names.tasks
        ))
        .bind(id)
        .fetch_optional(&mut *self.tx)
        .await?;
        let Some(queue) = queue else { return Ok(()) };
        let queue = String::from_utf8(queue).map_err(|e| corrupt("queue", e))?;
        sqlx::query(&format!(
            "UPDATE {} SET run_at = {} WHERE id = ?",
            self.b.names.tasks, self.b.names.now
        ))
        .bind(id)
        .execute(&mut *self.tx)
        .await?;
        self.wakes.push(Wake::now(queue));
        Ok(())
    }

    async fn set_cursor(&mut self, adv: &JobAdvance<'_>) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "UPDATE {} SET last_slot = ? WHERE name = ?",
            self.b.names.jobs
        ))
        .bind(adv.slot)
        .bind(adv.job)
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    async fn insert(&mut self, task: &NewTask, birth: Birth<'_>) -> Result<Enqueued, StoreError> {
        let now = &self.b.names.now;
        let skipped = match birth {
            Birth::Cancelled { reason } => Some(reason),
            _ => None,
        };
        let (out, wakes) = insert_tasks(
            &mut self.tx,
            &self.b.names,
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
            sqlx::query(&format!(
                "UPDATE {} SET state = 'running', attempt = 1, \
                 started_at = {now}, \
                 lease_until = {now} + INTERVAL ? MICROSECOND, worker = ?, \
                 claim_token = ? WHERE id = ?",
                self.b.names.tasks
            ))
            .bind(us(lease))
            .bind(worker)
            .bind(i64::try_from(RUN_RECORD_TOKEN.0).unwrap_or(1))
            .bind(e.id)
            .execute(&mut *self.tx)
            .await?;
        }
        self.wakes = wakes;
        Ok(e)
    }

    async fn commit(self, announce: bool) -> Result<(), StoreError> {
        self.tx.commit().await?;
        if announce {
            self.b.announce(self.wakes);
        }
        Ok(())
    }

    async fn rollback(self) -> Result<(), StoreError> {
        Ok(self.tx.rollback().await?)
    }
}

#[async_trait]
impl CancelTx for Tx<'_> {
    async fn state(&mut self, id: i64) -> Result<Option<TaskState>, StoreError> {
        let state: Option<Vec<u8>> = sqlx::query_scalar(&format!(
            "SELECT state FROM {} WHERE id = ? FOR UPDATE",
            self.b.names.tasks
        ))
        .bind(id)
        .fetch_optional(&mut *self.tx)
        .await?;
        state
            .map(|s| {
                let s = String::from_utf8(s).map_err(|e| corrupt("state", e))?;
                TaskState::from_str(&s)
            })
            .transpose()
    }

    async fn cancel_pending(&mut self, id: i64, reason: Option<&str>) -> Result<(), StoreError> {
        let now = &self.b.names.now;
        sqlx::query(&format!(
            "UPDATE {} SET state = 'cancelled', finished_at = {now}, \
             lease_until = NULL, last_error = coalesce(?, last_error) WHERE id = ?",
            self.b.names.tasks
        ))
        .bind(reason)
        .bind(id)
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    async fn request_cancel(&mut self, id: i64) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "UPDATE {} SET cancel_requested = 1 WHERE id = ?",
            self.b.names.tasks
        ))
        .bind(id)
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    async fn commit(self) -> Result<(), StoreError> {
        Ok(self.tx.commit().await?)
    }

    async fn rollback(self) -> Result<(), StoreError> {
        Ok(self.tx.rollback().await?)
    }
}
