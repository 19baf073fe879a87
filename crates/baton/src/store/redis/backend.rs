//! The [`Backend`] impl of the Redis backend: each call is one script (see
//! `lua/`), with its arguments built and its reply read in [`super::decode`].

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::broadcast;

use super::decode::{opt_ts, parse_i64, parse_u64, push_task_args, task, task_args, task_info};
use super::schema::LOCK_INDEX;
use super::{listener, schema, RedisBackend};
use super::{BATCH, ENQUEUE_CHUNK, ENQUEUE_PIPELINE, FINISH_CHUNK};
use crate::error::StoreError;
use crate::store::SchemaStatus;
use crate::store::{
    from_ms, ms, Acquire, Advanced, Backend, CancelOutcome, Claim, ClaimRequest, Enqueued,
    FencingToken, Finish, Heartbeat, JobState, LockInfo, LockRequest, NewTask, Overlap, QueueStats,
    Rescued, SlotAdvance, SlotRecord, Task, TaskFilter, TaskInfo, TaskState, Wake,
    CANCEL_REQUESTED, LEASE_EXPIRED, OVERLAP_SKIPPED,
};

#[async_trait]
impl Backend for RedisBackend {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        schema::migrate(self).await
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
        from_ms(s * 1000 + us / 1000)
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

    async fn lock_acquire(&self, req: &LockRequest<'_>) -> Result<Acquire, StoreError> {
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
        let crate::store::LockRelease {
            name,
            token,
            at_least,
        } = *params;
        let v: i64 = self
            .l(
                &self.scripts.lock_release,
                name,
                sargs![token.0.to_string(), ms(at_least)],
            )
            .await?;
        Ok(v == 1)
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
        let chunks: Vec<&[NewTask]> = tasks.chunks(ENQUEUE_CHUNK).collect();
        let single = chunks.len() == 1;
        let seq = self.key("seq");
        let hash = self.scripts.enqueue.get_hash().to_string();
        let mut out = Vec::with_capacity(tasks.len());
        let mut wake: BTreeSet<&str> = BTreeSet::new();
        let mut conn = self.conn.clone();
        for group in chunks.chunks(ENQUEUE_PIPELINE) {
            let pipe = |load: bool| {
                let mut pipe = redis::pipe();
                if load {
                    pipe.cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(&self.scripts.enqueue_code)
                        .ignore();
                }
                for chunk in group {
                    pipe.cmd("EVALSHA")
                        .arg(&hash)
                        .arg(1)
                        .arg(&seq)
                        .arg(&self.base)
                        .arg(if single { "1" } else { "0" });
                    for t in *chunk {
                        push_task_args(&mut pipe, t)?;
                    }
                }
                Ok::<_, StoreError>(pipe)
            };
            // One script call goes alone (the script is ~8 KB: loading it
            // each time cost more than the insert); a NOSCRIPT answer means
            // it did nothing, so it is loaded and sent again. Several go
            // after a load in the same pipeline, as a NOSCRIPT among them
            // would leave unknown which ones ran.
            let replies: Vec<Vec<i64>> = if group.len() == 1 {
                match pipe(false)?.query_async(&mut conn).await {
                    Err(e) if e.kind() == redis::ErrorKind::NoScriptError => {
                        pipe(true)?.query_async(&mut conn).await?
                    }
                    r => r?,
                }
            } else {
                pipe(true)?.query_async(&mut conn).await?
            };
            if replies.len() != group.len() {
                return Err(StoreError::Corrupt(format!(
                    "enqueue: {} replies for {} scripts",
                    replies.len(),
                    group.len()
                )));
            }
            for (chunk, reply) in group.iter().zip(replies) {
                if reply.len() != chunk.len() * 3 {
                    return Err(StoreError::Corrupt(format!(
                        "enqueue: reply of {} values for {} tasks",
                        reply.len(),
                        chunk.len()
                    )));
                }
                for (t, r) in chunk.iter().zip(reply.chunks(3)) {
                    let inserted = r[1] == 1;
                    if inserted && r[2] == 1 {
                        wake.insert(t.queue.as_str());
                    }
                    out.push(Enqueued { id: r[0], inserted });
                }
            }
        }
        if !single && !wake.is_empty() {
            let chan = self.wake_channel();
            let mut pipe = redis::pipe();
            for q in &wake {
                pipe.cmd("PUBLISH").arg(&chan).arg(*q).ignore();
            }
            // The tasks are stored; a lost wake-up only delays them until
            // the workers poll, so this must not fail the call.
            if let Err(e) = pipe.query_async::<()>(&mut conn).await {
                tracing::warn!("redis: publishing wake-ups failed: {e}");
            }
        }
        Ok(out)
    }

    async fn task_claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<Task>, StoreError> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let maps: Vec<HashMap<String, String>> = self
            .q(
                &self.scripts.claim,
                sargs![
                    req.queue,
                    req.worker,
                    req.limit,
                    ms(req.lease),
                    req.max_running.map(|m| m.to_string()).unwrap_or_default(),
                    CANCEL_REQUESTED,
                    req.limit.saturating_sub(req.buffered)
                ],
            )
            .await?;
        maps.iter().map(task).collect()
    }

    async fn task_heartbeat_many(
        &self,
        params: &crate::store::TaskHeartbeatMany<'_>,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        let crate::store::TaskHeartbeatMany { claims, lease } = *params;
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = self.scripts.heartbeat.key(self.key("seq"));
        inv.arg(&self.base).arg(ms(lease));
        for c in claims {
            inv.arg(c.id).arg(c.token.0);
        }
        let mut conn = self.conn.clone();
        let v: Vec<i64> = inv.invoke_async(&mut conn).await?;
        if v.len() != claims.len() {
            return Err(StoreError::Corrupt(format!(
                "heartbeat: {} answers for {} claims",
                v.len(),
                claims.len()
            )));
        }
        Ok(v.into_iter()
            .map(|x| match x {
                1 => Heartbeat::Extended,
                2 => Heartbeat::CancelRequested,
                _ => Heartbeat::Lost,
            })
            .collect())
    }

    async fn task_finish_many(&self, items: &[(Claim, Finish)]) -> Result<Vec<bool>, StoreError> {
        // One script call per chunk: every item is its own compare-and-set.
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(FINISH_CHUNK) {
            let mut args = Vec::with_capacity(chunk.len() * 5 + 1);
            args.push(CANCEL_REQUESTED.to_string());
            for (claim, finish) in chunk {
                let (kind, text, retry) = match finish {
                    Finish::Succeeded => ("s", "", String::new()),
                    Finish::Failed { error, retry_in } => (
                        "f",
                        error.as_str(),
                        retry_in.map(|d| ms(d).to_string()).unwrap_or_default(),
                    ),
                    Finish::Cancelled { reason } => ("c", reason.as_str(), String::new()),
                    Finish::HandBack => ("h", "", String::new()),
                };
                args.extend(sargs![claim.id, claim.token.0, kind, text, retry]);
            }
            let done: Vec<i64> = self.q(&self.scripts.finish, args).await?;
            if done.len() != chunk.len() {
                return Err(StoreError::Corrupt(format!(
                    "finish: {} answers for {} items",
                    done.len(),
                    chunk.len()
                )));
            }
            out.extend(done.into_iter().map(|v| v == 1));
        }
        Ok(out)
    }

    async fn task_set_progress(
        &self,
        params: &crate::store::TaskSetProgress<'_>,
    ) -> Result<bool, StoreError> {
        let crate::store::TaskSetProgress { claim, progress } = *params;
        let json = serde_json::to_string(progress)
            .map_err(|e| StoreError::Backend(format!("progress to JSON: {e}")))?;
        let v: i64 = self
            .q(
                &self.scripts.progress,
                sargs![claim.id, claim.token.0, json],
            )
            .await?;
        Ok(v == 1)
    }

    async fn task_rescue_many(&self) -> Result<Rescued, StoreError> {
        let mut total = Rescued::default();
        loop {
            let v: Vec<i64> = self
                .q(&self.scripts.rescue, sargs![BATCH, LEASE_EXPIRED])
                .await?;
            if v.len() != 4 {
                return Err(StoreError::Corrupt(format!("rescue: reply {v:?}")));
            }
            total.requeued += v[0].max(0) as u64;
            total.failed += v[1].max(0) as u64;
            total.cancelled += v[2].max(0) as u64;
            if (v[3] as usize) < BATCH {
                return Ok(total);
            }
        }
    }

    async fn task_cancel(&self, id: i64) -> Result<CancelOutcome, StoreError> {
        let (outcome, state): (String, String) = self.q(&self.scripts.cancel, sargs![id]).await?;
        match outcome.as_str() {
            "cancelled" => Ok(CancelOutcome::Cancelled),
            "requested" => Ok(CancelOutcome::Requested),
            "notfound" => Ok(CancelOutcome::NotFound),
            _ => Ok(CancelOutcome::AlreadyFinished(state.parse()?)),
        }
    }

    async fn task_retry(&self, id: i64) -> Result<bool, StoreError> {
        let v: i64 = self.q(&self.scripts.retry, sargs![id]).await?;
        match v {
            1 => Ok(true),
            -1 => Err(StoreError::Conflict(format!(
                "task {id}: its unique key is taken by another unfinished task"
            ))),
            _ => Ok(false),
        }
    }

    async fn task_get(&self, id: i64) -> Result<Option<TaskInfo>, StoreError> {
        let key = self.key(&format!("task:{id}"));
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
        let crate::store::QueueSetPaused { queue, paused } = *params;
        self.q::<i64>(
            &self.scripts.queue_set_paused,
            sargs![queue, if paused { "1" } else { "0" }],
        )
        .await?;
        Ok(())
    }

    async fn queue_stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        type Row = (String, HashMap<String, i64>, String, String);
        let rows: Vec<Row> = read_retry!(self.q(&self.scripts.stats, sargs![]).await)?;
        let mut out = Vec::new();
        for (queue, counts, age, paused) in rows {
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
                queue,
            };
            if paused || st.pending + st.running + st.succeeded + st.failed + st.cancelled > 0 {
                out.push(st);
            }
        }
        out.sort_by(|a, b| a.queue.cmp(&b.queue));
        Ok(out)
    }

    async fn task_prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        let mut total = 0u64;
        loop {
            let v: Vec<i64> = self
                .q(&self.scripts.prune, sargs![ms(older_than), BATCH])
                .await?;
            if v.len() != 2 {
                return Err(StoreError::Corrupt(format!("prune: reply {v:?}")));
            }
            total += v[0].max(0) as u64;
            if (v[1] as usize) < BATCH {
                return Ok(total);
            }
        }
    }

    async fn wake_subscribe(&self) -> Result<broadcast::Receiver<Wake>, StoreError> {
        Ok(listener::subscribe(self).await)
    }

    // ---- schedules ---------------------------------------------------------

    async fn job_register(
        &self,
        params: &crate::store::JobRegister<'_>,
    ) -> Result<JobState, StoreError> {
        let job = params.job;
        let (slot, paused, queue): (String, String, String) = self
            .q(
                &self.scripts.job_register,
                sargs![job, params.queue.unwrap_or_default()],
            )
            .await?;
        Ok(JobState {
            name: job.to_string(),
            last_slot: opt_ts(&slot, "last_slot")?,
            paused: paused == "1",
            queue: (!queue.is_empty()).then_some(queue),
        })
    }

    async fn slot_get(&self, key: &str) -> Result<Option<crate::store::PrunedSlot>, StoreError> {
        let v: Vec<String> = read_retry!(self.q(&self.scripts.slot_get, sargs![key]).await)?;
        let [job, slot, id, state, error, finished, has_error] = v.as_slice() else {
            if v.is_empty() {
                return Ok(None);
            }
            return Err(StoreError::Corrupt(format!(
                "slot tombstone {key:?}: {} fields",
                v.len()
            )));
        };
        Ok(Some(crate::store::PrunedSlot {
            key: key.to_string(),
            job: job.clone(),
            slot: opt_ts(slot, "slot")?,
            task_id: parse_i64(id, "task_id")?,
            state: std::str::FromStr::from_str(state)?,
            last_error: (has_error == "1").then(|| error.clone()),
            finished_at: opt_ts(finished, "finished_at")?,
        }))
    }

    async fn job_advance(&self, adv: &SlotAdvance<'_>) -> Result<Advanced, StoreError> {
        let opt_ms = |t: Option<DateTime<Utc>>| {
            t.map(|t| t.timestamp_millis().to_string())
                .unwrap_or_default()
        };
        let (record, lease, worker, reason) = match adv.record {
            SlotRecord::Enqueue => ("e", 0, "", OVERLAP_SKIPPED),
            SlotRecord::Run { worker, lease } => ("r", ms(lease), worker, OVERLAP_SKIPPED),
            SlotRecord::Skip { reason } => ("s", 0, "", reason),
        };
        let mut inv = self.scripts.job_advance.key(self.key("seq"));
        inv.arg(&self.base)
            .arg(adv.job)
            .arg(opt_ms(adv.expected))
            .arg(adv.slot.timestamp_millis())
            .arg(match adv.overlap {
                Overlap::Forbid => "f",
                Overlap::Allow => "a",
            })
            .arg(reason)
            .arg(record)
            .arg(lease)
            .arg(worker)
            .arg(opt_ms(adv.batch_after))
            .arg(if adv.due_only { "1" } else { "0" })
            .arg(opt_ms(adv.until))
            .arg(if adv.task.is_some() { "1" } else { "0" })
            .arg(opt_ms(adv.not_before));
        if let Some(task) = adv.task {
            for a in task_args(task)? {
                inv.arg(a);
            }
        }
        let mut conn = self.conn.clone();
        let (what, val, ins): (String, String, i64) = inv.invoke_async(&mut conn).await?;
        match what.as_str() {
            "unknown" => Ok(Advanced::UnknownJob),
            "paused" => Ok(Advanced::Paused),
            "moved" => Ok(Advanced::Moved(opt_ts(&val, "last_slot")?)),
            "notdue" => Ok(Advanced::NotDue {
                now: opt_ts(&val, "now")?
                    .ok_or_else(|| StoreError::Corrupt("job advance: no store time".into()))?,
            }),
            "skipped" => Ok(Advanced::Skipped(Enqueued {
                id: parse_i64(&val, "id")?,
                inserted: true,
            })),
            "enqueued" => Ok(Advanced::Enqueued(Enqueued {
                id: parse_i64(&val, "id")?,
                inserted: ins == 1,
            })),
            other => Err(StoreError::Corrupt(format!(
                "job advance: unexpected reply {other:?}"
            ))),
        }
    }

    async fn job_set_paused(
        &self,
        params: &crate::store::JobSetPaused<'_>,
    ) -> Result<bool, StoreError> {
        let crate::store::JobSetPaused { job, paused } = *params;
        let v: i64 = self
            .q(
                &self.scripts.job_set_paused,
                sargs![job, if paused { "1" } else { "0" }],
            )
            .await?;
        Ok(v == 1)
    }

    async fn job_list(&self) -> Result<Vec<JobState>, StoreError> {
        let rows: Vec<(String, String, String, String)> =
            read_retry!(self.q(&self.scripts.job_list, sargs![]).await)?;
        let mut out = rows
            .into_iter()
            .map(|(name, slot, paused, queue)| {
                Ok(JobState {
                    last_slot: opt_ts(&slot, "last_slot")?,
                    paused: paused == "1",
                    queue: (!queue.is_empty()).then_some(queue),
                    name,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// A fencing token from a script's integer reply.
fn token_u64(n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("lock token: negative: {n}")))
}
