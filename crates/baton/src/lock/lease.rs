//! A granted lease: [`Lease`] (owned, released on drop) and the
//! [`LeaseHandle`] the work under it holds, with its local deadline and
//! the supervisor's stop-by instant ([`StopBy`]).

use super::*;

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) name: String,
    pub(super) holder: String,
    pub(super) token: FencingToken,
    pub(super) locked_at: DateTime<Utc>,
    pub(super) lock_until: Mutex<DateTime<Utc>>,
    /// The local deadline (`bounds`' effective one); a watch so
    /// [`StopBy`] sees it move.
    pub(super) deadline: tokio::sync::watch::Sender<Instant>,
    pub(super) bounds: Mutex<Bounds>,
    pub(super) at_most: Duration,
    pub(super) lost: CancellationToken,
    /// Without a keep-alive nothing runs beside the lease: it is lost when
    /// its deadline passes, as [`LeaseHandle::lost`] and `is_lost` see.
    pub(super) keep_alive: bool,
    /// [`stop_margin`] of the lease.
    pub(super) margin: Duration,
}

/// A cheap, cloneable view of a lease for the work it protects: its
/// identity and its lost signal.
#[derive(Debug, Clone)]
pub struct LeaseHandle {
    pub(super) shared: Arc<Shared>,
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
    pub(super) fn lapse_if_past_deadline(&self) -> bool {
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
    pub(super) fn set_until(&self, t: DateTime<Utc>, sent: Instant) {
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
    pub(super) fn confirmed(&self, sent: Instant) {
        self.move_bounds(|b| b.confirmed = b.confirmed.map(|c| c.max(sent + RELEASE_BOUND)));
    }
    pub(super) fn move_bounds(&self, f: impl FnOnce(&mut Bounds)) {
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
pub(super) struct Bounds {
    /// The last grant's or extension's send time + `at_most`.
    pub(super) extended: Instant,
    /// For a lease that confirms itself ([`LockOptions::confirm_period`]):
    /// the last confirmation's (or extension's) send time +
    /// [`RELEASE_BOUND`], past which a force-release could have ended it.
    pub(super) confirmed: Option<Instant>,
}

impl Bounds {
    pub(super) fn new(sent: Instant, opts: &LockOptions) -> Bounds {
        Bounds {
            extended: sent + opts.at_most,
            confirmed: opts.confirm_period().map(|_| sent + RELEASE_BOUND),
        }
    }
    pub(super) fn effective(&self) -> Instant {
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
    pub(super) rx: tokio::sync::watch::Receiver<Instant>,
    pub(super) margin: Duration,
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
#[must_use = "dropping a Lease stops its keep-alive at once; hold it while the work runs and release it with Lease::release"]
pub struct Lease {
    pub(super) handle: LeaseHandle,
    pub(super) store: Store,
    pub(super) opts: LockOptions,
    pub(super) keeper: Option<JoinHandle<()>>,
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
    pub(super) fn start(store: Store, handle: LeaseHandle, opts: LockOptions) -> Lease {
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
            record: self.store.lock_history(),
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
