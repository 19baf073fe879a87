//! Workers: claim due tasks, run their handlers, heartbeat their leases,
//! finish them with a compare-and-set, rescue other workers' expired leases,
//! and shut down without losing or double-running anything.
//!
//! One [`Worker`] serves several queues, each with its own concurrency.
//! Its store traffic when idle is one call per poll interval (1 s, or 2 s
//! where the store's wake-ups reach across processes; see
//! [`WorkerConfig::poll_interval`]): a claim
//! (each queue in turn), or in place of one an upkeep call — a rescue every
//! `rescue_interval` (default 5 s), a check of the store's identity
//! every 10 s (at a rescue tick; shared with every clone of the store), a
//! prune of finished tasks past the retention every 300 polls, a sweep for
//! waiting slots of its queues' jobs every 15 (`release_sweep.rs`), three
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
//! Files, one service each: `ticker.rs` (the poll and wake-ups),
//! `claimer.rs` (one claim loop per queue, prefetch), `executor.rs` (an
//! attempt: the handler, its span, its stop; an attempt with nothing to
//! await after its result's write hands the result to the completer and
//! its task ends there, the attempt ending where the write is answered,
//! with no wake of a task per result), `heartbeat.rs`,
//! `completer.rs` (batched finishes), `ride.rs` (results held for the
//! next claim, which carries them in the same round trip), `upkeep.rs` (rescue, prune, the
//! store clock), `release_sweep.rs` (waiting slots no one else starts),
//! `shutdown.rs`; `context.rs` holds what a handler sees,
//! `shared.rs` what the services share. This file wires them.
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton::Error> {
//! use baton::queue::{Worker, WorkerConfig, TaskError};
//! let store = baton::Store::connect("sqlite://baton.db").await?;
//! let mut worker = Worker::new(store, WorkerConfig::default().queue("default", 2))?;
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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::config::WorkerConfig;
use super::counters::{Outcome, WorkerCounters};
use super::hooks::{AttemptMiddleware, WorkerEvent};
use super::{QueueRate, RateLimit, TaskAction};
use crate::clock::StoreClock;
use crate::error::{Error, StoreError};
use crate::store::{
    Claim, Finish, Heartbeat, KeyRate, QueueRateRef, Store, Task, TaskClaim, TaskClaimKeyRated,
    TaskClaimRated, TaskFinishAndClaim, Wake, IDENTITY_CHECK,
};

mod claimer;
mod completer;
mod context;
mod executor;
mod heartbeat;
mod release_sweep;
mod ride;
mod rollup;
mod shared;
mod shutdown;
#[cfg(test)]
mod tests;
mod ticker;
mod upkeep;

pub use super::task_error::TaskError;
use claimer::*;
use completer::*;
use context::{AttemptState, ProgressSink};
pub use context::{StopReason, TaskContext};
use executor::*;
use heartbeat::*;
use ride::{Hot, Ride, RIDE_MAX};
use shared::*;
use shutdown::*;
use ticker::*;
use upkeep::*;

/// Claims and runs tasks. See the module docs.
pub struct Worker {
    store: Store,
    config: WorkerConfig,
    id: String,
    handlers: HashMap<String, HandlerFn>,
    fallback: Option<HandlerFn>,
    backoffs: HashMap<String, super::Backoff>,
    counters: WorkerCounters,
    middleware: Vec<Arc<dyn AttemptMiddleware>>,
    events: tokio::sync::broadcast::Sender<WorkerEvent>,
}

impl Worker {
    /// A worker on `store`; add handlers, then [`Worker::run`]. Refuses a
    /// config that does not [`validate`](WorkerConfig::validate), with an
    /// [`InvalidInput`](crate::InvalidInput) naming the field.
    pub fn new(store: Store, config: WorkerConfig) -> Result<Worker, crate::InvalidInput> {
        config.validate()?;
        Ok(Worker {
            store,
            config,
            id: format!("{}:{}", crate::node::node_id(), crate::node::short_id()),
            handlers: HashMap::new(),
            fallback: None,
            backoffs: HashMap::new(),
            counters: WorkerCounters::default(),
            middleware: Vec::new(),
            events: tokio::sync::broadcast::Sender::new(super::hooks::EVENT_BUFFER),
        })
    }

    /// Run `m` around every attempt, inside the middleware added before
    /// it (see [`AttemptMiddleware`]; a closure `|ctx, next| async move {
    /// … next.run(ctx).await }` is one).
    pub fn around(&mut self, m: impl AttemptMiddleware) -> &mut Self {
        self.middleware.push(Arc::new(m));
        self
    }

    /// Receive this worker's [`WorkerEvent`]s from now on: each attempt's
    /// start and end, and the start of its shutdown. Subscribe before
    /// [`Worker::run`]; the worker never waits for a slow subscriber.
    ///
    /// ```no_run
    /// # async fn demo(worker: baton::queue::Worker) {
    /// use baton::queue::WorkerEvent;
    /// let mut events = worker.subscribe();
    /// tokio::spawn(async move {
    ///     while let Ok(e) = events.recv().await {
    ///         if let WorkerEvent::AttemptEnded { task, outcome, .. } = e {
    ///             println!("task {} {}", task.id, outcome.as_str());
    ///         }
    ///     }
    /// });
    /// # }
    /// ```
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<WorkerEvent> {
        self.events.subscribe()
    }

    /// A handle on this worker's counters (attempts by queue and outcome),
    /// readable while it runs.
    pub fn counters(&self) -> WorkerCounters {
        self.counters.clone()
    }

    /// The store this worker runs on.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Its config.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
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

    /// Retry failures of `kind` on this schedule instead of the worker's
    /// ([`WorkerConfig::backoff`]); a [`TaskError::retry_in`] still wins
    /// for its own failure. [`Worker::register`] sets it from
    /// [`TaskArgs::backoff`](super::TaskArgs::backoff).
    ///
    /// ```no_run
    /// # fn demo(worker: &mut baton::queue::Worker) {
    /// use std::time::Duration;
    /// use baton::queue::Backoff;
    /// // Webhooks: retry after 10 s, 20 s, 40 s … at most an hour apart.
    /// worker.backoff_for("webhook", Backoff { base: Duration::from_secs(10), ..Backoff::default() });
    /// # }
    /// ```
    pub fn backoff_for(&mut self, kind: impl Into<String>, backoff: super::Backoff) -> &mut Self {
        self.backoffs.insert(kind.into(), backoff);
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
        let kind = self.store.backend().kind();
        self.config = std::mem::take(&mut self.config).with_store_defaults(kind);
        self.config.listening = self.store.backend().wakes_across_processes();
        let (completions, completion_rx) = tokio::sync::mpsc::unbounded_channel();
        let (due, due_rx) = tokio::sync::mpsc::unbounded_channel();
        // Each queue's places for unacknowledged results (see `Slot`).
        let places = self
            .config
            .queues
            .iter()
            .map(|(q, conc)| conc + self.config.prefetch_tasks_of(q))
            .min()
            .unwrap_or(0);
        let ride = Arc::new(ride::Ride::new(
            self.store.backend().claims_carry_finishes(),
            places,
        ));
        let completer = tokio::spawn(complete_loop(
            self.store.clone(),
            self.config.lease,
            self.config.result_batches(),
            ride.clone(),
            completion_rx,
        ));
        let shared = Arc::new(Shared {
            completions,
            ride,
            store: self.store.clone(),
            config: self.config.clone(),
            id: self.id.clone(),
            handlers: {
                let chain = self.middleware.clone().into();
                self.handlers
                    .into_iter()
                    .map(|(k, h)| (k, super::hooks::wrap(h, &chain)))
                    .collect()
            },
            fallback: {
                let chain = self.middleware.into();
                self.fallback.map(|h| super::hooks::wrap(h, &chain))
            },
            backoffs: self.backoffs,
            running: Mutex::new(crate::fast_hash::FastMap::default()),
            stop_claiming: CancellationToken::new(),
            drained: Notify::new(),
            counters: self.counters.clone(),
            urgent: urgent.clone(),
            abandon: CancellationToken::new(),
            waiting_jobs: crate::store::WaitingJobs::default(),
            rollup: rollup::Rollup::default(),
            due,
            events: self.events.clone(),
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
        tokio::spawn(super::view::declare_limits(
            self.store.clone(),
            self.config.clone(),
            self.id.clone(),
        ));
        let wake = match self.store.backend().wake_subscribe().await {
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
        // `name=slots`, comma-separated: a field every log reader can split.
        let queues = self
            .config
            .queues
            .iter()
            .map(|(q, n)| format!("{q}={n}"))
            .collect::<Vec<_>>()
            .join(",");
        tracing::info!(
            worker = %self.id,
            queues = %queues,
            free_slot_on_return = self.config.free_slot_on_return_on(),
            result_batches_in_flight = self.config.result_batches(),
            prefetch = self.config.prefetch_tasks(),
            prefetch_adaptive = self.config.prefetch_adaptive(),
            "worker started"
        );

        ticker(
            &shared,
            &pokes,
            &clock,
            Wakes {
                store: wake,
                retries: due_rx,
            },
            &shutdown,
        )
        .await;
        upkeep.abort();
        let _ = shared.events.send(WorkerEvent::Stopping);

        drain(&shared, tasks, &urgent).await;
        // The last counts go to the store, but never hold up a stop: a
        // store that does not answer in time keeps them unsent (at most one
        // flush interval of counts lost, as a crash loses).
        let _ = tokio::time::timeout(rollup::FINAL_FLUSH, rollup::flush(&shared)).await;
        heart.abort();
        completer.abort();
        either.abort();
        tracing::info!(worker = %self.id, "worker stopped");
        Ok(())
    }
}
