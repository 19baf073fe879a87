//! baton makes scheduled and background work safe when a service runs as
//! many instances.
//!
//! - [`lock`]: lease locks with `at_most` / `at_least`, fencing tokens and a
//!   keep-alive that cancels the work when the lease is lost.
//! - [`queue`]: a durable task queue with leases, heartbeats, rescue,
//!   retries, unique keys and deploy-safe shutdown.
//! - [`schedule`]: cron and interval jobs that run once per slot across any
//!   number of instances, with no leader.
//!
//! All three stand on one seam, [`store::Backend`], implemented for SQLite
//! (embedded, the default), PostgreSQL, MySQL/MariaDB and Redis. The store
//! is the arbiter of time and truth.
//!
//! ```no_run
//! use baton::queue::{Queue, TaskArgs, TaskError, Worker, WorkerConfig};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct SendEmail { to: String }
//! impl TaskArgs for SendEmail { const KIND: &'static str = "send_email"; }
//!
//! # async fn demo() -> Result<(), baton::Error> {
//! let store = baton::Store::connect("sqlite://app.db").await?;
//! Queue::new(store.clone()).insert(&SendEmail { to: "ada@example.com".into() }).await?;
//! let mut worker = Worker::new(store, WorkerConfig::new().queue("default", 4))?;
//! worker.register(|_ctx, m: SendEmail| async move {
//!     println!("mail to {}", m.to);
//!     Ok::<_, TaskError>(())
//! });
//! worker.run(tokio_util::sync::CancellationToken::new()).await?;
//! # Ok(()) }
//! ```
//!
//! # Cargo features
//!
//! - `sqlite`, `postgres`, `mysql`, `redis`: one per backend, each bringing
//!   in only its own driver (the module `store::<backend>` and its URL
//!   schemes). [`Store::connect`] refuses the URL of a backend left out,
//!   naming its feature.
//! - `tls`: TLS with rustls on ring for the drivers of the backends that
//!   are on (PostgreSQL's `sslmode=`, Redis's `rediss://`).
//!
//! The default is all of them.
#![warn(missing_docs)]

#[cfg(not(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
)))]
compile_error!(
    "baton needs at least one backend: enable the cargo feature `sqlite`, `postgres`, `mysql` or `redis`"
);

pub mod audit;
pub mod clock;
pub mod duration;
pub mod error;
mod fast_hash;
pub mod lease;
pub mod lock;
#[cfg(feature = "prometheus")]
pub mod metrics;
pub mod names;
pub mod node;
pub mod queue;
pub mod schedule;
pub mod stats;
pub mod store;
pub mod testing;
mod timestamp;

/// The names most programs use, in one import: `use baton::prelude::*;`.
///
/// ```
/// use baton::prelude::*;
/// fn handler_result(ok: bool) -> TaskResult {
///     if ok { Ok(()) } else { Err(TaskError::retry("not yet")) }
/// }
/// assert!(handler_result(true).is_ok());
/// ```
pub mod prelude {
    pub use crate::error::{Error, InvalidInput, StoreError};
    pub use crate::lock::{LockOptions, Locker};
    pub use crate::queue::{
        Backoff, InsertOpts, Next, Queue, StopReason, TaskAction, TaskArgs, TaskBuilder,
        TaskContext, TaskError, TaskResult, Worker, WorkerConfig, WorkerEvent,
    };
    pub use crate::schedule::{Job, Misfire, Schedule, Scheduler};
    pub use crate::store::{Store, StoreOptions, TaskState};
}

pub use duration::{format_duration, parse_duration, parse_positive_duration};
pub use error::{Error, InvalidInput, Result, StoreError};
pub use queue::{TaskError, TaskResult};
pub use store::{FencingToken, Store, StoreOptions, DEFAULT_STORE_URL};
pub use timestamp::format_time;

/// The `sqlx` baton is built with (for [`queue::Queue::enqueue_in`] on the
/// application's own transaction, without a `sqlx` dependency that must
/// match baton's).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use sqlx;

/// The README's Rust examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
