//! The [`Backend`] impl of the Redis backend: each call is one script (see
//! `lua/`), with its arguments built and its reply read in [`super::decode`].

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::broadcast;

use super::decode::{opt_ts, parse_i64, parse_u64, task_info, token_u64};
use super::schema::LOCK_INDEX;
use super::{forget, jobs, listener, schema, RedisBackend};
use super::{BATCH, ENQUEUE_CHUNK, FINISH_CHUNK};
use crate::error::StoreError;
use crate::store::SchemaStatus;
use crate::store::{
    from_ms, ms, Acquire, Advanced, Backend, CancelOutcome, Claim, Enqueued, FencingToken, Finish,
    Heartbeat, JobAdvance, JobState, LockAcquire, LockInfo, NewTask, QueueStats, Rescued, Task,
    TaskClaim, TaskFilter, TaskInfo, TaskState, Wake, CANCEL_REQUESTED, LEASE_EXPIRED,
};
use crate::store::{AuditAppend, AuditPage, AuditRecord, StatsQuery, StatsRow};
use crate::store::{RatedClaim, TaskClaimRated};

#[async_trait]
impl Backend for RedisBackend {
    fn key_capped_claims_spare_places(&self) -> bool {
        true
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    fn wakes_across_processes(&self) -> bool {
        true
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        schema::migrate(self).await
    }

    async fn schema_remove(&self) -> Result<(), StoreError> {
        schema::remove(self).await
    }

    async fn schema_status(&self) -> Result<SchemaStatus, StoreError> {
        schema::status(self).await
    }

    /// Nothing: every new id is floored at the server's `TIME` in µs by
    /// the insert script itself (`B seq`, DESIGN.md I1).
    async fn task_id_floor(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// No probe yet: a READONLY reply to a write is classified where the
    /// driver's errors are mapped.
    async fn store_write_probe(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn store_identity(&self) -> Result<crate::store::StoreIdentity, StoreError> {
        let (id, seq): (Option<String>, Option<String>) = read_retry!({
            let mut conn = self.conn.clone();
            redis::cmd("MGET")
                .arg(self.key(schema::STORE_ID))
                .arg(self.key("seq"))
                .query_async::<(Option<String>, Option<String>)>(&mut conn)
                .await
                .map_err(StoreError::from)
        })?;
        Ok(crate::store::StoreIdentity {
            id,
            last_task_id: match seq {
                Some(s) => parse_i64(&s, "seq")?,
                None => 0,
            },
        })
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        let (s, us): (i64, i64) = read_retry!({
            let mut conn = self.conn.clone();
            redis::cmd("TIME")
                .query_async::<(i64, i64)>(&mut conn)
                .await
                .map_err(StoreError::from)
        })?;
        #[cfg(feature = "test-clock")]
        let us = us + read_retry!(self.test_clock_offset().await.map_err(StoreError::from))?;
        from_ms(s * 1000 + us.div_euclid(1000))
    }

    async fn warnings(&self) -> Result<Vec<String>, StoreError> {
        let mut conn = self.conn.clone();
        let reply: Result<Vec<String>, redis::RedisError> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendonly")
            .query_async(&mut conn)
            .await;
        match reply {
            Ok(v) => {
                if v.get(1).is_some_and(|s| s.eq_ignore_ascii_case("no")) {
                    Ok(vec![
                        "redis persistence: appendonly is off, so the lock, queue and schedule \
                         guarantees hold only as far as Redis keeps its data (a restart can lose \
                         locks, tasks and schedule cursors); set `appendonly yes` (AOF)"
                            .to_string(),
                    ])
                } else {
                    Ok(Vec::new())
                }
            }
            Err(e) => {
                let err = StoreError::from(e);
                if err.is_retryable() {
                    return Err(err);
                }
                // CONFIG is often disabled on managed Redis: nothing to check.
                tracing::debug!("redis: cannot read appendonly: {err}");
                Ok(Vec::new())
            }
        }
    }

    // ---- locks -------------------------------------------------------------

    async fn lock_acquire(&self, req: &LockAcquire<'_>) -> Result<Acquire, StoreError> {
        let acquire = self.l::<Vec<redis::Value>>(
            &self.scripts.lock_acquire,
            req.name,
            sargs![req.holder, ms(req.at_most)],
        );
        // The name goes into the lock index (what `lock_list` reads) with
        // this process's first acquire of it, sent alongside on the same
        // connection (no extra round trip). The index is not the lock: if
        // adding fails, the acquire stands and the next one adds it.
        let v = if self.lock_indexed(req.name) {
            acquire.await?
        } else {
            let mut conn = self.conn.clone();
            let mut sadd = redis::cmd("SADD");
            sadd.arg(self.key(LOCK_INDEX)).arg(req.name);
            let index = sadd.query_async::<()>(&mut conn);
            let (indexed, v) = tokio::join!(index, acquire);
            match indexed {
                Ok(()) => self.mark_lock_indexed(req.name),
                Err(e) => {
                    tracing::debug!(lock = req.name, error = %e, "redis: could not add the lock to the lock index; the next acquire will")
                }
            }
            v?
        };
        let int = |i: usize, what: &str| -> Result<i64, StoreError> {
            v.get(i)
                .and_then(|x| redis::from_redis_value::<i64>(x).ok())
                .ok_or_else(|| StoreError::Corrupt(format!("lock acquire: {what}: {v:?}")))
        };
        match int(0, "outcome")? {
            1 => Ok(Acquire::Granted {
                token: FencingToken(token_u64(int(1, "token")?)?),
                locked_at: from_ms(int(2, "locked_at")?)?,
                lock_until: from_ms(int(3, "lock_until")?)?,
            }),
            0 => {
                let holder = v
                    .get(1)
                    .and_then(|x| redis::from_redis_value::<String>(x).ok())
                    .ok_or_else(|| StoreError::Corrupt(format!("lock acquire: holder: {v:?}")))?;
                let until = int(4, "lock_until")?;
                let now = int(5, "now")?;
                Ok(Acquire::Busy(LockInfo {
                    name: req.name.to_string(),
                    holder,
                    token: FencingToken(token_u64(int(2, "token")?)?),
                    locked_at: from_ms(int(3, "locked_at")?)?,
                    lock_until: from_ms(until)?,
                    held: until > now,
                    now: from_ms(now)?,
                }))
            }
            2 => {
                // A value baton did not write where the lock would be:
                // held by something else, for as long as it lives.
                let kind = v
                    .get(1)
                    .and_then(|x| redis::from_redis_value::<String>(x).ok())
                    .unwrap_or_default();
                let pttl = int(2, "pttl")?;
                let now = int(3, "now")?;
                let expiry = if pttl > 0 {
                    format!(
                        "expiring in {}",
                        crate::format_duration(Duration::from_millis(pttl.unsigned_abs()))
                    )
                } else {
                    "without an expiry".to_string()
                };
                let until = if pttl > 0 {
                    now.saturating_add(pttl)
                } else {
                    now
                };
                // Not a lock of baton's: its name leaves the lock index
                // (where it may have been added alongside this acquire).
                self.unmark_lock_indexed(req.name);
                let mut conn = self.conn.clone();
                if let Err(e) = redis::cmd("SREM")
                    .arg(self.key(LOCK_INDEX))
                    .arg(req.name)
                    .query_async::<()>(&mut conn)
                    .await
                {
                    tracing::debug!(lock = req.name, error = %e, "redis: could not take a foreign key's name out of the lock index");
                }
                Ok(Acquire::Busy(LockInfo {
                    name: req.name.to_string(),
                    holder: format!(
                        "something else: a {kind} key baton did not write at {:?} ({expiry}); baton leaves it alone",
                        self.lock_key(req.name)
                    ),
                    token: FencingToken(0),
                    locked_at: from_ms(now)?,
                    lock_until: from_ms(until)?,
                    held: true,
                    now: from_ms(now)?,
                }))
            }
            _ => Err(StoreError::Corrupt(format!(
                "lock acquire: unexpected reply {v:?}"
            ))),
        }
    }

    async fn lock_extend(
        &self,
        params: &crate::store::LockExtend<'_>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let p = params;
        self.lock_until_after(&self.scripts.lock_extend, p.name, p.token, p.at_most)
            .await
    }

    async fn lock_revoke(
        &self,
        params: &crate::store::LockRevoke<'_>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let p = params;
        self.lock_until_after(&self.scripts.lock_revoke, p.name, p.token, p.within)
            .await
    }

    async fn lock_release(
        &self,
        params: &crate::store::LockRelease<'_>,
    ) -> Result<bool, StoreError> {
        super::lock_history::release(self, params).await
    }

    async fn lock_get(&self, name: &str) -> Result<Option<LockInfo>, StoreError> {
        let names = [name.to_string()];
        let v = read_retry!(self.lock_records(&names).await)?;
        Ok(v.into_iter().next())
    }

    async fn lock_list(&self) -> Result<Vec<LockInfo>, StoreError> {
        let names = read_retry!(schema::lock_names(self).await)?;
        let mut out = Vec::with_capacity(names.len());
        for chunk in names.chunks(500) {
            out.extend(read_retry!(self.lock_records(chunk).await)?);
        }
        Ok(out)
    }

    // ---- tasks -------------------------------------------------------------

    async fn task_insert_many(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        // A composite key scoped wider than its queue (which `Queue`
        // refuses first, naming the field) cannot be held here.
        if let Some(k) = tasks.iter().find_map(|t| {
            let k = crate::store::UniqueKey::parse(t.unique_key.as_deref()?);
            (k.composed && k.scope.spans_queues()).then_some(k)
        }) {
            return Err(StoreError::Config(format!(
                "unique key {k}: scope {} is not available on Redis, which keeps unique keys \
                 per queue; use kind-in-queue or queue",
                k.scope
            )));
        }
        // One group per queue (each queue's keys are on one shard), in
        // order within each; the answer keeps the callers' order.
        let mut order: Vec<usize> = (0..tasks.len()).collect();
        order.sort_by(|&a, &b| tasks[a].queue.cmp(&tasks[b].queue));
        let queues: Vec<&str> = order.iter().map(|&i| tasks[i].queue.as_str()).collect();
        let first = self.reserve_ids(&queues).await?;
        let single = tasks.len() <= ENQUEUE_CHUNK && queues.first() == queues.last();
        let mut out: Vec<Option<Enqueued>> = vec![None; tasks.len()];
        let mut unused = Vec::new();
        let mut wake: BTreeSet<&str> = BTreeSet::new();
        let mut pos = 0usize;
        for group in order.chunk_by(|&a, &b| tasks[a].queue == tasks[b].queue) {
            let queue = tasks[group[0]].queue.as_str();
            let group_tasks: Vec<&NewTask> = group.iter().map(|&i| &tasks[i]).collect();
            let replies = self
                .enqueue_queue(queue, &group_tasks, first + pos as i64, single)
                .await;
            let replies = match replies {
                Ok(r) => r,
                Err(e) => {
                    // This group's tasks may exist though the call failed:
                    // its earlier round trips inserted theirs, and the one
                    // that failed may have run (its reply lost with the
                    // connection, or its `WAIT` cut short by a failover
                    // that promoted a replica which had the write). Their
                    // ids stay in `B where`: an entry of an id no task
                    // took is harmless, a task without one is not found by
                    // its id (which the retry of a keyed enqueue answers).
                    // The next groups' ids were never sent.
                    unused.extend((pos + group.len()..tasks.len()).map(|j| first + j as i64));
                    self.unreserve(&unused).await;
                    return Err(e);
                }
            };
            for (k, (&i, (e, due))) in group.iter().zip(replies).enumerate() {
                if !e.inserted {
                    unused.push(first + (pos + k) as i64);
                } else if due {
                    wake.insert(queue);
                }
                out[i] = Some(e);
            }
            pos += group.len();
        }
        self.unreserve(&unused).await;
        if !single && !wake.is_empty() {
            let chan = self.wake_channel();
            let mut conn = self.conn.clone();
            for q in &wake {
                // The tasks are stored; a lost wake-up only delays them
                // until the workers poll, so this must not fail the call.
                if let Err(e) = redis::cmd("PUBLISH")
                    .arg(&chan)
                    .arg(*q)
                    .query_async::<()>(&mut conn)
                    .await
                {
                    tracing::warn!("redis: publishing wake-ups failed: {e}");
                }
            }
        }
        out.into_iter()
            .map(|e| {
                e.ok_or_else(|| StoreError::Corrupt("enqueue: a task without an answer".into()))
            })
            .collect()
    }

    async fn task_claim(&self, req: &TaskClaim<'_>) -> Result<Vec<Task>, StoreError> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let maps = self.claim_script(req, None, None).await?;
        self.claimed(req.queue, &maps)
    }

    async fn task_claim_rated(&self, req: &TaskClaimRated<'_>) -> Result<RatedClaim, StoreError> {
        // The finishes first, a call of their own (a queue's finishes are
        // one script call per queue; the claim another).
        let finished = crate::store::finish_ahead(self, req.finish).await?;
        let answer = self.claim_rated(req, None).await?;
        Ok(RatedClaim { finished, ..answer })
    }

    async fn task_claim_key_rated(
        &self,
        req: &crate::store::TaskClaimKeyRated<'_>,
    ) -> Result<RatedClaim, StoreError> {
        let finished = crate::store::finish_ahead(self, req.finish).await?;
        let answer = self.claim_key_rated(req).await?;
        Ok(RatedClaim { finished, ..answer })
    }

    async fn task_heartbeat_many(
        &self,
        params: &crate::store::TaskHeartbeatMany<'_>,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        let crate::store::TaskHeartbeatMany { claims, lease } = *params;
        let mut out = vec![Heartbeat::Lost; claims.len()];
        for (queue, idx) in self.by_queue(claims.iter().map(|c| c.id)).await? {
            let mut args = sargs![ms(lease)];
            for &i in &idx {
                args.extend(sargs![claims[i].id, claims[i].token.0]);
            }
            let v: Vec<i64> = self.qs(&queue, &self.scripts.heartbeat, args).await?;
            if v.len() != idx.len() {
                return Err(StoreError::Corrupt(format!(
                    "heartbeat: {} answers for {} claims",
                    v.len(),
                    idx.len()
                )));
            }
            for (&i, x) in idx.iter().zip(v) {
                out[i] = match x {
                    1 => Heartbeat::Extended,
                    2 => Heartbeat::CancelRequested,
                    _ => Heartbeat::Lost,
                };
            }
        }
        Ok(out)
    }

    async fn task_finish_many(&self, items: &[(Claim, Finish)]) -> Result<Vec<bool>, StoreError> {
        // One script call per queue and chunk: every item is its own
        // compare-and-set. A task of no known queue was never enqueued.
        let mut out = vec![false; items.len()];
        for (queue, idx) in self.by_queue(items.iter().map(|(c, _)| c.id)).await? {
            for chunk in idx.chunks(FINISH_CHUNK) {
                let mut args = Vec::with_capacity(chunk.len() * 5 + 1);
                args.push(CANCEL_REQUESTED.to_string());
                for &i in chunk {
                    let (claim, finish) = &items[i];
                    let (kind, text, retry) = match finish {
                        Finish::Succeeded => ("s", "", String::new()),
                        Finish::Failed { error, retry_in } => (
                            "f",
                            error.as_str(),
                            retry_in.map(|d| ms(d).to_string()).unwrap_or_default(),
                        ),
                        Finish::Cancelled { reason } => ("c", reason.as_str(), String::new()),
                        Finish::HandBack => ("h", "", String::new()),
                        Finish::Snoozed { run_in } => ("h", "", ms(*run_in).to_string()),
                    };
                    args.extend(sargs![claim.id, claim.token.0, kind, text, retry]);
                }
                let done: Vec<i64> = self.qs(&queue, &self.scripts.finish, args).await?;
                if done.len() != chunk.len() {
                    return Err(StoreError::Corrupt(format!(
                        "finish: {} answers for {} items",
                        done.len(),
                        chunk.len()
                    )));
                }
                for (&i, v) in chunk.iter().zip(done) {
                    out[i] = v == 1;
                }
            }
        }
        Ok(out)
    }

    async fn task_finish_and_claim(
        &self,
        req: &crate::store::TaskFinishAndClaim<'_>,
    ) -> Result<crate::store::FinishedAndClaimed, StoreError> {
        crate::store::finish_then_claim(self, req).await
    }

    async fn task_set_progress(
        &self,
        params: &crate::store::TaskSetProgress<'_>,
    ) -> Result<bool, StoreError> {
        let crate::store::TaskSetProgress { claim, progress } = *params;
        let json = serde_json::to_string(progress)
            .map_err(|e| StoreError::Backend(format!("progress to JSON: {e}")))?;
        let Some(queue) = self.queue_of(claim.id).await? else {
            return Ok(false);
        };
        let v: i64 = self
            .qs(
                &queue,
                &self.scripts.progress,
                sargs![claim.id, claim.token.0, json],
            )
            .await?;
        Ok(v == 1)
    }

    async fn task_rescue_many(&self) -> Result<Rescued, StoreError> {
        let mut total = Rescued::default();
        for queue in self.queues().await? {
            loop {
                let v: Vec<i64> = self
                    .qs(&queue, &self.scripts.rescue, sargs![BATCH, LEASE_EXPIRED])
                    .await?;
                if v.len() != 4 {
                    return Err(StoreError::Corrupt(format!("rescue: reply {v:?}")));
                }
                total.requeued += v[0].max(0) as u64;
                total.failed += v[1].max(0) as u64;
                total.cancelled += v[2].max(0) as u64;
                if (v[3] as usize) < BATCH {
                    break;
                }
            }
        }
        Ok(total)
    }

    async fn task_cancel(&self, id: i64) -> Result<CancelOutcome, StoreError> {
        let Some(queue) = self.queue_of(id).await? else {
            return Ok(CancelOutcome::NotFound);
        };
        let (outcome, state): (String, String) =
            self.qs(&queue, &self.scripts.cancel, sargs![id]).await?;
        match outcome.as_str() {
            "cancelled" => Ok(CancelOutcome::Cancelled),
            "requested" => Ok(CancelOutcome::Requested),
            "notfound" => Ok(CancelOutcome::NotFound),
            _ => Ok(CancelOutcome::AlreadyFinished(state.parse()?)),
        }
    }

    async fn task_retry(&self, id: i64) -> Result<bool, StoreError> {
        let Some(queue) = self.queue_of(id).await? else {
            return Ok(false);
        };
        let v: i64 = self.qs(&queue, &self.scripts.retry, sargs![id]).await?;
        match v {
            1 => Ok(true),
            -1 => Err(StoreError::Conflict(format!(
                "task {id}: its unique key is taken by another unfinished task of queue {queue:?}"
            ))),
            _ => Ok(false),
        }
    }

    async fn task_get(&self, id: i64) -> Result<Option<TaskInfo>, StoreError> {
        let Some(queue) = read_retry!(self.queue_of(id).await)? else {
            return Ok(None);
        };
        let key = format!("{}task:{id}", self.qbase(&queue));
        let m: HashMap<String, String> = read_retry!({
            let mut conn = self.conn.clone();
            redis::cmd("HGETALL")
                .arg(&key)
                .query_async::<HashMap<String, String>>(&mut conn)
                .await
                .map_err(StoreError::from)
        })?;
        if m.is_empty() {
            return Ok(None);
        }
        task_info(&m).map(Some)
    }

    async fn task_list(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, StoreError> {
        read_retry!(self.list_page(filter).await)
    }

    async fn queue_set_paused(
        &self,
        params: &crate::store::QueueSetPaused<'_>,
    ) -> Result<(), StoreError> {
        jobs::queue_set_paused(self, params).await
    }

    async fn queue_stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        let mut queues: BTreeSet<String> = read_retry!(self.queues().await)?.into_iter().collect();
        let paused: Vec<String> = read_retry!({
            let mut conn = self.conn.clone();
            redis::cmd("SMEMBERS")
                .arg(self.key("paused"))
                .query_async::<Vec<String>>(&mut conn)
                .await
                .map_err(StoreError::from)
        })?;
        queues.extend(paused);
        let mut out = Vec::new();
        for queue in queues {
            type Row = (
                HashMap<String, i64>,
                String,
                String,
                Option<String>,
                Option<String>,
                Option<String>,
            );
            let (counts, age, paused, note, by, at): Row =
                read_retry!(self.qs(&queue, &self.scripts.stats, sargs![queue]).await)?;
            let pause_change = crate::store::PauseChange::from_parts(
                note,
                by,
                opt_ts(at.as_deref().unwrap_or_default(), "pause_at")?,
            );
            let paused = paused == "1";
            let c = |s: TaskState| counts.get(s.as_str()).copied().unwrap_or(0).max(0) as u64;
            let st = QueueStats {
                pending: c(TaskState::Pending),
                running: c(TaskState::Running),
                succeeded: c(TaskState::Succeeded),
                failed: c(TaskState::Failed),
                cancelled: c(TaskState::Cancelled),
                oldest_pending_ms: if age.is_empty() {
                    None
                } else {
                    Some(parse_u64(&age, "oldest pending age")?)
                },
                paused,
                pause_change,
                queue,
                limits: None,
            };
            if paused || st.pending + st.running + st.succeeded + st.failed + st.cancelled > 0 {
                out.push(st);
            }
        }
        Ok(out)
    }

    async fn task_prune_many(&self, older_than: Duration) -> Result<u64, StoreError> {
        forget::prune_many(self, older_than).await
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

    async fn audit_append(&self, entry: &AuditAppend<'_>) -> Result<(), StoreError> {
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

    async fn jobdef_put(
        &self,
        p: &crate::store::JobDefPut<'_>,
    ) -> Result<crate::store::JobDefWrite, StoreError> {
        super::jobdefs::put(self, p).await
    }

    async fn jobdef_delete(
        &self,
        d: &crate::store::JobDefDelete<'_>,
    ) -> Result<crate::store::JobDefWrite, StoreError> {
        super::jobdefs::delete(self, d).await
    }

    async fn jobdef_list(&self) -> Result<Vec<crate::store::JobDef>, StoreError> {
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
        forget::delete_many(self, ids).await
    }

    async fn wake_subscribe(&self) -> Result<broadcast::Receiver<Wake>, StoreError> {
        Ok(listener::subscribe(self).await)
    }

    // ---- schedules ---------------------------------------------------------

    async fn job_register(
        &self,
        params: &crate::store::JobRegister<'_>,
    ) -> Result<JobState, StoreError> {
        jobs::job_register(self, params).await
    }

    async fn slot_get(&self, key: &str) -> Result<Option<crate::store::PrunedSlot>, StoreError> {
        jobs::slot_get(self, key).await
    }

    async fn job_advance(&self, adv: &JobAdvance<'_>) -> Result<Advanced, StoreError> {
        jobs::job_advance(self, adv).await
    }

    async fn job_release(&self, job: &str) -> Result<Option<i64>, StoreError> {
        jobs::job_release(self, job).await
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
