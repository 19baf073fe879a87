//! The note and author a pause or resume of a job or queue records
//! ([`PauseNote`], checked above the seam), and what the store keeps of
//! the last one ([`PauseChange`]): `baton jobs`, `baton queues`, the admin
//! API and the dashboard show it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;

/// The longest note a pause or resume keeps, in bytes.
pub const MAX_PAUSE_NOTE_LEN: usize = 1000;

/// The longest author (`by`) a pause or resume keeps, in bytes.
pub const MAX_PAUSE_BY_LEN: usize = 200;

/// What a pause or resume records besides the flag: an optional note
/// (why) and an optional author (who, e.g. `alice@build-7 via cli` or
/// `api:operate via api`). The store adds its own now.
///
/// ```
/// use baton::store::PauseNote;
/// let n = PauseNote::default().note("deploy in progress").by("alice@ops-1 via cli");
/// assert!(n.validate().is_ok());
/// let long = "x".repeat(baton::store::MAX_PAUSE_NOTE_LEN + 1);
/// assert!(PauseNote::default().note(&long).validate().unwrap_err().to_string().contains("note"));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PauseNote<'a> {
    /// Why (free text, at most [`MAX_PAUSE_NOTE_LEN`] bytes, no control
    /// characters but newline and tab).
    pub note: Option<&'a str>,
    /// Who (at most [`MAX_PAUSE_BY_LEN`] bytes, no control characters).
    pub by: Option<&'a str>,
}

impl<'a> PauseNote<'a> {
    /// With the note `note`.
    pub fn note(mut self, note: &'a str) -> PauseNote<'a> {
        self.note = Some(note);
        self
    }

    /// With the author `by`.
    pub fn by(mut self, by: &'a str) -> PauseNote<'a> {
        self.by = Some(by);
        self
    }

    /// Refuse a note or author that is empty, too long or holds control
    /// characters, naming the field (`note`, `by`) and the accepted form.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        check("note", self.note, MAX_PAUSE_NOTE_LEN, &['\n', '\t'])?;
        check("by", self.by, MAX_PAUSE_BY_LEN, &[])
    }
}

fn check(
    field: &str,
    value: Option<&str>,
    max: usize,
    allowed: &[char],
) -> Result<(), InvalidInput> {
    let Some(v) = value else { return Ok(()) };
    let form = format!(
        "must be 1 to {max} bytes of text without control characters{}",
        if allowed.is_empty() {
            ""
        } else {
            " (newlines and tabs allowed)"
        }
    );
    if v.trim().is_empty() {
        return Err(InvalidInput::new(field, format!("is empty; {form}")));
    }
    if v.len() > max {
        return Err(InvalidInput::new(
            field,
            format!("is {} bytes long; {form}", v.len()),
        ));
    }
    if v.chars().any(|c| c.is_control() && !allowed.contains(&c)) {
        return Err(InvalidInput::new(
            field,
            format!("holds a control character; {form}"),
        ));
    }
    Ok(())
}

/// The last pause or resume of a job or queue as the store keeps it: its
/// note, its author and the store's time of the change (the `paused` flag
/// next to it says which it was).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseChange {
    /// The note given, if any.
    pub note: Option<String>,
    /// Who made the change, if recorded.
    pub by: Option<String>,
    /// When, by the store's clock.
    pub at: DateTime<Utc>,
}

impl PauseChange {
    /// The record read from its three stored fields: `None` when the time
    /// is missing (never paused or resumed since the store recorded
    /// changes).
    pub(crate) fn from_parts(
        note: Option<String>,
        by: Option<String>,
        at: Option<DateTime<Utc>>,
    ) -> Option<PauseChange> {
        at.map(|at| PauseChange { note, by, at })
    }
}

/// One row of the SQL stores' queues table as `queue_stats` reads it: the
/// queue, its paused flag and its last pause or resume.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) type QueueRow = (String, bool, Option<PauseChange>);

/// Mark the paused queues in `stats` and attach each queue's last pause or
/// resume, adding an empty entry for a paused queue that holds no tasks
/// (then the list is sorted by queue again).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn mark_paused(
    stats: &mut Vec<super::QueueStats>,
    rows: impl IntoIterator<Item = QueueRow>,
) {
    let mut added = false;
    for (queue, paused, change) in rows {
        match stats.iter_mut().find(|s| s.queue == queue) {
            Some(s) => {
                s.paused = paused;
                s.pause_change = change;
            }
            None if paused => {
                stats.push(super::QueueStats {
                    queue,
                    paused: true,
                    pause_change: change,
                    ..super::QueueStats::default()
                });
                added = true;
            }
            None => {}
        }
    }
    if added {
        stats.sort_by(|a, b| a.queue.cmp(&b.queue));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_notes_and_authors_are_refused_naming_the_field() {
        let ok = PauseNote::default()
            .note("line one\nline two\tx")
            .by("bob@host via cli");
        assert!(ok.validate().is_ok());
        assert!(PauseNote::default().validate().is_ok());
        let cases = [
            (PauseNote::default().note(""), "note", "empty"),
            (PauseNote::default().note("  "), "note", "empty"),
            (PauseNote::default().note("a\u{7}b"), "note", "control"),
            (PauseNote::default().by("a\nb"), "by", "control"),
            (PauseNote::default().by(""), "by", "empty"),
        ];
        for (n, field, what) in cases {
            let e = n.validate().unwrap_err();
            assert_eq!(e.field, field);
            assert!(e.to_string().contains(what), "{e}");
        }
        let long = "é".repeat(MAX_PAUSE_NOTE_LEN / 2 + 1);
        let e = PauseNote::default().note(&long).validate().unwrap_err();
        assert_eq!(e.field, "note");
        assert!(e.to_string().contains("1000"), "{e}");
        let exact = "x".repeat(MAX_PAUSE_NOTE_LEN);
        assert!(PauseNote::default().note(&exact).validate().is_ok());
        let by = "x".repeat(MAX_PAUSE_BY_LEN + 1);
        assert_eq!(
            PauseNote::default().by(&by).validate().unwrap_err().field,
            "by"
        );
    }
}
