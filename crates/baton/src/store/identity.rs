//! Noticing a store that forgot: the identity a [`Store`](super::Store)
//! saw at connect, checked again at the upkeep.
//!
//! Every store records a random id once, when it is created or first
//! migrated ([`StoreIdentity::id`]). A store that lost its data (a Redis
//! restarted without AOF, a database dropped and created again) answers
//! another id or none; one restored from an older backup answers the same
//! id but a task id counter below the highest this process read before.
//! Either is logged once as an error naming what was lost, counted
//! ([`IdentityWatch::changes`], the `baton_store_identity_changes_total`
//! metric), and kept ([`IdentityWatch::lost`], which fails `/readyz`)
//! until the process restarts and takes the store as it is now.
//!
//! The watch also says when the task id counter is to be floored at the
//! store's clock ([`IdentityWatch::floor_due`]: at the first check and
//! after each change; DESIGN.md I1), so task ids never repeat across a
//! restore.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::StoreIdentity;

/// How often the upkeep reads the store's identity again: a worker at its
/// rescue ticks once this long passed since the last check, a scheduler
/// on a timer of its own; one check serves every clone of the store (a
/// `baton serve`'s worker and scheduler make one between them).
pub const IDENTITY_CHECK: Duration = Duration::from_secs(10);

/// What a process saw of its store's identity (see the module docs).
#[derive(Debug, Default)]
pub struct IdentityWatch {
    state: Mutex<Seen>,
    changes: AtomicU64,
    /// When the upkeep last took a check (see [`IdentityWatch::take_due`]).
    last_check: Mutex<Option<Instant>>,
}

#[derive(Debug)]
struct Seen {
    /// The identity last read; `None` until one was read that had an id.
    id: Option<String>,
    /// The highest task id counter read.
    high: i64,
    /// The first change found: why the store is not the one connected to.
    lost: Option<String>,
    /// The task id counter has not been floored since connect or since
    /// the last change (see [`IdentityWatch::floor_due`]).
    floor_pending: bool,
    /// A floor failed since the last one that worked (said once).
    floor_failing: bool,
}

impl Default for Seen {
    fn default() -> Seen {
        Seen {
            id: None,
            high: 0,
            lost: None,
            floor_pending: true,
            floor_failing: false,
        }
    }
}

impl IdentityWatch {
    /// Whether the store's task id counter is to be floored at its clock
    /// now: at the first check of a process and after each change found
    /// (a restored backup sets the counter back; a process connecting
    /// after it cannot know, so every process floors once at connect).
    pub fn floor_due(&self) -> bool {
        self.state.lock().map(|s| s.floor_pending).unwrap_or(false)
    }

    /// The floor was done.
    pub fn floored(&self) {
        if let Ok(mut s) = self.state.lock() {
            if s.floor_failing {
                tracing::info!("the task id counter is floored at the store's clock again");
            }
            s.floor_pending = false;
            s.floor_failing = false;
        }
    }

    /// The floor failed: said once (a warning) until one works; the next
    /// check tries again.
    pub fn floor_failed(&self, kind: &str, e: &crate::error::StoreError) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        if !s.floor_failing {
            s.floor_failing = true;
            // A read-only store is said once by the write watch.
            crate::store::warn_unless_read_only!(
                e,
                store = kind,
                error = %crate::error::chain(e),
                "could not floor the task id counter at the store's clock (tried again at the \
                 next identity check); until then a task id handed out before a restore of \
                 an older backup could be handed out again"
            );
        }
    }

    /// The identity seen (the one at connect, or the last one read after
    /// a change), if any was read.
    pub fn id(&self) -> Option<String> {
        self.state.lock().ok().and_then(|s| s.id.clone())
    }

    /// The first change found, if any: why this process no longer trusts
    /// the store it connected to.
    pub fn lost(&self) -> Option<String> {
        self.state.lock().ok().and_then(|s| s.lost.clone())
    }

    /// Whether an upkeep check is due: true (and the check taken, so other
    /// clones of the store skip theirs) when none was taken in the last
    /// `every`.
    pub fn take_due(&self, every: Duration) -> bool {
        let Ok(mut last) = self.last_check.lock() else {
            return true;
        };
        let now = Instant::now();
        if last.is_some_and(|t| now.saturating_duration_since(t) < every) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// How many changes the checks found (each logged once).
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// Compare a fresh read with what was seen; on a change, log it once
    /// (an error), count it, keep the first as [`IdentityWatch::lost`],
    /// and return its reason. `kind` names the backend in the message.
    pub fn observe(&self, kind: &str, read: &StoreIdentity) -> Option<String> {
        let Ok(mut s) = self.state.lock() else {
            return None;
        };
        let reason = match (&s.id, &read.id) {
            // Nothing seen yet (a store not migrated when we connected, or
            // the first read after a change to no identity): take it.
            (None, _) => None,
            (Some(was), Some(now)) if was == now => (read.last_task_id < s.high).then(|| {
                format!(
                    "{kind} store went back in time: its task id counter is {} but this \
                     process saw {} before (store identity {was} unchanged): the store was \
                     restored from an older backup; tasks, locks and schedule cursors \
                     written after that backup are gone",
                    read.last_task_id, s.high
                )
            }),
            (Some(was), now) => Some(format!(
                "store identity changed from {was} to {}: the {kind} store lost its data (a \
                 Redis restarted without AOF, a restored backup, a dropped database); tasks \
                 and locks written before are gone, and schedule cursors start again",
                now.as_deref().unwrap_or("none (no identity recorded)")
            )),
        };
        if let Some(why) = &reason {
            tracing::error!(
                store = kind,
                "{why}; restart baton processes once the store is as it should be"
            );
            self.changes.fetch_add(1, Ordering::Relaxed);
            s.floor_pending = true;
            if s.lost.is_none() {
                s.lost = Some(why.clone());
            }
            // The store as it is now is the baseline for later checks, so
            // each change is said once.
            s.high = read.last_task_id;
        } else {
            s.high = s.high.max(read.last_task_id);
        }
        if read.id.is_some() || reason.is_some() {
            s.id = read.id.clone();
        }
        reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(id: Option<&str>, last: i64) -> StoreIdentity {
        StoreIdentity {
            id: id.map(str::to_string),
            last_task_id: last,
        }
    }

    #[test]
    fn a_change_is_found_once_and_kept() {
        let w = IdentityWatch::default();
        assert_eq!(w.observe("redis", &read(Some("a"), 5)), None);
        assert_eq!(w.observe("redis", &read(Some("a"), 9)), None);
        let why = w.observe("redis", &read(None, 0)).expect("a change");
        assert!(
            why.contains("from a to none") && why.contains("lost its data"),
            "{why}"
        );
        assert_eq!(w.observe("redis", &read(None, 3)), None, "said once");
        // A new identity written after the loss: taken without a second alarm.
        assert_eq!(w.observe("redis", &read(Some("b"), 4)), None);
        assert_eq!(w.changes(), 1);
        assert_eq!(w.lost().as_deref(), Some(why.as_str()));
        let again = w
            .observe("redis", &read(Some("c"), 4))
            .expect("another change");
        assert!(again.contains("from b to c"), "{again}");
        assert_eq!(w.changes(), 2);
        assert_eq!(w.lost().as_deref(), Some(why.as_str()), "the first stays");
    }

    #[test]
    fn a_counter_going_down_is_a_restored_backup() {
        let w = IdentityWatch::default();
        assert_eq!(w.observe("postgres", &read(Some("a"), 50)), None);
        let why = w
            .observe("postgres", &read(Some("a"), 20))
            .expect("back in time");
        assert!(
            why.contains("went back in time") && why.contains("50"),
            "{why}"
        );
        assert_eq!(
            w.observe("postgres", &read(Some("a"), 21)),
            None,
            "said once"
        );
        assert_eq!(w.changes(), 1);
    }

    #[test]
    fn no_identity_at_first_is_not_a_change() {
        let w = IdentityWatch::default();
        assert_eq!(w.observe("sqlite", &read(None, 0)), None);
        assert_eq!(w.observe("sqlite", &read(Some("a"), 0)), None);
        assert_eq!(w.changes(), 0);
        assert_eq!(w.lost(), None);
    }
}
