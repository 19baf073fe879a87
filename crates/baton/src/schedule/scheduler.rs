//! The scheduler: every instance computes the same slots and races to move
//! each job's cursor in the store; the one compare-and-set that wins
//! enqueues the slot's task. No leader, no slot run twice, none lost.
//!
//! Two modes per job:
//!
//! - **durable** (default): the slot becomes a queued task (lease, heartbeat,
//!   retries), run by whichever worker claims it and resumed elsewhere if
//!   that worker dies. The task's kind is the job's name (unless set), and
//!   it carries its `job` and `slot`.
//! - **lock**: ShedLock's behaviour. Every instance's timer fires at each
//!   slot; a lease lock named after the job, with `at_most` / `at_least`,
//!   lets one of them run the job's function in-process. Nothing is queued;
//!   a crash loses that slot's run. Fixed-delay loops are supported.
//!
//! Time is the store's: each instance keeps an estimate of the store clock
//! (calibrated with `now()` and advanced on the monotonic clock), so a node
//! whose wall clock is minutes off fires at the same instants as the rest.
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton::Error> {
//! use baton::schedule::{Job, Scheduler, spec::Schedule};
//! let store = baton::Store::connect("sqlite://baton.db").await?;
//! let mut s = Scheduler::new(store.clone());
//! s.add(Job::new("batch", Schedule::cron("0 */6 * * *", "Asia/Seoul")?).max_attempts(3))?;
//! // A worker handles kind "batch"; the scheduler enqueues one task per slot.
//! s.run(tokio_util::sync::CancellationToken::new()).await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::spec::{due_slots, Misfire, Schedule, DEFAULT_MAX_CATCH_UP};
use crate::error::{Error, InvalidInput};
use crate::lock::{validate_name, LeaseHandle, LockOptions, Locker};
use crate::queue::TaskBuilder;
use crate::store::{Advanced, Enqueued, NewTask, Overlap, SlotAdvance, Store};

/// How a job's slots are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobMode {
    /// Each slot is a durable task in the queue.
    Durable,
    /// Each instance fires; a lease lock lets one run (ShedLock).
    Lock {
        /// Lease length (the run's upper bound if its holder dies).
        at_most: Duration,
        /// Minimum hold after the grant.
        at_least: Duration,
    },
}

/// A job definition.
#[derive(Debug, Clone)]
pub struct Job {
    /// Name: unique per store; the cursor's key and the lock's name.
    pub name: String,
    /// When its slots are.
    pub schedule: Schedule,
    /// Durable (queued) or lock mode.
    pub mode: JobMode,
    /// Lock mode only: wait this long after each run instead of firing at
    /// slot instants (ShedLock's `fixedDelay`).
    pub fixed_delay: Option<Duration>,
    /// Missed-slot policy (durable mode).
    pub misfire: Misfire,
    /// Most missed slots run with [`Misfire::All`].
    pub max_catch_up: usize,
    /// How old a slot may be and still run with [`Misfire::None`].
    pub misfire_grace: Duration,
    /// What to do when the previous run is unfinished.
    pub overlap: Overlap,
    /// Random delay up to this long added to each run (not to the slot).
    pub jitter: Duration,
    /// Queue for durable runs.
    pub queue: String,
    /// Task kind for durable runs (default: the job's name).
    pub kind: String,
    /// Task payload for durable runs.
    pub payload: serde_json::Value,
    /// Task priority.
    pub priority: i32,
    /// Attempts per slot.
    pub max_attempts: u32,
    /// Timeout per attempt.
    pub timeout: Option<Duration>,
}

impl Job {
    /// A durable job on the default queue, misfire `latest`, overlap
    /// `forbid`, 3 attempts, kind = name.
    pub fn new(name: impl Into<String>, schedule: Schedule) -> Job {
        let name = name.into();
        Job {
            kind: name.clone(),
            name,
            schedule,
            mode: JobMode::Durable,
            fixed_delay: None,
            misfire: Misfire::Latest,
            max_catch_up: DEFAULT_MAX_CATCH_UP,
            misfire_grace: Duration::from_secs(60),
            overlap: Overlap::Forbid,
            jitter: Duration::ZERO,
            queue: crate::queue::DEFAULT_QUEUE.into(),
            payload: serde_json::json!({}),
            priority: 0,
            max_attempts: crate::queue::DEFAULT_MAX_ATTEMPTS,
            timeout: None,
        }
    }
    /// Lock mode with these lease bounds.
    pub fn lock_mode(mut self, at_most: Duration, at_least: Duration) -> Job {
        self.mode = JobMode::Lock { at_most, at_least };
        self
    }
    /// Set the misfire policy.
    pub fn misfire(mut self, m: Misfire) -> Job {
        self.misfire = m;
        self
    }
    /// Set the overlap rule.
    pub fn overlap(mut self, o: Overlap) -> Job {
        self.overlap = o;
        self
    }
    /// Set the queue.
    pub fn queue(mut self, q: impl Into<String>) -> Job {
        self.queue = q.into();
        self
    }
    /// Set attempts per slot.
    pub fn max_attempts(mut self, n: u32) -> Job {
        self.max_attempts = n;
        self
    }

    fn validate(&self) -> Result<(), InvalidInput> {
        let ctx = |e: InvalidInput| {
            InvalidInput::new(format!("job {:?}: {}", self.name, e.field), e.problem)
        };
        validate_name("job name", &self.name)?;
        if let JobMode::Lock { at_most, at_least } = self.mode {
            LockOptions::new(at_most)
                .and_then(|o| o.at_least(at_least))
                .map_err(ctx)?;
        } else if self.fixed_delay.is_some() {
            return Err(ctx(InvalidInput::new(
                "fixed_delay",
                "applies only to lock mode",
            )));
        }
        self.task(Utc::now(), false).map(|_| ()).map_err(ctx)
    }

    /// The unique key of this job's run for `slot`: `job|RFC3339`.
    pub fn slot_key(&self, slot: DateTime<Utc>) -> String {
        slot_key(&self.name, slot)
    }

    /// The task that runs `slot`. Triggered runs are due now; scheduled
    /// runs at the slot (plus jitter).
    pub fn task(&self, slot: DateTime<Utc>, triggered: bool) -> Result<NewTask, InvalidInput> {
        let mut t = TaskBuilder::new(self.kind.clone(), self.payload.clone())
            .queue(self.queue.clone())
            .priority(self.priority)
            .max_attempts(self.max_attempts)
            .unique_key(self.slot_key(slot))
            .unique_forever(true)
            .slot(self.name.clone(), slot);
        if !triggered {
            let jitter = random_upto(self.jitter);
            t = t.run_at(slot + chrono::Duration::from_std(jitter).unwrap_or_default());
        }
        if let Some(d) = self.timeout {
            t = t.timeout(d);
        }
        t.build()
    }
}

/// The unique key of `job`'s run for `slot`.
pub fn slot_key(job: &str, slot: DateTime<Utc>) -> String {
    format!(
        "{job}|{}",
        slot.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
    )
}

fn random_upto(d: Duration) -> Duration {
    if d.is_zero() {
        Duration::ZERO
    } else {
        Duration::from_millis(fastrand::u64(0..=d.as_millis() as u64))
    }
}

/// Enqueue `job`'s run for `slot` now (an external trigger). Idempotent:
/// the same (job, slot) returns the same task however often it is called,
/// and a slot the scheduler also reaches still runs once. The job's cursor
/// is not moved, so a trigger for a future slot does not hold back the
/// regular schedule.
pub async fn trigger(store: &Store, job: &Job, slot: DateTime<Utc>) -> Result<Enqueued, Error> {
    if let JobMode::Lock { .. } = job.mode {
        return Err(InvalidInput::new(
            format!("job {:?}", job.name),
            "is a lock-mode job; only durable jobs can be triggered",
        )
        .into());
    }
    let t = job.task(slot, true)?;
    let mut out = store.backend().enqueue(std::slice::from_ref(&t)).await?;
    out.pop().ok_or_else(|| {
        Error::Store(crate::StoreError::Corrupt(
            "enqueue returned nothing".into(),
        ))
    })
}

/// The latest slot of `schedule` at or before store time `now` (the default
/// slot for a trigger), if any within a year.
pub fn latest_slot(schedule: &Schedule, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let from = now - chrono::Duration::days(366);
    due_slots(schedule, from, now, Misfire::Latest, 1, Duration::ZERO)
        .slots
        .last()
        .copied()
}

/// A run in lock mode, as the job's function sees it.
#[derive(Debug, Clone)]
pub struct SlotRun {
    /// Job name.
    pub job: String,
    /// The slot (for fixed-delay jobs, the store time of the firing).
    pub slot: DateTime<Utc>,
    /// The lease that makes this run exclusive.
    pub lease: LeaseHandle,
}

type SlotFut = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
type SlotFn = Arc<dyn Fn(SlotRun) -> SlotFut + Send + Sync>;

pub use crate::clock::StoreClock;

/// Runs jobs' slots. See the module docs.
pub struct Scheduler {
    store: Store,
    jobs: Vec<(Job, Option<SlotFn>)>,
}

impl Scheduler {
    /// A scheduler with no jobs.
    pub fn new(store: Store) -> Scheduler {
        Scheduler {
            store,
            jobs: Vec::new(),
        }
    }

    /// Add a durable job (its runs are tasks of `job.kind`).
    pub fn add(&mut self, job: Job) -> Result<&mut Self, InvalidInput> {
        if job.mode != JobMode::Durable {
            return Err(InvalidInput::new(
                format!("job {:?}", job.name),
                "is a lock-mode job; add it with add_locked and a function to run",
            ));
        }
        self.push(job, None)
    }

    /// Add a lock-mode job that runs `f` on whichever instance takes the lock.
    pub fn add_locked<F, Fut>(&mut self, job: Job, f: F) -> Result<&mut Self, InvalidInput>
    where
        F: Fn(SlotRun) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        if job.mode == JobMode::Durable {
            return Err(InvalidInput::new(
                format!("job {:?}", job.name),
                "is durable; add it with add",
            ));
        }
        self.push(job, Some(Arc::new(move |r| Box::pin(f(r)) as SlotFut)))
    }

    fn push(&mut self, job: Job, f: Option<SlotFn>) -> Result<&mut Self, InvalidInput> {
        job.validate()?;
        if self.jobs.iter().any(|(j, _)| j.name == job.name) {
            return Err(InvalidInput::new(
                format!("job {:?}", job.name),
                "is defined twice; job names must be unique",
            ));
        }
        self.jobs.push((job, f));
        Ok(self)
    }

    /// Run every job until `shutdown` fires. Lock-mode runs in progress are
    /// awaited (and their leases released) before returning.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let clock = StoreClock::new(self.store.clone()).await?;
        let mut set = tokio::task::JoinSet::new();
        for (job, f) in self.jobs {
            let (store, clock, stop) = (self.store.clone(), clock.clone(), shutdown.clone());
            match f {
                None => set.spawn(durable_loop(store, clock, job, stop)),
                Some(f) => set.spawn(lock_loop(store, clock, job, f, stop)),
            };
        }
        let calib = {
            let clock = clock.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    clock.recalibrate().await;
                }
            })
        };
        while set.join_next().await.is_some() {}
        calib.abort();
        Ok(())
    }
}

async fn durable_loop(store: Store, clock: StoreClock, job: Job, stop: CancellationToken) {
    const MAX_WAIT: Duration = Duration::from_secs(1);
    let b = store.backend();
    let mut backoff = Duration::from_millis(100);
    let mut cursor: Option<DateTime<Utc>> = None;
    let mut registered = false;
    'outer: while !stop.is_cancelled() {
        if !registered {
            match b.job_register(&job.name).await {
                Ok(st) => {
                    cursor = st.last_slot;
                    registered = true;
                    backoff = Duration::from_millis(100);
                }
                Err(e) => {
                    tracing::warn!(job = %job.name, error = %e, "cannot register the job; retrying");
                    pause(&stop, &mut backoff).await;
                    continue;
                }
            }
        }
        clock.recalibrate_if_suspended().await;
        let now = clock.now();
        let from = cursor.unwrap_or(now);
        let due = due_slots(
            &job.schedule,
            from,
            now,
            job.misfire,
            job.max_catch_up,
            job.misfire_grace,
        );
        if due.skipped > 0 {
            tracing::info!(job = %job.name, skipped = due.skipped, misfire = %job.misfire, "missed slots skipped by the misfire policy");
        }
        for slot in due.slots {
            let task = match job.task(slot, false) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(job = %job.name, error = %e, "cannot build the slot's task");
                    return;
                }
            };
            let adv = SlotAdvance {
                job: &job.name,
                expected: cursor,
                slot,
                task: &task,
                overlap: job.overlap,
            };
            match b.job_advance(&adv).await {
                Ok(Advanced::Enqueued(e)) => {
                    tracing::info!(job = %job.name, %slot, task = e.id, new = e.inserted, "slot enqueued");
                    cursor = Some(slot);
                }
                Ok(Advanced::Skipped(e)) => {
                    tracing::info!(job = %job.name, %slot, task = e.id, "slot skipped: previous run unfinished (overlap = forbid)");
                    cursor = Some(slot);
                }
                Ok(Advanced::Moved(c)) => {
                    // Another instance got there first: learn its cursor.
                    cursor = c;
                    continue 'outer;
                }
                Ok(Advanced::Paused) => {
                    tracing::debug!(job = %job.name, "paused");
                    break;
                }
                Ok(Advanced::UnknownJob) => {
                    registered = false;
                    continue 'outer;
                }
                Err(e) => {
                    tracing::warn!(job = %job.name, error = %e, "cannot advance the job; retrying");
                    pause(&stop, &mut backoff).await;
                    continue 'outer;
                }
            }
        }
        backoff = Duration::from_millis(100);
        let next = due.next.unwrap_or(now + chrono::Duration::seconds(60));
        tokio::select! {
            _ = clock.sleep_until(next, MAX_WAIT) => {}
            _ = stop.cancelled() => return,
        }
    }
}

async fn pause(stop: &CancellationToken, backoff: &mut Duration) {
    tokio::select! {
        _ = tokio::time::sleep(*backoff) => {}
        _ = stop.cancelled() => {}
    }
    *backoff = (*backoff * 2).min(Duration::from_secs(5));
}

async fn lock_loop(store: Store, clock: StoreClock, job: Job, f: SlotFn, stop: CancellationToken) {
    let JobMode::Lock { at_most, at_least } = job.mode else {
        return;
    };
    let opts = match LockOptions::new(at_most).and_then(|o| o.at_least(at_least)) {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(job = %job.name, error = %e, "bad lock options");
            return;
        }
    };
    let locker = Locker::new(store);
    let mut next = job.schedule.next_after(clock.now());
    loop {
        let slot = match job.fixed_delay {
            Some(_) => clock.now(),
            None => {
                let Some(slot) = next else { return };
                // Sleep (in short steps, to notice shutdown) until the slot.
                while clock.now() < slot {
                    clock.recalibrate_if_suspended().await;
                    tokio::select! {
                        _ = clock.sleep_until(slot, Duration::from_secs(1)) => {}
                        _ = stop.cancelled() => return,
                    }
                }
                slot
            }
        };
        if stop.is_cancelled() {
            return;
        }
        tokio::time::sleep(random_upto(job.jitter)).await;
        let name = job.name.clone();
        let f2 = f.clone();
        match locker
            .run(&job.name, &opts, move |lease| {
                f2(SlotRun {
                    job: name,
                    slot,
                    lease,
                })
            })
            .await
        {
            Ok(Some(Ok(()))) => tracing::info!(job = %job.name, %slot, "ran under lock"),
            Ok(Some(Err(e))) => tracing::warn!(job = %job.name, %slot, error = %e, "run failed"),
            Ok(None) => tracing::debug!(job = %job.name, %slot, "lock held elsewhere; skipped"),
            Err(e) => {
                tracing::warn!(job = %job.name, %slot, error = %e, "lock-mode run ended with an error")
            }
        }
        match job.fixed_delay {
            Some(d) => {
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = stop.cancelled() => return,
                }
            }
            None => next = job.schedule.next_after(slot.max(clock.now())),
        }
    }
}

/// Pause (or resume) a job cluster-wide: while paused, no instance
/// enqueues its slots. False if the store has never seen the job.
pub async fn set_paused(store: &Store, job: &str, paused: bool) -> Result<bool, Error> {
    validate_name("job name", job)?;
    Ok(store.backend().job_set_paused(job, paused).await?)
}

/// A job as the store knows it, with its latest run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobStatus {
    /// Cursor and pause flag.
    #[serde(flatten)]
    pub state: crate::store::JobState,
    /// The newest task of this job (its latest run or trigger), if any.
    pub last_run: Option<crate::store::TaskInfo>,
}

/// Every job the store knows, with its latest run.
pub async fn job_statuses(store: &Store) -> Result<Vec<JobStatus>, Error> {
    let b = store.backend();
    let mut out = Vec::new();
    for state in b.job_list().await? {
        let last_run = b
            .tasks(&crate::store::TaskFilter {
                job: Some(state.name.clone()),
                limit: 1,
                ..Default::default()
            })
            .await?
            .pop();
        out.push(JobStatus { state, last_run });
    }
    Ok(out)
}
