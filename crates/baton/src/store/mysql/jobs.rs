//! Schedules on MySQL: one cursor row per job.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::tasks::insert_tasks;
use super::{us, MyBackend};
use crate::error::StoreError;
use crate::store::sql_row::job_state;
use crate::store::{
    Advanced, Enqueued, JobAdvance, JobState, SlotRecord, OVERLAP_SKIPPED, RUN_RECORD_TOKEN,
};

impl MyBackend {
    pub(super) async fn register_job(
        &self,
        params: &crate::store::JobRegister<'_>,
    ) -> Result<JobState, StoreError> {
        let j = &self.names.jobs;
        let job = params.job;
        sqlx::query(&format!(
            "INSERT INTO {j} (name, last_slot, paused, queue) VALUES (?, UTC_TIMESTAMP(6), 0, ?) \
             ON DUPLICATE KEY UPDATE queue = COALESCE(VALUES(queue), queue)"
        ))
        .bind(job)
        .bind(params.queue.map(str::as_bytes))
        .execute(&self.pool)
        .await?;
        let row = sqlx::query(&format!(
            "SELECT name, last_slot, paused, queue FROM {j} WHERE name = ?"
        ))
        .bind(job)
        .fetch_one(&self.pool)
        .await?;
        job_state(&row)
    }

    /// One transaction: lock the job's row, check it (paused, cursor,
    /// store time), move the cursor, and record the slot's task.
    pub(super) async fn advance_job(&self, adv: &JobAdvance<'_>) -> Result<Advanced, StoreError> {
        let n = &*self.names;
        let mut tx = self.begin().await?;
        let row = sqlx::query(&format!(
            "SELECT last_slot, paused, last_slot <=> ? AS matches, UTC_TIMESTAMP(6) AS now \
             FROM {} WHERE name = ? FOR UPDATE",
            n.jobs
        ))
        .bind(adv.expected)
        .bind(adv.job)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            tx.rollback().await?;
            return Ok(Advanced::UnknownJob);
        };
        let paused: bool = row.try_get("paused")?;
        if paused {
            tx.rollback().await?;
            return Ok(Advanced::Paused);
        }
        if !row.try_get::<bool, _>("matches")? {
            let current: Option<DateTime<Utc>> = row.try_get("last_slot")?;
            tx.rollback().await?;
            return Ok(Advanced::Moved(current));
        }
        let now: DateTime<Utc> = row.try_get("now")?;
        if adv.refused_at(now) {
            tx.rollback().await?;
            return Ok(Advanced::NotDue { now });
        }
        let busy = if adv.checks_overlap() {
            let b: i64 = sqlx::query_scalar(&format!(
                "SELECT EXISTS (SELECT 1 FROM {} WHERE job = ? \
                 AND state IN ('pending', 'running') \
                 AND (? IS NULL OR slot IS NULL OR slot <= ?) AND created_at < ?)",
                n.tasks
            ))
            .bind(adv.job)
            .bind(adv.batch_after)
            .bind(adv.batch_after)
            .bind(adv.slot)
            .fetch_one(&mut *tx)
            .await?;
            b != 0
        } else {
            false
        };
        if busy && adv.early_at(now) {
            // Early, and the previous run is unfinished: judge the overlap
            // rule at the slot, not before it.
            tx.rollback().await?;
            return Ok(Advanced::NotDue { now });
        }
        sqlx::query(&format!(
            "UPDATE {} SET last_slot = ? WHERE name = ?",
            n.jobs
        ))
        .bind(adv.slot)
        .bind(adv.job)
        .execute(&mut *tx)
        .await?;
        let Some(task) = adv.task else {
            tx.commit().await?;
            return Ok(Advanced::Enqueued(Enqueued {
                id: 0,
                inserted: false,
            }));
        };
        let skip = match adv.record {
            SlotRecord::Skip { reason } => Some(reason),
            _ if busy => Some(OVERLAP_SKIPPED),
            _ => None,
        };
        let (out, wakes) = insert_tasks(&mut tx, n, std::slice::from_ref(task), skip).await?;
        let e = out
            .first()
            .copied()
            .ok_or_else(|| StoreError::Corrupt("job_advance: no insert result".into()))?;
        let mut announce = Vec::new();
        let result = if !e.inserted {
            // The slot's task exists already (a trigger made it): the slot
            // is not skipped, it runs as that task.
            Advanced::Enqueued(e)
        } else if skip.is_some() {
            Advanced::Skipped(e)
        } else {
            if let SlotRecord::Run { worker, lease } = adv.record {
                sqlx::query(&format!(
                    "UPDATE {} SET state = 'running', attempt = 1, \
                     started_at = UTC_TIMESTAMP(6), \
                     lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, worker = ?, \
                     claim_token = ? WHERE id = ?",
                    n.tasks
                ))
                .bind(us(lease))
                .bind(worker)
                .bind(i64::try_from(RUN_RECORD_TOKEN.0).unwrap_or(1))
                .bind(e.id)
                .execute(&mut *tx)
                .await?;
            } else {
                announce = wakes;
            }
            Advanced::Enqueued(e)
        };
        tx.commit().await?;
        self.announce(announce);
        Ok(result)
    }

    pub(super) async fn list_jobs(&self) -> Result<Vec<JobState>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT name, last_slot, paused, queue FROM {} ORDER BY name",
            self.names.jobs
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_state).collect()
    }
}
