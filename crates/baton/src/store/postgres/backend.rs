//! The [`Backend`] impl of the PostgreSQL backend: binds arguments to the
//! statements of [`super::sql`] and reads the rows back.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use tokio::sync::broadcast;

use super::outbox::{insert_tasks, INSERT_CHUNK};
use super::{dur, listener, schema, PgBackend, PoolMode};
use crate::error::StoreError;
use crate::store::key_rate;
use crate::store::rate::{self, StartLog};
use crate::store::sql_row::{
    claimed_task, job_state, lock_info, queue_row, queue_stats, task_info, token_arg, token_of,
    SqlRow,
};
use crate::store::task_search::{self, SearchArg, SearchDialect};
use crate::store::SchemaStatus;
use crate::store::{
    Acquire, Advanced, Backend, CancelOutcome, Claim, Enqueued, Finish, Heartbeat, JobAdvance,
    JobState, LockAcquire, LockInfo, NewTask, QueueStats, Rescued, Task, TaskClaim, TaskFilter,
    TaskInfo, Wake, LEASE_EXPIRED,
};
use crate::store::{
    AuditPage, AuditRecord, JobDef, JobDefDelete, JobDefPut, JobDefWrite, LockHistoryQuery,
    LockRecord, StatsQuery, StatsRow,
};
use crate::store::{KeyRate, RatedClaim, TaskClaimKeyRated, TaskClaimRated};

/// PostgreSQL's spelling of a task search (the payload as its JSON text).
struct Search;

impl SearchDialect for Search {
    fn ph(n: usize) -> String {
        format!("${n}")
    }
    fn contains(col: &str, p: &str) -> String {
        format!("strpos({col}::text, {p}) > 0")
    }
    fn ends_with(col: &str, p: &str, q: &str) -> String {
        format!("right({col}, length({p})) = {q}")
    }
}
use sqlx::postgres::PgRow;

/// Claimed rows as tasks, in claim order.
pub(super) fn claimed(rows: &[PgRow]) -> Result<Vec<Task>, StoreError> {
    let mut tasks = rows
        .iter()
        .map(claimed_task)
        .collect::<Result<Vec<_>, _>>()?;
    claim_order(&mut tasks);
    Ok(tasks)
}

/// Claimed tasks in claim order: priority, then due time, then id.
pub(super) fn claim_order(tasks: &mut [Task]) {
    tasks.sort_by_key(|t| (t.priority, t.run_at, t.id));
}

impl PgBackend {
    /// A claim inside `tx`: capped and fair claims are one call of a
    /// function that takes the queue's advisory lock itself (held to the
    /// commit), so claimers of the queue take turns and each counts the
    /// running tasks after the previous one committed.
    async fn claim_in(
        &self,
        tx: &mut sqlx::PgConnection,
        req: &TaskClaim<'_>,
    ) -> Result<Vec<Task>, StoreError> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        if req.fair {
            return self.claim_fair(&mut *tx, req).await;
        }
        if req.max_running.is_some() || req.per_key_max_running.is_some() {
            return self.claim_capped(&mut *tx, req).await;
        }
        self.plain_claim(&mut *tx, req).await
    }

    /// The uncapped claim, sent on `ex`: its tasks in claim order (the
    /// statement answers in one row of arrays, see [`Sql::claim_packed`]).
    async fn plain_claim<'e, E>(&self, ex: E, req: &TaskClaim<'_>) -> Result<Vec<Task>, StoreError>
    where
        E: sqlx::Executor<'e, Database = sqlx::Postgres>,
    {
        let row = self
            .q(self.sql.claim_packed(req.plain_walk()))
            .bind(req.queue)
            .bind(req.worker)
            .bind(dur(req.lease))
            .bind(i64::from(req.limit))
            .bind(i64::from(req.buffered))
            .fetch_one(ex)
            .await?;
        let mut tasks = super::rows::packed_tasks(&row, req.queue)?;
        claim_order(&mut tasks);
        Ok(tasks)
    }

    /// A claim under a rate limit inside `tx`, under a rate per key too
    /// when `key_rate` is set.
    async fn rated_in(
        &self,
        tx: &mut sqlx::PgConnection,
        req: &TaskClaimRated<'_>,
        key_rate: Option<KeyRate>,
    ) -> Result<RatedClaim, StoreError> {
        // Claimers of one limit take turns on its row in `<p>rates`, then
        // on the queue's advisory lock when capped (always in this order).
        let key = req.key();
        let (r, now_us) = (&self.names.rates, &self.names.now_us);
        let lock = format!("SELECT starts, {now_us} FROM {r} WHERE name = $1 FOR UPDATE");
        let read = |row: Option<PgRow>| -> Result<Option<(String, i64)>, StoreError> {
            row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
        };
        let mut row = read(self.q(&lock).bind(&key).fetch_optional(&mut *tx).await?)?;
        if row.is_none() {
            self.q(&format!(
                "INSERT INTO {r} (name) VALUES ($1) ON CONFLICT DO NOTHING"
            ))
            .bind(&key)
            .execute(&mut *tx)
            .await?;
            row = read(self.q(&lock).bind(&key).fetch_optional(&mut *tx).await?)?;
        }
        let (starts, now_us) = row.ok_or_else(|| {
            StoreError::Corrupt(format!("rate limit {key:?}: no row after its insert"))
        })?;
        let log = StartLog::decode(&starts)?;
        let mut key_next = None;
        // Every task of the claim started at one instant: `now()`, the
        // transaction's start read with the row, or, under a rate per key,
        // the instant the function read once it held its keys' locks
        // (`key_rate_fn.rs`), later than `now()`. The log holds the tasks'
        // `started_at` either way; counting from the earlier `now_us`
        // keeps T6's argument (a start in a window with this claim's is
        // later than this claim's start - P, so later than `now_us` - P).
        let (tasks, at) = match (rate::plan(req, &log, now_us), key_rate) {
            (Some(claim), Some(kr)) => {
                let got = self.claim_keys(&mut *tx, &claim, kr).await?;
                key_next = got.key_next;
                (got.tasks, got.now_us)
            }
            (Some(claim), None) => (self.claim_in(tx, &claim).await?, now_us),
            (None, _) => (Vec::new(), now_us),
        };
        let started = vec![at; tasks.len()];
        let mut d = rate::finish(req, log, tasks, &started, now_us)?;
        if let Some(text) = d.write {
            self.q(&format!("UPDATE {r} SET starts = $2 WHERE name = $1"))
                .bind(&key)
                .bind(text)
                .execute(&mut *tx)
                .await?;
        }
        d.answer.key_next = key_rate::key_next_at(key_next, d.answer.now.timestamp_micros())?;
        Ok(d.answer)
    }

    /// `sql` (a call of a claim function) with the claim's first seven
    /// arguments bound, in the order the functions take them: the queue,
    /// the worker, the lease in ms, the limit, `max_running`, the per-key
    /// cap (NULL: none) and `buffered`.
    pub(super) fn claim_call<'q>(
        &self,
        sql: &'q str,
        req: &TaskClaim<'q>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        self.q(sql)
            .bind(req.queue)
            .bind(req.worker)
            .bind(dur(req.lease))
            .bind(i64::from(req.limit))
            .bind(req.max_running.map(i64::from))
            .bind(req.per_key_max_running.map(i64::from))
            .bind(i64::from(req.buffered))
    }

    /// A call of a claim function returning [`RETURNS`](super::fair::RETURNS)
    /// rows (the capped and fair claims): `function($1…$params, now)`,
    /// its rows' [`CLAIM_COLS`](crate::store::sql_row::CLAIM_COLS).
    pub(super) fn claim_function_call(&self, function: &str, params: usize) -> String {
        let args: Vec<String> = (1..=params).map(|i| format!("${i}")).collect();
        format!(
            "SELECT {} FROM {function}({}, {}) AS f({})",
            crate::store::sql_row::CLAIM_COLS,
            args.join(", "),
            self.names.now,
            super::fair::RETURNS
        )
    }

    /// The text key of the queue's advisory lock (transaction-scoped),
    /// hashed by `hashtextextended(key, 0)`: capped, fair and
    /// rated-per-key claimers of a queue take turns on it.
    pub(super) fn lock_key(&self, queue: &str) -> String {
        format!("{}:{}", self.names.chan, queue)
    }
}

#[async_trait]
impl Backend for PgBackend {
    fn kind(&self) -> &'static str {
        "postgres"
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

    fn pool_recycle(&self) {
        self.recycle.mark();
    }

    fn claims_carry_finishes(&self) -> bool {
        true
    }

    fn key_capped_claims_spare_places(&self) -> bool {
        true
    }

    fn wakes_across_processes(&self) -> bool {
        // Behind a transaction pooler without a direct URL there is no
        // LISTEN session (see `listener::subscribe`).
        !matches!((self.mode, &self.listen), (PoolMode::Transaction, None))
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        Ok(self.qs(&self.sql.now).fetch_one(self.exec()).await?)
    }

    // ---- locks -------------------------------------------------------------

    async fn lock_acquire(&self, req: &LockAcquire<'_>) -> Result<Acquire, StoreError> {
        // When our snapshot and the latest version disagree (a concurrent
        // grant or release), try again (bounded) rather than report a lapsed
        // holder as busy.
        let mut last = None;
        for _ in 0..3 {
            let row = self
                .q(&self.sql.lock_acquire)
                .bind(req.name)
                .bind(req.holder)
                .bind(dur(req.at_most))
                .fetch_optional(self.exec())
                .await?;
            if let Some(row) = row {
                if row.try_get::<bool, _>("granted")? {
                    return Ok(Acquire::Granted {
                        token: token_of(row.big("token")?, "lock token")?,
                        locked_at: row.time("locked_at")?,
                        lock_until: row.time("lock_until")?,
                    });
                }
                let info = lock_info(&row)?;
                if info.held {
                    return Ok(Acquire::Busy(info));
                }
            }
            match self.lock_get(req.name).await? {
                Some(info) if info.held => return Ok(Acquire::Busy(info)),
                other => last = other,
            }
        }
        match last {
            Some(info) => Ok(Acquire::Busy(info)),
            None => Err(StoreError::Backend(format!(
                "lock {:?}: neither granted nor found",
                req.name
            ))),
        }
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
        let crate::store::LockRelease {
            name,
            token,
            at_least,
            record,
        } = *params;
        let sql = match record {
            true => &self.sql.lock_release_recorded,
            false => &self.sql.lock_release,
        };
        // The release commits without waiting for its WAL flush
        // (`synchronous_commit = off` for this one transaction). That is
        // safe: a release lost in a server crash leaves the row as granted
        // or last extended, whose `lock_until` is never earlier than the
        // release's, so the lease just lasts until then, as if the holder
        // had died. It never shortens a lease and never touches the token,
        // and the next durable commit (any grant) flushes it anyway. Grants
        // and extensions stay synchronous: losing one would let a second
        // holder in (or reissue a token) after a crash.
        let r = self
            .q(sql)
            .bind(name)
            .bind(token_arg(token))
            .bind(dur(at_least))
            .execute(self.exec())
            .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn lock_get(&self, name: &str) -> Result<Option<LockInfo>, StoreError> {
        let row = self
            .q(&self.sql.lock_get)
            .bind(name)
            .fetch_optional(self.exec())
            .await?;
        row.as_ref().map(lock_info).transpose()
    }

    async fn lock_list(&self) -> Result<Vec<LockInfo>, StoreError> {
        let rows = self.q(&self.sql.lock_list).fetch_all(self.exec()).await?;
        rows.iter().map(lock_info).collect()
    }

    // ---- tasks -------------------------------------------------------------

    async fn task_insert_many(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        // One statement is atomic on its own: a single task, or one chunk
        // of tasks without unique keys (no conflict, so no second round),
        // needs no transaction around it, which saves two round trips.
        // A slot's task takes a transaction: its insert may have to be
        // taken back (a prune racing it; outbox.rs); so does a debounce or
        // throttle (its read, locks and write, `store::enqueue_keyed`). (Behind a transaction
        // pooler a statement runs in a transaction anyway: see `exec`.)
        if self.begin_sql.is_none()
            && tasks.iter().all(|t| t.key_policy.is_none())
            && ((tasks.len() == 1 && !crate::store::tombstoned_kind(&tasks[0]))
                || (tasks.len() <= INSERT_CHUNK && tasks.iter().all(|t| t.unique_key.is_none())))
        {
            let mut conn = self.pool.acquire().await?;
            return insert_tasks(&mut conn, &self.sql.insert, &self.names.chan, tasks, None).await;
        }
        let mut tx = self.begin().await?;
        let out = insert_tasks(&mut tx, &self.sql.insert, &self.names.chan, tasks, None).await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn task_claim(&self, req: &TaskClaim<'_>) -> Result<Vec<Task>, StoreError> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        // One statement each, in autocommit: uncapped, fair (a function)
        // or capped (a function).
        if req.fair {
            return self.claim_fair(self.exec(), req).await;
        }
        if req.max_running.is_some() || req.per_key_max_running.is_some() {
            return self.claim_capped(self.exec(), req).await;
        }
        self.plain_claim(self.exec(), req).await
    }

    async fn task_claim_rated(&self, req: &TaskClaimRated<'_>) -> Result<RatedClaim, StoreError> {
        // The finishes first, in the claim's transaction (one commit for
        // both), before it waits for the limit's row.
        let mut tx = self.begin().await?;
        let finished = self.finish_many_on(&mut *tx, req.finish).await?;
        let answer = self.rated_in(&mut tx, req, None).await?;
        tx.commit().await?;
        Ok(RatedClaim { finished, ..answer })
    }

    async fn task_claim_key_rated(
        &self,
        req: &TaskClaimKeyRated<'_>,
    ) -> Result<RatedClaim, StoreError> {
        match req.rated() {
            Some(rated) => {
                let mut tx = self.begin().await?;
                let finished = self.finish_many_on(&mut *tx, req.finish).await?;
                let answer = self.rated_in(&mut tx, &rated, Some(req.key_rate)).await?;
                tx.commit().await?;
                Ok(RatedClaim { finished, ..answer })
            }
            None if req.finish.is_empty() => {
                // One statement (the key rated claim function), in its own
                // transaction.
                let got = self
                    .claim_keys(self.exec(), &req.claim, req.key_rate)
                    .await?;
                key_rate::answer(got.tasks, got.now_us, got.key_next)
            }
            None => {
                // The finishes and the claim in one statement.
                let (finished, got) = self
                    .finish_and_claim_keys(req.finish, &req.claim, req.key_rate)
                    .await?;
                let answer = key_rate::answer(got.tasks, got.now_us, got.key_next)?;
                Ok(RatedClaim { finished, ..answer })
            }
        }
    }

    async fn task_heartbeat_many(
        &self,
        params: &crate::store::TaskHeartbeatMany<'_>,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        let crate::store::TaskHeartbeatMany { claims, lease } = *params;
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = claims.iter().map(|c| c.id).collect();
        let tokens: Vec<i64> = claims.iter().map(|c| token_arg(c.token)).collect();
        let rows = self
            .q(&self.sql.heartbeat)
            .bind(&ids)
            .bind(&tokens)
            .bind(dur(lease))
            .fetch_all(self.exec())
            .await?;
        let mut found: HashMap<(i64, i64), bool> = HashMap::with_capacity(rows.len());
        for row in rows {
            found.insert((row.try_get(0)?, row.try_get(1)?), row.try_get(2)?);
        }
        Ok(ids
            .iter()
            .zip(&tokens)
            .map(|(&id, &a)| match found.get(&(id, a)) {
                Some(true) => Heartbeat::CancelRequested,
                Some(false) => Heartbeat::Extended,
                None => Heartbeat::Lost,
            })
            .collect())
    }

    async fn task_finish_many(&self, items: &[(Claim, Finish)]) -> Result<Vec<bool>, StoreError> {
        self.finish_many(items).await
    }

    async fn task_finish_and_claim(
        &self,
        req: &crate::store::TaskFinishAndClaim<'_>,
    ) -> Result<crate::store::FinishedAndClaimed, StoreError> {
        self.finish_and_claim(req).await
    }

    async fn task_set_progress(
        &self,
        params: &crate::store::TaskSetProgress<'_>,
    ) -> Result<bool, StoreError> {
        let crate::store::TaskSetProgress { claim, progress } = *params;
        let r = self
            .q(&self.sql.progress)
            .bind(claim.id)
            .bind(token_arg(claim.token))
            .bind(progress)
            .execute(self.exec())
            .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn task_rescue_many(&self) -> Result<Rescued, StoreError> {
        let row = self
            .q(&self.sql.rescue)
            .bind(LEASE_EXPIRED)
            .bind(&self.names.chan)
            .fetch_one(self.exec())
            .await?;
        let get = |c: &str| -> Result<u64, StoreError> {
            let v: i64 = row.try_get(c)?;
            Ok(u64::try_from(v).unwrap_or(0))
        };
        Ok(Rescued {
            requeued: get("requeued")?,
            failed: get("failed")?,
            cancelled: get("cancelled")?,
        })
    }

    async fn task_cancel(&self, id: i64) -> Result<CancelOutcome, StoreError> {
        crate::store::job_advance::task_cancel(self.tx().await?, id).await
    }

    async fn task_retry(&self, id: i64) -> Result<bool, StoreError> {
        let row = self
            .q(&self.sql.retry)
            .bind(id)
            .bind(&self.names.chan)
            .fetch_optional(self.exec())
            .await
            .map_err(|e| match StoreError::from(e) {
                StoreError::Conflict(_) => StoreError::Conflict(format!(
                    "task {id}: its unique key is taken by another unfinished task"
                )),
                other => other,
            })?;
        Ok(row.is_some())
    }

    async fn task_get(&self, id: i64) -> Result<Option<TaskInfo>, StoreError> {
        let row = self
            .q(&self.sql.task)
            .bind(id)
            .fetch_optional(self.exec())
            .await?;
        row.as_ref().map(task_info).transpose()
    }

    async fn task_list(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, StoreError> {
        let (where_, args) = task_search::where_clause::<Search>(filter);
        let limit = task_search::page_size(filter);
        let sql = format!("{} {where_} ORDER BY id DESC LIMIT {limit}", self.sql.tasks);
        let mut q = self.q(&sql);
        for a in args {
            q = match a {
                SearchArg::Text(v) => q.bind(v),
                SearchArg::Int(v) => q.bind(v),
                SearchArg::Time(t) => q.bind(t),
            };
        }
        let rows = q.fetch_all(self.exec()).await?;
        rows.iter().map(task_info).collect()
    }

    async fn queue_set_paused(
        &self,
        params: &crate::store::QueueSetPaused<'_>,
    ) -> Result<(), StoreError> {
        let (queue, paused, note) = (params.queue, params.paused, params.note);
        self.q(&self.sql.queue_set_paused)
            .bind(queue)
            .bind(paused)
            .bind(&self.names.chan)
            .bind(note.note)
            .bind(note.by)
            .fetch_all(self.exec())
            .await?;
        Ok(())
    }

    async fn queue_stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        let paused = self
            .q(&self.sql.queues_paused)
            .fetch_all(self.exec())
            .await?
            .iter()
            .map(queue_row)
            .collect::<Result<Vec<_>, _>>()?;
        let rows = self.q(&self.sql.stats).fetch_all(self.exec()).await?;
        let mut out = rows
            .iter()
            .map(queue_stats)
            .collect::<Result<Vec<_>, _>>()?;
        crate::store::mark_paused(&mut out, paused);
        Ok(out)
    }

    async fn task_prune_many(&self, older_than: Duration) -> Result<u64, StoreError> {
        let n: i64 = self
            .qs(&self.sql.prune)
            .bind(dur(older_than))
            .fetch_one(self.exec())
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
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
        Ok(self
            .qs(&self.sql.delete)
            .bind(ids)
            .fetch_all(self.exec())
            .await?)
    }

    async fn wake_subscribe(&self) -> Result<broadcast::Receiver<Wake>, StoreError> {
        Ok(listener::subscribe(self))
    }

    // ---- schedules ---------------------------------------------------------

    async fn job_register(
        &self,
        params: &crate::store::JobRegister<'_>,
    ) -> Result<JobState, StoreError> {
        let row = self
            .q(&self.sql.job_insert)
            .bind(params.job)
            .bind(params.queue)
            .bind(params.overlap.map(|o| o.as_str()))
            .bind(params.fingerprint)
            .fetch_one(self.exec())
            .await?;
        job_state(&row)
    }

    async fn slot_get(&self, key: &str) -> Result<Option<crate::store::PrunedSlot>, StoreError> {
        self.q(&self.sql.slot_get)
            .bind(key)
            .fetch_optional(self.exec())
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
        let r = self
            .q(&self.sql.job_set_paused)
            .bind(job)
            .bind(paused)
            .bind(note.note)
            .bind(note.by)
            .execute(self.exec())
            .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn job_list(&self) -> Result<Vec<JobState>, StoreError> {
        let rows = self.q(&self.sql.job_list).fetch_all(self.exec()).await?;
        rows.iter().map(job_state).collect()
    }

    async fn job_get(&self, job: &str) -> Result<Option<JobState>, StoreError> {
        self.q(&self.sql.job_get)
            .bind(job)
            .fetch_optional(self.exec())
            .await?
            .as_ref()
            .map(job_state)
            .transpose()
    }
}

impl PgBackend {
    /// Run a lock statement of (`$1` name, `$2` token, `$3` ms) that
    /// answers the lease's new `lock_until`, or no row when the lease was
    /// not current (extend, revoke).
    async fn lock_until_after(
        &self,
        sql: &str,
        name: &str,
        token: crate::store::FencingToken,
        d: Duration,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(self
            .qs(sql)
            .bind(name)
            .bind(token_arg(token))
            .bind(dur(d))
            .fetch_optional(self.exec())
            .await?)
    }
}
