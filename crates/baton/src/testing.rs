//! Test helpers, in the spirit of River's `rivertest` and Oban's
//! `Oban.Testing`: run a handler on a test [`TaskContext`] without a store
//! ([`perform`], [`TaskContext::for_test`]), an in-memory store
//! ([`memory_store`]), a worker that runs until its queues are idle
//! ([`run_until_idle`]), and assertions on what was enqueued
//! ([`assert_enqueued`], [`enqueued`], [`assert_not_enqueued`]).
//!
//! The assertions panic with a message that says what was found, like
//! `assert!`; the rest return [`crate::Error`].
//!
//! ```
//! use std::time::Duration;
//! use baton::prelude::*;
//! use baton::testing;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! struct Welcome { user: u64 }
//! impl TaskArgs for Welcome { const KIND: &'static str = "welcome"; }
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! struct Reminder { user: u64 }
//! impl TaskArgs for Reminder { const KIND: &'static str = "reminder"; }
//!
//! /// The handler under test: a welcome mail now, a reminder tomorrow; not
//! /// before the account is ready.
//! async fn welcome(ctx: TaskContext, w: Welcome, queue: Queue) -> TaskResult {
//!     if w.user == 0 {
//!         return Err(TaskError::snooze(Duration::from_secs(60)));
//!     }
//!     ctx.progress(serde_json::json!({"sent": w.user})).await?;
//!     let later = TaskBuilder::from_args(&Reminder { user: w.user })?.delay(Duration::from_secs(86_400));
//!     queue.enqueue(later).await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), baton::Error> {
//! let store = testing::memory_store().await?;
//! let queue = Queue::new(store.clone());
//!
//! // One handler, one run, no worker: its result is the handler's.
//! let q = queue.clone();
//! let e = testing::perform(|ctx, w| welcome(ctx, w, q.clone()), &Welcome { user: 0 }).await.unwrap_err();
//! assert_eq!(e.action(), TaskAction::Snooze { after: Duration::from_secs(60) });
//! testing::assert_not_enqueued::<Reminder>(&store).await;
//!
//! // A real worker on the in-memory store, until nothing is due.
//! queue.insert(&Welcome { user: 7 }).await?;
//! let mut worker = Worker::new(store.clone(), WorkerConfig::new().queue("default", 2))?;
//! let q = queue.clone();
//! worker.register(move |ctx, w: Welcome| welcome(ctx, w, q.clone()));
//! testing::run_until_idle(worker, Duration::from_secs(10)).await?;
//! assert_eq!(testing::assert_enqueued::<Reminder>(&store).await, Reminder { user: 7 });
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

use crate::error::Error;
use crate::queue::{Queue, StopReason, TaskArgs, TaskBuilder, TaskContext, TaskResult, Worker};
use crate::store::{FencingToken, RunAt, Task, TaskFilter, TaskInfo, TaskState};
use crate::Store;

/// A store on a private in-memory SQLite database
/// (`Store::connect("sqlite::memory:")`): nothing on disk, migrated, gone
/// with its last handle. Every clone of the store sees the same database;
/// each call makes a new one. One connection serves it, so it suits tests,
/// not load.
pub async fn memory_store() -> Result<Store, Error> {
    Ok(Store::connect("sqlite::memory:").await?)
}

/// The task a worker would hand `builder`'s handler on its first attempt
/// (id 1, attempt 1, a claim token of 1, due and leased now), for
/// [`TaskContext::for_test`]. Set `attempt` to test a later one.
pub fn task_of(builder: TaskBuilder) -> Result<Task, Error> {
    let t = builder.build()?;
    let now = chrono::Utc::now();
    let run_at = match t.run_at {
        RunAt::At(at) => at,
        RunAt::Now | RunAt::Delay(_) => now,
    };
    Ok(Task {
        id: 1,
        queue: t.queue,
        kind: t.kind,
        payload: t.payload,
        priority: t.priority,
        attempt: 1,
        token: FencingToken(1),
        max_attempts: t.max_attempts,
        timeout: t.timeout,
        run_at,
        lease_until: now + chrono::Duration::hours(1),
        job: t.job,
        slot: t.slot,
        traceparent: t.traceparent,
    })
}

/// [`task_of`] for a typed task: `args` as its payload (through JSON, as
/// a worker would see it), its kind's insert options applied.
pub fn task<A: TaskArgs>(args: &A) -> Result<Task, Error> {
    task_of(TaskBuilder::from_args(args)?)
}

/// Run a typed handler once, on a test context, as
/// [`Worker::register`] would (Oban's `perform_job`): `args` goes through
/// JSON and is decoded as the worker decodes it, then `handler` runs; its
/// result is returned. No store, no worker.
pub async fn perform<A, F, Fut>(handler: F, args: &A) -> TaskResult
where
    A: TaskArgs,
    F: FnOnce(TaskContext, A) -> Fut,
    Fut: Future<Output = TaskResult>,
{
    let ctx = TaskContext::for_test(task(args)?);
    let decoded = ctx.args::<A>()?;
    handler(ctx, decoded).await
}

/// Ask a test context's handler to stop, as a worker would on a cancel,
/// a shutdown, a timeout or a lost lease: [`TaskContext::stopped`]
/// resolves and [`TaskContext::stop_reason`] says why.
pub fn stop(ctx: &TaskContext, why: StopReason) {
    ctx.stop_with(why);
}

/// Run `worker` until its queues are idle — no task of theirs due and none
/// running, seen twice 20 ms apart — then shut it down and return. A retry
/// or a snooze due later is left pending (idle means nothing to do now).
///
/// # Panics
///
/// When the queues are not idle within `timeout` (a handler that hangs, a
/// task that keeps failing fast).
pub async fn run_until_idle(worker: Worker, timeout: Duration) -> Result<(), Error> {
    let store = worker.store().clone();
    let queues: Vec<String> = worker
        .config()
        .queues()
        .iter()
        .map(|(q, _)| q.clone())
        .collect();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut run = tokio::spawn(worker.run(stop.clone()));
    let deadline = tokio::time::Instant::now() + timeout;
    let mut quiet = 0;
    loop {
        tokio::select! {
            r = &mut run => return joined(r),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        quiet = if idle(&store, &queues).await? {
            quiet + 1
        } else {
            0
        };
        if quiet >= 2 {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            stop.cancel();
            let _ = run.await;
            panic!("queues {queues:?} not idle within {timeout:?}");
        }
    }
    stop.cancel();
    joined(run.await)
}

fn joined(r: Result<Result<(), Error>, tokio::task::JoinError>) -> Result<(), Error> {
    match r {
        Ok(r) => r,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Whether none of `queues` has a task running or due now.
async fn idle(store: &Store, queues: &[String]) -> Result<bool, Error> {
    let now = store.now().await?;
    for q in queues {
        let running = tasks(store, Some(q), TaskState::Running).await?;
        let pending = tasks(store, Some(q), TaskState::Pending).await?;
        if !running.is_empty() || pending.iter().any(|t| t.run_at <= now) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Every task in `state` (of `queue`, or of every queue), oldest first.
async fn tasks(
    store: &Store,
    queue: Option<&str>,
    state: TaskState,
) -> Result<Vec<TaskInfo>, Error> {
    let mut out = Queue::new(store.clone())
        .tasks_all(&TaskFilter {
            queue: queue.map(str::to_string),
            state: Some(state),
            ..TaskFilter::default()
        })
        .await?;
    out.reverse();
    Ok(out)
}

/// The pending tasks of `kind` (any queue), oldest first, with their
/// queue, due time, unique key and attempts.
pub async fn enqueued_tasks(store: &Store, kind: &str) -> Result<Vec<TaskInfo>, Error> {
    let mut all = tasks(store, None, TaskState::Pending).await?;
    all.retain(|t| t.kind == kind);
    Ok(all)
}

/// The pending tasks of `A::KIND`, decoded as `A`, oldest first (River's
/// `RequireManyInserted`).
pub async fn enqueued<A: TaskArgs>(store: &Store) -> Result<Vec<A>, Error> {
    enqueued_tasks(store, A::KIND)
        .await?
        .into_iter()
        .map(|t| decode::<A>(&t))
        .collect()
}

fn decode<A: TaskArgs>(t: &TaskInfo) -> Result<A, Error> {
    serde_json::from_value(t.payload.clone()).map_err(|e| {
        Error::Invalid(crate::InvalidInput::new(
            "payload",
            format!(
                "task {} of kind {:?} does not decode as {}: {e}",
                t.id,
                A::KIND,
                std::any::type_name::<A>()
            ),
        ))
    })
}

/// The oldest pending task of `A::KIND`, decoded (Oban's
/// `assert_enqueued`, River's `RequireInserted`).
///
/// # Panics
///
/// When there is none (naming the kinds that are pending), or it does not
/// decode, or the store fails.
pub async fn assert_enqueued<A: TaskArgs>(store: &Store) -> A {
    assert_enqueued_where::<A>(store, |_| true).await
}

/// The oldest pending task of `A::KIND` whose arguments satisfy `pred`.
///
/// # Panics
///
/// As [`assert_enqueued`].
pub async fn assert_enqueued_where<A: TaskArgs>(store: &Store, pred: impl Fn(&A) -> bool) -> A {
    let found = match enqueued::<A>(store).await {
        Ok(found) => found,
        Err(e) => panic!("assert_enqueued::<{}>: {e}", std::any::type_name::<A>()),
    };
    if let Some(a) = found.into_iter().find(|a| pred(a)) {
        return a;
    }
    let pending = tasks(store, None, TaskState::Pending)
        .await
        .map(|ts| ts.into_iter().map(|t| t.kind).collect::<Vec<_>>())
        .unwrap_or_default();
    panic!(
        "no pending task of kind {:?} matches (pending kinds: {pending:?})",
        A::KIND
    );
}

/// That no task of `A::KIND` is pending (Oban's `refute_enqueued`).
///
/// # Panics
///
/// When one is (or the store fails).
pub async fn assert_not_enqueued<A: TaskArgs>(store: &Store) {
    match enqueued_tasks(store, A::KIND).await {
        Ok(found) if found.is_empty() => {}
        Ok(found) => panic!(
            "{} pending task(s) of kind {:?}: {:?}",
            found.len(),
            A::KIND,
            found.iter().map(|t| &t.payload).collect::<Vec<_>>()
        ),
        Err(e) => panic!("assert_not_enqueued::<{}>: {e}", std::any::type_name::<A>()),
    }
}
