//! Workers: claim due tasks, run their handlers, heartbeat their leases,
//! finish them with a compare-and-set, rescue other workers' expired leases,
//! and shut down without losing or double-running anything.
//!
//! One [`Worker`] serves several queues, each with its own concurrency.
//! Its store traffic when idle is one call per `poll_interval`: a claim
//! (each queue in turn), or in place of one an upkeep call — a rescue every
//! `rescue_interval` (default five polls), a check of the store's identity
//! every 10 s (at a rescue tick; shared with every clone of the store), a
//! prune of finished tasks past the retention every 300 polls, three
//! readings of the store's clock (the best one is kept) once a minute —
//! each on a timer of its own, half a poll off the ticker's beat; the poll
//! after an upkeep call is skipped, never two in a row, so a wake-up the
//! store lost waits at most two poll intervals. Background calls of
//! anything else on the same [`Store`] (a scheduler's clock readings and
//! identity checks) are paid for the same way, so a `baton serve` with a
//! worker and a scheduler stays at one store call per poll interval. New work normally arrives sooner through the
//! store's wake-up channel: a wake-up for work due later (a delayed task, a
//! scheduled slot, a retry after its backoff) arms a timer, so the task is
//! claimed when its `run_at` comes, not at the next poll.
//!
//! Each attempt logs one `task started` line (info) and one `task ended`
//! line (info; warn when it failed or its lease was lost) with the task's
//! id, queue, kind, attempt, outcome, duration and, for handlers that ran a
//! process, its exit code; the handler runs inside a `task` span (id,
//! queue, kind, attempt, job, slot; `outcome`, `duration_ms` and
//! `exit_code` recorded at the end), so its own events carry that context.
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton::Error> {
//! use baton::queue::{Worker, WorkerConfig, TaskError};
//! let store = baton::Store::connect("sqlite://baton.db").await?;
//! let mut worker = Worker::new(store, WorkerConfig::default().queue("default", 2));
//! worker.handle("export", |ctx| async move {
//!     println!("task {} attempt {}", ctx.task().id, ctx.task().attempt);
//!     Ok::<_, TaskError>(())
//! });
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! worker.run(shutdown).await?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::config::{WorkerConfig, PREFETCH_HORIZON};
use super::counters::{Outcome, WorkerCounters};
use crate::clock::StoreClock;
use crate::error::Error;
use crate::store::{Claim, ClaimRequest, Finish, Heartbeat, Store, Task, Wake, IDENTITY_CHECK};

/// Why a handler is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The lease was lost: another worker may run (or has run) this attempt's
    /// task. The result will be refused.
    LeaseLost,
    /// Someone cancelled the task.
    Cancelled,
    /// The worker is shutting down; the task is handed back.
    Shutdown,
    /// The attempt's timeout elapsed.
    TimedOut,
    /// No heartbeat confirmed the lease in time (the store is slow or
    /// unreachable): the handler is stopped before the lease can lapse, and
    /// dropped when it would. Treated like [`StopReason::LeaseLost`]:
    /// nothing is written, and the task is rescued after its lease.
    LeaseExpiring,
}

/// An error from a handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskError {
    /// The message kept on the task.
    pub message: String,
    /// False: fail the task now without further attempts.
    pub retry: bool,
}

impl TaskError {
    /// A failure that is retried (while attempts are left).
    pub fn retryable(msg: impl Into<String>) -> TaskError {
        TaskError {
            message: msg.into(),
            retry: true,
        }
    }
    /// A failure that ends the task as `failed` at once.
    pub fn permanent(msg: impl Into<String>) -> TaskError {
        TaskError {
            message: msg.into(),
            retry: false,
        }
    }
}

impl<E: std::fmt::Display> From<E> for TaskError {
    fn from(e: E) -> Self {
        TaskError::retryable(e.to_string())
    }
}

/// What a handler gets: the task, a stop signal, progress reporting.
#[derive(Clone)]
pub struct TaskContext {
    task: Arc<Task>,
    stop: CancellationToken,
    reason: Arc<Mutex<Option<StopReason>>>,
    exit_code: Arc<Mutex<Option<i32>>>,
    store: Store,
    /// The attempt's local lease bound (last confirmed heartbeat's send
    /// time + lease), as the heartbeat loop moves it.
    lease_bound: Arc<tokio::sync::watch::Sender<Instant>>,
    /// [`crate::lock::stop_margin`] of the queue's lease.
    margin: Duration,
}

impl TaskContext {
    /// The task (id, attempt, payload, job and slot for scheduled runs…).
    pub fn task(&self) -> &Task {
        &self.task
    }
    /// The claim this attempt holds.
    pub fn claim(&self) -> Claim {
        self.task.claim()
    }
    /// Resolves when the handler should stop (lease lost, cancelled,
    /// shutdown after the grace period, timeout). After it fires the handler
    /// has the worker's grace period to return before it is dropped.
    pub async fn stopped(&self) {
        self.stop.cancelled().await
    }
    /// Whether the handler was asked to stop.
    pub fn is_stopped(&self) -> bool {
        self.stop.is_cancelled()
    }
    /// The instant by which this attempt's work must be gone: its local
    /// lease bound (the last confirmed heartbeat's send time + the lease,
    /// moved on by every confirmed heartbeat) less
    /// [`crate::lock::stop_margin`] of the lease. The worker drops the
    /// handler there at the latest; a process run for the task should be
    /// killed by then too, even if this process is frozen (see
    /// [`TaskContext::watch_stop_by`]).
    pub fn stop_by(&self) -> Instant {
        let bound = *self.lease_bound.borrow();
        bound.checked_sub(self.margin).unwrap_or(bound)
    }
    /// Follow [`TaskContext::stop_by`] as heartbeats move it: for a
    /// watchdog outside this process (`baton work` sends each new value to
    /// its command's supervisor, which kills the command there by itself).
    pub fn watch_stop_by(&self) -> crate::lock::StopBy {
        crate::lock::StopBy::new(self.lease_bound.subscribe(), self.margin)
    }
    /// Why the handler was asked to stop, if it was.
    pub fn stop_reason(&self) -> Option<StopReason> {
        lock(&self.reason).as_ref().copied()
    }
    /// For handlers that run a process: its exit code, shown on the
    /// attempt's `task ended` line and recorded on its `task` span.
    pub fn set_exit_code(&self, code: i32) {
        *lock(&self.exit_code) = Some(code);
    }
    /// Record progress on the task (any JSON). Fails with
    /// [`Error::LeaseLost`] when the claim is no longer this worker's.
    pub async fn progress(&self, value: serde_json::Value) -> Result<(), Error> {
        if self
            .store
            .backend()
            .task_set_progress(&crate::store::TaskSetProgress {
                claim: self.claim(),
                progress: &value,
            })
            .await?
        {
            Ok(())
        } else {
            Err(Error::LeaseLost(format!("task {}", self.task.id)))
        }
    }
    fn stop_with(&self, why: StopReason) {
        let mut r = lock(&self.reason);
        if r.is_none() {
            *r = Some(why);
        }
        drop(r);
        self.stop.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

type BoxFut = Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;
type HandlerFn = Arc<dyn Fn(TaskContext) -> BoxFut + Send + Sync>;

/// A running attempt, as the heartbeat loop sees it.
struct Running {
    ctx: TaskContext,
    /// Local monotonic bound on the lease: last heartbeat's send time + lease.
    deadline: Instant,
    /// False while the task waits in its queue's prefetch buffer.
    started: bool,
}

/// Claims and runs tasks. See the module docs.
pub struct Worker {
    store: Store,
    config: WorkerConfig,
    id: String,
    handlers: HashMap<String, HandlerFn>,
    fallback: Option<HandlerFn>,
    counters: WorkerCounters,
}

impl Worker {
    /// A worker on `store`; add handlers, then [`Worker::run`].
    pub fn new(store: Store, config: WorkerConfig) -> Worker {
        Worker {
            store,
            config,
            id: format!("{}:{}", crate::lock::node_id(), crate::lock::short_id()),
            handlers: HashMap::new(),
            fallback: None,
            counters: WorkerCounters::default(),
        }
    }

    /// A handle on this worker's counters (attempts by queue and outcome),
    /// readable while it runs.
    pub fn counters(&self) -> WorkerCounters {
        self.counters.clone()
    }

    /// This worker's id, recorded on the tasks it claims.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Handle tasks of `kind` with an async function.
    pub fn handle<F, Fut>(&mut self, kind: impl Into<String>, f: F) -> &mut Self
    where
        F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), TaskError>> + Send + 'static,
    {
        self.handlers
            .insert(kind.into(), Arc::new(move |c| Box::pin(f(c)) as BoxFut));
        self
    }

    /// Handle every kind that has no handler of its own.
    pub fn handle_any<F, Fut>(&mut self, f: F) -> &mut Self
    where
        F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), TaskError>> + Send + 'static,
    {
        self.fallback = Some(Arc::new(move |c| Box::pin(f(c)) as BoxFut));
        self
    }

    /// Run until `shutdown` fires, then stop claiming, let running handlers
    /// finish for `shutdown_grace`, stop the rest and hand their tasks back
    /// (without counting the attempt), and return. Same as
    /// [`Worker::run_with`] without an urgent signal.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        self.run_with(shutdown, CancellationToken::new()).await
    }

    /// Run until `shutdown` (graceful) or `urgent` fires.
    ///
    /// Graceful: stop claiming, let running handlers finish for
    /// `shutdown_grace`, then stop the rest ([`StopReason::Shutdown`]), give
    /// them `stop_grace` to return, and hand their tasks back without
    /// counting the attempt. Urgent (at any time, e.g. a second SIGTERM):
    /// skip what is left of the grace, stop every handler now, drop those
    /// that have not returned within 1 s, and hand their tasks back within
    /// 3 s more. Either way the return is bounded even when the store does
    /// not answer: a claim in flight is not waited for past the grace, and a
    /// task that cannot be handed back in time is left to be rescued after
    /// its lease (and logged).
    ///
    /// ```no_run
    /// # async fn demo(worker: baton::queue::Worker) -> Result<(), baton::Error> {
    /// use tokio_util::sync::CancellationToken;
    /// let (graceful, urgent) = (CancellationToken::new(), CancellationToken::new());
    /// let (g, u) = (graceful.clone(), urgent.clone());
    /// tokio::spawn(async move {
    ///     tokio::signal::ctrl_c().await.ok();
    ///     g.cancel(); // first Ctrl-C: finish what runs, within the grace
    ///     tokio::signal::ctrl_c().await.ok();
    ///     u.cancel(); // second: stop now, hand the tasks back
    /// });
    /// worker.run_with(graceful, urgent).await?;
    /// # Ok(()) }
    /// ```
    pub async fn run_with(
        mut self,
        shutdown: CancellationToken,
        urgent: CancellationToken,
    ) -> Result<(), Error> {
        self.config.validate()?;
        let kind = self.store.backend().kind();
        self.config = std::mem::take(&mut self.config).with_store_defaults(kind);
        let (completions, completion_rx) = tokio::sync::mpsc::unbounded_channel();
        let (due, due_rx) = tokio::sync::mpsc::unbounded_channel();
        let completer = tokio::spawn(complete_loop(
            self.store.clone(),
            self.config.lease,
            self.config.result_batches(),
            completion_rx,
        ));
        let shared = Arc::new(Shared {
            completions,
            store: self.store.clone(),
            config: self.config.clone(),
            id: self.id.clone(),
            handlers: self.handlers,
            fallback: self.fallback,
            running: Mutex::new(HashMap::new()),
            stop_claiming: CancellationToken::new(),
            drained: Notify::new(),
            counters: self.counters.clone(),
            urgent: urgent.clone(),
            abandon: CancellationToken::new(),
            due,
        });
        // Either signal ends the ticker below; `urgent` also cuts the grace.
        let shutdown = shutdown.child_token();
        let either = {
            let (s, u) = (shutdown.clone(), urgent.clone());
            tokio::spawn(async move {
                u.cancelled().await;
                s.cancel();
            })
        };
        shared
            .counters
            .serve(self.config.queues.iter().map(|(q, _)| q.clone()));
        let mut wake = match self.store.backend().wake_subscribe().await {
            Ok(rx) => Some(rx),
            Err(e) => {
                tracing::warn!(error = %crate::error::chain(&e), "no wake-up channel; polling only");
                None
            }
        };
        let pokes: Vec<Arc<Notify>> = self
            .config
            .queues
            .iter()
            .map(|_| Arc::new(Notify::new()))
            .collect();
        let mut tasks = JoinSet::new();
        for (i, (queue, conc)) in self.config.queues.iter().enumerate() {
            tasks.spawn(claim_loop(
                shared.clone(),
                queue.clone(),
                *conc,
                pokes[i].clone(),
            ));
        }
        let heart = tokio::spawn(heartbeat_loop(shared.clone()));
        // Rescue, prune and the store clock run on timers of their own, so
        // they never take a claim's turn nor hold up a wake-up.
        let clock: Arc<std::sync::OnceLock<StoreClock>> = Arc::default();
        let upkeep = tokio::spawn(upkeep_loop(shared.clone(), pokes.clone(), clock.clone()));
        tracing::info!(
            worker = %self.id,
            queues = ?self.config.queues,
            free_slot_on_return = self.config.free_slot_on_return_on(),
            result_batches_in_flight = self.config.result_batches(),
            prefetch = self.config.prefetch_tasks(),
            prefetch_adaptive = self.config.prefetch_adaptive(),
            "worker started"
        );

        // The ticker: one claim per tick (queues in turn) when idle, claims
        // on wake-ups, and timers for work announced as due later.
        let mut tick = tokio::time::interval(self.config.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut k: usize = 0;
        let n = self.config.queues.len();
        // Upkeep calls the ticker has skipped a poll for (this worker's,
        // and those of anything else on the same store, e.g. the scheduler
        // of a `baton serve`), and whether the last tick was skipped (never
        // two in a row: a wake-up the store lost waits at most two poll
        // intervals).
        let (mut paid, mut skipped) = (self.store.upkeep_calls(), false);
        let mut timers = Timers::default();
        let mut due_rx = due_rx;
        loop {
            let next_timer = timers.next();
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {
                    if !skipped && shared.store.upkeep_calls() > paid {
                        paid += 1;
                        skipped = true;
                    } else {
                        skipped = false;
                        pokes[k % n].notify_one();
                        k = k.wrapping_add(1);
                    }
                }
                _ = sleep_until_opt(next_timer) => {
                    for i in timers.take_due(Instant::now()) {
                        pokes[i].notify_one();
                    }
                }
                msg = recv_wake(&mut wake) => match msg {
                    Some(w) => {
                        for (i, (queue, _)) in self.config.queues.iter().enumerate() {
                            if *queue != w.queue {
                                continue;
                            }
                            // Work due later: claim when the store's clock
                            // reaches its run_at. Until the store's clock is
                            // read (the first moments after start), this
                            // host's clock stands in for it: looking now
                            // would find nothing due and leave the task to
                            // the next poll, up to a poll interval late.
                            let at = w.due.map(|t| match clock.get() {
                                Some(c) => c.instant_at(t),
                                None => local_instant_at(t),
                            });
                            match at {
                                Some(at) if at > Instant::now() => timers.arm(at, i),
                                _ => pokes[i].notify_one(),
                            }
                        }
                    }
                    None => wake = None,
                },
                Some((queue, at)) = due_rx.recv() => {
                    // An attempt of ours ended in a retry: we know when it is due.
                    if let Some(i) = self.config.queues.iter().position(|(q, _)| *q == queue) {
                        timers.arm(at, i);
                    }
                }
            }
        }
        upkeep.abort();

        // Shutdown: stop claiming, give running handlers the grace period.
        tracing::info!(worker = %self.id, "shutting down: no new claims");
        shared.stop_claiming.cancel();
        let grace_end = Instant::now() + self.config.shutdown_grace;
        // A claim in flight on a store that does not answer is not waited
        // for past the grace (1 s after an urgent request).
        tokio::select! {
            _ = async { while tasks.join_next().await.is_some() {} } => {}
            _ = tokio::time::sleep_until(grace_end) => {}
            _ = after(&urgent, URGENT_STOP) => {}
        }
        if !tasks.is_empty() {
            tracing::warn!("a claim got no answer from the store; abandoning it (anything it claimed is rescued after its lease)");
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
        // Claim loops hand their prefetched tasks back as they stop; an
        // aborted one could not: its buffered tasks are left to rescue.
        let unstarted = {
            let mut running = lock(&shared.running);
            let before = running.len();
            running.retain(|_, r| r.started);
            before - running.len()
        };
        if unstarted > 0 {
            tracing::warn!(count = unstarted, "prefetched tasks could not be handed back (the store does not answer); they are rescued after their lease");
            shared.drained.notify_waiters();
        }
        loop {
            let notified = shared.drained.notified();
            if lock(&shared.running).is_empty()
                || Instant::now() >= grace_end
                || urgent.is_cancelled()
            {
                break;
            }
            tokio::select! {
                _ = tokio::time::timeout_at(grace_end, notified) => {}
                _ = urgent.cancelled() => {}
            }
        }
        let left: Vec<TaskContext> = lock(&shared.running)
            .values()
            .map(|r| r.ctx.clone())
            .collect();
        if !left.is_empty() {
            tracing::info!(
                count = left.len(),
                urgent = urgent.is_cancelled(),
                "stopping handlers and handing their tasks back"
            );
        }
        for ctx in &left {
            ctx.stop_with(StopReason::Shutdown);
        }
        // Every attempt ends by itself within stop_grace + its lease (the
        // handler is dropped at its lease's end, and writes stop there); the
        // bound below is the backstop, much shorter after an urgent request.
        let drain_end = Instant::now() + self.config.stop_grace + self.config.lease;
        let mut urgent_end: Option<Instant> = None;
        loop {
            let notified = shared.drained.notified();
            if lock(&shared.running).is_empty() {
                break;
            }
            if urgent.is_cancelled() && urgent_end.is_none() {
                urgent_end = Some(Instant::now() + URGENT_STOP + URGENT_HAND_BACK);
            }
            let end = urgent_end.map_or(drain_end, |u| u.min(drain_end));
            if Instant::now() >= end {
                break;
            }
            tokio::select! {
                _ = tokio::time::timeout_at(end, notified) => {}
                _ = urgent.cancelled(), if urgent_end.is_none() => {}
            }
        }
        let stuck = lock(&shared.running).len();
        if stuck > 0 {
            tracing::warn!(
                count = stuck,
                "tasks could not be handed back in time (the store does not answer); they are rescued after their lease"
            );
            shared.abandon.cancel();
            // Let the abandoned attempts unwind (their handlers are dropped).
            let unwound = async {
                loop {
                    let notified = shared.drained.notified();
                    if lock(&shared.running).is_empty() {
                        break;
                    }
                    notified.await;
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(1), unwound).await;
        }
        heart.abort();
        completer.abort();
        either.abort();
        tracing::info!(worker = %self.id, "worker stopped");
        Ok(())
    }
}

/// After an urgent shutdown request, how long a stopped handler may take to
/// return before it is dropped.
const URGENT_STOP: Duration = Duration::from_secs(1);
/// After an urgent shutdown request and [`URGENT_STOP`], how long hand-backs
/// may take before their tasks are left to rescue.
const URGENT_HAND_BACK: Duration = Duration::from_secs(3);

/// Resolves `wait` after `token` fires.
async fn after(token: &CancellationToken, wait: Duration) {
    token.cancelled().await;
    tokio::time::sleep(wait).await;
}

/// How many future due times a worker remembers; beyond that the latest
/// are dropped (the poll finds their tasks).
const MAX_TIMERS: usize = 4096;

/// How often a worker re-reads the store's clock for its timers.
const CLOCK_RECALIBRATION: Duration = Duration::from_secs(60);

/// Local instants at which a queue's announced work falls due.
#[derive(Default)]
struct Timers(std::collections::BTreeSet<(Instant, usize)>);

impl Timers {
    fn arm(&mut self, at: Instant, queue: usize) {
        self.0.insert((at, queue));
        if self.0.len() > MAX_TIMERS {
            self.0.pop_last();
        }
    }
    fn next(&self) -> Option<Instant> {
        self.0.first().map(|(at, _)| *at)
    }
    /// The queues whose timers have fired by `now` (each once).
    fn take_due(&mut self, now: Instant) -> BTreeSet<usize> {
        let mut out = BTreeSet::new();
        while let Some(&(at, q)) = self.0.first() {
            if at > now {
                break;
            }
            self.0.pop_first();
            out.insert(q);
        }
        out
    }
}

/// The local instant at which this host's wall clock reads `t` (now, if
/// it already has).
fn local_instant_at(t: chrono::DateTime<chrono::Utc>) -> Instant {
    Instant::now() + (t - chrono::Utc::now()).to_std().unwrap_or_default()
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Rescue (with the store identity check when one is due), prune and the
/// store clock, each on its own timer, half a poll interval off the poll
/// ticker's beat (a call of each at the same instant would need two
/// connections). A rescue that requeues tasks pokes every queue.
async fn upkeep_loop(
    shared: Arc<Shared>,
    pokes: Vec<Arc<Notify>>,
    clock: Arc<std::sync::OnceLock<StoreClock>>,
) {
    let cfg = &shared.config;
    let rescue_every = cfg.rescue_interval.unwrap_or(cfg.poll_interval * 5);
    let prune_every = cfg.poll_interval * 300;
    let start = Instant::now() + cfg.poll_interval / 2;
    let mut rescue = tokio::time::interval_at(start + rescue_every, rescue_every);
    rescue.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut prune = tokio::time::interval_at(start + prune_every, prune_every);
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first reading half a poll in; until one succeeds, retry each second.
    let mut recal = tokio::time::interval_at(start, CLOCK_RECALIBRATION);
    recal.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = recal.tick() => match clock.get() {
                Some(c) => {
                    c.recalibrate_if_suspended().await;
                    c.recalibrate_best_of(3).await;
                    shared.store.note_upkeep(3);
                }
                None => match StoreClock::new(shared.store.clone()).await {
                    Ok(c) => {
                        c.recalibrate_best_of(2).await;
                        shared.store.note_upkeep(3);
                        let _ = clock.set(c);
                    }
                    Err(e) => {
                        shared.counters.store_error("now");
                        tracing::warn!(error = %crate::error::chain(&e), "reading the store's clock failed; retrying");
                        recal.reset_after(Duration::from_secs(1));
                    }
                },
            },
            _ = rescue.tick(), if cfg.rescue => {
                match shared.upkeep(shared.store.backend().task_rescue_many()).await {
                    Ok(r) if r.requeued + r.failed + r.cancelled > 0 => {
                        tracing::info!(requeued = r.requeued, failed = r.failed, cancelled = r.cancelled, "rescued expired leases");
                        pokes.iter().for_each(|p| p.notify_one());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        shared.counters.store_error("task_rescue_many");
                        tracing::warn!(error = %crate::error::chain(&e), "rescue failed")
                    }
                }
                // Is it still the store we connected to? Read every
                // IDENTITY_CHECK (every other rescue at the default
                // cadence; one check serves every clone of the store). A
                // change (a store that lost its data or went back in time)
                // is logged by the check, once; here only a failed read is
                // said.
                if !shared.store.identity().take_due(IDENTITY_CHECK) {
                    continue;
                }
                if let Err(e) = shared.upkeep(shared.store.check_identity()).await {
                    shared.counters.store_error("store_identity");
                    tracing::debug!(error = %crate::error::chain(&e), "reading the store's identity failed");
                }
            }
            _ = prune.tick(), if cfg.retention.is_some() => {
                if let Some(keep) = cfg.retention {
                    match shared.upkeep(shared.store.backend().task_prune(keep)).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(pruned = n, "pruned finished tasks"),
                        Err(e) => {
                            shared.counters.store_error("task_prune");
                            tracing::warn!(error = %crate::error::chain(&e), "prune failed")
                        }
                    }
                }
            }
        }
    }
}

async fn recv_wake(rx: &mut Option<tokio::sync::broadcast::Receiver<Wake>>) -> Option<Wake> {
    use tokio::sync::broadcast::error::RecvError;
    match rx {
        None => std::future::pending().await,
        Some(r) => loop {
            match r.recv().await {
                Ok(q) => return Some(q),
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return None,
            }
        },
    }
}

/// A finished attempt waiting to be written, with where to send the answer.
struct Completion {
    claim: Claim,
    finish: Finish,
    reply: tokio::sync::oneshot::Sender<Result<bool, crate::StoreError>>,
}

struct Shared {
    completions: tokio::sync::mpsc::UnboundedSender<Completion>,
    store: Store,
    config: WorkerConfig,
    id: String,
    handlers: HashMap<String, HandlerFn>,
    fallback: Option<HandlerFn>,
    running: Mutex<HashMap<Claim, Running>>,
    stop_claiming: CancellationToken,
    drained: Notify,
    counters: WorkerCounters,
    /// Retries this worker wrote, with the local instant they fall due.
    due: tokio::sync::mpsc::UnboundedSender<(String, Instant)>,
    /// The urgent shutdown request.
    urgent: CancellationToken,
    /// Fired when shutdown gives up on attempts that could not finish in
    /// time: their handlers are dropped and nothing more is written.
    abandon: CancellationToken,
}

impl Shared {
    /// An upkeep store call, counted on the store: the ticker skips a
    /// poll for each, so an idle worker stays at one store call per poll
    /// interval.
    async fn upkeep<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        self.store.note_upkeep(1);
        call.await
    }

    /// The local bound on a running attempt's lease, if it still runs.
    fn deadline(&self, claim: Claim) -> Option<Instant> {
        lock(&self.running).get(&claim).map(|r| r.deadline)
    }

    /// How long before its lease's end an unconfirmed attempt is stopped.
    fn guard(&self) -> Duration {
        self.config.stop_grace.min(self.config.lease / 3)
    }

    /// Resolves `before` the attempt's lease ends (its deadline, moved on by
    /// every confirmed heartbeat).
    async fn lease_end(&self, claim: Claim, before: Duration) {
        loop {
            let Some(deadline) = self.deadline(claim) else {
                return std::future::pending().await;
            };
            let at = deadline.checked_sub(before).unwrap_or(deadline);
            if Instant::now() >= at {
                return;
            }
            tokio::time::sleep_until(at).await;
        }
    }
}

/// Aborts the handler's task when the attempt is dropped (e.g. abandoned).
struct AbortOnDrop(tokio::task::JoinHandle<Result<(), TaskError>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long after a failed claim a queue is polled every [`RECOVERY_POLL`]
/// (longer than a wake-up channel's longest reconnect backoff plus a claim's).
const RECOVERY_WINDOW: Duration = Duration::from_secs(15);
/// The claim period while recovering from a store error.
const RECOVERY_POLL: Duration = Duration::from_millis(100);

/// With slots freed as handlers return, how long a claim for fewer than
/// half the slots waits for more to free.
const CLAIM_GATHER: Duration = Duration::from_millis(2);

async fn claim_loop(shared: Arc<Shared>, queue: String, concurrency: usize, poke: Arc<Notify>) {
    let mut buffer = VecDeque::new();
    claim_into(&shared, &queue, concurrency, &poke, &mut buffer).await;
    // Stopped: what waits in the prefetch buffer goes back unstarted.
    if !buffer.is_empty() {
        let tasks: Vec<Task> = buffer.iter().map(|c| c.task().clone()).collect();
        hand_back(&shared, &tasks).await;
        let mut running = lock(&shared.running);
        for ctx in &buffer {
            running.remove(&ctx.claim());
        }
        drop(running);
        shared.drained.notify_waiters();
    }
}

/// The claim loop proper: returns when claiming stops, leaving in `buffer`
/// the prefetched tasks not started (registered as running, unstarted).
async fn claim_into(
    shared: &Arc<Shared>,
    queue: &str,
    concurrency: usize,
    poke: &Notify,
    buffer: &mut VecDeque<TaskContext>,
) {
    let slots = Arc::new(Semaphore::new(concurrency));
    let early = shared.config.free_slot_on_return_on();
    let capped = shared.config.max_running.contains_key(queue);
    // A buffered task counts as running against a cluster-wide cap: capped
    // queues claim only for free slots.
    let max_prefetch = if capped {
        0
    } else {
        shared.config.prefetch_tasks()
    };
    // Attempts whose handler has returned but whose result the store has
    // not acknowledged yet, beyond the running ones: at most `concurrency`
    // plus the prefetch bound, as many as the worker may hold claimed
    // but not started (see `start_task`); results written in batches
    // grow to that.
    let unacked = Arc::new(Semaphore::new(if early {
        concurrency + max_prefetch
    } else {
        0
    }));
    let freed = Arc::new(Notify::new());
    let slot = |permit| Slot {
        permit: Some(permit),
        is_slot: true,
        unacked: unacked.clone(),
        freed: freed.clone(),
    };
    let mut more = true; // the last claim filled every free slot: there may be more
                         // Under a cluster-wide cap a claim can come back short while work
                         // waits; a slot freed here is then a reason to look again.
    let mut pace = shared
        .config
        .prefetch_adaptive()
        .then(|| Pace::new(Instant::now()));
    // The last claim came back short of its buffer share only (see below).
    let mut filtered = false;
    let mut backoff = Duration::from_millis(50);
    // After a failed claim the store may have restarted, and the wake-ups
    // sent while the wake-up channel reconnects (with a backoff of its own,
    // up to 5 s) are lost: look often until that window has passed, so work
    // due meanwhile is not left for the next poll.
    let mut recovering_until: Option<Instant> = None;
    loop {
        if shared.stop_claiming.is_cancelled() {
            return;
        }
        // Buffered tasks take the free slots first, without a round trip.
        while !buffer.is_empty() {
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                break;
            };
            if let Some(ctx) = buffer.pop_front() {
                start_task(shared.clone(), ctx, Instant::now(), slot(permit));
                if let Some(p) = pace.as_mut() {
                    p.started(1);
                }
            }
        }
        let prefetch = match pace.as_mut() {
            Some(p) => p.buffer(Instant::now(), max_prefetch),
            None => max_prefetch,
        };
        let low_water = prefetch / 2;
        let mut free = slots.available_permits();
        if free > 0
            && more
            && early
            && (prefetch == 0 || filtered)
            && free < concurrency.div_ceil(2)
        {
            // Slots free one by one as handlers return (see `Slot`): let a
            // few more free before claiming, so claims stay large rather
            // than one round trip (and commit) per task or two.
            tokio::select! {
                _ = tokio::time::sleep(CLAIM_GATHER) => {}
                _ = shared.stop_claiming.cancelled() => return,
            }
            free = slots.available_permits();
        }
        // Claim for the free slots plus the buffer's room, once the buffer
        // is down to its low-water mark.
        let want = if buffer.len() <= low_water {
            free + prefetch - buffer.len()
        } else {
            0
        };
        if want > 0 && more {
            let req = ClaimRequest {
                queue,
                worker: &shared.id,
                limit: u32::try_from(want).unwrap_or(u32::MAX),
                lease: shared.config.lease,
                max_running: shared.config.max_running.get(queue).copied(),
                buffered: u32::try_from(want.saturating_sub(free)).unwrap_or(u32::MAX),
            };
            let sent = Instant::now();
            match shared.store.backend().task_claim(&req).await {
                Ok(mut batch) => {
                    shared.counters.claimed(queue, sent.elapsed());
                    backoff = Duration::from_millis(50);
                    let full = batch.len() == want;
                    // The buffer's share is taken only among tasks with an
                    // attempt to spare (see `ClaimRequest::buffered`), so a
                    // claim that filled the free slots but not the buffer
                    // may have stepped over tasks on their last attempt:
                    // claim again when a slot frees, gathering a few.
                    filtered = !full && free > 0 && batch.len() >= free;
                    more = full || filtered;
                    // Tasks on their last attempt start at once (the store
                    // returns at most `free` of them): ahead of the rest.
                    batch.sort_by_key(|t| t.attempt < t.max_attempts);
                    // A claim that came back so late (a store that was just
                    // restarted, a pool waiting for connections) that its
                    // lease, counted from the send, is already inside the
                    // stop guard would be stopped as it starts — while a
                    // command may still finish and then be discarded and run
                    // again. Hand such tasks back unstarted instead.
                    if sent.elapsed() + shared.guard() >= shared.config.lease {
                        tracing::warn!(queue = %queue, tasks = batch.len(), took_ms = ms(sent.elapsed()), "claim answered too late to run within its lease; handing the tasks back");
                        hand_back(shared, &batch).await;
                        more = true;
                        continue;
                    }
                    for task in batch {
                        let ctx = register(shared, task, sent);
                        match slots.clone().try_acquire_owned() {
                            Ok(permit) => {
                                start_task(shared.clone(), ctx, sent, slot(permit));
                                if let Some(p) = pace.as_mut() {
                                    p.started(1);
                                }
                            }
                            // Beyond the free slots: into the buffer (heartbeated
                            // from now on, like the running ones).
                            Err(_) => buffer.push_back(ctx),
                        }
                    }
                    if full {
                        continue;
                    }
                }
                Err(e) => {
                    shared.counters.store_error("task_claim");
                    tracing::warn!(queue = %queue, error = %crate::error::chain(&e), "claim failed; backing off");
                    recovering_until = Some(Instant::now() + RECOVERY_WINDOW);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shared.stop_claiming.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        }
        // Wait for a reason to claim again: a wake-up or poll tick (there may
        // be new work), or a freed slot when the last claim was full or a
        // buffered task waits for it.
        let recovering = recovering_until.filter(|t| *t > Instant::now());
        tokio::select! {
            _ = poke.notified() => more = true,
            _ = tokio::time::sleep(RECOVERY_POLL), if recovering.is_some() => more = true,
            _ = freed.notified(), if more || capped || !buffer.is_empty() => {
                more = more || capped;
                // Slots free in bursts (completions are written in batches):
                // let the burst land so the next claim takes them together.
                if buffer.is_empty() && slots.available_permits() < concurrency.div_ceil(4) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            _ = shared.stop_claiming.cancelled() => return,
        }
    }
}

/// A queue's recent pace (tasks started per second), which sizes an
/// adaptive prefetch buffer to [`PREFETCH_HORIZON`] of work.
struct Pace {
    /// Start of the current window.
    since: Instant,
    /// Tasks started in the current window.
    count: u32,
    /// The estimate: each finished window averaged with the one before.
    per_sec: f64,
}

impl Pace {
    /// How long a window of counted starts lasts before it updates the
    /// estimate.
    const WINDOW: Duration = Duration::from_millis(50);

    fn new(now: Instant) -> Pace {
        Pace {
            since: now,
            count: 0,
            per_sec: 0.0,
        }
    }

    fn started(&mut self, n: u32) {
        self.count = self.count.saturating_add(n);
    }

    /// The buffer to keep now: the estimate times the horizon, at most
    /// `max`. A window that ended updates the estimate first; a long quiet
    /// spell (many windows without a look) replaces it, so a queue that
    /// went idle starts again from its free slots.
    fn buffer(&mut self, now: Instant, max: usize) -> usize {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed >= Self::WINDOW {
            let rate = f64::from(self.count) / elapsed.as_secs_f64();
            self.per_sec = if elapsed >= Self::WINDOW * 8 {
                rate
            } else {
                (self.per_sec + rate) / 2.0
            };
            self.since = now;
            self.count = 0;
        }
        // Saturating float-to-int: a huge rate is `max`.
        ((self.per_sec * PREFETCH_HORIZON.as_secs_f64()) as usize).min(max)
    }
}

/// An attempt's concurrency slot, and how it is given back.
struct Slot {
    /// The slot (one of the queue's `concurrency` handlers), or, after
    /// [`Slot::handler_returned`], a place for an unacknowledged result.
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Whether `permit` is still the slot.
    is_slot: bool,
    /// Places for attempts whose handler returned and whose result is not
    /// acknowledged yet (as many as the queue's concurrency).
    unacked: Arc<Semaphore>,
    /// Told when the slot is free again.
    freed: Arc<Notify>,
}

impl Slot {
    /// The handler has returned: free the slot for the next task now, while
    /// the result is still being written, when a place for an unacknowledged
    /// result is left (held until the write is answered). With none left
    /// the slot stays taken until then, so the results waiting on a slow
    /// store stay bounded. The attempt itself stays in the running set
    /// (heartbeated, its lease watched) until its result is answered.
    fn handler_returned(&mut self) {
        if !self.is_slot {
            return;
        }
        if let Ok(place) = self.unacked.clone().try_acquire_owned() {
            drop(self.permit.replace(place));
            self.is_slot = false;
            self.freed.notify_one();
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Free the slot before saying so: the claimer counts free slots.
        drop(self.permit.take());
        if self.is_slot {
            self.freed.notify_one();
        }
    }
}

/// Record a claimed task as this worker's (heartbeated, its lease watched)
/// before it starts: at once, or after a wait in the prefetch buffer.
fn register(shared: &Shared, task: Task, sent: Instant) -> TaskContext {
    let ctx = TaskContext {
        task: Arc::new(task),
        stop: CancellationToken::new(),
        reason: Arc::default(),
        exit_code: Arc::default(),
        store: shared.store.clone(),
        lease_bound: Arc::new(tokio::sync::watch::Sender::new(sent + shared.config.lease)),
        margin: crate::lock::stop_margin(shared.config.lease),
    };
    lock(&shared.running).insert(
        ctx.claim(),
        Running {
            ctx: ctx.clone(),
            deadline: sent + shared.config.lease,
            started: false,
        },
    );
    ctx
}

/// Run a registered attempt in `slot`; `sent` is when its duration starts.
fn start_task(shared: Arc<Shared>, ctx: TaskContext, sent: Instant, mut slot: Slot) {
    let claim = ctx.claim();
    if let Some(r) = lock(&shared.running).get_mut(&claim) {
        r.started = true;
    }
    let task = ctx.task();
    let queue = task.queue.clone();
    shared.counters.started(&queue);
    // The slot's lag: from the slot to this claim, by the store's clock
    // (the claim set the lease to end `lease` after its own now).
    let lag = task.slot.map(|slot| {
        let claimed_at =
            task.lease_until - chrono::Duration::from_std(shared.config.lease).unwrap_or_default();
        (claimed_at - slot).to_std().unwrap_or_default()
    });
    if let Some(lag) = lag {
        shared.counters.slot_lag(&queue, lag);
    }
    let slot_at = task.slot.map(|s| s.to_rfc3339());
    let span = tracing::info_span!(
        "task",
        id = task.id,
        queue = %task.queue,
        kind = %task.kind,
        attempt = task.attempt,
        job = task.job.as_deref(),
        slot = slot_at.as_deref(),
        traceparent = task.traceparent.as_deref(),
        outcome = tracing::field::Empty,
        duration_ms = tracing::field::Empty,
        exit_code = tracing::field::Empty,
    );
    #[cfg(feature = "otel")]
    if let Some(tp) = &task.traceparent {
        super::trace::link(&span, tp);
    }
    tracing::info!(
        task = task.id,
        queue = %task.queue,
        kind = %task.kind,
        attempt = task.attempt,
        max_attempts = task.max_attempts,
        job = task.job.as_deref(),
        slot = slot_at.as_deref(),
        slot_lag_ms = lag.map(ms),
        "task started"
    );
    tokio::spawn(async move {
        let attempt = async {
            let result = execute(&shared, ctx.clone()).await;
            let error = match &result {
                Some(Finish::Failed { error, .. }) => Some(error.clone()),
                _ => None,
            };
            // A retry we write falls due `retry_in` after the store's now at
            // the write, which is no later than our now when the write returns.
            let retry_in = match &result {
                Some(Finish::Failed {
                    retry_in: Some(d), ..
                }) if ctx.task().attempt < ctx.task().max_attempts => Some(*d),
                _ => None,
            };
            if result.is_some() {
                slot.handler_returned();
            }
            let outcome = match result {
                Some(finish) if finish_with_retries(&shared, claim, &finish).await => {
                    match finish {
                        Finish::Succeeded => Outcome::Succeeded,
                        Finish::Failed { .. } => Outcome::Failed,
                        Finish::Cancelled { .. } => Outcome::Cancelled,
                        Finish::HandBack => Outcome::HandedBack,
                    }
                }
                _ => Outcome::Lost,
            };
            (outcome, retry_in, error)
        }
        .instrument(span.clone());
        let (outcome, retry_in, error) = tokio::select! {
            o = attempt => o,
            _ = shared.abandon.cancelled() => (Outcome::Lost, None, None),
        };
        if let (Some(d), Outcome::Failed) = (retry_in, &outcome) {
            let _ = shared.due.send((queue.clone(), Instant::now() + d));
        }
        let took = sent.elapsed();
        let exit_code = *lock(&ctx.exit_code);
        span.record("outcome", outcome.as_str());
        span.record("duration_ms", ms(took));
        if let Some(code) = exit_code {
            span.record("exit_code", code);
        }
        drop(span);
        let t = ctx.task();
        macro_rules! ended {
            ($level:ident) => {
                tracing::$level!(
                    task = t.id,
                    queue = %t.queue,
                    kind = %t.kind,
                    attempt = t.attempt,
                    outcome = outcome.as_str(),
                    duration_ms = ms(took),
                    exit_code,
                    error = error.as_deref(),
                    retry_in_ms = retry_in.map(ms),
                    "task ended"
                )
            };
        }
        match outcome {
            Outcome::Succeeded | Outcome::Cancelled | Outcome::HandedBack => ended!(info),
            Outcome::Failed | Outcome::Lost => ended!(warn),
        }
        if outcome == Outcome::Lost {
            shared.counters.lease_lost(&queue);
        }
        shared.counters.ended(&queue, outcome, took);
        lock(&shared.running).remove(&claim);
        drop(slot);
        shared.drained.notify_waiters();
    });
}

/// Hand claimed tasks back unstarted (the attempt is not counted), in one
/// call; a task that cannot be handed back is rescued after its lease.
async fn hand_back(shared: &Shared, tasks: &[Task]) {
    if tasks.is_empty() {
        return;
    }
    let items: Vec<(Claim, Finish)> = tasks
        .iter()
        .map(|t| (t.claim(), Finish::HandBack))
        .collect();
    match shared.store.backend().task_finish_many(&items).await {
        Ok(answers) => {
            for (task, ok) in tasks.iter().zip(answers) {
                if ok {
                    tracing::info!(task = task.id, queue = %task.queue, attempt = task.attempt, "task handed back unstarted")
                } else {
                    tracing::warn!(task = task.id, queue = %task.queue, attempt = task.attempt, "handing the task back was refused: its claim was lost")
                }
            }
        }
        Err(e) => {
            shared.counters.store_error("task_finish_many");
            tracing::warn!(tasks = tasks.len(), error = %crate::error::chain(&e), "handing tasks back failed; they are rescued after their lease");
        }
    }
}

/// A duration in whole milliseconds, for log fields.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Run the handler to an outcome; `None` when the lease was lost (nothing
/// may be written for this attempt any more).
async fn execute(shared: &Shared, ctx: TaskContext) -> Option<Finish> {
    let task = ctx.task().clone();
    let handler = shared
        .handlers
        .get(&task.kind)
        .or(shared.fallback.as_ref())
        .cloned();
    // An attempt that waited in the prefetch buffer may have been stopped
    // meanwhile (its lease lost, a cancel requested), or its lease may be
    // too near its end to start (no heartbeat confirmed it lately): it does
    // not run.
    let claim = ctx.claim();
    if let Some(why) = ctx.stop_reason() {
        return match why {
            StopReason::LeaseLost | StopReason::LeaseExpiring => None,
            StopReason::Cancelled => Some(Finish::Cancelled {
                reason: "cancelled".into(),
            }),
            StopReason::Shutdown | StopReason::TimedOut => Some(Finish::HandBack),
        };
    }
    if shared
        .deadline(claim)
        .is_none_or(|d| Instant::now() + shared.guard() >= d)
    {
        tracing::warn!(
            task = task.id,
            attempt = task.attempt,
            "lease too near its end to start (no heartbeat confirmed it); handing the task back"
        );
        return Some(Finish::HandBack);
    }
    let Some(handler) = handler else {
        return Some(Finish::Failed {
            error: format!("no handler for kind {:?} on this worker", task.kind),
            retry_in: Some(shared.config.backoff.delay(task.attempt)),
        });
    };
    // The handler runs in its own task so a panic is caught as a failure,
    // inside the attempt's `task` span.
    let mut join = AbortOnDrop(tokio::spawn(handler(ctx.clone()).in_current_span()));
    let timeout = async {
        match task.timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        r = &mut join.0 => Some(r),
        _ = ctx.stopped() => None,
        _ = timeout => { ctx.stop_with(StopReason::TimedOut); None }
        _ = shared.lease_end(claim, shared.guard()) => {
            tracing::warn!(task = task.id, attempt = task.attempt, "no heartbeat confirmed the lease in time; stopping the handler before the lease can lapse");
            ctx.stop_with(StopReason::LeaseExpiring);
            None
        }
    };
    let mut expired = false;
    let result = match result {
        Some(r) => r,
        None => {
            // Asked to stop: give the handler its grace to return, but never
            // past its lease's end (nor long after an urgent shutdown).
            let why = tokio::select! {
                r = &mut join.0 => Ok(r),
                _ = tokio::time::sleep(shared.config.stop_grace) => Err("the grace period"),
                _ = shared.lease_end(claim, crate::lock::stop_margin(shared.config.lease)) => {
                    expired = true;
                    Err("its lease's end")
                }
                _ = after(&shared.urgent, URGENT_STOP) => Err("the urgent shutdown"),
            };
            match why {
                Ok(r) => r,
                Err(when) => {
                    join.0.abort();
                    // Wait until it is really dropped (a command's child is
                    // killed on drop), briefly: a handler that blocks its
                    // thread cannot be stopped anyway.
                    let _ = tokio::time::timeout(Duration::from_secs(1), &mut join.0).await;
                    tracing::warn!(
                        task = task.id,
                        attempt = task.attempt,
                        before = when,
                        "handler did not stop in time; dropped"
                    );
                    Ok(Err(TaskError::retryable(format!(
                        "handler did not stop before {when}"
                    ))))
                }
            }
        }
    };
    if expired {
        // The lease may have lapsed (no heartbeat confirmed it): write
        // nothing; the task is rescued and run again.
        ctx.stop_with(StopReason::LeaseExpiring);
        tracing::warn!(
            task = task.id,
            attempt = task.attempt,
            "lease lost: it ended unconfirmed; nothing recorded, the task will be rescued"
        );
        return None;
    }
    let reason = ctx.stop_reason();
    let attempt_error = |msg: String, retry: bool| Finish::Failed {
        retry_in: retry.then(|| shared.config.backoff.delay(task.attempt)),
        error: msg,
    };
    match (reason, result) {
        (Some(StopReason::LeaseLost | StopReason::LeaseExpiring), _) => {
            tracing::warn!(
                task = task.id,
                attempt = task.attempt,
                "lease lost; result discarded"
            );
            None
        }
        // Work that completed is recorded as done, whatever stop came late.
        (_, Ok(Ok(()))) => Some(Finish::Succeeded),
        (Some(StopReason::Shutdown), _) => Some(Finish::HandBack),
        (Some(StopReason::Cancelled), _) => Some(Finish::Cancelled {
            reason: "cancelled".into(),
        }),
        (Some(StopReason::TimedOut), _) => Some(attempt_error(
            format!(
                "timed out after {}",
                crate::format_duration(task.timeout.unwrap_or_default())
            ),
            true,
        )),
        (None, Ok(Err(e))) => Some(attempt_error(e.message, e.retry)),
        (None, Err(join_err)) if join_err.is_panic() => {
            let msg = join_err
                .into_panic()
                .downcast::<String>()
                .map(|s| *s)
                .or_else(|p| p.downcast::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|_| "panic".into());
            Some(attempt_error(format!("handler panicked: {msg}"), true))
        }
        (None, Err(_)) => Some(attempt_error("handler was aborted".into(), true)),
    }
}

/// Write finished attempts in batches: whatever queued up while the last
/// batches were being written goes in the next one (one statement or round
/// trip where the backend can), with up to `in_flight` batches written at
/// once (see [`WorkerConfig::result_batches_in_flight`]), so a busy worker does not pay one commit per
/// task, nor wait for one batch's commit before sending the next, and an
/// idle one adds no delay.
async fn complete_loop(
    store: Store,
    lease: Duration,
    in_flight: usize,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Completion>,
) {
    const MAX_BATCH: usize = 256;
    let gate = Arc::new(Semaphore::new(in_flight.max(1)));
    let mut writes = JoinSet::new();
    loop {
        // A free place first, then the batch: what queues up while every
        // place is taken joins the next batch.
        let Ok(place) = gate.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            break;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(_) => break,
            }
        }
        while writes.try_join_next().is_some() {}
        writes.spawn(write_batch(store.clone(), lease, batch, place));
    }
    while writes.join_next().await.is_some() {}
}

/// Write one batch of results and answer each waiter.
async fn write_batch(
    store: Store,
    lease: Duration,
    batch: Vec<Completion>,
    _place: tokio::sync::OwnedSemaphorePermit,
) {
    let items: Vec<(Claim, Finish)> = batch.iter().map(|c| (c.claim, c.finish.clone())).collect();
    // No batch waits past a lease: its waiters have given up by then.
    let call = crate::store::bounded(
        lease,
        "task_finish_many",
        store.backend().task_finish_many(&items),
    );
    match call.await {
        Ok(answers) if answers.len() == batch.len() => {
            for (c, ok) in batch.into_iter().zip(answers) {
                let _ = c.reply.send(Ok(ok));
            }
        }
        Ok(_) => {
            for c in batch {
                let _ = c.reply.send(Err(crate::StoreError::Corrupt(
                    "finish_many answered the wrong number of items".into(),
                )));
            }
        }
        Err(e) => {
            let msg = e.to_string();
            let retryable = e.is_retryable();
            for c in batch {
                let err = if retryable {
                    crate::StoreError::Unavailable(msg.clone())
                } else {
                    crate::StoreError::Backend(msg.clone())
                };
                let _ = c.reply.send(Err(err));
            }
        }
    }
}

async fn finish_once(
    shared: &Shared,
    claim: Claim,
    finish: &Finish,
) -> Result<bool, crate::StoreError> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let sent = shared.completions.send(Completion {
        claim,
        finish: finish.clone(),
        reply,
    });
    if sent.is_err() {
        // The completer is gone (shutdown): write directly.
        return shared
            .store
            .backend()
            .task_finish_many(&[(claim, finish.clone())])
            .await
            .map(|r| r == [true]);
    }
    match answer.await {
        Ok(r) => r,
        Err(_) => shared
            .store
            .backend()
            .task_finish_many(&[(claim, finish.clone())])
            .await
            .map(|r| r == [true]),
    }
}

/// Record the attempt's result, retrying store errors while the lease
/// lasts; whether it was recorded. No call outlives the lease: past it the
/// result is unknown or refused, and the task is rescued.
async fn finish_with_retries(shared: &Shared, claim: Claim, finish: &Finish) -> bool {
    let mut backoff = Duration::from_millis(20);
    loop {
        let Some(deadline) = shared.deadline(claim) else {
            return false;
        };
        if Instant::now() >= deadline {
            tracing::warn!(
                task = claim.id,
                attempt = claim.attempt,
                "lease lost: it ended before the result was recorded; the task will be rescued"
            );
            return false;
        }
        let answer = match tokio::time::timeout_at(deadline, finish_once(shared, claim, finish))
            .await
        {
            Ok(a) => a,
            Err(_) => {
                tracing::warn!(
                    task = claim.id,
                    attempt = claim.attempt,
                    "lease lost: the store did not answer before it ended; result not recorded, the task will be rescued"
                );
                return false;
            }
        };
        match answer {
            Ok(true) => {
                tracing::debug!(
                    task = claim.id,
                    attempt = claim.attempt,
                    ?finish,
                    "task finished"
                );
                return true;
            }
            Ok(false) => {
                tracing::warn!(
                    task = claim.id,
                    attempt = claim.attempt,
                    "result refused: the claim was lost"
                );
                return false;
            }
            Err(e) => {
                shared.counters.store_error("task_finish_many");
                let deadline = lock(&shared.running).get(&claim).map(|r| r.deadline);
                if deadline.is_none_or(|d| Instant::now() + backoff >= d) {
                    tracing::warn!(task = claim.id, error = %crate::error::chain(&e), "could not record the result before the lease ends; the task will be rescued and run again");
                    return false;
                }
                tracing::warn!(task = claim.id, error = %crate::error::chain(&e), "finish failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Renew the leases of every running attempt, often enough that one slow
/// answer does not stop a handler: every third of `lease - guard`, each
/// call bounded by that period, and again soon after an error.
async fn heartbeat_loop(shared: Arc<Shared>) {
    let lease = shared.config.lease;
    let period = ((lease - shared.guard()) / 3).max(Duration::from_millis(5));
    let mut wait = period;
    loop {
        tokio::time::sleep(wait).await;
        wait = period;
        let claims: Vec<Claim> = lock(&shared.running).keys().copied().collect();
        if claims.is_empty() {
            continue;
        }
        let sent = Instant::now();
        let params = crate::store::TaskHeartbeatMany {
            claims: &claims,
            lease,
        };
        let call = shared.store.backend().task_heartbeat_many(&params);
        match crate::store::bounded(period, "task_heartbeat_many", call).await {
            Ok(answers) => {
                let mut running = lock(&shared.running);
                for (claim, answer) in claims.iter().zip(answers) {
                    let Some(r) = running.get_mut(claim) else {
                        continue;
                    };
                    match answer {
                        Heartbeat::Extended => {
                            r.deadline = sent + lease;
                            r.ctx.lease_bound.send_replace(r.deadline);
                        }
                        Heartbeat::CancelRequested => {
                            r.deadline = sent + lease;
                            r.ctx.lease_bound.send_replace(r.deadline);
                            if !r.ctx.is_stopped() {
                                tracing::info!(
                                    task = claim.id,
                                    attempt = claim.attempt,
                                    "cancel requested; stopping the handler"
                                );
                            }
                            r.ctx.stop_with(StopReason::Cancelled)
                        }
                        Heartbeat::Lost => {
                            if !r.ctx.is_stopped() {
                                tracing::warn!(
                                    task = claim.id,
                                    attempt = claim.attempt,
                                    "lease lost: the claim is no longer ours; stopping the handler"
                                );
                            }
                            r.ctx.stop_with(StopReason::LeaseLost)
                        }
                    }
                }
            }
            Err(e) => {
                // Each attempt's own watch stops its handler before its
                // lease can lapse; here we only try again soon.
                shared.counters.heartbeat_failed();
                shared.counters.store_error("task_heartbeat_many");
                tracing::warn!(tasks = claims.len(), error = %crate::error::chain(&e), "heartbeat failed; retrying soon");
                wait = period.min(Duration::from_millis(250));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_sizes_the_buffer_to_the_horizon_and_forgets_idle_spells() {
        let t0 = Instant::now();
        let mut p = Pace::new(t0);
        assert_eq!(p.buffer(t0, 512), 0, "no pace known yet: free slots only");
        // 200 starts in 50 ms: 4000/s, averaged with the unknown 0 → 2000/s
        // → 200 tasks in 100 ms.
        p.started(200);
        assert_eq!(p.buffer(t0 + Duration::from_millis(50), 512), 200);
        // The same pace again: the average converges to 4000/s → 300, then 350.
        p.started(200);
        assert_eq!(p.buffer(t0 + Duration::from_millis(100), 512), 300);
        p.started(200);
        assert_eq!(p.buffer(t0 + Duration::from_millis(150), 512), 350);
        // Bounded by `max`.
        assert_eq!(p.buffer(t0 + Duration::from_millis(160), 100), 100);
        // Long handlers: 24 starts a second buffer next to nothing.
        let mut slow = Pace::new(t0);
        slow.started(24);
        assert_eq!(slow.buffer(t0 + Duration::from_secs(1), 512), 2);
        // An idle spell replaces the estimate: nothing buffered after it.
        assert_eq!(p.buffer(t0 + Duration::from_secs(5), 512), 0);
    }
}
