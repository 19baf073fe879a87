//! The [`Backend`] impl of the MySQL / MariaDB backend, kept thin: each
//! operation calls the file of its concern (`locks`, `tasks`, `admin`,
//! `jobs`, `advance`, `schema`), named by the seam's rule.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use tokio::sync::broadcast;

use super::{admin, claim, jobs, locks, schema, tasks, us, MyBackend};
use crate::error::StoreError;
use crate::store::sql_row::{self, SqlRow};
use crate::store::{
    Acquire, Advanced, Backend, CancelOutcome, Claim, Enqueued, Finish, Heartbeat, JobAdvance,
    JobState, LockAcquire, LockInfo, NewTask, QueueStats, Rescued, SchemaStatus, Task, TaskClaim,
    TaskFilter, TaskInfo, Wake,
};

#[async_trait]
impl Backend for MyBackend {
    fn kind(&self) -> &'static str {
        "mysql"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        schema::migrate(self).await
    }

    async fn store_identity(&self) -> Result<crate::store::StoreIdentity, StoreError> {
        // The counter: the tasks table's next AUTO_INCREMENT value, less one
        // (MariaDB reads it exact; MySQL 8 may answer a cached value, never
        // a higher one).
        let read: Result<(Option<Vec<u8>>, Option<u64>), sqlx::Error> = sqlx::query_as(&format!(
            "SELECT (SELECT value FROM {} WHERE `key` = 'store_id'), \
                     (SELECT CAST(AUTO_INCREMENT AS UNSIGNED) FROM information_schema.TABLES \
                      WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?)",
            self.names.meta
        ))
        .bind(format!("{}tasks", self.names.prefix))
        .fetch_one(&self.pool)
        .await;
        match read {
            Ok((id, next)) => Ok(crate::store::StoreIdentity {
                id: id.map(|v| String::from_utf8_lossy(&v).into_owned()),
                last_task_id: next
                    .map(|n| i64::try_from(n.saturating_sub(1)).unwrap_or(i64::MAX))
                    .unwrap_or(0),
            }),
            Err(e) if sql_row::is_missing_table(&e) => Ok(crate::store::StoreIdentity::default()),
            Err(e) => Err(e.into()),
        }
    }

    /// An insert of a row with the id `now` in µs, rolled back: InnoDB
    /// raises the `AUTO_INCREMENT` counter to an explicit id above it at the
    /// insert and never takes that back (a rollback leaves a gap, as any
    /// rolled-back insert does), and an explicit id never lowers it, so
    /// floors need no lock between them. No DDL (`ALTER TABLE …
    /// AUTO_INCREMENT` would wait for, and then stall, every transaction on
    /// the table for its metadata lock), and no row is ever seen.
    async fn task_id_floor(&self) -> Result<(), StoreError> {
        let now_us = &self.names.now_us;
        let read: Result<(Option<u64>, i64), sqlx::Error> = sqlx::query_as(&format!(
            "SELECT (SELECT CAST(AUTO_INCREMENT AS UNSIGNED) FROM information_schema.TABLES \
                     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?), CAST({now_us} AS SIGNED)"
        ))
        .bind(format!("{}tasks", self.names.prefix))
        .fetch_one(&self.pool)
        .await;
        let (next, now) = match read {
            Ok(r) => r,
            Err(e) if sql_row::is_missing_table(&e) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        // No tasks table yet: nothing to floor.
        let Some(next) = next else { return Ok(()) };
        let last = i64::try_from(next.saturating_sub(1)).unwrap_or(i64::MAX);
        if last >= now.saturating_sub(crate::store::ID_FLOOR_SLACK_US) {
            return Ok(());
        }
        self.batch(&format!(
            "START TRANSACTION; \
             INSERT INTO {} (id, queue, kind, payload, state, run_at, created_at, errors) \
             VALUES ({now}, X'', X'', '', 'cancelled', {clock}, {clock}, '[]'); \
             ROLLBACK",
            self.names.tasks,
            clock = self.names.now
        ))
        .await
        .map(|_| ())
    }

    /// An `UPDATE` of no row: refused at once by a server running
    /// `read_only` (for a user without the right to write there anyway),
    /// a no-op otherwise.
    async fn store_write_probe(&self) -> Result<(), StoreError> {
        let probe = format!("UPDATE {} SET value = value WHERE 1 = 0", self.names.meta);
        match sqlx::query(&probe).execute(&self.pool).await {
            Ok(_) => Ok(()),
            Err(e) if sql_row::is_missing_table(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn pool_recycle(&self) {
        self.recycle.mark();
    }

    async fn schema_status(&self) -> Result<SchemaStatus, StoreError> {
        schema::status(self).await
    }

    async fn schema_remove(&self) -> Result<(), StoreError> {
        schema::remove(self).await
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        Ok(sqlx::query_scalar(&self.names.now_select)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn warnings(&self) -> Result<Vec<String>, StoreError> {
        let row = sqlx::query(
            "SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED) AS flush, \
             CAST(@@log_bin AS SIGNED) AS log_bin, CAST(@@sync_binlog AS SIGNED) AS sync_binlog, \
             CAST(@@binlog_format AS CHAR) AS binlog_format",
        )
        .fetch_one(&self.pool)
        .await?;
        let flush: i64 = row.try_get("flush")?;
        let log_bin: i64 = row.try_get("log_bin")?;
        let sync_binlog: i64 = row.try_get("sync_binlog")?;
        let format = row.opt_text("binlog_format")?.unwrap_or_default();
        let mut out = Vec::new();
        if flush != 1 {
            out.push(format!(
                "innodb_flush_log_at_trx_commit = {flush}: a commit is not flushed to disk when it returns, \
                 so a server crash can lose lock grants and claims baton already reported (set it to 1)"
            ));
        }
        if log_bin == 1 && sync_binlog != 1 {
            out.push(format!(
                "sync_binlog = {sync_binlog}: with the binary log on, a crash can lose commits from the \
                 binlog that replicas or point-in-time recovery rely on (set it to 1)"
            ));
        }
        if log_bin == 1 && format.eq_ignore_ascii_case("STATEMENT") {
            out.push(
                "binlog_format = STATEMENT: baton runs at READ COMMITTED, which needs ROW or MIXED"
                    .to_string(),
            );
        }
        Ok(out)
    }

    async fn lock_acquire(&self, req: &LockAcquire<'_>) -> Result<Acquire, StoreError> {
        locks::lock_acquire(self, req).await
    }

    async fn lock_extend(
        &self,
        params: &crate::store::LockExtend<'_>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let crate::store::LockExtend {
            name,
            token,
            at_most,
        } = *params;
        locks::lock_extend(self, name, token, at_most).await
    }

    async fn lock_revoke(
        &self,
        params: &crate::store::LockRevoke<'_>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let crate::store::LockRevoke {
            name,
            token,
            within,
        } = *params;
        locks::lock_revoke(self, name, token, within).await
    }

    async fn lock_release(
        &self,
        params: &crate::store::LockRelease<'_>,
    ) -> Result<bool, StoreError> {
        locks::lock_release(self, params).await
    }

    async fn lock_get(&self, name: &str) -> Result<Option<LockInfo>, StoreError> {
        locks::lock_read(self, Some(name))
            .await
            .map(|mut v| v.pop())
    }

    async fn lock_list(&self) -> Result<Vec<LockInfo>, StoreError> {
        locks::lock_read(self, None).await
    }

    async fn task_insert_many(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>, StoreError> {
        tasks::task_insert_many(self, tasks).await
    }

    async fn task_claim(&self, req: &TaskClaim<'_>) -> Result<Vec<Task>, StoreError> {
        super::again_if_deadlocked(|| claim::task_claim(self, req)).await
    }

    async fn task_claim_rated(
        &self,
        req: &crate::store::TaskClaimRated<'_>,
    ) -> Result<crate::store::RatedClaim, StoreError> {
        // The finishes first, a call of their own; the claim sees them.
        let finished = crate::store::finish_ahead(self, req.finish).await?;
        let answer = super::again_if_deadlocked(|| claim::task_claim_rated(self, req)).await?;
        Ok(crate::store::RatedClaim { finished, ..answer })
    }

    async fn task_claim_key_rated(
        &self,
        req: &crate::store::TaskClaimKeyRated<'_>,
    ) -> Result<crate::store::RatedClaim, StoreError> {
        let finished = crate::store::finish_ahead(self, req.finish).await?;
        let answer = super::again_if_deadlocked(|| claim::task_claim_key_rated(self, req)).await?;
        Ok(crate::store::RatedClaim { finished, ..answer })
    }

    async fn task_heartbeat_many(
        &self,
        params: &crate::store::TaskHeartbeatMany<'_>,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        let crate::store::TaskHeartbeatMany { claims, lease } = *params;
        tasks::task_heartbeat_many(self, claims, lease).await
    }

    async fn task_finish_many(&self, items: &[(Claim, Finish)]) -> Result<Vec<bool>, StoreError> {
        tasks::task_finish_many(self, items).await
    }

    async fn task_finish_and_claim(
        &self,
        req: &crate::store::TaskFinishAndClaim<'_>,
    ) -> Result<crate::store::FinishedAndClaimed, StoreError> {
        self.finish_and_claim(req).await
    }

    fn claims_carry_finishes(&self) -> bool {
        true
    }

    fn key_capped_claims_spare_places(&self) -> bool {
        true
    }

    async fn task_set_progress(
        &self,
        params: &crate::store::TaskSetProgress<'_>,
    ) -> Result<bool, StoreError> {
        let crate::store::TaskSetProgress { claim, progress } = *params;
        let r = sqlx::query(&format!(
            "UPDATE {} SET progress = ? WHERE id = ? AND claim_token = ? AND state = 'running'",
            self.names.tasks
        ))
        .bind(progress.to_string())
        .bind(claim.id)
        .bind(crate::store::sql_row::token_arg(claim.token))
        .execute(&self.pool)
        .await?;
        // The pool reports matched rows (CLIENT_FOUND_ROWS), not changed ones.
        Ok(r.rows_affected() == 1)
    }

    async fn task_rescue_many(&self) -> Result<Rescued, StoreError> {
        admin::task_rescue_many(self).await
    }

    async fn task_cancel(&self, id: i64) -> Result<CancelOutcome, StoreError> {
        crate::store::job_advance::task_cancel(self.tx().await?, id).await
    }

    async fn task_retry(&self, id: i64) -> Result<bool, StoreError> {
        admin::task_retry(self, id).await
    }

    async fn task_get(&self, id: i64) -> Result<Option<TaskInfo>, StoreError> {
        let f = TaskFilter::default();
        admin::task_list(self, &f, Some(id))
            .await
            .map(|mut v| v.pop())
    }

    async fn task_list(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, StoreError> {
        admin::task_list(self, filter, None).await
    }

    async fn queue_set_paused(
        &self,
        params: &crate::store::QueueSetPaused<'_>,
    ) -> Result<(), StoreError> {
        jobs::queue_set_paused(self, params).await
    }

    async fn queue_stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        admin::queue_stats(self).await
    }

    async fn task_prune_many(&self, older_than: Duration) -> Result<u64, StoreError> {
        // One transaction and one cutoff: every slot task deleted leaves
        // its tombstone.
        let n = &self.names;
        let mut tx = self.pool.begin().await?;
        let cutoff: DateTime<Utc> =
            sqlx::query_scalar(&format!("SELECT {} - INTERVAL ? MICROSECOND", n.now))
                .bind(us(older_than))
                .fetch_one(&mut *tx)
                .await?;
        sqlx::query(&tasks::tombstones(n, "finished_at < ?"))
            .bind(cutoff)
            .execute(&mut *tx)
            .await?;
        let r = sqlx::query(&format!(
            "DELETE FROM {} WHERE {} AND finished_at < ?",
            n.tasks,
            tasks::FINISHED
        ))
        .bind(cutoff)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(r.rows_affected())
    }

    async fn queue_declare(
        &self,
        params: &crate::store::QueueDeclare<'_>,
    ) -> Result<Option<crate::store::DeclaredLimits>, StoreError> {
        super::queue_view::declare(self, params).await
    }

    async fn queue_limits_list(&self) -> Result<Vec<crate::store::DeclaredLimits>, StoreError> {
        super::queue_view::list(self).await
    }

    async fn queue_keys(
        &self,
        query: &crate::store::QueueKeysQuery<'_>,
    ) -> Result<crate::store::QueueKeys, StoreError> {
        super::queue_view::keys(self, query).await
    }

    async fn audit_append(&self, entry: &crate::store::AuditAppend<'_>) -> Result<(), StoreError> {
        super::audit::append(self, entry).await
    }

    async fn audit_list(
        &self,
        page: &crate::store::AuditPage,
    ) -> Result<Vec<crate::store::AuditRecord>, StoreError> {
        super::audit::list(self, page).await
    }

    async fn audit_prune_many(&self, older_than: Duration) -> Result<u64, StoreError> {
        super::audit::prune(self, older_than).await
    }

    async fn jobdef_prune_many(&self, older_than: Duration) -> Result<u64, StoreError> {
        super::again_if_deadlocked(|| super::jobdefs::prune(self, older_than)).await
    }

    async fn jobdef_put(
        &self,
        p: &crate::store::JobDefPut<'_>,
    ) -> Result<crate::store::JobDefWrite, StoreError> {
        crate::store::jobdefs::put(self, p).await
    }

    async fn jobdef_delete(
        &self,
        d: &crate::store::JobDefDelete<'_>,
    ) -> Result<crate::store::JobDefWrite, StoreError> {
        crate::store::jobdefs::delete(self, d).await
    }

    async fn jobdef_list(&self) -> Result<Vec<crate::store::JobDef>, StoreError> {
        super::jobdefs::list(self).await
    }

    async fn jobdef_revision(&self) -> Result<i64, StoreError> {
        super::jobdefs::revision(self).await
    }

    async fn stats_add(&self, rows: &[crate::store::StatsRow]) -> Result<(), StoreError> {
        super::stats::add(self, rows).await
    }

    async fn stats_read(
        &self,
        q: &crate::store::StatsQuery,
    ) -> Result<Vec<crate::store::StatsRow>, StoreError> {
        super::stats::read(self, q).await
    }

    async fn stats_prune_many(&self) -> Result<u64, StoreError> {
        super::stats::prune(self).await
    }

    async fn lock_history_list(
        &self,
        q: &crate::store::LockHistoryQuery,
    ) -> Result<Vec<crate::store::LockRecord>, StoreError> {
        super::lock_history::list(self, q).await
    }

    async fn lock_history_prune_many(&self) -> Result<u64, StoreError> {
        super::lock_history::prune(self).await
    }

    async fn task_delete_many(&self, ids: &[i64]) -> Result<Vec<i64>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let n = &self.names;
        let list = ids
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let mut tx = self.pool.begin().await?;
        // Locked first, so the tombstones, the delete and the answer agree.
        let gone: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT id FROM {} WHERE {} AND id IN ({list}) FOR UPDATE",
            n.tasks,
            tasks::FINISHED
        ))
        .fetch_all(&mut *tx)
        .await?;
        if !gone.is_empty() {
            let list = gone
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let pred = format!("id IN ({list})");
            sqlx::query(&tasks::tombstones(n, &pred))
                .execute(&mut *tx)
                .await?;
            sqlx::query(&format!("DELETE FROM {} WHERE {pred}", n.tasks))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(gone)
    }

    async fn wake_subscribe(&self) -> Result<broadcast::Receiver<Wake>, StoreError> {
        Ok(self.wake.subscribe())
    }

    async fn job_register(
        &self,
        params: &crate::store::JobRegister<'_>,
    ) -> Result<JobState, StoreError> {
        jobs::job_register(self, params).await
    }

    async fn slot_get(&self, key: &str) -> Result<Option<crate::store::PrunedSlot>, StoreError> {
        sqlx::query(&format!(
            "SELECT unique_key, job, slot, task_id, state, last_error, finished_at \
             FROM {} WHERE unique_key = ?",
            self.names.slots
        ))
        .bind(key.as_bytes())
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(crate::store::sql_row::pruned_slot)
        .transpose()
    }

    async fn job_advance(&self, adv: &JobAdvance<'_>) -> Result<Advanced, StoreError> {
        crate::store::job_advance::job_advance(self.tx().await?, adv).await
    }

    async fn job_release(&self, job: &str) -> Result<Option<i64>, StoreError> {
        crate::store::job_advance::job_release(self.tx().await?, job).await
    }

    async fn job_set_paused(
        &self,
        params: &crate::store::JobSetPaused<'_>,
    ) -> Result<bool, StoreError> {
        jobs::job_set_paused(self, params).await
    }

    async fn job_list(&self) -> Result<Vec<JobState>, StoreError> {
        jobs::job_list(self).await
    }

    async fn job_get(&self, job: &str) -> Result<Option<JobState>, StoreError> {
        jobs::job_get(self, job).await
    }
}
