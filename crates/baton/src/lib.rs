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
//! (embedded, the default), PostgreSQL and Redis. The store is the arbiter
//! of time and truth.
#![warn(missing_docs)]

pub mod clock;
pub mod duration;
pub mod error;
pub mod lock;
pub mod queue;
pub mod schedule;
pub mod store;

pub use duration::{format_duration, parse_duration, parse_positive_duration};
pub use error::{Error, InvalidInput, Result, StoreError};
pub use store::{FencingToken, Store, StoreOptions, DEFAULT_STORE_URL};

/// The README's Rust examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
