//! The ticker: one claim per poll interval (queues in turn) when idle,
//! claims on wake-ups, and timers for work announced as due later.

use super::*;

/// Where the ticker hears of new work besides its own poll.
pub(super) struct Wakes {
    /// The store's wake-up channel (`None`: polling only).
    pub(super) store: Option<tokio::sync::broadcast::Receiver<Wake>>,
    /// Retries this worker wrote, with the local instant each falls due.
    pub(super) retries: tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>,
}

/// Run the ticker until `shutdown`: poke queue `i`'s claim loop through
/// `pokes[i]` once per poll interval (queues in turn; a tick after an
/// upkeep call is skipped, never two in a row), on a wake-up for it, and
/// when work announced for later falls due (by the store's clock, once
/// read into `clock`).
pub(super) async fn ticker(
    shared: &Shared,
    pokes: &[Arc<Notify>],
    clock: &std::sync::OnceLock<StoreClock>,
    wakes: Wakes,
    shutdown: &CancellationToken,
) {
    let Wakes {
        store: mut wake,
        retries: mut due_rx,
    } = wakes;
    // The ticker: one claim per tick (queues in turn) when idle, claims
    // on wake-ups, and timers for work announced as due later.
    let mut tick = tokio::time::interval(shared.config.tick());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut k: usize = 0;
    let n = shared.config.queues.len();
    // Upkeep calls the ticker has skipped a poll for (this worker's,
    // and those of anything else on the same store, e.g. the scheduler
    // of a `baton serve`), and whether the last tick was skipped (never
    // two in a row: a wake-up the store lost waits at most two poll
    // intervals).
    let (mut paid, mut skipped) = (shared.store.upkeep_calls(), false);
    let mut timers = Timers::default();
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
                // The channel is back after a gap: look at every queue.
                Some(w) if w.is_resync() => {
                    for p in pokes {
                        p.notify_one();
                    }
                }
                Some(w) => {
                    for (i, (queue, _)) in shared.config.queues.iter().enumerate() {
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
                if let Some(i) = shared.config.queues.iter().position(|(q, _)| *q == queue) {
                    timers.arm(at, i);
                }
            }
        }
    }
}

/// How many future due times a worker remembers; beyond that the latest
/// are dropped (the poll finds their tasks).
pub(super) const MAX_TIMERS: usize = 4096;

/// Local instants at which a queue's announced work falls due.
#[derive(Default)]
pub(super) struct Timers(std::collections::BTreeSet<(Instant, usize)>);

impl Timers {
    pub(super) fn arm(&mut self, at: Instant, queue: usize) {
        self.0.insert((at, queue));
        if self.0.len() > MAX_TIMERS {
            self.0.pop_last();
        }
    }
    pub(super) fn next(&self) -> Option<Instant> {
        self.0.first().map(|(at, _)| *at)
    }
    /// The queues whose timers have fired by `now` (each once).
    pub(super) fn take_due(&mut self, now: Instant) -> BTreeSet<usize> {
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
pub(super) fn local_instant_at(t: chrono::DateTime<chrono::Utc>) -> Instant {
    Instant::now() + (t - chrono::Utc::now()).to_std().unwrap_or_default()
}

pub(super) async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub(super) async fn recv_wake(
    rx: &mut Option<tokio::sync::broadcast::Receiver<Wake>>,
) -> Option<Wake> {
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
