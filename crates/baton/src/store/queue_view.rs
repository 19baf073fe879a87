//! What an operator sees of a queue's limits: the caps, rate limit and
//! fairness its workers claim with ([`QueueLimits`], declared to the store
//! by each worker at its start, so `baton queues`, the admin API and the
//! dashboard show them and workers that disagree are told), and the load of
//! its concurrency keys ([`QueueKeys`]: running and pending per key).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::StoreError;

/// The most keys one [`QueueKeysQuery`] answers.
pub const MAX_KEYS_PAGE: u32 = 1000;

/// The most pending tasks a Redis [`queue_keys`](super::Backend::queue_keys)
/// reads to count pending per key (one script call must stay short); past
/// it the answer is marked [`QueueKeys::truncated`]. The SQL stores count
/// every pending task.
pub const KEYS_SCAN_MAX: u32 = 10_000;

/// The cluster-wide limits a worker claims a queue's tasks with (from
/// [`WorkerConfig`](crate::queue::WorkerConfig)): what each of its claims
/// decides in the store. Workers that claim one queue should declare the
/// same; the store keeps the latest declaration.
///
/// ```
/// use baton::store::QueueLimits;
/// let l = QueueLimits { per_key_max_running: Some(2), rate: Some("100/1m".into()), ..Default::default() };
/// assert_eq!(l.describe(), "per key 2, rate 100/1m");
/// assert_eq!(QueueLimits::default().describe(), "none");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueLimits {
    /// At most this many of the queue's tasks running at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
    /// At most this many tasks of one concurrency key running at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_key_max_running: Option<u32>,
    /// At most this many starts per period (`N/PERIOD`, e.g. `100/1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// The name of the shared rate limit [`rate`](Self::rate) belongs to
    /// (`None`: the queue's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_name: Option<String>,
    /// At most this many starts of each concurrency key per period
    /// (`N/PERIOD`, e.g. `10/1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_key_rate: Option<String>,
    /// Claims interleave the concurrency keys (fair claiming).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fair: bool,
}

impl QueueLimits {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == QueueLimits::default()
    }

    /// One line for a table: `max 10, per key 2, rate 100/1m (partner),
    /// fair`, or `none`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = self.max_running {
            parts.push(format!("max {m}"));
        }
        if let Some(k) = self.per_key_max_running {
            parts.push(format!("per key {k}"));
        }
        if let Some(r) = &self.rate {
            match &self.rate_name {
                Some(n) => parts.push(format!("rate {r} ({n})")),
                None => parts.push(format!("rate {r}")),
            }
        }
        if let Some(r) = &self.per_key_rate {
            parts.push(format!("rate {r} per key"));
        }
        if self.fair {
            parts.push("fair".into());
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }

    /// The stored form (JSON).
    pub(crate) fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }

    /// Read the stored form.
    pub(crate) fn decode(text: &str) -> Result<QueueLimits, StoreError> {
        serde_json::from_str(text)
            .map_err(|e| StoreError::Corrupt(format!("queue limits {text:?}: {e}")))
    }
}

/// A queue's limits as the store keeps them: the latest worker's
/// declaration, who made it and when (store time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredLimits {
    /// The queue.
    pub queue: String,
    /// The limits.
    pub limits: QueueLimits,
    /// The declaring worker (its id, `host:pid:…`).
    pub by: String,
    /// When it declared them.
    pub at: DateTime<Utc>,
}

/// A worker's declaration of a queue's limits
/// ([`Backend::queue_declare`](super::Backend::queue_declare)).
#[derive(Debug, Clone, Copy)]
pub struct QueueDeclare<'a> {
    /// The queue.
    pub queue: &'a str,
    /// Its limits as this worker claims with them.
    pub limits: &'a QueueLimits,
    /// The worker's id.
    pub by: &'a str,
}

/// Which keys' load to read
/// ([`Backend::queue_keys`](super::Backend::queue_keys)).
#[derive(Debug, Clone, Copy)]
pub struct QueueKeysQuery<'a> {
    /// The queue.
    pub queue: &'a str,
    /// At most this many keys (1 ..= [`MAX_KEYS_PAGE`]).
    pub limit: u32,
}

/// One concurrency key's load in a queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyLoad {
    /// The concurrency key.
    pub key: String,
    /// Its tasks running now.
    pub running: u64,
    /// Its tasks pending (due now or later).
    pub pending: u64,
    /// Its latest starts logged under a rate per key, latest first (at
    /// most the rate's `max`; empty without a rate or when it started
    /// nothing lately). Read for the listed keys only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_starts: Vec<DateTime<Utc>>,
    /// Its state under the queue's declared rate per key (filled by
    /// [`Queue::keys`](crate::queue::Queue::keys), not by the store call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<KeyRateState>,
}

/// A key's state under its queue's rate per key, at the store's now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRateState {
    /// Its starts in the current window (the last `per` up to now).
    pub started_in_window: u32,
    /// The starts the rate allows in any window.
    pub max: u32,
    /// The window, ms.
    pub per_ms: u64,
    /// When its next start is allowed, when the window is used up
    /// (`None`: it may start now).
    pub next_start_at: Option<DateTime<Utc>>,
}

impl KeyRateState {
    /// The state of a key whose latest starts are `recent` (latest first)
    /// under `max` starts per `per`, at `now`.
    pub fn of(
        recent: &[DateTime<Utc>],
        max: u32,
        per: std::time::Duration,
        now: DateTime<Utc>,
    ) -> KeyRateState {
        let per_c = chrono::Duration::from_std(per).unwrap_or(chrono::Duration::MAX);
        let since = now
            .checked_sub_signed(per_c)
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let n = recent.iter().take_while(|&&t| t > since).count();
        let next_start_at = (n >= max as usize)
            .then(|| recent.get(max as usize - 1))
            .flatten()
            .and_then(|&nth| nth.checked_add_signed(per_c))
            .filter(|&at| at > now);
        KeyRateState {
            started_in_window: u32::try_from(n).unwrap_or(u32::MAX),
            max,
            per_ms: u64::try_from(per.as_millis()).unwrap_or(u64::MAX),
            next_start_at,
        }
    }
}

/// Put each key's logged starts (`(key, instants in µs)`, any order) on
/// the listed keys.
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "redis"
    )),
    allow(dead_code)
)]
pub(crate) fn put_starts(
    keys: &mut [KeyLoad],
    logs: impl IntoIterator<Item = (String, Vec<i64>)>,
) -> Result<(), StoreError> {
    let mut by: std::collections::HashMap<String, Vec<i64>> = logs.into_iter().collect();
    for k in keys {
        if let Some(mut v) = by.remove(&k.key) {
            v.sort_unstable_by(|a, b| b.cmp(a));
            k.recent_starts = v
                .into_iter()
                .map(|us| {
                    DateTime::<Utc>::from_timestamp_micros(us)
                        .ok_or_else(|| StoreError::Corrupt(format!("key start log instant {us}")))
                })
                .collect::<Result<_, _>>()?;
        }
    }
    Ok(())
}

/// The load of a queue's concurrency keys: the busiest keys (most running,
/// then most pending, then by name) and how many keys have tasks running
/// or pending. Tasks without a key are not counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueKeys {
    /// The queue.
    pub queue: String,
    /// The busiest keys, at most the query's `limit`.
    pub keys: Vec<KeyLoad>,
    /// Keys with at least one task running.
    pub keys_running: u64,
    /// Keys with at least one task pending.
    pub keys_pending: u64,
    /// The pending counts cover only the first [`KEYS_SCAN_MAX`] pending
    /// tasks in claim order (Redis; the running counts are exact).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The per-key cap the queue's workers declared, if any (filled by
    /// [`Queue::keys`](crate::queue::Queue::keys), not by the store call).
    #[serde(default)]
    pub per_key_max_running: Option<u32>,
    /// The rate per key the queue's workers declared (`10/1m`), if any
    /// (filled by [`Queue::keys`](crate::queue::Queue::keys)).
    #[serde(default)]
    pub per_key_rate: Option<String>,
    /// Listed keys whose rate holds their next start back now (filled by
    /// [`Queue::keys`](crate::queue::Queue::keys)).
    #[serde(default)]
    pub keys_rate_held: u64,
}

impl QueueKeys {
    /// Fill each listed key's [`KeyRateState`] under `max` starts per
    /// `per` at `now` (from its [`KeyLoad::recent_starts`]), and
    /// [`QueueKeys::keys_rate_held`].
    pub fn apply_rate(&mut self, max: u32, per: std::time::Duration, now: DateTime<Utc>) {
        for k in &mut self.keys {
            k.rate = Some(KeyRateState::of(&k.recent_starts, max, per, now));
        }
        self.keys_rate_held = self
            .keys
            .iter()
            .filter(|k| k.rate.is_some_and(|r| r.next_start_at.is_some()))
            .count() as u64;
    }
}

#[cfg(any(feature = "redis", test))]
impl QueueKeys {
    /// The answer from every key's `(key, running, pending)`: sorted
    /// busiest first and cut to `limit`, with the totals counted first.
    pub(crate) fn from_loads(
        queue: &str,
        mut all: Vec<KeyLoad>,
        limit: u32,
        truncated: bool,
    ) -> QueueKeys {
        let keys_running = all.iter().filter(|k| k.running > 0).count() as u64;
        let keys_pending = all.iter().filter(|k| k.pending > 0).count() as u64;
        all.sort_by(|a, b| {
            b.running
                .cmp(&a.running)
                .then(b.pending.cmp(&a.pending))
                .then_with(|| a.key.cmp(&b.key))
        });
        all.truncate(limit as usize);
        QueueKeys {
            queue: queue.to_string(),
            keys: all,
            keys_running,
            keys_pending,
            truncated,
            ..QueueKeys::default()
        }
    }
}

/// Put each queue's declared limits on its stats, adding an empty entry
/// for a declared queue that holds no tasks (the list stays sorted).
pub(crate) fn merge_limits(stats: &mut Vec<super::QueueStats>, declared: Vec<DeclaredLimits>) {
    let mut added = false;
    for d in declared {
        match stats.iter_mut().find(|s| s.queue == d.queue) {
            Some(s) => s.limits = Some(d),
            None => {
                stats.push(super::QueueStats {
                    queue: d.queue.clone(),
                    limits: Some(d),
                    ..super::QueueStats::default()
                });
                added = true;
            }
        }
    }
    if added {
        stats.sort_by(|a, b| a.queue.cmp(&b.queue));
    }
}

/// The SQL stores' statements and row readers, written once (each backend
/// binds the queue as its first parameter, `p1`, and the limit as `p2`).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod sql {
    use super::{DeclaredLimits, KeyLoad, QueueLimits};
    use crate::error::StoreError;
    use crate::store::sql_row::SqlRow;

    /// The columns of the queues table a declaration is read from, its
    /// key read as `name` (`key` is `name`, or MySQL's `queue`).
    pub(crate) fn declared_cols(key: &str) -> String {
        format!("{key} AS name, limits, limits_by, limits_at")
    }

    /// The busiest keys of queue `p1`, at most `p2`.
    pub(crate) fn keys(tasks: &str, p1: &str, p2: &str) -> String {
        format!(
            "SELECT concurrency_key AS k, \
                 COUNT(CASE WHEN state = 'running' THEN 1 END) AS running, \
                 COUNT(CASE WHEN state = 'pending' THEN 1 END) AS pending \
             FROM {tasks} WHERE queue = {p1} AND state IN ('pending', 'running') \
                 AND concurrency_key IS NOT NULL \
             GROUP BY concurrency_key ORDER BY running DESC, pending DESC, k LIMIT {p2}"
        )
    }

    /// How many keys of queue `p1` have tasks running and pending.
    pub(crate) fn key_totals(tasks: &str, p1: &str) -> String {
        format!(
            "SELECT COUNT(DISTINCT CASE WHEN state = 'running' THEN concurrency_key END) AS running, \
                 COUNT(DISTINCT CASE WHEN state = 'pending' THEN concurrency_key END) AS pending \
             FROM {tasks} WHERE queue = {p1} AND state IN ('pending', 'running') \
                 AND concurrency_key IS NOT NULL"
        )
    }

    /// A row of [`declared_cols`].
    pub(crate) fn declared(row: &impl SqlRow) -> Result<DeclaredLimits, StoreError> {
        Ok(DeclaredLimits {
            queue: row.text("name")?,
            limits: QueueLimits::decode(&row.text("limits")?)?,
            by: row.text("limits_by")?,
            at: row.time("limits_at")?,
        })
    }

    /// A row of [`keys`].
    fn key_load(row: &impl SqlRow) -> Result<KeyLoad, StoreError> {
        Ok(KeyLoad {
            key: row.text("k")?,
            running: count(row.big("running")?),
            pending: count(row.big("pending")?),
            recent_starts: Vec::new(),
            rate: None,
        })
    }

    /// `(ckey, starts)` rows of `<p>key_rates` as [`put_starts`](super::put_starts) takes them.
    pub(crate) fn key_logs<R: SqlRow>(rows: &[R]) -> Result<Vec<(String, Vec<i64>)>, StoreError> {
        rows.iter()
            .map(|r| {
                let log = crate::store::rate::StartLog::decode(&r.text("starts")?)?;
                Ok((r.text("ckey")?, log.instants()))
            })
            .collect()
    }

    /// The answer from the rows of [`keys`] and the row of [`key_totals`].
    pub(crate) fn answer<R: SqlRow>(
        queue: &str,
        rows: &[R],
        totals: &R,
    ) -> Result<super::QueueKeys, StoreError> {
        Ok(super::QueueKeys {
            queue: queue.to_string(),
            keys: rows.iter().map(key_load).collect::<Result<Vec<_>, _>>()?,
            keys_running: count(totals.big("running")?),
            keys_pending: count(totals.big("pending")?),
            truncated: false,
            ..super::QueueKeys::default()
        })
    }

    fn count(n: i64) -> u64 {
        u64::try_from(n).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(key: &str, running: u64, pending: u64) -> KeyLoad {
        KeyLoad {
            key: key.into(),
            running,
            pending,
            recent_starts: Vec::new(),
            rate: None,
        }
    }

    #[test]
    fn busiest_keys_first_and_totals_before_the_cut() {
        let k = QueueKeys::from_loads(
            "q",
            vec![
                load("c", 0, 9),
                load("a", 2, 1),
                load("b", 2, 5),
                load("d", 0, 0),
            ],
            2,
            false,
        );
        assert_eq!(k.keys, vec![load("b", 2, 5), load("a", 2, 1)]);
        assert_eq!((k.keys_running, k.keys_pending), (2, 3));
    }

    #[test]
    fn limits_round_trip_and_describe() {
        let l = QueueLimits {
            max_running: Some(10),
            per_key_max_running: Some(2),
            rate: Some("5/1s".into()),
            rate_name: Some("partner".into()),
            per_key_rate: Some("10/1m".into()),
            fair: true,
        };
        assert_eq!(QueueLimits::decode(&l.encode()).unwrap(), l);
        assert_eq!(
            l.describe(),
            "max 10, per key 2, rate 5/1s (partner), rate 10/1m per key, fair"
        );
        assert_eq!(QueueLimits::decode("{}").unwrap(), QueueLimits::default());
        assert!(QueueLimits::decode("nope").is_err());
    }
}
