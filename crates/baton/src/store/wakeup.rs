//! The wake-up a store's channel carries ([`Backend::wake_subscribe`](super::Backend::wake_subscribe)):
//! a queue with new work, due now or later.

use chrono::{DateTime, Utc};

/// A wake-up: `queue` has new pending work, due now (`due: None`) or at
/// `due` (store time). Workers claim at once, or arm a timer for `due`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wake {
    /// The queue with new work.
    pub queue: String,
    /// When the earliest announced task becomes due, in store time; `None`
    /// when it is due already.
    pub due: Option<DateTime<Utc>>,
}

/// The [`Wake`] "queue" a backend sends when its wake-up channel listens
/// after a gap (PostgreSQL's `LISTEN` session once it listens, at first
/// and after a reconnect; a Redis subscription made again): wake-ups
/// sent before were missed, so whoever waits for them looks again now
/// (workers claim on every queue, a scheduler reads the definitions'
/// counter). A control character leads it, so no queue can have this
/// name.
pub(crate) const RESYNC_WAKE: &str = "\u{1}resync";

impl Wake {
    /// The wake-up that says wake-ups may have been missed
    /// ([`RESYNC_WAKE`]).
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn resync() -> Wake {
        Wake::now(RESYNC_WAKE)
    }

    /// Whether this is a resync: the channel listens again after a gap
    /// (or for the first time), and wake-ups sent before were missed, so
    /// whoever waits for them should look again now.
    pub fn is_resync(&self) -> bool {
        self.queue == RESYNC_WAKE
    }

    /// Work in `queue` due now.
    pub fn now(queue: impl Into<String>) -> Wake {
        Wake {
            queue: queue.into(),
            due: None,
        }
    }

    /// Parse a wake-up message as the PostgreSQL and Redis backends send it:
    /// `queue` (due now) or `queue\n<run_at in µs since the epoch>`. Queue
    /// names hold no control characters, so the newline is unambiguous; a
    /// malformed time reads as "due now" (a wake-up is only a hint).
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn parse(payload: &str) -> Wake {
        match payload.split_once('\n') {
            None => Wake::now(payload),
            Some((queue, at)) => Wake {
                queue: queue.to_string(),
                due: at
                    .trim()
                    .parse::<i64>()
                    .ok()
                    .and_then(DateTime::from_timestamp_micros),
            },
        }
    }
}
