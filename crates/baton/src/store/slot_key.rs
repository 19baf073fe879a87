//! Slot keys: the unique key a schedule's run of one slot is enqueued
//! under (`JOB|RFC3339`). They live with the store's types because both
//! the queue (which refuses such a key from anyone but the slot's own
//! task) and the schedule (which writes them) need them, and layers point
//! down only.

use chrono::{DateTime, Utc};

/// The unique key of `job`'s run for `slot`: `JOB|RFC3339` (UTC, as few
/// fractional digits as the instant needs).
///
/// ```
/// use chrono::{TimeZone, Utc};
/// let slot = Utc.with_ymd_and_hms(2026, 1, 2, 3, 0, 0).unwrap();
/// assert_eq!(baton::store::slot_key("report", slot), "report|2026-01-02T03:00:00Z");
/// ```
pub fn slot_key(job: &str, slot: DateTime<Utc>) -> String {
    format!(
        "{job}|{}",
        slot.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
    )
}

/// Whether `key` has the form of a slot key (`JOB|RFC3339`), which is
/// reserved for the scheduler and triggers: a task enqueued with such a key
/// would take that slot's place.
///
/// ```
/// assert!(baton::store::is_slot_key("report|2026-01-02T03:00:00Z"));
/// assert!(!baton::store::is_slot_key("order-17"));
/// ```
pub fn is_slot_key(key: &str) -> bool {
    key.rsplit_once('|')
        .is_some_and(|(job, t)| !job.is_empty() && DateTime::parse_from_rfc3339(t).is_ok())
}
