//! The audit log's records: who did what to which target, from where, and
//! how it ended — kept in the store so every instance lists the same
//! trail, pruned by age ([`Backend::audit_prune_many`]).
//!
//! [`Backend::audit_prune_many`]: super::Backend::audit_prune_many

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The longest field of an audit record, in bytes; longer text is cut (at
/// a character boundary) and ends with `…`.
pub const MAX_AUDIT_FIELD: usize = 1024;

/// Params of [`Backend::audit_append`](super::Backend::audit_append): one
/// operator action to record, at the store's now.
#[derive(Debug, Clone, Copy)]
pub struct AuditAppend<'a> {
    /// Who: a token's name (`api:alice`), a CLI user (`ana@host`).
    pub actor: &'a str,
    /// What, e.g. `POST /api/v1/queues/{name}/pause`, `tasks retry`.
    pub action: &'a str,
    /// On what, e.g. `queue emails`, `task 42`.
    pub target: &'a str,
    /// From where: `api`, `dashboard` or `cli`.
    pub source: &'a str,
    /// How it ended, e.g. `200`, `409 already finished`, `done`.
    pub outcome: &'a str,
}

/// One recorded action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Its id: later records have larger ids.
    pub id: i64,
    /// When it was recorded (store time).
    pub at: DateTime<Utc>,
    /// Who.
    pub actor: String,
    /// What.
    pub action: String,
    /// On what.
    pub target: String,
    /// From where.
    pub source: String,
    /// How it ended.
    pub outcome: String,
}

/// A page of the audit log, newest first.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuditPage {
    /// Only ids below this one (the previous page's last id).
    pub before_id: Option<i64>,
    /// Page size (0 means 100).
    pub limit: u32,
}

impl AuditPage {
    /// The page size asked for (0 means 100).
    pub(crate) fn size(&self) -> u32 {
        page_size(self.limit)
    }
}

/// A page size asked for as `limit`: 0 means 100.
pub(crate) fn page_size(limit: u32) -> u32 {
    if limit == 0 {
        100
    } else {
        limit
    }
}

/// `s` cut to [`MAX_AUDIT_FIELD`] bytes at a character boundary, ending
/// with `…` when cut.
pub(crate) fn clip_field(s: &str) -> std::borrow::Cow<'_, str> {
    if s.len() <= MAX_AUDIT_FIELD {
        return s.into();
    }
    let mut end = MAX_AUDIT_FIELD - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end]).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_fields_are_cut_at_a_character_boundary() {
        assert_eq!(clip_field("short"), "short");
        let long = "é".repeat(MAX_AUDIT_FIELD);
        let cut = clip_field(&long);
        assert!(
            cut.len() <= MAX_AUDIT_FIELD && cut.ends_with('…'),
            "{}",
            cut.len()
        );
    }
}
