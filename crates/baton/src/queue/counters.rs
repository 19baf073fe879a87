//! What one [`Worker`](super::Worker) has done since it started: attempts
//! by queue and outcome, time spent in handlers, attempts running now.
//! Process-local (the store's [`QueueStats`](crate::store::QueueStats) are
//! the cluster-wide view); for rates and dashboards.

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
    /// The lease was lost (or the result refused): the store will rescue
    /// the task and run it again.
    Lost,
}

impl Outcome {
    /// Every outcome, in a fixed order.
    pub const ALL: [Outcome; 5] = [
        Outcome::Succeeded,
        Outcome::Failed,
        Outcome::Cancelled,
        Outcome::HandedBack,
        Outcome::Lost,
    ];

    /// The outcome's name: `succeeded`, `failed`, `cancelled`,
    /// `handed_back`, `lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::HandedBack => "handed_back",
            Outcome::Lost => "lost",
        }
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
}

/// A handle on a worker's counters; clones share them. Take it with
/// [`Worker::counters`](super::Worker::counters) before running the worker.
///
/// ```no_run
/// # async fn demo(store: baton::Store) {
/// use baton::queue::{Worker, WorkerConfig};
/// let worker = Worker::new(store, WorkerConfig::default());
/// let counters = worker.counters();
/// // … run the worker; elsewhere, e.g. in a metrics endpoint:
/// for (queue, c) in counters.snapshot() {
///     println!("{queue}: {} running, {:?}", c.running, c.ended);
/// }
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct WorkerCounters(Arc<Mutex<BTreeMap<String, QueueCounters>>>);

impl WorkerCounters {
    /// Every queue this worker has seen, with its counters.
    pub fn snapshot(&self) -> BTreeMap<String, QueueCounters> {
        self.with(|m| m.clone())
    }

    /// Register the queues this worker serves, so they report zeros.
    pub(crate) fn serve(&self, queues: impl IntoIterator<Item = String>) {
        self.with(|m| {
            for q in queues {
                m.entry(q).or_default();
            }
        });
    }

    pub(crate) fn started(&self, queue: &str) {
        self.update(queue, |q| q.running += 1);
    }

    pub(crate) fn ended(&self, queue: &str, outcome: Outcome, took: Duration) {
        self.update(queue, |q| {
            q.running = q.running.saturating_sub(1);
            *q.ended.entry(outcome).or_default() += 1;
            q.busy += took;
        });
    }

    /// Change one queue's counters; the name is copied only the first
    /// time (this runs twice per task).
    fn update(&self, queue: &str, f: impl FnOnce(&mut QueueCounters)) {
        self.with(|m| match m.get_mut(queue) {
            Some(q) => f(q),
            None => f(m.entry(queue.to_string()).or_default()),
        });
    }

    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<String, QueueCounters>) -> T) -> T {
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
        }
    }
}
