//! The [`Backend`] impl of the SQLite backend: binds arguments to the
//! statements of [`super::sql`], reads the rows back, and sends wake-ups.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use tokio::sync::broadcast;

use super::outbox::insert_tasks;
use super::rows::{claim_answer, json_text, opt_time};
use super::{schema, SqliteBackend, NOW_US};
use crate::error::StoreError;
use crate::store::key_rate;
use crate::store::rate::{self, StartLog};
use crate::store::sql_row::{
    corrupt, count_of, job_state, lock_info, queue_row, task_info, token_arg, token_of, SqlRow,
};
use crate::store::task_search::{self, SearchArg, SearchDialect};
use crate::store::SchemaStatus;
use crate::store::{
    from_ms, ms, Acquire, Advanced, Backend, CancelOutcome, Claim, Enqueued, Finish, Heartbeat,
    JobAdvance, JobState, LockAcquire, LockInfo, NewTask, QueueStats, Rescued, Task, TaskClaim,
    TaskFilter, TaskInfo, TaskState, Wake, LEASE_EXPIRED,
};
use crate::store::{
    AuditPage, AuditRecord, JobDef, JobDefDelete, JobDefPut, JobDefWrite, LockHistoryQuery,
    LockRecord, StatsQuery, StatsRow,
};
use crate::store::{KeyRate, RatedClaim, TaskClaimKeyRated, TaskClaimRated};

/// SQLite's spelling of a task search.
struct Search;

impl SearchDialect for Search {
    fn ph(n: usize) -> String {
        format!("?{n}")
    }
    fn contains(col: &str, p: &str) -> String {
        format!("instr({col}, {p}) > 0")
    }
    fn ends_with(col: &str, p: &str, q: &str) -> String {
        format!("substr({col}, -length({p})) = {q}")
    }
}

impl SqliteBackend {
    /// The statements of `req`'s claim ([`super::sql::ClaimSql`]).
    fn claim_sql(&self, req: &TaskClaim<'_>) -> &super::sql::ClaimSql {
        match req.per_key_max_running {
            Some(cap) if cap <= super::sql::KEY_PROBE_MAX => &self.sql.claim_keyed_probe,
            Some(_) => &self.sql.claim_keyed,
            None => &self.sql.claim,
        }
    }

    /// A claim in a write transaction of its own, answered in one row.
    async fn claim_alone(&self, req: &TaskClaim<'_>) -> Result<Vec<Task>, StoreError> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let sql = self.claim_sql(req).alone.clone();
        let rows = self
            .in_own_transaction(sql, ClaimArgs::of(req, None))
            .await?;
        claimed(&rows, req.queue)
    }

    /// Attempts ended with success, then a claim, in one write transaction
    /// answered in one row: per finish, whether its claim held.
    async fn succeed_and_claim(
        &self,
        finish: &[(Claim, Finish)],
        req: &TaskClaim<'_>,
    ) -> Result<crate::store::FinishedAndClaimed, StoreError> {
        let (pairs, list) = success_pairs(finish)?;
        let sql = self.claim_sql(req).after_successes.clone();
        let rows = self
            .in_own_transaction(sql, ClaimArgs::of(req, Some(list)))
            .await?;
        let tasks = claimed(&rows, req.queue)?;
        Ok(crate::store::FinishedAndClaimed {
            finished: held(&pairs, rows[0].try_get("done")?)?,
            tasks,
        })
    }

    /// Attempts ended with success inside the caller's write transaction
    /// `tx`: per finish, whether its claim held.
    async fn succeed_in(
        &self,
        tx: &mut sqlx::SqliteConnection,
        finish: &[(Claim, Finish)],
    ) -> Result<Vec<bool>, StoreError> {
        let (pairs, list) = success_pairs(finish)?;
        let done: String = sqlx::query_scalar(&self.sql.succeed_answered)
            .bind(list)
            .fetch_one(&mut *tx)
            .await?;
        held(&pairs, &done)
    }

    /// The finishes ahead of a rated claim, and its write transaction:
    /// successes (the common case) inside that transaction, anything else
    /// in calls of their own first.
    async fn finish_then_immediate(
        &self,
        finish: &[(Claim, Finish)],
    ) -> Result<(Vec<bool>, sqlx::Transaction<'static, sqlx::Sqlite>), StoreError> {
        if !all_successes(finish) {
            let finished = crate::store::finish_ahead(self, finish).await?;
            return Ok((finished, self.immediate().await?));
        }
        let mut tx = self.immediate().await?;
        let finished = self.succeed_in(&mut tx, finish).await?;
        Ok((finished, tx))
    }

    /// Statements that open a write transaction and close it (`sql`,
    /// [`super::sql::ClaimSql`]), on a writer connection; their rows
    /// ([`SqliteBackend::in_own_write`]).
    async fn in_own_transaction(
        &self,
        sql: String,
        args: ClaimArgs,
    ) -> Result<Vec<sqlx::sqlite::SqliteRow>, StoreError> {
        self.in_own_write(move |conn| {
            Box::pin(async move { Ok(args.query(&sql).fetch_all(&mut *conn).await?) })
        })
        .await
    }

    /// `work` on a writer connection: calls that open a write transaction
    /// (`BEGIN IMMEDIATE`) and close it (`COMMIT`) in their own statements.
    ///
    /// It runs on a task of its own, to its end whether or not this call
    /// is still awaited: only its own `COMMIT`, or the `ROLLBACK` here
    /// after an error, closes the transaction, so a caller that stops
    /// waiting cannot leave one open on a pooled connection. A connection
    /// whose transaction could not be rolled back is closed, not returned
    /// to the pool.
    pub(super) async fn in_own_write<T, W>(&self, work: W) -> Result<T, StoreError>
    where
        T: Send + 'static,
        W: for<'c> FnOnce(
                &'c mut sqlx::SqliteConnection,
            )
                -> futures_util::future::BoxFuture<'c, Result<T, StoreError>>
            + Send
            + 'static,
    {
        let mut conn = self.pool.acquire().await?;
        tokio::spawn(async move {
            let res = work(&mut conn).await;
            if res.is_err() {
                if let Err(e) = sqlx::query("ROLLBACK").execute(&mut *conn).await {
                    if !e.to_string().contains("no transaction is active") {
                        tracing::warn!(error = %e, "a failed claim's transaction could not be rolled back; closing its connection");
                        conn.close_on_drop();
                    }
                }
            }
            res
        })
        .await
        .map_err(|e| StoreError::Backend(format!("claim: its task ended early: {e}")))?
    }

    /// A claim inside the caller's write transaction `tx`.
    async fn claim_within(
        &self,
        tx: &mut sqlx::SqliteConnection,
        req: &TaskClaim<'_>,
    ) -> Result<Vec<Task>, StoreError> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let args = ClaimArgs::of(req, None);
        let rows = args
            .query(&self.claim_sql(req).within)
            .fetch_all(&mut *tx)
            .await?;
        claimed(&rows, req.queue)
    }

    /// A claim under a rate limit on `tx` (inside `BEGIN IMMEDIATE`),
    /// under a rate per key too when `key_rate` is set.
    async fn rated_in(
        &self,
        tx: &mut sqlx::SqliteConnection,
        req: &TaskClaimRated<'_>,
        key_rate: Option<KeyRate>,
    ) -> Result<RatedClaim, StoreError> {
        let key = req.key();
        let r = &self.t.rates;
        let (starts, now_us): (Option<String>, i64) = sqlx::query_as(&format!(
            "SELECT (SELECT starts FROM {r} WHERE name = ?1), {NOW_US}"
        ))
        .bind(&key)
        .fetch_one(&mut *tx)
        .await?;
        let log = StartLog::decode(starts.as_deref().unwrap_or(""))?;
        let mut key_next = None;
        // Each task's start (µs), when the claim says it.
        let mut started = None;
        let tasks = match (rate::plan(req, &log, now_us), key_rate) {
            (Some(claim), Some(kr)) => {
                let claimed = self.claim_keys_in(tx, &claim, kr, Some(now_us)).await?;
                key_next = claimed.next;
                started = Some(vec![claimed.now_us; claimed.tasks.len()]);
                claimed.tasks
            }
            (Some(claim), None) if claim.fair => self.claim_fair(tx, &claim).await?,
            (Some(claim), None) => self.claim_within(tx, &claim).await?,
            (None, _) => Vec::new(),
        };
        let mut started = started.unwrap_or_default();
        if started.len() != tasks.len() {
            let ids = serde_json::Value::from(tasks.iter().map(|t| t.id).collect::<Vec<_>>());
            started = sqlx::query_scalar(&format!(
                "SELECT started_at * 1000 FROM {} WHERE id IN (SELECT value FROM json_each(?1))",
                self.t.tasks
            ))
            .bind(json_text(&ids)?)
            .fetch_all(&mut *tx)
            .await?;
        }
        let mut d = rate::finish(req, log, tasks, &started, now_us)?;
        if let Some(text) = d.write {
            sqlx::query(&format!(
                "INSERT INTO {r} (name, starts) VALUES (?1, ?2) \
                 ON CONFLICT (name) DO UPDATE SET starts = excluded.starts"
            ))
            .bind(&key)
            .bind(text)
            .execute(&mut *tx)
            .await?;
        }
        d.answer.key_next = key_rate::key_next_at(key_next, d.answer.now.timestamp_micros())?;
        Ok(d.answer)
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    fn key_capped_claims_spare_places(&self) -> bool {
        true
    }

    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn warnings(&self) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        schema::migrate(self).await
    }

    async fn schema_status(&self) -> Result<SchemaStatus, StoreError> {
        schema::status(self).await
    }

    async fn schema_remove(&self) -> Result<(), StoreError> {
        schema::remove(self).await
    }

    async fn store_identity(&self) -> Result<crate::store::StoreIdentity, StoreError> {
        schema::identity(self).await
    }

    async fn task_id_floor(&self) -> Result<(), StoreError> {
        schema::floor_ids(self).await
    }

    async fn store_write_probe(&self) -> Result<(), StoreError> {
        schema::write_probe(self).await
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        super::step::check();
        let now: i64 = sqlx::query_scalar(&self.sql.now)
            .fetch_one(&*self.reader)
            .await?;
        from_ms(now)
    }

    // ---- locks ---------------------------------------------------------------

    async fn lock_acquire(&self, req: &LockAcquire<'_>) -> Result<Acquire, StoreError> {
        // A lease granted before a forward host clock step is not taken
        // over early (sqlite/step.rs).
        let grace = super::step::check();
        let mut tx = self.immediate().await?;
        let granted = sqlx::query(&self.sql.lock_acquire)
            .bind(req.name)
            .bind(req.holder)
            .bind(ms(req.at_most))
            .bind(ms(grace))
            .fetch_optional(&mut *tx)
            .await?;
        let answer = match granted {
            Some(row) => Acquire::Granted {
                token: token_of(row.big("token")?, "lock token")?,
                locked_at: row.time("locked_at")?,
                lock_until: row.time("lock_until")?,
            },
            None => {
                let row = sqlx::query(&self.sql.lock_get)
                    .bind(req.name)
                    .fetch_one(&mut *tx)
                    .await?;
                Acquire::Busy(lock_info(&row)?)
            }
        };
        tx.commit().await?;
        Ok(answer)
    }

    async fn lock_extend(
        &self,
        params: &crate::store::LockExtend<'_>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let p = params;
        self.lock_until_after(&self.sql.lock_extend, p.name, p.token, p.at_most)
            .await
    }

    async fn lock_revoke(
        &self,
        params: &crate::store::LockRevoke<'_>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let p = params;
        self.lock_until_after(&self.sql.lock_revoke, p.name, p.token, p.within)
            .await
    }

    async fn lock_release(
        &self,
        params: &crate::store::LockRelease<'_>,
    ) -> Result<bool, StoreError> {
        super::lock_history::release(self, params).await
    }

    async fn lock_get(&self, name: &str) -> Result<Option<LockInfo>, StoreError> {
        sqlx::query(&self.sql.lock_get)
            .bind(name)
            .fetch_optional(&*self.reader)
            .await?
            .as_ref()
            .map(lock_info)
            .transpose()
    }

    async fn lock_list(&self) -> Result<Vec<LockInfo>, StoreError> {
        sqlx::query(&self.sql.lock_list)
            .fetch_all(&*self.reader)
            .await?
            .iter()
            .map(lock_info)
            .collect()
    }

    // ---- tasks ---------------------------------------------------------------

    async fn task_insert_many(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.immediate().await?;
        let inserted = insert_tasks(&mut tx, &self.sql.insert, tasks, None).await?;
        tx.commit().await?;
        self.wake(inserted.due_queues.iter().map(|&i| tasks[i].queue.as_str()));
        self.wake_later(
            inserted
                .later
                .iter()
                .map(|&(i, at)| (tasks[i].queue.as_str(), at)),
        );
        Ok(inserted.results)
    }

    async fn task_claim(&self, req: &TaskClaim<'_>) -> Result<Vec<Task>, StoreError> {
        if req.fair {
            let mut tx = self.immediate().await?;
            let tasks = self.claim_fair(&mut tx, req).await?;
            tx.commit().await?;
            return Ok(tasks);
        }
        self.claim_alone(req).await
    }

    async fn task_claim_rated(&self, req: &TaskClaimRated<'_>) -> Result<RatedClaim, StoreError> {
        // The finishes first, a call of their own (SQLite's finish has its
        // own statements and transaction); then one `BEGIN IMMEDIATE`: the
        // log, the claim and the log's update cannot interleave with
        // another claim.
        let (finished, mut tx) = self.finish_then_immediate(req.finish).await?;
        let answer = self.rated_in(&mut tx, req, None).await?;
        tx.commit().await?;
        Ok(RatedClaim { finished, ..answer })
    }

    async fn task_claim_key_rated(
        &self,
        req: &TaskClaimKeyRated<'_>,
    ) -> Result<RatedClaim, StoreError> {
        let Some(rated) = req.rated() else {
            return self.key_rated_alone(req).await;
        };
        let (finished, mut tx) = self.finish_then_immediate(req.finish).await?;
        let answer = self.rated_in(&mut tx, &rated, Some(req.key_rate)).await?;
        tx.commit().await?;
        Ok(RatedClaim { finished, ..answer })
    }

    async fn task_heartbeat_many(
        &self,
        params: &crate::store::TaskHeartbeatMany<'_>,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        let crate::store::TaskHeartbeatMany { claims, lease } = *params;
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let list = serde_json::Value::Array(
            claims
                .iter()
                .map(|c| serde_json::json!([c.id, token_arg(c.token)]))
                .collect(),
        );
        let rows = sqlx::query(&self.sql.heartbeat)
            .bind(json_text(&list)?)
            .bind(ms(lease))
            .fetch_all(&*self.pool)
            .await?;
        let mut found = HashMap::with_capacity(rows.len());
        for row in &rows {
            let id: i64 = row.try_get(0)?;
            let token: i64 = row.try_get(1)?;
            let cancel: i64 = row.try_get(2)?;
            found.insert((id, token), cancel != 0);
        }
        Ok(claims
            .iter()
            .map(|c| match found.get(&(c.id, token_arg(c.token))) {
                Some(true) => Heartbeat::CancelRequested,
                Some(false) => Heartbeat::Extended,
                None => Heartbeat::Lost,
            })
            .collect())
    }

    async fn task_finish_many(&self, items: &[(Claim, Finish)]) -> Result<Vec<bool>, StoreError> {
        super::finish::finish_many(self, items).await
    }

    async fn task_finish_and_claim(
        &self,
        req: &crate::store::TaskFinishAndClaim<'_>,
    ) -> Result<crate::store::FinishedAndClaimed, StoreError> {
        // Successes (the common case) and an unfair claim share one write
        // transaction; anything else is the finishes, then the claim.
        if !all_successes(req.finish) || req.claim.fair {
            return crate::store::finish_then_claim(self, req).await;
        }
        self.succeed_and_claim(req.finish, req.claim).await
    }

    fn claims_carry_finishes(&self) -> bool {
        true
    }

    async fn task_set_progress(
        &self,
        params: &crate::store::TaskSetProgress<'_>,
    ) -> Result<bool, StoreError> {
        let crate::store::TaskSetProgress { claim, progress } = *params;
        let done = sqlx::query(&self.sql.progress)
            .bind(claim.id)
            .bind(token_arg(claim.token))
            .bind(json_text(progress)?)
            .execute(&*self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn task_rescue_many(&self) -> Result<Rescued, StoreError> {
        // A forward step of the host clock makes live leases look lapsed:
        // allow for it (sqlite/step.rs).
        let grace = super::step::check();
        let rows = sqlx::query(&self.sql.rescue)
            .bind(LEASE_EXPIRED)
            .bind(ms(grace))
            .fetch_all(&*self.pool)
            .await?;
        let mut out = Rescued::default();
        let mut requeued = Vec::new();
        for row in &rows {
            let state: String = row.try_get("state")?;
            match TaskState::from_str(&state)? {
                TaskState::Pending => {
                    out.requeued += 1;
                    requeued.push(row.try_get::<String, _>("queue")?);
                }
                TaskState::Failed => out.failed += 1,
                TaskState::Cancelled => out.cancelled += 1,
                other => return Err(corrupt("rescued task state", other)),
            }
        }
        self.wake(requeued.iter().map(String::as_str));
        Ok(out)
    }

    async fn task_cancel(&self, id: i64) -> Result<CancelOutcome, StoreError> {
        crate::store::job_advance::task_cancel(self.tx().await?, id).await
    }

    async fn task_retry(&self, id: i64) -> Result<bool, StoreError> {
        let res = sqlx::query_scalar::<_, String>(&self.sql.retry)
            .bind(id)
            .fetch_optional(&*self.pool)
            .await;
        match res {
            Ok(Some(queue)) => {
                self.wake([queue.as_str()]);
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                Err(StoreError::Conflict(format!(
                    "task {id}: its unique key is taken by another unfinished task"
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn task_get(&self, id: i64) -> Result<Option<TaskInfo>, StoreError> {
        sqlx::query(&self.sql.task)
            .bind(id)
            .fetch_optional(&*self.reader)
            .await?
            .as_ref()
            .map(task_info)
            .transpose()
    }

    async fn task_list(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, StoreError> {
        let (where_, args) = task_search::where_clause::<Search>(filter);
        let limit = task_search::page_size(filter);
        let sql = format!(
            "{} {where_} ORDER BY id DESC LIMIT {limit}",
            self.sql.tasks_select
        );
        let mut q = sqlx::query(&sql);
        for a in args {
            q = match a {
                SearchArg::Text(v) => q.bind(v),
                SearchArg::Int(v) => q.bind(v),
                SearchArg::Time(t) => q.bind(t.timestamp_millis()),
            };
        }
        q.fetch_all(&*self.reader)
            .await?
            .iter()
            .map(task_info)
            .collect()
    }

    async fn queue_set_paused(
        &self,
        params: &crate::store::QueueSetPaused<'_>,
    ) -> Result<(), StoreError> {
        let (queue, paused, note) = (params.queue, params.paused, params.note);
        sqlx::query(&self.sql.queue_set_paused)
            .bind(queue)
            .bind(paused)
            .bind(note.note)
            .bind(note.by)
            .execute(&*self.pool)
            .await?;
        if !paused {
            self.wake([queue]);
        }
        Ok(())
    }

    async fn queue_stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        let paused = sqlx::query(&self.sql.queues_paused)
            .fetch_all(&*self.reader)
            .await?
            .iter()
            .map(queue_row)
            .collect::<Result<Vec<_>, _>>()?;
        let rows = sqlx::query(&self.sql.stats)
            .fetch_all(&*self.reader)
            .await?;
        let mut out: Vec<QueueStats> = Vec::new();
        for row in &rows {
            let queue: String = row.try_get("queue")?;
            let state: String = row.try_get("state")?;
            let count = count_of(row.try_get("count")?, "count")?;
            let oldest: Option<i64> = row.try_get("oldest")?;
            if out.last().map(|s| s.queue != queue).unwrap_or(true) {
                out.push(QueueStats {
                    queue,
                    ..QueueStats::default()
                });
            }
            let Some(s) = out.last_mut() else {
                continue;
            };
            match TaskState::from_str(&state)? {
                TaskState::Pending => {
                    s.pending = count;
                    s.oldest_pending_ms = oldest.map(|o| u64::try_from(o).unwrap_or(0));
                }
                TaskState::Running => s.running = count,
                TaskState::Succeeded => s.succeeded = count,
                TaskState::Failed => s.failed = count,
                TaskState::Cancelled => s.cancelled = count,
            }
        }
        crate::store::mark_paused(&mut out, paused);
        Ok(out)
    }

    async fn task_prune_many(&self, older_than: Duration) -> Result<u64, StoreError> {
        // One cutoff for both statements, so every slot task deleted left
        // its tombstone.
        let mut tx = self.immediate().await?;
        let now: i64 = sqlx::query_scalar(&self.sql.now)
            .fetch_one(&mut *tx)
            .await?;
        let cutoff = now.saturating_sub(ms(older_than));
        sqlx::query(&self.sql.prune_tombstones)
            .bind(cutoff)
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query(&self.sql.prune)
            .bind(cutoff)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
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

    async fn audit_list(&self, page: &AuditPage) -> Result<Vec<AuditRecord>, StoreError> {
        super::audit::list(self, page).await
    }

    async fn audit_prune_many(&self, older_than: Duration) -> Result<u64, StoreError> {
        super::audit::prune(self, older_than).await
    }

    async fn jobdef_prune_many(&self, older_than: Duration) -> Result<u64, StoreError> {
        super::jobdefs::prune(self, older_than).await
    }

    async fn jobdef_put(&self, p: &JobDefPut<'_>) -> Result<JobDefWrite, StoreError> {
        crate::store::jobdefs::put(self, p).await
    }

    async fn jobdef_delete(&self, d: &JobDefDelete<'_>) -> Result<JobDefWrite, StoreError> {
        crate::store::jobdefs::delete(self, d).await
    }

    async fn jobdef_list(&self) -> Result<Vec<JobDef>, StoreError> {
        super::jobdefs::list(self).await
    }

    async fn jobdef_revision(&self) -> Result<i64, StoreError> {
        super::jobdefs::revision(self).await
    }

    async fn stats_add(&self, rows: &[StatsRow]) -> Result<(), StoreError> {
        super::stats::add(self, rows).await
    }

    async fn stats_read(&self, q: &StatsQuery) -> Result<Vec<StatsRow>, StoreError> {
        super::stats::read(self, q).await
    }

    async fn stats_prune_many(&self) -> Result<u64, StoreError> {
        super::stats::prune(self).await
    }

    async fn lock_history_list(&self, q: &LockHistoryQuery) -> Result<Vec<LockRecord>, StoreError> {
        super::lock_history::list(self, q).await
    }

    async fn lock_history_prune_many(&self) -> Result<u64, StoreError> {
        super::lock_history::prune(self).await
    }

    async fn task_delete_many(&self, ids: &[i64]) -> Result<Vec<i64>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = serde_json::to_string(ids).map_err(|e| StoreError::Config(e.to_string()))?;
        let mut tx = self.immediate().await?;
        sqlx::query(&self.sql.delete_tombstones)
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
        let gone: Vec<i64> = sqlx::query_scalar(&self.sql.delete)
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(gone)
    }

    async fn wake_subscribe(&self) -> Result<broadcast::Receiver<Wake>, StoreError> {
        Ok(self.wake.subscribe())
    }

    // ---- schedules -----------------------------------------------------------

    async fn job_register(
        &self,
        params: &crate::store::JobRegister<'_>,
    ) -> Result<JobState, StoreError> {
        let row = sqlx::query(&self.sql.job_register)
            .bind(params.job)
            .bind(params.queue)
            .bind(params.overlap.map(|o| o.as_str()))
            .bind(params.fingerprint)
            .fetch_one(&*self.pool)
            .await?;
        job_state(&row)
    }

    async fn slot_get(&self, key: &str) -> Result<Option<crate::store::PrunedSlot>, StoreError> {
        sqlx::query(&self.sql.slot_get)
            .bind(key)
            .fetch_optional(&*self.reader)
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
        let crate::store::JobSetPaused { job, paused, note } = *params;
        let done = sqlx::query(&self.sql.job_set_paused)
            .bind(job)
            .bind(paused)
            .bind(note.note)
            .bind(note.by)
            .execute(&*self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn job_list(&self) -> Result<Vec<JobState>, StoreError> {
        sqlx::query(&self.sql.job_list)
            .fetch_all(&*self.reader)
            .await?
            .iter()
            .map(job_state)
            .collect()
    }

    async fn job_get(&self, job: &str) -> Result<Option<JobState>, StoreError> {
        sqlx::query(&self.sql.job_one)
            .bind(job)
            .fetch_optional(&*self.reader)
            .await?
            .as_ref()
            .map(job_state)
            .transpose()
    }
}

impl SqliteBackend {
    /// Run a lock statement of (`?1` name, `?2` token, `?3` ms) that
    /// answers the lease's new `lock_until`, or no row when the lease was
    /// not current (extend, revoke).
    async fn lock_until_after(
        &self,
        sql: &str,
        name: &str,
        token: crate::store::FencingToken,
        d: Duration,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let until: Option<i64> = sqlx::query_scalar(sql)
            .bind(name)
            .bind(token_arg(token))
            .bind(ms(d))
            .fetch_optional(&*self.pool)
            .await?;
        opt_time(until)
    }
}

/// A claim's arguments, owned (a claim's statements may outlive the call;
/// see `SqliteBackend::claim_alone`): `?1` queue, `?2` worker, `?3` lease
/// ms, `?4` limit, `?5` max_running, `?6` buffered, `?7` the per-key cap,
/// `?8` the successes a claim follows ([`super::sql::ClaimSql::after_successes`]).
struct ClaimArgs {
    queue: String,
    worker: String,
    lease_ms: i64,
    limit: i64,
    max_running: Option<i64>,
    buffered: i64,
    per_key: Option<i64>,
    successes: Option<String>,
}

impl ClaimArgs {
    fn of(req: &TaskClaim<'_>, successes: Option<String>) -> ClaimArgs {
        ClaimArgs {
            queue: req.queue.to_string(),
            worker: req.worker.to_string(),
            lease_ms: ms(req.lease),
            limit: i64::from(req.limit),
            max_running: req.max_running.map(i64::from),
            buffered: i64::from(req.buffered),
            per_key: req.per_key_max_running.map(i64::from),
            successes,
        }
    }

    fn query<'q>(
        &self,
        sql: &'q str,
    ) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
        let q = sqlx::query(sql)
            .bind(self.queue.clone())
            .bind(self.worker.clone())
            .bind(self.lease_ms)
            .bind(self.limit)
            .bind(self.max_running)
            .bind(self.buffered);
        let q = match (self.per_key, &self.successes) {
            (per_key, Some(list)) => q.bind(per_key).bind(list.clone()),
            (Some(cap), None) => q.bind(cap),
            (None, None) => q,
        };
        super::sql::spare_params(q)
    }
}

/// Whether `finish` is a non-empty batch of successes only (what one
/// write transaction ends beside a claim; `sqlite::sql::succeed_sql`).
pub(super) fn all_successes(finish: &[(Claim, Finish)]) -> bool {
    !finish.is_empty() && finish.iter().all(|(_, f)| matches!(f, Finish::Succeeded))
}

/// The (id, claim token) pairs of successes, and their JSON text.
pub(super) fn success_pairs(
    finish: &[(Claim, Finish)],
) -> Result<(Vec<(i64, i64)>, String), StoreError> {
    let pairs: Vec<(i64, i64)> = finish
        .iter()
        .map(|(c, _)| (c.id, token_arg(c.token)))
        .collect();
    let list = serde_json::to_string(&pairs)
        .map_err(|e| StoreError::Backend(format!("cannot encode JSON: {e}")))?;
    Ok((pairs, list))
}

/// Per pair, whether it is among `done` ([`super::sql::SUCCEEDED_PAIRS`]).
pub(super) fn held(pairs: &[(i64, i64)], done: &str) -> Result<Vec<bool>, StoreError> {
    let done: crate::fast_hash::FastSet<(i64, i64)> = serde_json::from_str(done)
        .map_err(|e| StoreError::Corrupt(format!("finished tasks: {e}")))?;
    Ok(pairs.iter().map(|p| done.contains(p)).collect())
}

/// The tasks of a claim's one answer row, in claim order.
fn claimed(rows: &[sqlx::sqlite::SqliteRow], queue: &str) -> Result<Vec<Task>, StoreError> {
    let [row] = rows else {
        return Err(StoreError::Backend(format!(
            "a claim answered {} rows, not one",
            rows.len()
        )));
    };
    let mut tasks = claim_answer(row, queue)?;
    tasks.sort_by_key(|t| (t.priority, t.run_at, t.id));
    Ok(tasks)
}
