//! Lease locks: one holder per name at a time, fenced, kept alive while the
//! work runs, and lost loudly.
//!
//! A [`Locker`] grants [`Lease`]s on names. A lease lapses by itself
//! `at_most` after it was granted or last extended (so a dead holder frees
//! the name), and [`Lease::release`] keeps it until `granted_at + at_least`
//! (ShedLock's `lockAtLeastFor`) so a fast job on one instance is not re-run
//! by another whose timer fires a moment later. Every grant carries a
//! [`FencingToken`] greater than all earlier ones for that name.
//!
//! By default a lease keeps itself alive: it extends every `at_most / 3`
//! (more often with [`LockOptions::renew_margin`]).
//! When an extension is refused, or the store cannot be reached before the
//! lease would lapse, the lease is *lost*: [`LeaseHandle::lost`] resolves, and
//! [`Locker::run`] drops (cancels) the work. Logging the failure while the
//! work goes on is how two holders end up running at once; baton stops the
//! work instead.
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton::Error> {
//! use std::time::Duration;
//! use baton::lock::{LockOptions, Locker};
//!
//! let store = baton::Store::connect("sqlite://baton.db").await?;
//! let locker = Locker::new(store);
//! let opts = LockOptions::new(Duration::from_secs(15 * 60))
//!     .at_least(Duration::from_secs(30));
//! // Run only if no other instance holds "daemon-runner"; skip otherwise.
//! let ran = locker
//!     .run("daemon-runner", &opts, |lease| async move {
//!         println!("running with fencing token {}", lease.token());
//!     })
//!     .await?;
//! if ran.is_none() {
//!     println!("another instance holds the lock; skipped");
//! }
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, InvalidInput};
use crate::lease::stop_margin;
use crate::names::validate_name;
use crate::node::{node_id, short_id};
use crate::store::{Acquire, FencingToken, LockAcquire, LockInfo, Store};

mod inspect;
mod keep_alive;
mod lease;
mod options;

use keep_alive::*;
use lease::{Bounds, Shared};
pub use lease::{Lease, LeaseHandle, StopBy};
pub use options::LockOptions;

/// How soon an operator's force-release ([`crate::store::Backend::lock_revoke`],
/// `POST /api/v1/locks/{name}/release`) frees a lock at the latest: the
/// revoked lease ends at `min(lock_until, now + RELEASE_BOUND)`. A holder
/// kept alive sees it within 5 s (an extension, or between extensions a
/// confirmation every [`LockOptions::confirm_period`]) and stops its work,
/// and bounds its lease locally by the last confirmation's send time +
/// this bound too ([`LeaseHandle::deadline`]), so even a holder that
/// cannot reach the store (or is frozen, under `baton lock`'s supervisor)
/// stops before a revoked lease could be granted again. The price: a lease
/// longer than this bound tolerates a store outage of about this bound
/// (less the work's stop time), not of `at_most`.
pub const RELEASE_BOUND: Duration = Duration::from_secs(30);

/// Grants leases on lock names from one store.
#[derive(Debug, Clone)]
pub struct Locker {
    store: Store,
    node: Arc<str>,
}

impl Locker {
    /// A locker whose holders are named `host:pid:<unique id>`.
    pub fn new(store: Store) -> Locker {
        Locker {
            store,
            node: node_id().into(),
        }
    }

    /// The store it locks in.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Take the lease if the name is free; `Ok(None)` when someone else
    /// holds it (skip).
    pub async fn try_lock(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>, Error> {
        match self.attempt(name, opts).await? {
            Ok(lease) => Ok(Some(lease)),
            Err(_) => Ok(None),
        }
    }

    /// Take the lease, waiting up to `wait` for the holder to release it or
    /// for its lease to lapse. After the wait, [`Error::Busy`] says who holds
    /// it and until when. Store errors during the wait are retried until the
    /// wait runs out.
    pub async fn lock(
        &self,
        name: &str,
        opts: &LockOptions,
        wait: Duration,
    ) -> Result<Lease, Error> {
        let deadline = Instant::now() + wait;
        let mut backoff = Duration::from_millis(10);
        loop {
            let busy = match self.attempt(name, opts).await {
                Ok(Ok(lease)) => return Ok(lease),
                Ok(Err(info)) => Some(info),
                Err(Error::Store(e)) if e.is_retryable() && Instant::now() < deadline => {
                    crate::store::warn_unless_read_only!(e, lock = name, error = %crate::error::chain(&e), "store unavailable while waiting for lock; retrying");
                    None
                }
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(match busy {
                    Some(info) => busy_error(info),
                    None => Error::Store(crate::StoreError::Unavailable(format!(
                        "the wait for lock {name:?} ran out while the store was unreachable"
                    ))),
                });
            }
            // Sleep until the lease would lapse (store-relative), but poll
            // often enough to notice an early release.
            let until_free = busy
                .as_ref()
                .map(|i| (i.lock_until - i.now).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(backoff);
            let jitter = Duration::from_millis(fastrand::u64(0..=backoff.as_millis() as u64 / 2));
            let nap = until_free.min(backoff).max(Duration::from_millis(1)) + jitter;
            tokio::time::sleep(nap.min(deadline - now)).await;
            backoff = (backoff * 2).min(Duration::from_millis(250));
        }
    }

    /// Run `work` under the lock, skipping it (`Ok(None)`) when the lock is
    /// busy. The lease is passed in; if it is lost while `work` runs, `work`
    /// is dropped at its next await point and [`Error::LeaseLost`] returned.
    /// Afterwards the lease is released (honouring `at_least`).
    ///
    /// Both answers matter: `None` says the work did not run here, and a
    /// `T` that is a `Result` holds the work's own error.
    ///
    /// ```no_run
    /// # async fn scan(_token: baton::FencingToken) -> Result<(), std::io::Error> { Ok(()) }
    /// # async fn demo(store: baton::Store) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use baton::lock::{LockOptions, Locker};
    /// let opts = LockOptions::new(Duration::from_secs(900));
    /// match Locker::new(store).run("daemon-runner", &opts, |lease| scan(lease.token())).await? {
    ///     Some(result) => result?,                        // ran here: its own error, if any
    ///     None => println!("another instance runs it"),   // busy: skipped
    /// }
    /// # Ok(()) }
    /// ```
    #[must_use = "None means the work did not run, and the work's own result is inside"]
    pub async fn run<F, Fut, T>(
        &self,
        name: &str,
        opts: &LockOptions,
        work: F,
    ) -> Result<Option<T>, Error>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let Some(lease) = self.try_lock(name, opts).await? else {
            return Ok(None);
        };
        lease.run(work).await.map(Some)
    }

    async fn attempt(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Result<Lease, LockInfo>, Error> {
        validate_name("lock name", name)?;
        opts.validate()?;
        let holder = format!("{}:{}", self.node, short_id());
        let sent = Instant::now();
        let answer = self
            .store
            .backend()
            .lock_acquire(&LockAcquire {
                name,
                holder: &holder,
                at_most: opts.at_most,
            })
            .await?;
        match answer {
            Acquire::Granted {
                token,
                locked_at,
                lock_until,
            } => {
                tracing::debug!(lock = name, %token, %holder, "lock acquired");
                Ok(Ok(Lease::start(
                    self.store.clone(),
                    LeaseHandle {
                        shared: Arc::new(Shared {
                            name: name.to_string(),
                            holder,
                            token,
                            locked_at,
                            lock_until: Mutex::new(lock_until),
                            deadline: tokio::sync::watch::Sender::new(
                                Bounds::new(sent, opts).effective(),
                            ),
                            bounds: Mutex::new(Bounds::new(sent, opts)),
                            at_most: opts.at_most,
                            lost: CancellationToken::new(),
                            keep_alive: opts.keep_alive,
                            margin: stop_margin(opts.at_most),
                        }),
                    },
                    *opts,
                )))
            }
            Acquire::Busy(info) => Ok(Err(info)),
        }
    }
}

fn busy_error(info: LockInfo) -> Error {
    Error::Busy {
        name: info.name,
        holder: info.holder,
        until: info.lock_until,
        token: info.token.0,
    }
}
