//! Hooks: code of the application's that runs at every enqueue
//! ([`InsertMiddleware`], on a [`Queue`](super::Queue)) and around every
//! attempt ([`AttemptMiddleware`], on a [`Worker`](super::Worker)), and the
//! lifecycle events a worker publishes ([`WorkerEvent`],
//! [`Worker::subscribe`](super::Worker::subscribe)).
//!
//! Why small traits and not `tower` layers: an attempt is one call with
//! one owned context and one result, never back-pressured (`poll_ready`
//! has nothing to say: the worker's slots already bound it), and a
//! middleware must be object-safe to be stored per worker; a trait of one
//! method, implemented for closures, says that with no dependency. A tower
//! `Service` can still be called from inside one.
//!
//! ```no_run
//! # fn demo(store: baton::Store, worker: &mut baton::queue::Worker) {
//! use std::time::Instant;
//! use baton::queue::{Next, Queue, TaskContext};
//!
//! // Every task this queue client enqueues runs at priority 10 or better.
//! let queue = Queue::new(store).with_insert_middleware(|task: &mut baton::store::NewTask| {
//!     task.priority = task.priority.min(10);
//!     Ok(())
//! });
//!
//! // Time every attempt (middleware run outermost first, in the order added).
//! worker.around(|ctx: TaskContext, next: Next| async move {
//!     let started = Instant::now();
//!     let result = next.run(ctx.clone()).await;
//!     tracing::info!(task = ctx.task().id, took_ms = started.elapsed().as_millis() as u64, ok = result.is_ok());
//!     result
//! });
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::counters::Outcome;
use super::worker::{TaskContext, TaskError};
use crate::error::InvalidInput;
use crate::store::{NewTask, Task};

/// A boxed attempt future (what [`Next::run`] returns).
pub type AttemptFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;

/// The handler as a middleware sees it.
pub(crate) type HandlerFn = Arc<dyn Fn(TaskContext) -> AttemptFuture + Send + Sync>;

/// Runs at every enqueue through a [`Queue`](super::Queue) (`enqueue`,
/// `enqueue_many`, `insert`, the outbox calls), after the task is built
/// and before it is written: to set defaults, add to the payload, or
/// refuse a task. The task is validated again afterwards, so a hook
/// cannot write a task [`TaskBuilder::build`](super::TaskBuilder::build)
/// would refuse. An error refuses the whole call; nothing is written.
/// Scheduled slots are enqueued by the scheduler in the store's own
/// transaction and do not pass through it. The task's `unique_key` is the
/// stored form, scope and all ([`UniqueKey`](super::UniqueKey)); a key a
/// hook sets without that composite is compared as given, store-wide.
pub trait InsertMiddleware: Send + Sync + 'static {
    /// Inspect or change `task` before it is written.
    fn before_insert(&self, task: &mut NewTask) -> Result<(), InvalidInput>;
}

impl<F> InsertMiddleware for F
where
    F: Fn(&mut NewTask) -> Result<(), InvalidInput> + Send + Sync + 'static,
{
    fn before_insert(&self, task: &mut NewTask) -> Result<(), InvalidInput> {
        self(task)
    }
}

/// Runs around every attempt a [`Worker`](super::Worker) makes (River's
/// worker middleware): call [`Next::run`] to run the rest of the chain
/// and the handler, or return without it to skip the handler. Runs inside
/// the attempt's `task` span, under its timeout and stop, and a panic in
/// it fails the attempt as a handler's panic does.
pub trait AttemptMiddleware: Send + Sync + 'static {
    /// Run the attempt of `ctx`'s task, usually through `next`.
    fn around(&self, ctx: TaskContext, next: Next) -> AttemptFuture;
}

impl<F, Fut> AttemptMiddleware for F
where
    F: Fn(TaskContext, Next) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), TaskError>> + Send + 'static,
{
    fn around(&self, ctx: TaskContext, next: Next) -> AttemptFuture {
        Box::pin(self(ctx, next))
    }
}

/// The rest of an attempt's chain: the middleware after this one, then
/// the handler.
pub struct Next {
    chain: Arc<[Arc<dyn AttemptMiddleware>]>,
    at: usize,
    handler: HandlerFn,
}

impl std::fmt::Debug for Next {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Next")
            .field("middleware_left", &(self.chain.len() - self.at))
            .finish_non_exhaustive()
    }
}

impl Next {
    /// Run the rest of the chain and the handler on `ctx`.
    pub fn run(self, ctx: TaskContext) -> AttemptFuture {
        match self.chain.get(self.at).cloned() {
            Some(m) => m.around(
                ctx,
                Next {
                    chain: self.chain,
                    at: self.at + 1,
                    handler: self.handler,
                },
            ),
            None => (self.handler)(ctx),
        }
    }
}

/// `handler` behind `chain` (outermost first); the handler itself when
/// there is no middleware.
pub(crate) fn wrap(handler: HandlerFn, chain: &Arc<[Arc<dyn AttemptMiddleware>]>) -> HandlerFn {
    if chain.is_empty() {
        return handler;
    }
    let chain = chain.clone();
    Arc::new(move |ctx| {
        Next {
            chain: chain.clone(),
            at: 0,
            handler: handler.clone(),
        }
        .run(ctx)
    })
}

/// What a worker did, published to its subscribers
/// ([`Worker::subscribe`](super::Worker::subscribe)) as it happens: for
/// the application's own metrics, audit or tests. A subscriber that falls
/// more than 1,024 events behind loses the oldest (its receiver says how
/// many, `RecvError::Lagged`); the worker never waits for one.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum WorkerEvent {
    /// An attempt's handler is about to run.
    AttemptStarted {
        /// The task as claimed (its `attempt` is this one).
        task: Arc<Task>,
    },
    /// An attempt ended and its outcome was written (or its lease lost).
    AttemptEnded {
        /// The task as claimed.
        task: Arc<Task>,
        /// How it ended.
        outcome: Outcome,
        /// From the handler's start to the outcome's write.
        duration: Duration,
        /// The failure's message, for a failed attempt.
        error: Option<String>,
    },
    /// The worker stopped claiming (shutdown began).
    Stopping,
}

/// How many events a lagging subscriber may fall behind.
pub(crate) const EVENT_BUFFER: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn handler(log: Arc<Mutex<Vec<String>>>) -> HandlerFn {
        Arc::new(move |_ctx| {
            let log = log.clone();
            Box::pin(async move {
                log.lock().unwrap().push("handler".into());
                Ok(())
            })
        })
    }

    fn named(name: &'static str, log: Arc<Mutex<Vec<String>>>) -> Arc<dyn AttemptMiddleware> {
        Arc::new(move |ctx: TaskContext, next: Next| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(format!("{name} in"));
                let r = next.run(ctx).await;
                log.lock().unwrap().push(format!("{name} out"));
                r
            }
        })
    }

    #[tokio::test]
    async fn middleware_run_outermost_first_around_the_handler() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let chain: Arc<[Arc<dyn AttemptMiddleware>]> =
            vec![named("a", log.clone()), named("b", log.clone())].into();
        let run = wrap(handler(log.clone()), &chain);
        run(TaskContext::for_test(
            crate::testing::task_of(crate::queue::TaskBuilder::new("k", serde_json::json!({})))
                .unwrap(),
        ))
        .await
        .unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            ["a in", "b in", "handler", "b out", "a out"]
        );
    }

    #[tokio::test]
    async fn a_middleware_that_does_not_call_next_skips_the_handler() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let refuse: Arc<dyn AttemptMiddleware> = Arc::new(|_ctx: TaskContext, _next: Next| async {
            Err(TaskError::cancel("refused by middleware"))
        });
        let chain: Arc<[Arc<dyn AttemptMiddleware>]> = vec![refuse].into();
        let run = wrap(handler(log.clone()), &chain);
        let e = run(TaskContext::for_test(
            crate::testing::task_of(crate::queue::TaskBuilder::new("k", serde_json::json!({})))
                .unwrap(),
        ))
        .await
        .unwrap_err();
        assert_eq!(e.message(), "refused by middleware");
        assert!(log.lock().unwrap().is_empty());
    }

    /// On a real (in-memory SQLite) store: insert middleware change what
    /// is written, are validated again, and refuse a call whole; attempt
    /// middleware wrap every attempt of a running worker, whose events
    /// report each start and end.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn hooks_on_a_running_worker_and_queue() {
        use crate::queue::{Queue, TaskBuilder, Worker, WorkerConfig};
        let store = crate::testing::memory_store().await.unwrap();
        let queue = Queue::new(store.clone())
            .with_insert_middleware(|t: &mut NewTask| {
                t.payload["tagged"] = serde_json::json!(true);
                Ok(())
            })
            .with_insert_middleware(|t: &mut NewTask| {
                if t.kind == "forbidden" {
                    return Err(InvalidInput::new("kind", "forbidden here"));
                }
                if t.kind == "loud" {
                    t.priority = 1000; // out of range: the re-validation refuses it
                }
                Ok(())
            });
        let a = queue
            .enqueue(TaskBuilder::new("ok", serde_json::json!({"n": 1})))
            .await
            .unwrap();
        let info = queue.task(a.id).await.unwrap().unwrap();
        assert_eq!(info.payload["tagged"], true, "{:?}", info.payload);
        let e = queue
            .enqueue_many(vec![
                TaskBuilder::new("ok", serde_json::json!({})),
                TaskBuilder::new("forbidden", serde_json::json!({})),
            ])
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("task 1: kind: forbidden here"),
            "{e}"
        );
        let e = queue
            .enqueue(TaskBuilder::new("loud", serde_json::json!({})))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("priority"), "{e}");
        // Nothing of the refused calls was written.
        let all = crate::testing::enqueued_tasks(&store, "ok").await.unwrap();
        assert_eq!(all.len(), 1);

        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut worker =
            Worker::new(store.clone(), WorkerConfig::default().queue("default", 1)).unwrap();
        worker.handle("ok", |_ctx| async { Ok(()) });
        let s = seen.clone();
        worker.around(move |ctx: TaskContext, next: Next| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push(ctx.task().id);
                next.run(ctx).await
            }
        });
        let mut events = worker.subscribe();
        crate::testing::run_until_idle(worker, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(*seen.lock().unwrap(), [a.id]);
        let mut got = Vec::new();
        while let Ok(e) = events.try_recv() {
            got.push(match e {
                WorkerEvent::AttemptStarted { task } => format!("started {}", task.id),
                WorkerEvent::AttemptEnded { task, outcome, .. } => {
                    format!("ended {} {}", task.id, outcome.as_str())
                }
                WorkerEvent::Stopping => "stopping".into(),
            });
        }
        assert_eq!(
            got,
            [
                format!("started {}", a.id),
                format!("ended {} succeeded", a.id),
                "stopping".into()
            ]
        );
    }
}
