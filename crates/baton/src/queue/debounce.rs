//! The builder's debounce and throttle ([`KeyPolicy`]); the store decides
//! them with the insert (`store::key_policy`).

use std::time::Duration;

use super::TaskBuilder;
use crate::store::{KeyPolicy, RunAt};

impl TaskBuilder {
    /// Debounce on the unique key: run once, `d` after the last enqueue
    /// of the key. A pending task holding the key takes this payload and
    /// priority and is due `d` after the store's now
    /// ([`EnqueueOutcome::Debounced`](crate::store::EnqueueOutcome::Debounced),
    /// its id returned); a task of the key that is already running is left
    /// alone and this one is inserted as a new pending task, which takes
    /// the key. Needs a unique key held while unfinished (the default
    /// hold); `d` from 1 ms to 30 days (field `debounce`). Sets the due
    /// time, so leave out [`delay`](Self::delay) and [`run_at`](Self::run_at).
    ///
    /// ```
    /// use baton::queue::TaskBuilder;
    /// use std::time::Duration;
    /// let t = TaskBuilder::new("reindex", serde_json::json!({"doc": 7}))
    ///     .unique_key("doc:7")
    ///     .debounce(Duration::from_secs(5))
    ///     .build()
    ///     .unwrap();
    /// assert!(t.key_policy.is_some());
    /// let e = TaskBuilder::new("reindex", serde_json::json!({}))
    ///     .debounce(Duration::from_secs(5))
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(e.field, "debounce");
    /// ```
    pub fn debounce(mut self, d: Duration) -> Self {
        self.task.key_policy = Some(KeyPolicy::Debounce(d));
        self.task.run_at = RunAt::Delay(d);
        self
    }

    /// Throttle on the unique key: at most one start per `period`. While a
    /// task with the key started less than `period` ago by the store's
    /// clock, the enqueue writes nothing and answers
    /// [`EnqueueOutcome::Throttled`](crate::store::EnqueueOutcome::Throttled)
    /// with the instant it is accepted again (and that task's id); a
    /// pending task holding the key is returned as usual
    /// (`Existing`). Needs a unique key held while unfinished (the
    /// default hold); `period` from 1 s to 366 days (field `throttle`).
    pub fn throttle(mut self, period: Duration) -> Self {
        self.task.key_policy = Some(KeyPolicy::Throttle(period));
        self
    }
}
