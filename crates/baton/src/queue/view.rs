//! What an operator sees of a queue's limits: each worker declares the
//! limits it claims a queue with to the store at its start (and is told
//! when another worker declared different ones), and [`Queue::keys`]
//! reads the load of a queue's concurrency keys.

use crate::error::{Error, InvalidInput};
use crate::store::{QueueDeclare, QueueKeys, QueueKeysQuery, QueueLimits, Store, MAX_KEYS_PAGE};

use super::{Queue, WorkerConfig};

impl WorkerConfig {
    /// The cluster-wide limits this config claims `queue` with, as the
    /// store records them (`baton queues`, the admin API).
    ///
    /// ```
    /// use baton::queue::WorkerConfig;
    /// let cfg = WorkerConfig::default().queue("exports", 8).per_key_max_running("exports", 2);
    /// assert_eq!(cfg.limits_of("exports").per_key_max_running, Some(2));
    /// assert!(cfg.limits_of("other").is_empty());
    /// ```
    pub fn limits_of(&self, queue: &str) -> QueueLimits {
        let rate = self.rate_limit_of(queue);
        QueueLimits {
            max_running: self.max_running_of(queue),
            per_key_max_running: self.per_key_max_running_of(queue),
            rate: rate.map(|(_, r)| r.to_string()),
            rate_name: rate.and_then(|(n, _)| n.map(str::to_string)),
            per_key_rate: self.per_key_rate_limit_of(queue).map(|r| r.to_string()),
            fair: self.fair_of(queue),
        }
    }
}

/// Record each queue's limits as `config` claims with them, and warn when
/// another worker declared different ones (two deployments of one queue
/// with different configs each enforce their own: the operator must know).
/// Best effort: a store that does not answer leaves the record as it was.
pub(crate) async fn declare_limits(store: Store, config: WorkerConfig, by: String) {
    for (queue, _) in &config.queues {
        let limits = config.limits_of(queue);
        let declared = QueueDeclare {
            queue,
            limits: &limits,
            by: &by,
        };
        match store.backend().queue_declare(&declared).await {
            Ok(Some(before)) if before.limits != limits && before.by != by => {
                tracing::warn!(
                    queue = %queue,
                    limits = %limits.describe(),
                    other_worker = %before.by,
                    other_limits = %before.limits.describe(),
                    declared_at = %crate::format_time(before.at),
                    "this worker claims the queue with other limits than another worker \
                     declared; each enforces its own (give every worker of a queue the same limits)"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                queue = %queue,
                error = %crate::error::chain(&e),
                "could not record the queue's limits in the store"
            ),
        }
    }
}

impl Queue {
    /// The load of `queue`'s concurrency keys: the `limit` busiest keys
    /// (most running, then most pending), how many keys have tasks
    /// running or pending, the per-key cap and rate the queue's workers
    /// declared, and under a rate per key each listed key's starts in the
    /// current window and when its next start is allowed (`limit`: 1 ..=
    /// [`MAX_KEYS_PAGE`]; the start logs are read for the listed keys
    /// only).
    ///
    /// ```no_run
    /// # async fn demo(q: baton::queue::Queue) -> Result<(), baton::Error> {
    /// let keys = q.keys("exports", 20).await?;
    /// for k in &keys.keys {
    ///     println!("{}: {} running, {} pending", k.key, k.running, k.pending);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn keys(&self, queue: &str, limit: u32) -> Result<QueueKeys, Error> {
        crate::names::validate_name("queue", queue)?;
        if !(1..=MAX_KEYS_PAGE).contains(&limit) {
            return Err(InvalidInput::new(
                "limit",
                format!("{limit} is out of range; use 1 to {MAX_KEYS_PAGE}"),
            )
            .into());
        }
        let query = QueueKeysQuery { queue, limit };
        let mut keys = self.store.backend().queue_keys(&query).await?;
        let declared = self
            .store
            .backend()
            .queue_limits_list()
            .await?
            .into_iter()
            .find(|d| d.queue == queue)
            .map(|d| d.limits)
            .unwrap_or_default();
        keys.per_key_max_running = declared.per_key_max_running;
        keys.per_key_rate = declared.per_key_rate;
        // Each listed key under the declared rate per key, from its start
        // log the store read with the keys (a declaration this build cannot
        // read shows no state rather than failing the view).
        let rate = keys
            .per_key_rate
            .as_deref()
            .and_then(|r| super::RateLimit::parse("per_key_rate", r).ok());
        if let Some(rate) = rate {
            keys.apply_rate(rate.max(), rate.per(), self.store.now().await?);
        }
        Ok(keys)
    }
}
