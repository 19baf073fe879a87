//! Typed tasks: a payload type that names its kind ([`TaskArgs`], like
//! River's `JobArgs`), enqueued with [`Queue::insert`] and handled with
//! [`Worker::register`], which decodes the payload before the handler runs.
//!
//! The typed API sits on top of the untyped one: a typed task is stored as
//! its kind and its payload serialized to JSON, so typed and untyped
//! producers and consumers can share a queue.
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton::Error> {
//! use baton::queue::{Queue, TaskArgs, TaskError, Worker, WorkerConfig};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct SendEmail {
//!     to: String,
//! }
//!
//! impl TaskArgs for SendEmail {
//!     const KIND: &'static str = "send_email";
//! }
//!
//! let store = baton::Store::connect("sqlite://baton.db").await?;
//! Queue::new(store.clone()).insert(&SendEmail { to: "ada@example.com".into() }).await?;
//!
//! let mut worker = Worker::new(store, WorkerConfig::default().queue("default", 4))?;
//! worker.register(|_ctx, email: SendEmail| async move {
//!     println!("mail to {}", email.to);
//!     Ok::<_, TaskError>(())
//! });
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{Backoff, Queue, TaskBuilder, TaskContext, TaskError, UniqueOpts, Worker};
use crate::error::{Error, InvalidInput};
use crate::store::Enqueued;

/// A task's payload type, naming its kind: the arguments of one kind of
/// task. Serialized to JSON on insert, decoded before the handler runs.
///
/// ```
/// use baton::queue::{InsertOpts, TaskArgs};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Resize { image: u64, width: u32 }
///
/// impl TaskArgs for Resize {
///     const KIND: &'static str = "resize";
///     // Optional: where and how this kind goes by default.
///     fn insert_opts() -> InsertOpts {
///         InsertOpts { queue: Some("images".into()), max_attempts: Some(5), ..InsertOpts::default() }
///     }
/// }
///
/// let b = baton::queue::TaskBuilder::from_args(&Resize { image: 7, width: 640 }).unwrap();
/// let t = b.build().unwrap();
/// assert_eq!((t.kind.as_str(), t.queue.as_str(), t.max_attempts), ("resize", "images", 5));
/// assert_eq!(t.payload["width"], 640);
/// ```
pub trait TaskArgs: Serialize + DeserializeOwned + Send + 'static {
    /// The kind the tasks are stored and routed under (1 to 255 bytes of
    /// printable text; unique among the kinds a worker handles).
    const KIND: &'static str;

    /// Default insert options for this kind; each field left `None` keeps
    /// the queue's default ([`TaskBuilder::new`]'s). Calls on the
    /// [`TaskBuilder`] after [`TaskBuilder::from_args`] override them.
    fn insert_opts() -> InsertOpts {
        InsertOpts::default()
    }

    /// This kind's retry schedule (Oban's `backoff/1`), which
    /// [`Worker::register`] sets for the kind
    /// ([`Worker::backoff_for`]); `None` (the default): the worker's
    /// ([`WorkerConfig::backoff`](super::WorkerConfig::backoff)). A handler
    /// that knows better for one failure returns
    /// [`TaskError::retry_in`].
    fn backoff() -> Option<Backoff> {
        None
    }

    /// The concurrency key of this task, taken from its arguments (e.g.
    /// `Some(format!("customer:{}", self.customer))`); `None` (the
    /// default) uses [`InsertOpts::concurrency_key`]. See
    /// [`TaskBuilder::concurrency_key`].
    fn concurrency_key(&self) -> Option<String> {
        None
    }

    /// The unique key of this task, taken from its arguments (e.g.
    /// `Some(format!("order-{}", self.order))`); `None` (the default): no
    /// key of its own (a kind whose [`InsertOpts::unique`] asks for
    /// `by_args` or a `period` still gets one). Its scope, args, period
    /// and hold are the kind's [`InsertOpts::unique`] (default: the same
    /// kind in the same queue, while unfinished). See
    /// [`TaskBuilder::unique_key`].
    ///
    /// ```
    /// use baton::queue::{InsertOpts, TaskArgs, TaskBuilder, UniqueKey, UniqueOpts, UniqueScope};
    /// use serde::{Deserialize, Serialize};
    /// use std::time::Duration;
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Digest { user: u64 }
    ///
    /// impl TaskArgs for Digest {
    ///     const KIND: &'static str = "digest";
    ///     // One digest per user per day, whichever queue it goes to.
    ///     fn unique_key(&self) -> Option<String> {
    ///         Some(format!("user-{}", self.user))
    ///     }
    ///     fn insert_opts() -> InsertOpts {
    ///         InsertOpts {
    ///             unique: Some(UniqueOpts {
    ///                 scope: UniqueScope::Kind,
    ///                 period: Some(Duration::from_secs(86_400)),
    ///                 ..UniqueOpts::default()
    ///             }),
    ///             ..InsertOpts::default()
    ///         }
    ///     }
    /// }
    ///
    /// let t = TaskBuilder::from_args(&Digest { user: 7 }).unwrap().build().unwrap();
    /// let k = UniqueKey::parse(t.unique_key.as_deref().unwrap());
    /// assert_eq!((k.scope, k.key.as_deref()), (UniqueScope::Kind, Some("user-7")));
    /// assert!(k.period.is_some());
    /// ```
    fn unique_key(&self) -> Option<String> {
        None
    }
}

/// Default insert options of a [`TaskArgs`] kind (see
/// [`TaskArgs::insert_opts`]); `None` keeps the general default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InsertOpts {
    /// The queue (default [`DEFAULT_QUEUE`](super::DEFAULT_QUEUE)).
    pub queue: Option<String>,
    /// Priority in -100..=100; lower runs first (default 0).
    pub priority: Option<i32>,
    /// Attempts allowed in total (default
    /// [`DEFAULT_MAX_ATTEMPTS`](super::DEFAULT_MAX_ATTEMPTS)).
    pub max_attempts: Option<u32>,
    /// Handler timeout per attempt (default none).
    pub timeout: Option<Duration>,
    /// A concurrency key shared by every task of the kind (default none;
    /// a key taken from the arguments is [`TaskArgs::concurrency_key`]'s,
    /// which wins over this one). See [`TaskBuilder::concurrency_key`].
    pub concurrency_key: Option<String>,
    /// How this kind's unique keys are scoped, derived and held (default
    /// none: [`UniqueOpts::default`], the same kind in the same queue,
    /// while unfinished). The key itself comes from
    /// [`TaskArgs::unique_key`] or [`TaskBuilder::unique_key`]; with
    /// `by_args` or a `period` every task of the kind has one.
    pub unique: Option<UniqueOpts>,
    /// Debounce or throttle on this kind's unique key (default none; see
    /// [`TaskBuilder::debounce`] and [`TaskBuilder::throttle`]): e.g.
    /// `Some(KeyPolicy::Debounce(5 s))` runs a kind keyed by its document
    /// once, 5 s after the document's last change.
    pub key_policy: Option<crate::store::KeyPolicy>,
}

/// `args` as a task payload; [`InvalidInput`] (field `payload`) when it
/// does not serialize to JSON.
pub(crate) fn payload_of<A: TaskArgs>(args: &A) -> Result<serde_json::Value, InvalidInput> {
    serde_json::to_value(args).map_err(|e| {
        InvalidInput::new(
            "payload",
            format!("task kind {:?}: does not serialize to JSON: {e}", A::KIND),
        )
    })
}

impl TaskBuilder {
    /// A task of kind `A::KIND` whose payload is `args` as JSON, with `A`'s
    /// [`insert_opts`](TaskArgs::insert_opts) applied. Fails with
    /// [`InvalidInput`] (field `payload`) when `args` does not serialize to
    /// JSON (e.g. a map with non-string keys).
    pub fn from_args<A: TaskArgs>(args: &A) -> Result<TaskBuilder, InvalidInput> {
        let payload = payload_of(args)?;
        let opts = A::insert_opts();
        let mut b = TaskBuilder::new(A::KIND, payload);
        if let Some(q) = opts.queue {
            b = b.queue(q);
        }
        if let Some(p) = opts.priority {
            b = b.priority(p);
        }
        if let Some(n) = opts.max_attempts {
            b = b.max_attempts(n);
        }
        if let Some(t) = opts.timeout {
            b = b.timeout(t);
        }
        if let Some(k) = args.concurrency_key().or(opts.concurrency_key) {
            b = b.concurrency_key(k);
        }
        if let Some(u) = opts.unique {
            b = b.unique(u);
        }
        if let Some(k) = args.unique_key() {
            b = b.unique_key(k);
        }
        match opts.key_policy {
            Some(crate::store::KeyPolicy::Debounce(d)) => b = b.debounce(d),
            Some(crate::store::KeyPolicy::Throttle(p)) => b = b.throttle(p),
            None => {}
        }
        Ok(b)
    }
}

impl Queue {
    /// Enqueue one typed task with its kind's default options. For a unique
    /// key, a delay or other options, build it with
    /// [`TaskBuilder::from_args`] and [`Queue::enqueue`] it.
    pub async fn insert<A: TaskArgs>(&self, args: &A) -> Result<Enqueued, Error> {
        self.enqueue(TaskBuilder::from_args(args)?).await
    }
}

impl TaskContext {
    /// The payload decoded as `A`. A payload that does not decode gives a
    /// permanent [`TaskError`] naming the kind and serde's error (what
    /// [`Worker::register`] fails the task with).
    pub fn args<A: TaskArgs>(&self) -> Result<A, TaskError> {
        serde_json::from_value(self.task().payload.clone()).map_err(|e| {
            TaskError::permanent(format!(
                "task kind {:?}: payload does not decode as {}: {e}",
                A::KIND,
                std::any::type_name::<A>()
            ))
        })
    }
}

impl Worker {
    /// Handle tasks of kind `A::KIND` with an async function of the
    /// context and the decoded payload. A payload that does not decode as
    /// `A` fails the task at once, without retries, with a message naming
    /// the kind and serde's error; the handler does not run. The kind's
    /// [`TaskArgs::backoff`], if any, becomes its retry schedule.
    ///
    /// ```no_run
    /// # fn demo(worker: &mut baton::queue::Worker) {
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize)] struct Resize { image: u64 }
    /// # impl baton::queue::TaskArgs for Resize { const KIND: &'static str = "resize"; }
    /// worker.register(|ctx, args: Resize| async move {
    ///     println!("resizing {} (attempt {})", args.image, ctx.task().attempt);
    ///     Ok::<_, baton::queue::TaskError>(())
    /// });
    /// # }
    /// ```
    pub fn register<A, F, Fut>(&mut self, f: F) -> &mut Self
    where
        A: TaskArgs,
        F: Fn(TaskContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), TaskError>> + Send + 'static,
    {
        if let Some(b) = A::backoff() {
            self.backoff_for(A::KIND, b);
        }
        let f = std::sync::Arc::new(f);
        self.handle(A::KIND, move |ctx| {
            let f = f.clone();
            async move {
                let args = ctx.args::<A>()?;
                f(ctx, args).await
            }
        })
    }
}
