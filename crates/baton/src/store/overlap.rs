//! A job's overlap policy: what a slot does when the job's previous run is
//! unfinished, and the records it leaves (DESIGN.md S7). The decision is
//! the store's, taken with the slot's compare-and-set
//! (`store::job_advance`); a slot that waits is a pending task whose
//! `run_at` is [`WAITING_RUN_AT`] (so no claim takes it) until
//! [`Backend::job_release`](super::Backend::job_release) finds the job's
//! earlier runs all finished and makes it due.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// How the scheduler treats a slot when the job's previous run is
/// unfinished (pending or running). Written in config and the API in
/// snake case (`skip`, `allow`, `buffer_one`, `buffer_all`,
/// `cancel_other`, `terminate_other`); `forbid` is read as `skip`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Record the slot as skipped (a `cancelled` task whose `last_error`
    /// is [`OVERLAP_SKIPPED`]). Formerly `forbid`, still accepted.
    #[default]
    #[serde(alias = "forbid")]
    Skip,
    /// Enqueue it anyway: runs may overlap.
    Allow,
    /// Record the slot waiting; it starts once every earlier run of the
    /// job has finished. At most one slot waits: a further slot while one
    /// waits is recorded skipped ([`OVERLAP_BUFFER_FULL`]).
    BufferOne,
    /// Record every such slot waiting; they start one at a time, in slot
    /// order, each once the earlier runs have finished.
    BufferAll,
    /// Ask the running previous run to stop (a cancel request, seen at
    /// its next heartbeat: lease-safe), cancel previous runs that have
    /// not started ([`OVERLAP_REPLACED`]), and record the slot waiting
    /// until the previous run has stopped.
    CancelOther,
    /// Decided in the store as [`Overlap::CancelOther`]; the running
    /// previous run is then stopped at once rather than gracefully: `baton
    /// serve` kills a job command's process tree without its `--grace`
    /// when the run is cancelled. An in-process handler sees
    /// [`StopReason::Cancelled`](crate::queue::StopReason) as under
    /// `CancelOther` and should return at once.
    TerminateOther,
}

/// Every accepted spelling, for error messages.
pub const OVERLAP_FORMS: &str =
    "skip (or forbid), allow, buffer_one, buffer_all, cancel_other, terminate_other";

impl Overlap {
    /// The config/API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
            Overlap::BufferOne => "buffer_one",
            Overlap::BufferAll => "buffer_all",
            Overlap::CancelOther => "cancel_other",
            Overlap::TerminateOther => "terminate_other",
        }
    }

    /// Whether a slot under this policy may wait for the previous run
    /// (then the scheduler releases waiting slots as runs finish).
    pub fn may_wait(self) -> bool {
        matches!(
            self,
            Overlap::BufferOne
                | Overlap::BufferAll
                | Overlap::CancelOther
                | Overlap::TerminateOther
        )
    }

    /// Whether a slot under this policy stops the job's previous run
    /// ([`Overlap::CancelOther`], [`Overlap::TerminateOther`]).
    pub fn replaces(self) -> bool {
        matches!(self, Overlap::CancelOther | Overlap::TerminateOther)
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown overlap policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("overlap: unknown policy {0:?}; expected one of {OVERLAP_FORMS}")]
pub struct UnknownOverlap(pub String);

impl FromStr for Overlap {
    type Err = UnknownOverlap;

    fn from_str(s: &str) -> Result<Overlap, UnknownOverlap> {
        Ok(match s {
            "skip" | "forbid" => Overlap::Skip,
            "allow" => Overlap::Allow,
            "buffer_one" => Overlap::BufferOne,
            "buffer_all" => Overlap::BufferAll,
            "cancel_other" => Overlap::CancelOther,
            "terminate_other" => Overlap::TerminateOther,
            _ => return Err(UnknownOverlap(s.to_string())),
        })
    }
}

/// The reason kept on a slot skipped by [`Overlap::Skip`].
pub const OVERLAP_SKIPPED: &str = "skipped: previous run still pending or running";

/// The reason kept on a slot skipped by [`Overlap::BufferOne`] because a
/// slot already waits.
pub const OVERLAP_BUFFER_FULL: &str =
    "skipped: a slot is already waiting for the previous run (overlap = buffer_one)";

/// The reason kept on a previous run that had not started when a later
/// slot replaced it under [`Overlap::CancelOther`] (it is cancelled).
pub const OVERLAP_REPLACED: &str = "cancelled: replaced by a later slot (overlap = cancel_other)";

/// `run_at` of a slot's task waiting for the job's previous run, in ms
/// since the epoch (9999-01-01T00:00:00Z): never due, so no claim takes
/// it; `job_release` sets it to the store's now.
pub const WAITING_RUN_AT_MS: i64 = 253_370_764_800_000;

/// [`WAITING_RUN_AT_MS`] as an instant.
pub fn waiting_run_at() -> DateTime<Utc> {
    DateTime::from_timestamp_millis(WAITING_RUN_AT_MS).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Whether a pending task's `run_at` marks it waiting for the job's
/// previous run.
pub fn is_waiting(run_at: DateTime<Utc>) -> bool {
    run_at.timestamp_millis() >= WAITING_RUN_AT_MS
}

/// [`Backend::job_release`](super::Backend::job_release) for `job`,
/// logged: what the scheduler calls on a short poll (for jobs under a
/// policy that may wait) and the worker when a slot's run ends (through
/// [`WaitingJobs`]).
pub(crate) async fn release_waiting(store: &super::Store, job: &str) {
    match store.backend().job_release(job).await {
        Ok(Some(id)) => {
            tracing::info!(job = %job, task = id, "waiting slot started: the previous run finished");
        }
        Ok(None) => {}
        Err(e) => {
            tracing::debug!(job = %job, error = %crate::error::chain(&e), "releasing a waiting slot failed");
        }
    }
}

/// How long a worker trusts the overlap policy it read for a job.
pub(crate) const POLICY_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// The most jobs a worker remembers a policy of (past it, the memory
/// starts afresh).
const POLICY_MEMORY: usize = 10_000;

/// A worker's memory of its jobs' overlap policies, as the jobs' records
/// say (registered by the schedulers, [`JobRegister::overlap`](super::JobRegister::overlap)):
/// when a slot's run ends, the worker asks the store to start a waiting
/// slot only for a job whose policy may leave one waiting. A run of a
/// `skip` or `allow` job then costs no `job_release` (a transaction
/// locking the job's row and reading its unfinished runs), only one
/// `job_get` per job every [`POLICY_TTL`]. A job with no recorded
/// policy (registered by an older build) is released as before. A
/// policy changed to a waiting one since the read is covered by the
/// schedulers' poll ([`release_waiting`] every second for such jobs).
#[derive(Debug, Default)]
pub(crate) struct WaitingJobs {
    known: std::sync::Mutex<std::collections::HashMap<String, (bool, std::time::Instant)>>,
}

impl WaitingJobs {
    /// Whether `job`'s runs may have a slot waiting for them, from memory
    /// or (stale or unknown) the job's record; `true` when the record
    /// cannot be read.
    pub(crate) async fn may_wait(&self, store: &super::Store, job: &str) -> bool {
        let now = std::time::Instant::now();
        if let Ok(known) = self.known.lock() {
            if let Some((waits, at)) = known.get(job) {
                if now.duration_since(*at) < POLICY_TTL {
                    return *waits;
                }
            }
        }
        let waits = match store.backend().job_get(job).await {
            Ok(Some(state)) => state.overlap.is_none_or(Overlap::may_wait),
            // Unknown (nothing to release) or unreadable: let the release
            // decide, without remembering it.
            Ok(None) | Err(_) => return true,
        };
        if let Ok(mut known) = self.known.lock() {
            if known.len() >= POLICY_MEMORY {
                known.clear();
            }
            known.insert(job.to_string(), (waits, now));
        }
        waits
    }

    /// [`release_waiting`] for `job` when [`WaitingJobs::may_wait`] says so.
    pub(crate) async fn release(&self, store: &super::Store, job: &str) {
        if self.may_wait(store, job).await {
            release_waiting(store, job).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_round_trips_and_forbid_reads_as_skip() {
        for o in [
            Overlap::Skip,
            Overlap::Allow,
            Overlap::BufferOne,
            Overlap::BufferAll,
            Overlap::CancelOther,
            Overlap::TerminateOther,
        ] {
            assert_eq!(o.as_str().parse::<Overlap>(), Ok(o));
            let json = serde_json::to_string(&o).unwrap();
            assert_eq!(json, format!("\"{o}\""));
            assert_eq!(serde_json::from_str::<Overlap>(&json).unwrap(), o);
        }
        assert_eq!("forbid".parse::<Overlap>(), Ok(Overlap::Skip));
        assert_eq!(
            serde_json::from_str::<Overlap>("\"forbid\"").unwrap(),
            Overlap::Skip
        );
        let e = "replace".parse::<Overlap>().unwrap_err().to_string();
        assert!(e.contains("overlap") && e.contains("buffer_one"), "{e}");
        assert_eq!(waiting_run_at().to_rfc3339(), "9999-01-01T00:00:00+00:00");
    }
}
