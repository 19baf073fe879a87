//! A durable task queue: enqueue with unique keys, priorities and delays;
//! workers that lease, heartbeat, retry with backoff and hand work back on
//! shutdown; inspection and pruning.
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton::Error> {
//! use baton::queue::{Queue, TaskBuilder};
//! let store = baton::Store::connect("sqlite://baton.db").await?;
//! let queue = Queue::new(store);
//! let t = queue
//!     .enqueue(TaskBuilder::new("export", serde_json::json!({"report": 42})).unique_key("report-42"))
//!     .await?;
//! println!("task {} (new: {})", t.id, t.inserted);
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::{Error, InvalidInput};
use crate::format_duration;
use crate::names::validate_name;
pub use crate::store::{
    args_hash, canonical_json, DeleteOutcome, EnqueueOutcome, KeyPolicy, UniqueHold, UniqueKey,
    UniqueOpts, UniquePeriod, UniqueScope,
};
use crate::store::{
    CancelOutcome, Enqueued, NewTask, PauseNote, QueueStats, RunAt, Store, TaskFilter, TaskInfo,
    TaskState,
};

mod backoff;
mod config;
pub mod counters;
mod debounce;
pub mod hooks;
mod outbox;
mod rate;
mod task_error;
mod trace;
mod typed;
mod view;
pub mod worker;

pub use backoff::Backoff;
pub use config::{
    WorkerConfig, DEFAULT_POLL_INTERVAL, LISTENING_POLL_INTERVAL, MIN_LEASE, PREFETCH_HORIZON,
    SERVER_SQL_PREFETCH_HORIZON,
};
pub use counters::{
    Histogram, Outcome, QueueCounters, WorkerCounters, WorkerTotals, ON_TIME_WINDOW,
    STORE_OPERATIONS,
};
pub use hooks::{AttemptMiddleware, InsertMiddleware, Next, WorkerEvent};
pub use outbox::{InsertFuture, OutboxConnection};
pub(crate) use rate::QueueRate;
pub use rate::{RateLimit, MAX_RATE};
pub use task_error::{BoxError, TaskAction, TaskError, TaskResult};
pub use trace::validate_traceparent;
pub(crate) use typed::payload_of;
pub use typed::{InsertOpts, TaskArgs};
pub use worker::{StopReason, TaskContext, Worker};

/// The queue tasks go to when none is named.
pub const DEFAULT_QUEUE: &str = "default";
/// Accepted priorities (lower runs first).
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -100..=100;
/// The longest stored unique key, in bytes: a key as given
/// ([`UniqueScope::Global`]) or the composite of a scoped one, whose scope
/// (queue, kind, period, args) takes part of it.
pub const MAX_KEY_LEN: usize = crate::store::MAX_STORED_KEY_LEN;
/// The longest accepted concurrency key ([`TaskBuilder::concurrency_key`]),
/// in bytes.
pub const MAX_CONCURRENCY_KEY_LEN: usize = 255;
/// Attempts when none are given.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// The largest accepted payload, in bytes of JSON (8 MiB): every store
/// takes it in one statement (MySQL's default packet limit is 16 MiB).
pub const MAX_PAYLOAD_BYTES: usize = 8 << 20;

/// The longest a task may be put off: a delay, a `run_at` ahead of now,
/// a snooze or a handler's retry delay (10 years, which every store's time
/// type holds). Longer delays are refused at enqueue (field `delay` or
/// `run_at`); a longer snooze or retry delay is shortened to it.
pub const MAX_DELAY: Duration = Duration::from_secs(3650 * 24 * 3600);

/// The length of `v` as JSON, without building the text.
fn json_len(v: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    // Writing a Value to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// Check a concurrency key: 1 to [`MAX_CONCURRENCY_KEY_LEN`] bytes without
/// control characters (field `concurrency_key`).
///
/// ```
/// assert!(baton::queue::validate_concurrency_key("customer:42").is_ok());
/// let e = baton::queue::validate_concurrency_key("").unwrap_err();
/// assert_eq!(e.field, "concurrency_key");
/// ```
pub fn validate_concurrency_key(k: &str) -> Result<(), InvalidInput> {
    if k.is_empty() || k.len() > MAX_CONCURRENCY_KEY_LEN {
        return Err(InvalidInput::new(
            "concurrency_key",
            format!(
                "is {} bytes; use 1 to {MAX_CONCURRENCY_KEY_LEN} bytes (e.g. customer:42)",
                k.len()
            ),
        ));
    }
    if k.chars().any(char::is_control) {
        return Err(InvalidInput::new(
            "concurrency_key",
            format!("{k:?} contains a control character; use printable text (e.g. customer:42)"),
        ));
    }
    Ok(())
}

/// Builds a [`NewTask`], validating every field.
#[derive(Debug, Clone)]
#[must_use = "a TaskBuilder enqueues nothing until it is passed to Queue::enqueue"]
pub struct TaskBuilder {
    /// The task; its `unique_key` is the caller's key until [`build`]
    /// composes the stored one.
    ///
    /// [`build`]: TaskBuilder::build
    task: NewTask,
    /// Scope, args, period and hold of the unique key.
    unique: UniqueOpts,
}

impl TaskBuilder {
    /// A task of `kind` with a JSON payload, on the default queue, due now,
    /// priority 0, 3 attempts.
    pub fn new(kind: impl Into<String>, payload: serde_json::Value) -> TaskBuilder {
        TaskBuilder {
            task: NewTask {
                queue: DEFAULT_QUEUE.into(),
                kind: kind.into(),
                payload,
                priority: 0,
                run_at: RunAt::Now,
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                timeout: None,
                unique_key: None,
                unique_hold: UniqueHold::Unfinished,
                job: None,
                slot: None,
                traceparent: None,
                concurrency_key: None,
                key_policy: None,
            },
            unique: UniqueOpts::default(),
        }
    }
    /// The queue.
    pub fn queue(mut self, q: impl Into<String>) -> Self {
        self.task.queue = q.into();
        self
    }
    /// Priority in -100..=100; lower runs first.
    pub fn priority(mut self, p: i32) -> Self {
        self.task.priority = p;
        self
    }
    /// Due this long after the store's now.
    pub fn delay(mut self, d: Duration) -> Self {
        self.task.run_at = RunAt::Delay(d);
        self
    }
    /// Due at this instant.
    pub fn run_at(mut self, t: DateTime<Utc>) -> Self {
        self.task.run_at = RunAt::At(t);
        self
    }
    /// Attempts allowed in total (at least 1).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.task.max_attempts = n;
        self
    }
    /// Handler timeout per attempt.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.task.timeout = Some(d);
        self
    }
    /// Idempotency key (printable text, no control characters):
    /// enqueueing it again while the task is unfinished returns the same
    /// task. It is compared only with tasks of the same kind in the same
    /// queue unless [`unique_scope`](Self::unique_scope) says otherwise.
    ///
    /// ```
    /// use baton::queue::{TaskBuilder, UniqueScope};
    /// use serde_json::json;
    /// // Same key string, two kinds: two different keys by default...
    /// let email = TaskBuilder::new("email", json!({})).unique_key("42").build().unwrap();
    /// let report = TaskBuilder::new("report", json!({})).unique_key("42").build().unwrap();
    /// assert_ne!(email.unique_key, report.unique_key);
    /// // ...one key across kinds in the queue with UniqueScope::Queue, and
    /// // across the store (as before scopes) with UniqueScope::Global.
    /// let g = TaskBuilder::new("report", json!({}))
    ///     .unique_key("42")
    ///     .unique_scope(UniqueScope::Global)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(g.unique_key.as_deref(), Some("42"));
    /// ```
    pub fn unique_key(mut self, k: impl Into<String>) -> Self {
        self.task.unique_key = Some(k.into());
        self
    }
    /// What the unique key is compared with (default
    /// [`UniqueScope::KindInQueue`]). `Kind` and `Global` are refused on
    /// Redis (see [`UniqueScope`]).
    pub fn unique_scope(mut self, scope: UniqueScope) -> Self {
        self.unique.scope = scope;
        self
    }
    /// Make the payload part of the unique key: tasks whose payloads are
    /// equal as JSON (fields in any order, [`canonical_json`]) share it.
    /// With or without [`unique_key`](Self::unique_key).
    ///
    /// ```
    /// use baton::queue::TaskBuilder;
    /// use serde_json::json;
    /// let a = TaskBuilder::new("k", json!({"x": 1, "y": 2})).unique_by_args(true).build().unwrap();
    /// let b = TaskBuilder::new("k", json!({"y": 2, "x": 1})).unique_by_args(true).build().unwrap();
    /// assert_eq!(a.unique_key, b.unique_key);
    /// ```
    pub fn unique_by_args(mut self, on: bool) -> Self {
        self.unique.by_args = on;
        self
    }
    /// Make the time bucket `floor(now / period)` part of the unique key,
    /// `now` read from **this host's clock** when the task is built (UTC
    /// from the Unix epoch, so `1d` is a UTC day): the same key enqueued
    /// in the next bucket is a new task. At least 1 s (field
    /// `unique_period`). With or without a key or args.
    pub fn unique_period(mut self, period: Duration) -> Self {
        self.unique.period = Some(period);
        self
    }
    /// How long the key stays taken (default
    /// [`UniqueHold::Unfinished`]).
    pub fn unique_hold(mut self, hold: UniqueHold) -> Self {
        self.unique.hold = hold;
        self
    }
    /// Scope, args, period and hold at once (e.g. a kind's
    /// [`InsertOpts::unique`]); the key itself is
    /// [`unique_key`](Self::unique_key)'s.
    pub fn unique(mut self, opts: UniqueOpts) -> Self {
        self.unique = opts;
        self
    }
    /// The task's concurrency key (e.g. `customer:42`; 1 to
    /// [`MAX_CONCURRENCY_KEY_LEN`] bytes, no control characters): a worker
    /// whose queue declares
    /// [`WorkerConfig::per_key_max_running`] starts at most that many
    /// tasks of one key at once, across the whole cluster; the others wait
    /// pending (no attempt counted) while tasks of other keys run.
    ///
    /// ```
    /// use baton::queue::TaskBuilder;
    /// let t = TaskBuilder::new("export", serde_json::json!({"customer": 42}))
    ///     .concurrency_key("customer:42")
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(t.concurrency_key.as_deref(), Some("customer:42"));
    /// ```
    pub fn concurrency_key(mut self, k: impl Into<String>) -> Self {
        self.task.concurrency_key = Some(k.into());
        self
    }
    /// Keep the key taken after the task finished (until it is pruned):
    /// [`UniqueHold::Forever`] when `on`, else
    /// [`UniqueHold::Unfinished`].
    pub fn unique_forever(mut self, on: bool) -> Self {
        self.unique.hold = UniqueHold::forever(on);
        self
    }
    /// Mark the task as the run of a schedule job's slot.
    pub fn slot(mut self, job: impl Into<String>, slot: DateTime<Utc>) -> Self {
        self.task.job = Some(job.into());
        self.task.slot = Some(slot);
        self
    }

    /// The enqueuer's W3C trace context (`traceparent`, e.g. from an
    /// incoming request's header): the worker's attempt span is linked to
    /// it. Without one, an enqueue made inside a span with an OpenTelemetry
    /// context records that span's (with the `otel` feature).
    pub fn traceparent(mut self, tp: impl Into<String>) -> Self {
        self.task.traceparent = Some(tp.into());
        self
    }

    /// Validate and return the task (what the store's seam and the
    /// lower-level `store::{postgres,mysql,sqlite}::enqueue_in` take;
    /// [`Queue::enqueue`] and [`Queue::enqueue_in`] build it for you). Its
    /// `unique_key` is the stored form: the caller's key composed with
    /// its scope, args and period ([`UniqueKey`]).
    pub fn build(self) -> Result<NewTask, InvalidInput> {
        let TaskBuilder { mut task, unique } = self;
        match &task.traceparent {
            Some(tp) => trace::validate_traceparent(tp)?,
            #[cfg(feature = "otel")]
            None => task.traceparent = trace::current(),
            #[cfg(not(feature = "otel"))]
            None => {}
        }
        validate_name("queue", &task.queue)?;
        validate_name("kind", &task.kind)?;
        task.unique_hold = unique.hold;
        if let Some(k) = &task.unique_key {
            refuse_slot_form(&task, k)?;
        }
        // A schedule slot's own key stays as the scheduler writes it.
        if !is_own_slot_key(&task) {
            task.unique_key = crate::store::compose_unique_key(
                &task.queue,
                &task.kind,
                &task.payload,
                task.unique_key.as_deref(),
                &unique,
                Utc::now(),
            )?;
        }
        check(&task)?;
        Ok(task)
    }

    /// Whether the task, once built, has a unique key whose scope reaches
    /// beyond its queue (what a Redis store refuses).
    fn spans_queues(&self) -> bool {
        self.unique.scope.spans_queues()
            && (self.task.unique_key.is_some()
                || self.unique.by_args
                || self.unique.period.is_some())
            && !is_own_slot_key(&self.task)
    }
}

/// Whether `t`'s key is its own schedule slot's (`JOB|RFC3339`).
fn is_own_slot_key(t: &NewTask) -> bool {
    match (&t.job, t.slot, &t.unique_key) {
        (Some(j), Some(s), Some(k)) => *k == crate::store::slot_key(j, s),
        _ => false,
    }
}

/// `JOB|RFC3339` is the scheduler's key for a job's slot; a task that took
/// it would take that slot's place.
fn refuse_slot_form(t: &NewTask, k: &str) -> Result<(), InvalidInput> {
    if !is_own_slot_key(t) && crate::store::is_slot_key(k) {
        return Err(InvalidInput::new(
            "unique key",
            format!(
                "{k:?} has the form JOB|RFC3339, which is reserved for scheduled \
                 slots; use another key (e.g. without the '|'), or `baton trigger` \
                 to run a job's slot"
            ),
        ));
    }
    Ok(())
}

/// Check every field of a built task (again after the insert middleware).
fn check(t: &NewTask) -> Result<(), InvalidInput> {
    validate_name("queue", &t.queue)?;
    validate_name("kind", &t.kind)?;
    if let Some(tp) = &t.traceparent {
        trace::validate_traceparent(tp)?;
    }
    if !PRIORITY_RANGE.contains(&t.priority) {
        return Err(InvalidInput::new(
            "priority",
            format!(
                "{} is out of range; use an integer from -100 to 100 (lower runs first)",
                t.priority
            ),
        ));
    }
    if t.max_attempts == 0 || t.max_attempts > 10_000 {
        return Err(InvalidInput::new(
            "max_attempts",
            format!("{} is out of range; use 1 to 10000", t.max_attempts),
        ));
    }
    let size = json_len(&t.payload);
    if size > MAX_PAYLOAD_BYTES {
        return Err(InvalidInput::new(
            "payload",
            format!(
                "is {size} bytes of JSON; at most {MAX_PAYLOAD_BYTES} (8 MiB) are accepted \
                 (keep large data elsewhere and pass a reference)"
            ),
        ));
    }
    if t.timeout.is_some_and(|d| d.is_zero()) {
        return Err(InvalidInput::new(
            "timeout",
            "must be greater than 0 (e.g. 30s, 5m)",
        ));
    }
    if let Some(k) = &t.concurrency_key {
        validate_concurrency_key(k)?;
    }
    check_run_at(&t.run_at)?;
    crate::store::check_key_policy(t)?;
    if let Some(k) = &t.unique_key {
        crate::store::validate_stored_unique_key(k)?;
        refuse_slot_form(t, k)?;
    }
    Ok(())
}

/// A task's due time within [`MAX_DELAY`] of now (by this host's clock:
/// the bound is far from any skew).
fn check_run_at(run_at: &RunAt) -> Result<(), InvalidInput> {
    let limit = "10 years (e.g. 30s, 5m, 7d)";
    match run_at {
        RunAt::Delay(d) if *d > MAX_DELAY => Err(InvalidInput::new(
            "delay",
            format!("{} is too long; use at most {limit}", format_duration(*d)),
        )),
        RunAt::At(t) => {
            let ahead = (*t - Utc::now()).to_std().unwrap_or_default();
            if ahead > MAX_DELAY {
                Err(InvalidInput::new(
                    "run_at",
                    format!(
                        "{} is too far ahead; use an instant at most {limit} from now",
                        crate::format_time(*t)
                    ),
                ))
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

/// The client side of the queue: enqueue, inspect, cancel, retry, prune.
#[derive(Clone)]
pub struct Queue {
    store: Store,
    /// Run at every enqueue, in order ([`Queue::with_insert_middleware`]).
    inserts: Vec<Arc<dyn InsertMiddleware>>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("store", &self.store)
            .field("insert_middleware", &self.inserts.len())
            .finish()
    }
}

impl Queue {
    /// A queue client on `store`.
    pub fn new(store: Store) -> Queue {
        Queue {
            store,
            inserts: Vec::new(),
        }
    }

    /// The same queue client, running `m` at every enqueue after the
    /// middleware added before it (see [`InsertMiddleware`]).
    pub fn with_insert_middleware(mut self, m: impl InsertMiddleware) -> Queue {
        self.inserts.push(Arc::new(m));
        self
    }

    /// Build every task and pass it through the insert middleware, then
    /// validate it again; fail naming the first bad one (`task N: field`
    /// when `numbered`) before anything is written.
    pub(crate) fn prepare(
        &self,
        tasks: Vec<TaskBuilder>,
        numbered: bool,
    ) -> Result<Vec<NewTask>, InvalidInput> {
        let redis = self.store.backend().kind() == "redis";
        let one = |t: TaskBuilder| -> Result<NewTask, InvalidInput> {
            if redis && t.spans_queues() {
                return Err(InvalidInput::new(
                    "unique_scope",
                    format!(
                        "{} is not available on Redis, which keeps unique keys per queue \
                         (one hash tag per queue: a Redis Cluster cannot check a key across \
                         hash slots atomically); use kind-in-queue (the default) or queue, \
                         or a SQL store for a key across queues",
                        t.unique.scope
                    ),
                ));
            }
            let mut task = t.build()?;
            if self.inserts.is_empty() {
                return Ok(task);
            }
            for m in &self.inserts {
                m.before_insert(&mut task)?;
            }
            check(&task)?;
            Ok(task)
        };
        tasks
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                one(t).map_err(|mut e| {
                    if numbered {
                        e.field = format!("task {i}: {}", e.field);
                    }
                    e
                })
            })
            .collect()
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Enqueue one task. With a unique key that is taken, returns the
    /// existing task (`inserted == false`).
    pub async fn enqueue(&self, task: TaskBuilder) -> Result<Enqueued, Error> {
        let t = self.prepare(vec![task], false)?;
        let mut out = self.store.backend().task_insert_many(&t).await?;
        out.pop().ok_or_else(|| {
            Error::Store(crate::StoreError::Corrupt(
                "enqueue returned nothing".into(),
            ))
        })
    }

    /// Enqueue many tasks in one call (batched inside the store). Every task
    /// is validated before anything is written.
    pub async fn enqueue_many(&self, tasks: Vec<TaskBuilder>) -> Result<Vec<Enqueued>, Error> {
        let built = self.prepare(tasks, true)?;
        Ok(self.store.backend().task_insert_many(&built).await?)
    }

    /// Cancel a task: a pending one at once, a running one at its worker's
    /// next heartbeat.
    pub async fn cancel(&self, id: i64) -> Result<CancelOutcome, Error> {
        Ok(self.store.backend().task_cancel(id).await?)
    }

    /// Delete a task that is not running: a pending one is cancelled first
    /// (its unique key freed, a waiting task of its concurrency key let
    /// through), then the finished task is deleted as
    /// [`prune`](Queue::prune) deletes it (a schedule slot's task leaves its
    /// tombstone, so the slot is not run again). A running task is left
    /// alone ([`DeleteOutcome::Running`]): cancel it and delete it once it
    /// has stopped. (A pending task claimed at that very moment is asked
    /// to stop, as [`cancel`](Queue::cancel) would, and answers `Running`.)
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton::Error> {
    /// use baton::queue::{DeleteOutcome, Queue, TaskBuilder};
    /// let store = baton::testing::memory_store().await?;
    /// let queue = Queue::new(store);
    /// let id = queue.enqueue(TaskBuilder::new("report", serde_json::json!({}))).await?.id;
    /// assert_eq!(queue.delete(id).await?, DeleteOutcome::Deleted);
    /// assert_eq!(queue.task(id).await?, None);
    /// assert_eq!(queue.delete(id).await?, DeleteOutcome::NotFound);
    /// # Ok(()) }
    /// ```
    pub async fn delete(&self, id: i64) -> Result<DeleteOutcome, Error> {
        let b = self.store.backend();
        match b.task_get(id).await?.map(|t| t.state) {
            None => return Ok(DeleteOutcome::NotFound),
            Some(TaskState::Running) => return Ok(DeleteOutcome::Running),
            Some(TaskState::Pending) => match b.task_cancel(id).await? {
                CancelOutcome::NotFound => return Ok(DeleteOutcome::NotFound),
                // Claimed in between: it asked the run to stop, as a
                // cancel does; the run is left alone otherwise.
                CancelOutcome::Requested => return Ok(DeleteOutcome::Running),
                CancelOutcome::Cancelled | CancelOutcome::AlreadyFinished(_) => {}
            },
            Some(_) => {}
        }
        if b.task_delete_many(&[id]).await?.is_empty() {
            // Retried onto pending or claimed again since: not deleted.
            return Ok(match b.task_get(id).await? {
                None => DeleteOutcome::NotFound,
                Some(_) => DeleteOutcome::Running,
            });
        }
        Ok(DeleteOutcome::Deleted)
    }

    /// Delete every finished task (succeeded, failed or cancelled) that
    /// `filter` matches (its `before_id` and `limit` are ignored; a filter
    /// on `pending` or `running` matches nothing to delete), as
    /// [`delete`](Queue::delete) deletes one; the ids deleted. For an
    /// operator's bulk delete: show the count with
    /// [`tasks_all`](Queue::tasks_all) first.
    pub async fn delete_finished(&self, filter: &TaskFilter) -> Result<Vec<i64>, Error> {
        let ids: Vec<i64> = self
            .tasks_all(filter)
            .await?
            .into_iter()
            .filter(|t| t.state.is_terminal())
            .map(|t| t.id)
            .collect();
        self.delete_finished_ids(&ids).await
    }

    /// Delete those of `ids` that are finished (succeeded, failed or
    /// cancelled), as [`delete`](Queue::delete) deletes one, in batches;
    /// the ids deleted. Pending and running tasks and unknown ids are left
    /// alone.
    pub async fn delete_finished_ids(&self, ids: &[i64]) -> Result<Vec<i64>, Error> {
        let b = self.store.backend();
        let mut gone = Vec::new();
        for chunk in ids.chunks(500) {
            gone.extend(b.task_delete_many(chunk).await?);
        }
        Ok(gone)
    }

    /// Put a failed or cancelled task back to pending, with at least one
    /// more attempt. False if it is not failed or cancelled.
    pub async fn retry(&self, id: i64) -> Result<bool, Error> {
        Ok(self.store.backend().task_retry(id).await?)
    }

    /// One task, with its attempt history.
    pub async fn task(&self, id: i64) -> Result<Option<TaskInfo>, Error> {
        Ok(self.store.backend().task_get(id).await?)
    }

    /// A page of tasks, newest first; the filter's search terms are
    /// checked first ([`TaskFilter::validate`]).
    pub async fn tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, Error> {
        filter.validate()?;
        Ok(self.store.backend().task_list(filter).await?)
    }

    /// Every task `filter` matches (its `before_id` and `limit` are
    /// ignored), read page by page, newest first.
    pub async fn tasks_all(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, Error> {
        let mut page_filter = TaskFilter {
            before_id: None,
            limit: 500,
            ..filter.clone()
        };
        let mut out = Vec::new();
        loop {
            let page = self.tasks(&page_filter).await?;
            let Some(last) = page.last() else {
                break;
            };
            page_filter.before_id = Some(last.id);
            out.extend(page);
        }
        Ok(out)
    }

    /// Pause a queue on every instance: from now on no worker of the
    /// cluster claims its tasks (the store's claim checks the flag in the
    /// same statement or script). Running tasks finish normally and
    /// enqueues are still accepted. Pausing a paused queue, or a queue with
    /// no tasks yet, is fine.
    pub async fn pause(&self, queue: &str) -> Result<(), Error> {
        self.set_paused(queue, true, PauseNote::default()).await
    }

    /// [`Queue::pause`] recording `note` (why, and who) with the store's
    /// time as the queue's [`PauseChange`](crate::store::PauseChange),
    /// shown by `baton queues`, the admin API and the dashboard. A note or
    /// author too long or holding control characters is refused naming the
    /// field.
    pub async fn pause_with(&self, queue: &str, note: PauseNote<'_>) -> Result<(), Error> {
        self.set_paused(queue, true, note).await
    }

    /// Resume a paused queue on every instance and wake its workers, so
    /// claiming restarts at once (workers in other processes of SQLite and
    /// MySQL stores, which have no cross-process wake-up, within their poll
    /// interval). Resuming a queue that is not paused is fine.
    pub async fn resume(&self, queue: &str) -> Result<(), Error> {
        self.set_paused(queue, false, PauseNote::default()).await
    }

    /// [`Queue::resume`] recording `note`, as [`Queue::pause_with`].
    pub async fn resume_with(&self, queue: &str, note: PauseNote<'_>) -> Result<(), Error> {
        self.set_paused(queue, false, note).await
    }

    async fn set_paused(
        &self,
        queue: &str,
        paused: bool,
        note: PauseNote<'_>,
    ) -> Result<(), Error> {
        validate_name("queue", queue)?;
        note.validate()?;
        Ok(self
            .store
            .backend()
            .queue_set_paused(&crate::store::QueueSetPaused {
                queue,
                paused,
                note,
            })
            .await?)
    }

    /// Counts per queue and state, with each queue's paused flag and the
    /// limits its workers declared (a declared queue without tasks is
    /// listed too).
    pub async fn stats(&self) -> Result<Vec<QueueStats>, Error> {
        let mut stats = self.store.backend().queue_stats().await?;
        let declared = self.store.backend().queue_limits_list().await?;
        crate::store::merge_limits(&mut stats, declared);
        Ok(stats)
    }

    /// Delete finished tasks older than `retention` (default 7 days).
    pub async fn prune(&self, retention: Duration) -> Result<u64, Error> {
        Ok(self.store.backend().task_prune_many(retention).await?)
    }
}

/// The default retention for finished tasks.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_or_run_at_beyond_max_delay_is_refused_naming_the_field() {
        let t = || TaskBuilder::new("k", serde_json::json!({}));
        let e = t()
            .delay(MAX_DELAY + Duration::from_secs(1))
            .build()
            .unwrap_err();
        assert_eq!(e.field, "delay", "{e}");
        assert!(e.to_string().contains("at most 10 years"), "{e}");
        let e = t()
            .run_at(Utc::now() + chrono::Duration::days(3660))
            .build()
            .unwrap_err();
        assert_eq!(e.field, "run_at", "{e}");
        assert!(t().delay(MAX_DELAY).build().is_ok());
        assert!(t()
            .run_at(Utc::now() - chrono::Duration::days(3660))
            .build()
            .is_ok());
    }
}
