//! The one text form of an instant in what baton writes for people and
//! tools — log fields, the CLI's tables and JSON: RFC 3339, UTC,
//! milliseconds, `Z` (`2026-01-31T06:00:00.000Z`), so a slot reads and
//! greps the same everywhere. (Stored forms are the store's own, and a slot
//! key keeps its `JOB|2026-01-31T06:00:00Z`.)

use chrono::{DateTime, SecondsFormat, Utc};

/// `t` as RFC 3339 in UTC with milliseconds and `Z`, whatever precision
/// it has.
///
/// ```
/// let t: chrono::DateTime<chrono::Utc> = "2026-01-31T15:00:00.123456+09:00".parse().unwrap();
/// assert_eq!(baton::format_time(t), "2026-01-31T06:00:00.123Z");
/// ```
pub fn format_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}
