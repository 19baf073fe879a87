//! What one [`Worker`](super::Worker) has done since it started: attempts
//! by queue and outcome, time spent in handlers, attempts running now,
//! fixed-bucket histograms of claim latency, run duration and slot → start
//! lag, lease losses, heartbeat failures and store errors by operation.
//! Process-local (the store's [`QueueStats`](crate::store::QueueStats) are
//! the cluster-wide view); for rates, dashboards and metrics exporters
//! (`baton serve` renders them as Prometheus metrics).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How an attempt on this worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// The handler returned `Ok` and the result was recorded.
    Succeeded,
    /// The handler failed, panicked or timed out (retried later or dead).
    Failed,
    /// The task was cancelled while it ran.
    Cancelled,
    /// Shutdown handed the task back without using up the attempt.
    HandedBack,
    /// The handler snoozed the task ([`TaskError::snooze`](super::TaskError::snooze)):
    /// due again later, the attempt not counted.
    Snoozed,
    /// The lease was lost (or the result refused): the store will rescue
    /// the task and run it again.
    Lost,
}

impl Outcome {
    /// Every outcome, in a fixed order.
    pub const ALL: [Outcome; 6] = [
        Outcome::Succeeded,
        Outcome::Failed,
        Outcome::Cancelled,
        Outcome::HandedBack,
        Outcome::Snoozed,
        Outcome::Lost,
    ];

    /// The outcome's name: `succeeded`, `failed`, `cancelled`,
    /// `handed_back`, `snoozed`, `lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::HandedBack => "handed_back",
            Outcome::Snoozed => "snoozed",
            Outcome::Lost => "lost",
        }
    }
}

/// The upper bounds (seconds) of every [`Histogram`]'s buckets, from 1 ms
/// to an hour; the last bucket (`+Inf`) is implied.
pub const BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];

/// A histogram of durations with the fixed buckets [`BUCKETS`].
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Observations per bucket (not cumulative): `counts[i]` counts those
    /// in `(BUCKETS[i-1], BUCKETS[i]]`; the last one those above every
    /// bound. `BUCKETS.len() + 1` entries.
    pub counts: Vec<u64>,
    /// The sum of every observation, in seconds.
    pub sum: f64,
    /// How many observations.
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }
}

impl Histogram {
    /// Record one duration.
    pub fn observe(&mut self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BUCKETS.len());
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum += secs;
        self.count += 1;
    }

    /// `(upper bound, observations at or below it)` for every bucket,
    /// ending with `(f64::INFINITY, count)`: Prometheus' `le` buckets.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        BUCKETS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(&self.counts)
            .map(|(le, n)| {
                total += n;
                (le, total)
            })
            .collect()
    }

    /// Add another histogram's observations to this one.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum += other.sum;
        self.count += other.count;
    }
}

/// One queue's counters on one worker.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueCounters {
    /// Attempts running now.
    pub running: u64,
    /// Ended attempts by outcome (every [`Outcome`] present, zeros too).
    pub ended: BTreeMap<Outcome, u64>,
    /// Time spent in ended attempts, from claim to outcome.
    pub busy: Duration,
    /// How long each claim call that the store answered took (those that
    /// found nothing too).
    pub claim_latency: Histogram,
    /// Each ended attempt's duration, from claim to outcome.
    pub run_duration: Histogram,
    /// For scheduled tasks (those with a slot): from the task's due time
    /// (its slot plus the job's jitter, or when it was triggered or its
    /// retry fell due) to the claim that started the attempt, both by the
    /// store's clock.
    pub slot_lag: Histogram,
    /// For scheduled tasks not run on time by the scheduler (see
    /// [`ON_TIME_WINDOW`]: a trigger or backfill of a slot, a retry due
    /// long after its slot): from the task's due time to the claim that
    /// started the attempt. Kept apart so a backfill's backlog does not
    /// read as schedules running late.
    pub trigger_lag: Histogram,
    /// Attempts whose lease was lost (no heartbeat confirmed it in time,
    /// another claim took the task, or the result was refused): nothing
    /// was recorded, and the task is rescued.
    pub lease_losses: u64,
}

/// How long after its slot a scheduled task may fall due and still count
/// as the scheduler's on-time run: the scheduler enqueues a slot due at
/// the slot plus the job's jitter, while a trigger or a backfill is due
/// when it is made (an older slot's long after it, a future slot's before
/// it). A task due before its slot or more than this after it observes
/// [`QueueCounters::trigger_lag`]; so does the on-time run of a job whose
/// jitter exceeds this (an hour).
pub const ON_TIME_WINDOW: Duration = Duration::from_secs(3600);

/// Whether a scheduled task due at `run_at` for `slot` is the scheduler's
/// on-time run ([`ON_TIME_WINDOW`]).
pub(crate) fn on_time(
    slot: chrono::DateTime<chrono::Utc>,
    run_at: chrono::DateTime<chrono::Utc>,
) -> bool {
    let after = run_at - slot;
    after >= chrono::Duration::zero()
        && after <= chrono::Duration::from_std(ON_TIME_WINDOW).unwrap_or(chrono::Duration::MAX)
}

/// Worker-wide counters (not per queue).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerTotals {
    /// Heartbeat calls that failed (the store did not answer in time or
    /// answered an error).
    pub heartbeat_failures: u64,
    /// Store calls that failed, by operation: one of [`STORE_OPERATIONS`].
    pub store_errors: BTreeMap<&'static str, u64>,
}

/// The store calls whose failures [`WorkerTotals::store_errors`] counts,
/// by their names on the [`Backend`](crate::store::Backend) seam (a
/// hand-back is a `task_finish_many`; reading the store's clock is `now`).
pub const STORE_OPERATIONS: [&str; 13] = [
    "task_claim",
    "task_finish_many",
    "task_heartbeat_many",
    "task_rescue_many",
    "task_prune_many",
    "now",
    "store_identity",
    "audit_prune_many",
    "jobdef_prune_many",
    "stats_add",
    "stats_prune_many",
    "lock_history_prune_many",
    "job_list",
];

#[derive(Debug, Default)]
struct Inner {
    queues: BTreeMap<String, QueueCounters>,
    totals: WorkerTotals,
}

/// A handle on a worker's counters; clones share them. Take it with
/// [`Worker::counters`](super::Worker::counters) before running the worker.
///
/// ```no_run
/// # async fn demo(store: baton::Store) -> Result<(), baton::Error> {
/// use baton::queue::{Worker, WorkerConfig};
/// let worker = Worker::new(store, WorkerConfig::default().queue("default", 4))?;
/// let counters = worker.counters();
/// // … run the worker; elsewhere, e.g. in a metrics endpoint:
/// for (queue, c) in counters.snapshot() {
///     println!("{queue}: {} running, {:?}", c.running, c.ended);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct WorkerCounters(Arc<Mutex<Inner>>);

impl WorkerCounters {
    /// Every queue this worker has seen, with its counters.
    pub fn snapshot(&self) -> BTreeMap<String, QueueCounters> {
        self.with(|m| m.queues.clone())
    }

    /// The worker-wide counters: heartbeat failures, store errors.
    pub fn totals(&self) -> WorkerTotals {
        self.with(|m| m.totals.clone())
    }

    /// Register the queues this worker serves, so they report zeros.
    pub(crate) fn serve(&self, queues: impl IntoIterator<Item = String>) {
        self.with(|m| {
            for q in queues {
                m.queues.entry(q).or_default();
            }
        });
    }

    pub(crate) fn claimed(&self, queue: &str, took: Duration) {
        self.update(queue, |q| q.claim_latency.observe(took));
    }

    /// A scheduled task's lag: into [`QueueCounters::slot_lag`] when
    /// `on_time`, else [`QueueCounters::trigger_lag`].
    pub(crate) fn slot_lag(&self, queue: &str, lag: Duration, on_time: bool) {
        self.update(queue, |q| {
            if on_time {
                q.slot_lag.observe(lag)
            } else {
                q.trigger_lag.observe(lag)
            }
        });
    }

    pub(crate) fn lease_lost(&self, queue: &str) {
        self.update(queue, |q| q.lease_losses += 1);
    }

    pub(crate) fn heartbeat_failed(&self) {
        self.with(|m| m.totals.heartbeat_failures += 1);
    }

    pub(crate) fn store_error(&self, operation: &'static str) {
        debug_assert!(
            STORE_OPERATIONS.contains(&operation),
            "{operation} is not in STORE_OPERATIONS"
        );
        self.with(|m| *m.totals.store_errors.entry(operation).or_default() += 1);
    }

    pub(crate) fn started(&self, queue: &str) {
        self.update(queue, |q| q.running += 1);
    }

    pub(crate) fn ended(&self, queue: &str, outcome: Outcome, took: Duration) {
        self.update(queue, |q| {
            q.running = q.running.saturating_sub(1);
            *q.ended.entry(outcome).or_default() += 1;
            q.busy += took;
            q.run_duration.observe(took);
        });
    }

    /// Change one queue's counters; the name is copied only the first
    /// time (this runs twice per task).
    fn update(&self, queue: &str, f: impl FnOnce(&mut QueueCounters)) {
        self.with(|m| match m.queues.get_mut(queue) {
            Some(q) => f(q),
            None => f(m.queues.entry(queue.to_string()).or_default()),
        });
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        let mut g = match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut g)
    }
}

impl Default for QueueCounters {
    /// Nothing running, zero of every outcome.
    fn default() -> QueueCounters {
        QueueCounters {
            running: 0,
            ended: Outcome::ALL.iter().map(|o| (*o, 0)).collect(),
            busy: Duration::ZERO,
            claim_latency: Histogram::default(),
            run_duration: Histogram::default(),
            slot_lag: Histogram::default(),
            trigger_lag: Histogram::default(),
            lease_losses: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_with_inf() {
        let mut h = Histogram::default();
        h.observe(Duration::from_micros(500)); // <= 0.001
        h.observe(Duration::from_millis(1)); // == 0.001: same bucket
        h.observe(Duration::from_millis(300)); // <= 0.5
        h.observe(Duration::from_secs(7200)); // above every bound
        let c = h.cumulative();
        assert_eq!(c.len(), BUCKETS.len() + 1);
        assert_eq!(c[0], (0.001, 2));
        let half = c.iter().find(|(le, _)| *le == 0.5).map(|x| x.1);
        assert_eq!(half, Some(3));
        assert_eq!(c[BUCKETS.len() - 1], (3600.0, 3));
        assert_eq!(c[BUCKETS.len()], (f64::INFINITY, 4));
        assert_eq!(h.count, 4);
        assert!((h.sum - 7200.3015).abs() < 1e-6, "{}", h.sum);
        let mut m = Histogram::default();
        m.merge(&h);
        m.merge(&h);
        assert_eq!(m.count, 8);
        assert_eq!(m.cumulative()[0], (0.001, 4));
    }
}
