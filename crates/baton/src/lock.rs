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
//! let opts = LockOptions::new(Duration::from_secs(15 * 60))?
//!     .at_least(Duration::from_secs(30))?;
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
use crate::store::{Acquire, FencingToken, LockInfo, LockRequest, Store};

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

/// The longest accepted lock name, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// Check a name (lock, queue, job): 1 to 255 bytes, no control characters.
/// `what` names the field in the error.
pub fn validate_name(what: &str, name: &str) -> Result<(), InvalidInput> {
    if name.is_empty() {
        return Err(InvalidInput::new(
            what,
            "is empty; give 1 to 255 bytes of text",
        ));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(InvalidInput::new(
            what,
            format!(
                "is {} bytes long; at most {MAX_NAME_LEN} bytes are accepted",
                name.len()
            ),
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(InvalidInput::new(
            what,
            format!("contains the control character {c:?}; use printable text"),
        ));
    }
    Ok(())
}

/// How long a lease lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockOptions {
    at_most: Duration,
    at_least: Duration,
    keep_alive: bool,
    margin: Duration,
}

impl LockOptions {
    /// A lease that lapses `at_most` after its grant or last extension.
    /// `at_most` must be at least 1 ms. Keep-alive is on, `at_least` is 0.
    pub fn new(at_most: Duration) -> Result<LockOptions, InvalidInput> {
        if at_most < Duration::from_millis(1) {
            return Err(InvalidInput::new(
                "at_most",
                "must be greater than 0 (e.g. 30s, 15m, PT15M)",
            ));
        }
        Ok(LockOptions {
            at_most,
            at_least: Duration::ZERO,
            keep_alive: true,
            margin: Duration::ZERO,
        })
    }

    /// Keep the lease at least this long after its grant, even when released
    /// earlier. Must not exceed `at_most`.
    pub fn at_least(mut self, at_least: Duration) -> Result<LockOptions, InvalidInput> {
        if at_least > self.at_most {
            return Err(InvalidInput::new(
                "at_least",
                format!(
                    "{} is longer than at_most {}; at_least must be at most at_most",
                    crate::format_duration(at_least),
                    crate::format_duration(self.at_most)
                ),
            ));
        }
        self.at_least = at_least;
        Ok(self)
    }

    /// Turn the automatic keep-alive on (default) or off. Without it the
    /// lease lapses `at_most` after the grant however long the work runs
    /// (ShedLock's plain behaviour), and [`LeaseHandle::lost`] fires then.
    pub fn keep_alive(mut self, on: bool) -> LockOptions {
        self.keep_alive = on;
        self
    }

    /// Keep the lease's local deadline ([`LeaseHandle::deadline`]) more
    /// than `margin` ahead while the store answers: the keep-alive extends
    /// every `min(at_most / 3, (at_most - margin) / 2)`. For work that needs
    /// `margin` to shut down once the store stops answering (stop it at
    /// `deadline() - margin`). Must be shorter than `at_most`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use baton::lock::LockOptions;
    ///
    /// // A command that needs up to 2 s to stop, under a 3 s lease:
    /// // extensions every 500 ms, so `deadline() - 2s` is never reached
    /// // while they succeed.
    /// let opts = LockOptions::new(Duration::from_secs(3))?
    ///     .renew_margin(Duration::from_secs(2))?;
    /// assert_eq!(opts.renew_period(), Duration::from_millis(500));
    /// # Ok::<(), baton::InvalidInput>(())
    /// ```
    pub fn renew_margin(mut self, margin: Duration) -> Result<LockOptions, InvalidInput> {
        if margin >= self.at_most {
            return Err(InvalidInput::new(
                "margin",
                format!(
                    "{} is not shorter than at_most {}; the margin must be shorter than the lease",
                    crate::format_duration(margin),
                    crate::format_duration(self.at_most)
                ),
            ));
        }
        self.margin = margin;
        Ok(self)
    }

    /// How often the keep-alive extends the lease:
    /// `min(at_most / 3, (at_most - margin) / 2)`.
    pub fn renew_period(&self) -> Duration {
        (self.at_most / 3).min((self.at_most - self.margin) / 2)
    }

    /// How often a kept-alive lease whose [`LockOptions::renew_period`] is
    /// longer than `RELEASE_BOUND / 6` (5 s) confirms that it has not been
    /// revoked (a read of its record, between extensions):
    /// `min(RELEASE_BOUND / 6, (RELEASE_BOUND - margin) / 3)`, at least
    /// 50 ms, so the local deadline stays more than `margin` ahead while
    /// the store answers. So a holder learns of a force-release within
    /// 5 s (plus a round trip) whatever `at_most`. `None` when no
    /// confirmation is needed: without keep-alive, or when the extensions
    /// themselves come every 5 s or more often (a revoked token's
    /// extension is refused).
    pub fn confirm_period(&self) -> Option<Duration> {
        if !self.keep_alive || self.renew_period() <= RELEASE_BOUND / 6 {
            return None;
        }
        let by_margin = RELEASE_BOUND.saturating_sub(self.margin) / 3;
        Some(
            (RELEASE_BOUND / 6)
                .min(by_margin)
                .max(Duration::from_millis(50)),
        )
    }

    /// The lease length.
    pub fn at_most_duration(&self) -> Duration {
        self.at_most
    }

    /// The minimum hold after the grant.
    pub fn at_least_duration(&self) -> Duration {
        self.at_least
    }
}

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
        let holder = format!("{}:{}", self.node, short_id());
        let sent = Instant::now();
        let answer = self
            .store
            .backend()
            .lock_acquire(&LockRequest {
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

/// `host:pid`, the stable part of every holder id from this process.
pub fn node_id() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("{host}:{}", std::process::id())
}

/// How long before a lease's local deadline the work under it must be
/// gone (killed, dropped): a tenth of the lease, at most 100 ms. The
/// deadline itself is safe by the request's one-way latency only; this
/// margin absorbs a late timer on a busy host and the teardown itself, so
/// the work is gone before the store could grant the lease again.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(baton::lock::stop_margin(Duration::from_secs(30)), Duration::from_millis(100));
/// assert_eq!(baton::lock::stop_margin(Duration::from_millis(500)), Duration::from_millis(50));
/// ```
pub fn stop_margin(lease: Duration) -> Duration {
    (lease / 10).min(Duration::from_millis(100))
}

/// A short random id (12 hex digits), unique per acquisition beside the
/// `host:pid` it follows.
pub(crate) fn short_id() -> String {
    format!("{:012x}", fastrand::u64(..) >> 16)
}

#[derive(Debug)]
struct Shared {
    name: String,
    holder: String,
    token: FencingToken,
    locked_at: DateTime<Utc>,
    lock_until: Mutex<DateTime<Utc>>,
    /// The local deadline (`bounds`' effective one); a watch so
    /// [`StopBy`] sees it move.
    deadline: tokio::sync::watch::Sender<Instant>,
    bounds: Mutex<Bounds>,
    at_most: Duration,
    lost: CancellationToken,
    /// Without a keep-alive nothing runs beside the lease: it is lost when
    /// its deadline passes, as [`LeaseHandle::lost`] and `is_lost` see.
    keep_alive: bool,
    /// [`stop_margin`] of the lease.
    margin: Duration,
}

/// A cheap, cloneable view of a lease for the work it protects: its
/// identity and its lost signal.
#[derive(Debug, Clone)]
pub struct LeaseHandle {
    shared: Arc<Shared>,
}

impl LeaseHandle {
    /// The lock name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }
    /// The holder id (`host:pid:unique`).
    pub fn holder(&self) -> &str {
        &self.shared.holder
    }
    /// The fencing token of this grant.
    pub fn token(&self) -> FencingToken {
        self.shared.token
    }
    /// When the lease was granted, in store time.
    pub fn locked_at(&self) -> DateTime<Utc> {
        self.shared.locked_at
    }
    /// When the lease ends unless extended, in store time.
    pub fn expires_at(&self) -> DateTime<Utc> {
        match self.shared.lock_until.lock() {
            Ok(g) => *g,
            Err(p) => *p.into_inner(),
        }
    }
    /// A local, monotonic bound on the lease's end: the lease cannot last
    /// past it unless extended again. It is the send time of the request
    /// that granted or last extended the lease plus `at_most` (the store
    /// set its expiry after that), so it holds whatever the clocks say.
    /// For a kept-alive lease longer than [`RELEASE_BOUND`] it is also at
    /// most the last confirmation's (or extension's) send time +
    /// [`RELEASE_BOUND`], the latest a force-release could end it. It
    /// moves forward with every extension and confirmation.
    ///
    /// Work that must be over before anyone else can hold the lock stops at
    /// `deadline() - its_shutdown_time` (see [`LockOptions::renew_margin`]);
    /// `baton lock` SIGTERMs its command `--grace` before it.
    ///
    /// ```no_run
    /// # async fn demo(lease: baton::lock::Lease) {
    /// use std::time::Duration;
    /// let grace = Duration::from_secs(2);
    /// let h = lease.handle();
    /// tokio::select! {
    ///     _ = tokio::time::sleep_until(h.deadline() - grace) => { /* start stopping */ }
    ///     _ = h.lost() => { /* refused: stop at once */ }
    /// }
    /// # }
    /// ```
    pub fn deadline(&self) -> Instant {
        *self.shared.deadline.borrow()
    }
    /// The instant by which the work under this lease must be gone
    /// (SIGKILLed, dropped): [`LeaseHandle::deadline`] less [`stop_margin`],
    /// so a late timer or a slow teardown still ends it before the store
    /// could grant the lock to anyone else. Moves with the deadline.
    pub fn stop_by(&self) -> Instant {
        let deadline = self.deadline();
        deadline.checked_sub(self.shared.margin).unwrap_or(deadline)
    }
    /// Follow [`LeaseHandle::stop_by`] as extensions move it: for a
    /// watchdog outside this process (`baton lock` sends each new value to
    /// its command's supervisor, which kills the command there by itself
    /// if no later value comes, even while baton is frozen).
    pub fn watch_stop_by(&self) -> StopBy {
        StopBy {
            rx: self.shared.deadline.subscribe(),
            margin: self.shared.margin,
        }
    }
    /// Whether the lease has been lost.
    pub fn is_lost(&self) -> bool {
        if !self.shared.keep_alive && !self.shared.lost.is_cancelled() {
            self.lapse_if_past_deadline();
        }
        self.shared.lost.is_cancelled()
    }
    /// Resolves when the lease is lost (an extension was refused, or the
    /// store stayed unreachable until the lease would have lapsed; without
    /// a keep-alive, when `at_most` from the grant or last extension has
    /// passed).
    pub async fn lost(&self) {
        if self.shared.keep_alive {
            return self.shared.lost.cancelled().await;
        }
        // No task watches a lease without a keep-alive: its deadline is
        // watched here (moved on by each manual `Lease::extend`).
        loop {
            tokio::select! {
                _ = self.shared.lost.cancelled() => return,
                _ = tokio::time::sleep_until(self.deadline()) => {
                    if self.lapse_if_past_deadline() {
                        return;
                    }
                }
            }
        }
    }
    /// Without a keep-alive: mark the lease lost once its deadline passed.
    fn lapse_if_past_deadline(&self) -> bool {
        if Instant::now() < self.deadline() {
            return false;
        }
        if !self.shared.lost.is_cancelled() {
            tracing::warn!(lock = self.name(), token = %self.token(), reason = "at_most elapsed without keep-alive", "lease lost");
            self.shared.lost.cancel();
        }
        true
    }
    /// An extension sent at `sent` was granted until `t`: it confirms the
    /// lease too (a revoked token cannot be extended).
    fn set_until(&self, t: DateTime<Utc>, sent: Instant) {
        match self.shared.lock_until.lock() {
            Ok(mut g) => *g = t,
            Err(p) => *p.into_inner() = t,
        }
        let at_most = self.shared.at_most;
        self.move_bounds(|b| {
            b.extended = b.extended.max(sent + at_most);
            b.confirmed = b.confirmed.map(|c| c.max(sent + RELEASE_BOUND));
        });
    }
    /// A read sent at `sent` found the lease still ours (not revoked).
    fn confirmed(&self, sent: Instant) {
        self.move_bounds(|b| b.confirmed = b.confirmed.map(|c| c.max(sent + RELEASE_BOUND)));
    }
    fn move_bounds(&self, f: impl FnOnce(&mut Bounds)) {
        let effective = {
            let mut b = match self.shared.bounds.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            f(&mut b);
            b.effective()
        };
        self.shared.deadline.send_if_modified(|d| {
            let moved = effective > *d;
            *d = (*d).max(effective);
            moved
        });
    }
}

/// The two local bounds on a lease's end.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    /// The last grant's or extension's send time + `at_most`.
    extended: Instant,
    /// For a lease that confirms itself ([`LockOptions::confirm_period`]):
    /// the last confirmation's (or extension's) send time +
    /// [`RELEASE_BOUND`], past which a force-release could have ended it.
    confirmed: Option<Instant>,
}

impl Bounds {
    fn new(sent: Instant, opts: &LockOptions) -> Bounds {
        Bounds {
            extended: sent + opts.at_most,
            confirmed: opts.confirm_period().map(|_| sent + RELEASE_BOUND),
        }
    }
    fn effective(&self) -> Instant {
        self.confirmed
            .map_or(self.extended, |c| c.min(self.extended))
    }
}

/// A view that follows a lease's (or a task attempt's) stop-by instant —
/// its local deadline less [`stop_margin`] — as it moves forward with each
/// confirmed extension or heartbeat: [`LeaseHandle::watch_stop_by`],
/// [`crate::queue::TaskContext::watch_stop_by`].
#[derive(Debug, Clone)]
pub struct StopBy {
    rx: tokio::sync::watch::Receiver<Instant>,
    margin: Duration,
}

impl StopBy {
    /// A view of `deadline` (less `margin`) as a watch follows it.
    pub(crate) fn new(rx: tokio::sync::watch::Receiver<Instant>, margin: Duration) -> StopBy {
        StopBy { rx, margin }
    }

    /// The current stop-by instant (marks it seen).
    pub fn get(&mut self) -> Instant {
        let deadline = *self.rx.borrow_and_update();
        deadline.checked_sub(self.margin).unwrap_or(deadline)
    }

    /// Wait until the stop-by instant moves past the last one seen (by
    /// [`StopBy::get`] or this call); the new one. `None` once the lease or
    /// attempt is gone and nothing can move it any more.
    pub async fn changed(&mut self) -> Option<Instant> {
        self.rx.changed().await.ok()?;
        Some(self.get())
    }
}

/// A granted lease. Release it with [`Lease::release`]; dropping it stops
/// the keep-alive, and the lease then lapses `at_most` after its last
/// extension.
#[derive(Debug)]
pub struct Lease {
    handle: LeaseHandle,
    store: Store,
    opts: LockOptions,
    keeper: Option<JoinHandle<()>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
    }
}

impl std::ops::Deref for Lease {
    type Target = LeaseHandle;
    fn deref(&self) -> &LeaseHandle {
        &self.handle
    }
}

impl Lease {
    fn start(store: Store, handle: LeaseHandle, opts: LockOptions) -> Lease {
        // The grant happened after the request was sent, so its send time
        // + at_most (the handle's deadline) is a safe local (monotonic)
        // bound on the lease's end.
        let deadline = handle.deadline();
        let keeper = opts
            .keep_alive
            .then(|| tokio::spawn(keep_alive(store.clone(), handle.clone(), opts, deadline)));
        Lease {
            handle,
            store,
            opts,
            keeper,
        }
    }

    /// On release, keep the lock until at least `until` (store time)
    /// instead of `locked_at + at_least`: the lease then ends at
    /// `max(now, until)`, never later than `locked_at + at_most`. For work
    /// whose minimum hold counts from another instant than the grant, such
    /// as a scheduled slot (a lock-mode job holds its lock until `slot +
    /// at_least`, so an `at_least` equal to the interval never overlaps the
    /// next slot's grant).
    ///
    /// ```no_run
    /// # async fn demo(locker: baton::lock::Locker, opts: baton::lock::LockOptions) -> Result<(), baton::Error> {
    /// let slot = chrono::Utc::now();
    /// if let Some(mut lease) = locker.try_lock("report", &opts).await? {
    ///     lease.hold_until(slot + chrono::Duration::seconds(30));
    ///     lease.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn hold_until(&mut self, until: DateTime<Utc>) {
        let held = (until - self.locked_at())
            .to_std()
            .unwrap_or(Duration::ZERO);
        self.opts.at_least = held.min(self.opts.at_most);
    }

    /// A cloneable view for the protected work.
    pub fn handle(&self) -> LeaseHandle {
        self.handle.clone()
    }

    /// Extend the lease to `at_most` from now (store time). Fails with
    /// [`Error::LeaseLost`] if the lease lapsed or was taken over.
    pub async fn extend(&self) -> Result<DateTime<Utc>, Error> {
        if self.is_lost() {
            return Err(Error::LeaseLost(self.name().to_string()));
        }
        let sent = Instant::now();
        match self
            .store
            .backend()
            .lock_extend(&crate::store::LockExtend {
                name: self.name(),
                token: self.token(),
                at_most: self.opts.at_most,
            })
            .await?
        {
            Some(until) => {
                self.handle.set_until(until, sent);
                Ok(until)
            }
            None => {
                self.handle.shared.lost.cancel();
                Err(Error::LeaseLost(self.name().to_string()))
            }
        }
    }

    /// Release the lease. It stays held until `granted_at + at_least`.
    /// Fails with [`Error::LeaseLost`] if the lease had already lapsed or
    /// been taken over (then nothing is changed), or if the store has not
    /// answered by the lease's deadline: by then the lock is free without
    /// a release, so a stalled store never holds the caller longer.
    pub async fn release(mut self) -> Result<(), Error> {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        let req = crate::store::LockRelease {
            name: self.name(),
            token: self.token(),
            at_least: self.opts.at_least,
        };
        let release = self.store.backend().lock_release(&req);
        let ok = match tokio::time::timeout_at(self.handle.deadline(), release).await {
            Ok(answer) => answer?,
            Err(_) => {
                tracing::warn!(lock = self.name(), token = %self.token(), "the store did not answer the release before the lease's deadline; the lease has lapsed");
                false
            }
        };
        if ok {
            tracing::debug!(lock = self.name(), token = %self.token(), "lock released");
            Ok(())
        } else {
            self.handle.shared.lost.cancel();
            Err(Error::LeaseLost(self.name().to_string()))
        }
    }

    /// Run `work` under this lease, then release it. If the lease is lost
    /// first, `work` is dropped and [`Error::LeaseLost`] returned.
    pub async fn run<F, Fut, T>(self, work: F) -> Result<T, Error>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let handle = self.handle();
        let out = tokio::select! {
            out = work(handle.clone()) => out,
            _ = handle.lost() => {
                tracing::warn!(lock = handle.name(), token = %handle.token(), "lease lost; work cancelled");
                return Err(Error::LeaseLost(handle.name().to_string()));
            }
        };
        self.release().await?;
        Ok(out)
    }
}

/// Keep the lease alive: extend it every [`LockOptions::renew_period`]
/// and, for a lease longer than [`RELEASE_BOUND`], confirm between
/// extensions (every [`LockOptions::confirm_period`]) that it was not
/// revoked; lost when refused, revoked, or unconfirmed by its deadline.
async fn keep_alive(store: Store, handle: LeaseHandle, opts: LockOptions, mut deadline: Instant) {
    let lost = |why: &str| {
        tracing::warn!(lock = handle.name(), token = %handle.token(), reason = %why, "lease lost");
        handle.shared.lost.cancel();
    };
    let period = opts.renew_period();
    let confirm = opts.confirm_period();
    let mut next = Instant::now() + period;
    let mut next_confirm = confirm.map(|c| Instant::now() + c);
    loop {
        // A manual `Lease::extend` or a confirmation may have moved it.
        deadline = deadline.max(handle.deadline());
        let wake = next_confirm.map_or(next, |c| c.min(next)).min(deadline);
        tokio::time::sleep_until(wake).await;
        deadline = deadline.max(handle.deadline());
        if Instant::now() >= deadline {
            lost("could not extend or confirm it before it lapsed");
            return;
        }
        if let (Some(at), Some(every)) = (next_confirm, confirm) {
            if Instant::now() < next && Instant::now() >= at {
                let sent = Instant::now();
                let read = tokio::time::timeout(
                    deadline.saturating_duration_since(sent),
                    store.backend().lock_get(handle.name()),
                )
                .await;
                match read {
                    Ok(Ok(Some(info))) if info.token == handle.token() && info.held => {
                        handle.confirmed(sent);
                        next_confirm = Some(sent + every);
                    }
                    Ok(Ok(Some(info)))
                        if info.token.0 == handle.token().0.wrapping_add(1)
                            && info.holder.starts_with("revoked:") =>
                    {
                        lost("an operator released (revoked) the lock");
                        return;
                    }
                    Ok(Ok(_)) => {
                        lost("the store no longer shows this lease (lapsed, taken over or lost)");
                        return;
                    }
                    Ok(Err(e)) => {
                        crate::store::warn_unless_read_only!(e, lock = handle.name(), error = %crate::error::chain(&e), "lease confirmation failed; retrying");
                        let left = deadline.saturating_duration_since(Instant::now());
                        next_confirm = Some(
                            Instant::now()
                                + (left / 4)
                                    .clamp(Duration::from_millis(5), Duration::from_secs(1)),
                        );
                    }
                    Err(_) => {
                        lost("the store did not answer before the lease's local bound");
                        return;
                    }
                }
                continue;
            }
        }
        let sent = Instant::now();
        let attempt = tokio::time::timeout(
            deadline.saturating_duration_since(sent),
            store.backend().lock_extend(&crate::store::LockExtend {
                name: handle.name(),
                token: handle.token(),
                at_most: opts.at_most,
            }),
        )
        .await;
        match attempt {
            Ok(Ok(Some(until))) => {
                handle.set_until(until, sent);
                deadline = handle.deadline();
                next = sent + period;
                next_confirm = confirm.map(|c| sent + c);
            }
            Ok(Ok(None)) => {
                lost("the store refused the extension (lapsed, taken over or released by an operator)");
                return;
            }
            Ok(Err(e)) => {
                crate::store::warn_unless_read_only!(e, lock = handle.name(), error = %crate::error::chain(&e), "lease extension failed; retrying");
                // Retry soon, but no later than the deadline allows.
                let left = deadline.saturating_duration_since(Instant::now());
                next = Instant::now()
                    + (left / 4).clamp(Duration::from_millis(5), Duration::from_secs(1));
            }
            Err(_) => {
                lost("the store did not answer before the lease lapsed");
                return;
            }
        }
    }
}
