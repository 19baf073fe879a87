//! Lock history: who held which lock, with which token, from when until
//! its release — one record a release, written by the release itself (the
//! same statement on PostgreSQL, the same script on Redis, the same
//! transaction on SQLite and MySQL), kept [`LOCK_HISTORY_RETENTION`] and
//! at most [`LOCK_HISTORY_PER_LOCK`] a lock ([`Backend::lock_history_prune_many`]).
//! A lease that lapsed (its holder died) or was revoked has no release,
//! so no record: the audit log has the revocations.
//!
//! [`Backend::lock_history_prune_many`]: super::Backend::lock_history_prune_many

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::FencingToken;

/// How long a release is kept: a day.
pub const LOCK_HISTORY_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The most releases kept a lock (the newest).
pub const LOCK_HISTORY_PER_LOCK: usize = 100;

/// One lease that was released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRecord {
    /// The lock.
    pub name: String,
    /// Who held it.
    pub holder: String,
    /// The grant's fencing token.
    pub token: FencingToken,
    /// When it was granted (store time).
    pub acquired_at: DateTime<Utc>,
    /// When it was released (store time; the lease may last until its
    /// `at_least`).
    pub released_at: DateTime<Utc>,
}

/// Params of [`Backend::lock_history_list`](super::Backend::lock_history_list):
/// one lock's releases or every lock's, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockHistoryQuery {
    /// Only this lock.
    pub name: Option<String>,
    /// At most this many (0 means 100).
    pub limit: u32,
}

impl LockHistoryQuery {
    /// The most records asked for (0 means 100).
    pub(crate) fn size(&self) -> u32 {
        super::audit::page_size(self.limit)
    }
}
