//! Debounce and throttle: an enqueue policy on a task's unique key
//! ([`KeyPolicy`]), decided by the store atomically with the insert, and
//! what an enqueue did ([`EnqueueOutcome`]).
//!
//! Both are the unique key's rules with one more step, written once here
//! ([`plan`]) and carried out by every backend in the insert's own
//! transaction or script: the backend reads the key's *holder* (the
//! unfinished task holding the key, its row locked) and the key's *last
//! start* (the latest `started_at` among the tasks with that key), then
//! does what [`plan`] says.
//!
//! | policy | holder pending | holder running | no holder |
//! |---|---|---|---|
//! | `Debounce(d)` | payload and priority replaced, `run_at = now + d` → `Debounced` | the key passes to a new pending task (the running one keeps running, unchanged but for losing its key) → `Inserted` | inserted with `run_at = now + d` → `Inserted` |
//! | `Throttle(p)` | that task → `Existing` | `Throttled { until }` if it started within `p`, else `Existing` | `Throttled { until }` if the key's last start is within `p`, else inserted → `Inserted` |
//!
//! `until` is the last start plus `p`, in the store's clock.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{InvalidInput, StoreError};
use crate::store::{from_ms, ms, NewTask, RunAt, TaskState, UniqueHold};

/// The longest debounce accepted (30 days).
pub const MAX_DEBOUNCE: Duration = Duration::from_secs(30 * 24 * 3600);

/// The longest throttle period accepted (366 days).
pub const MAX_THROTTLE: Duration = Duration::from_secs(366 * 24 * 3600);

/// What an enqueue with a unique key does when the key was used lately
/// ([`TaskBuilder::debounce`](crate::queue::TaskBuilder::debounce),
/// [`TaskBuilder::throttle`](crate::queue::TaskBuilder::throttle)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyPolicy {
    /// Run once, this long after the last enqueue of the key: a pending
    /// task holding the key takes the new payload and priority and is due
    /// this long after the store's now; a running one is left alone and a
    /// new pending task takes the key.
    Debounce(Duration),
    /// At most one start per period: refused (`Throttled { until }`)
    /// while a task with the key started less than this long ago by the
    /// store's clock.
    Throttle(Duration),
}

impl KeyPolicy {
    /// The field that names it: `debounce` or `throttle`.
    pub fn field(self) -> &'static str {
        match self {
            KeyPolicy::Debounce(_) => "debounce",
            KeyPolicy::Throttle(_) => "throttle",
        }
    }
}

/// What an enqueue did with one task ([`Enqueued::outcome`](crate::store::Enqueued::outcome)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum EnqueueOutcome {
    /// A new task was inserted.
    #[default]
    Inserted,
    /// The key was taken: the task holding it is returned, unchanged.
    Existing,
    /// Debounce: the pending task holding the key took the new payload and
    /// priority and is due `debounce` after the store's now.
    Debounced,
    /// Throttle: refused, nothing written; the returned task started
    /// within the period, and an enqueue of the key is accepted again
    /// from `until` (store time).
    Throttled {
        /// When the key may run again: its last start plus the period.
        until: DateTime<Utc>,
    },
}

/// The result of enqueueing one [`NewTask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enqueued {
    /// The task's id: the new task's, or the one the key led to (the
    /// holder, the debounced task, the task that started last).
    pub id: i64,
    /// True exactly when a new task was inserted.
    pub inserted: bool,
    /// What happened (`Inserted` when a serialized answer lacks it).
    #[serde(default)]
    pub outcome: EnqueueOutcome,
}

impl Enqueued {
    /// A new task `id`.
    pub fn new(id: i64) -> Enqueued {
        Enqueued {
            id,
            inserted: true,
            outcome: EnqueueOutcome::Inserted,
        }
    }

    /// The task `id` already holding the key, unchanged.
    pub fn existing(id: i64) -> Enqueued {
        Enqueued {
            id,
            inserted: false,
            outcome: EnqueueOutcome::Existing,
        }
    }
}

/// What a backend read of a key, inside the insert's transaction: the
/// unfinished task holding it (row locked) and the key's latest start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeySeen {
    /// The holder's id and state.
    pub holder: Option<(i64, TaskState)>,
    /// The id and `started_at` (ms) of the task with the key that started
    /// last.
    pub last_start: Option<(i64, i64)>,
    /// The store's now (ms).
    pub now_ms: i64,
}

impl KeySeen {
    /// From the columns a SQL backend reads: the holder's id and state,
    /// the last start's id and instant (ms), and now (ms).
    pub(crate) fn from_columns(
        holder: (Option<i64>, Option<&str>),
        last_start: (Option<i64>, Option<i64>),
        now_ms: i64,
    ) -> Result<KeySeen, StoreError> {
        Ok(KeySeen {
            holder: match holder {
                (Some(id), Some(st)) => Some((id, st.parse::<TaskState>()?)),
                _ => None,
            },
            last_start: match last_start {
                (Some(id), Some(at)) => Some((id, at)),
                _ => None,
            },
            now_ms,
        })
    }
}

/// What the backend does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyPlan {
    /// Insert the task as `task_insert_many` does.
    Insert,
    /// Clear the key of running task `id`, then insert.
    HandOver(i64),
    /// Set pending task `id`'s payload and priority to the new task's and
    /// its `run_at` to `run_at_ms`.
    Replace {
        /// The pending task.
        id: i64,
        /// Its new due time (ms).
        run_at_ms: i64,
    },
    /// Answer task `id`, unchanged.
    Existing(i64),
    /// Refuse: task `id` started within the period; allowed at `until_ms`.
    Throttled {
        /// The task that started last.
        id: i64,
        /// Its start plus the period (ms).
        until_ms: i64,
    },
}

/// The decision of the table in the module docs.
pub(crate) fn plan(policy: KeyPolicy, seen: KeySeen) -> KeyPlan {
    match policy {
        KeyPolicy::Debounce(d) => match seen.holder {
            Some((id, TaskState::Pending)) => KeyPlan::Replace {
                id,
                run_at_ms: seen.now_ms + ms(d),
            },
            Some((id, TaskState::Running)) => KeyPlan::HandOver(id),
            // Only an unfinished task holds a debounced key (the builder
            // refuses other holds); a finished holder is answered as is.
            Some((id, _)) => KeyPlan::Existing(id),
            None => KeyPlan::Insert,
        },
        KeyPolicy::Throttle(p) => {
            if let Some((id, TaskState::Pending)) = seen.holder {
                return KeyPlan::Existing(id);
            }
            if let Some((id, at)) = seen.last_start {
                let until_ms = at.saturating_add(ms(p));
                if seen.now_ms < until_ms {
                    return KeyPlan::Throttled { id, until_ms };
                }
            }
            match seen.holder {
                Some((id, _)) => KeyPlan::Existing(id),
                None => KeyPlan::Insert,
            }
        }
    }
}

impl KeyPlan {
    /// The answer for a plan that writes no new task (`None` for `Insert`
    /// and `HandOver`, whose answer is the insert's).
    pub(crate) fn answer(self) -> Result<Option<Enqueued>, StoreError> {
        Ok(match self {
            KeyPlan::Insert | KeyPlan::HandOver(_) => None,
            KeyPlan::Replace { id, .. } => Some(Enqueued {
                id,
                inserted: false,
                outcome: EnqueueOutcome::Debounced,
            }),
            KeyPlan::Existing(id) => Some(Enqueued::existing(id)),
            KeyPlan::Throttled { id, until_ms } => Some(Enqueued {
                id,
                inserted: false,
                outcome: EnqueueOutcome::Throttled {
                    until: from_ms(until_ms)?,
                },
            }),
        })
    }
}

/// One SQL backend's side of an enqueue with a [`KeyPolicy`], inside the
/// insert's transaction (SQLite `BEGIN IMMEDIATE`; PostgreSQL and MySQL
/// with the holder's row locked by [`KeyTx::key_seen`]).
#[async_trait]
pub(crate) trait KeyTx: Send {
    /// The key's holder (its row locked), its last start, the store's now.
    async fn key_seen(&mut self, key: &str) -> Result<KeySeen, StoreError>;
    /// Clear running task `id`'s unique key: it passes to the task about
    /// to be inserted.
    async fn key_hand_over(&mut self, id: i64) -> Result<(), StoreError>;
    /// Give pending task `id` the payload and priority of `task` and the
    /// due time `run_at_ms`; false when it is no longer pending.
    async fn key_replace(
        &mut self,
        id: i64,
        task: &NewTask,
        run_at_ms: i64,
    ) -> Result<bool, StoreError>;
    /// Insert `task` as `task_insert_many` does.
    async fn key_insert(&mut self, task: &NewTask) -> Result<Enqueued, StoreError>;
}

/// Enqueue `task` (which has a policy and a key) on `tx`: read, [`plan`],
/// act. A plan overtaken by a writer that does not lock what was read (a
/// claim taking the pending task on MySQL, a plain enqueue inserting the
/// key) is made again from a fresh read; three rounds are plenty, since
/// each overtaking write moves the key forward once.
pub(crate) async fn enqueue_keyed<T: KeyTx>(
    tx: &mut T,
    task: &NewTask,
) -> Result<Enqueued, StoreError> {
    let (Some(policy), Some(key)) = (task.key_policy, task.unique_key.as_deref()) else {
        return Err(StoreError::Config(
            "debounce and throttle need a unique key".into(),
        ));
    };
    for _ in 0..3 {
        let p = plan(policy, tx.key_seen(key).await?);
        match p {
            KeyPlan::Insert | KeyPlan::HandOver(_) => {
                if let KeyPlan::HandOver(id) = p {
                    tx.key_hand_over(id).await?;
                }
                let e = tx.key_insert(task).await?;
                if e.inserted {
                    return Ok(e);
                }
            }
            KeyPlan::Replace { id, run_at_ms } => {
                if tx.key_replace(id, task, run_at_ms).await? {
                    return Ok(p.answer()?.unwrap_or(Enqueued::existing(id)));
                }
            }
            KeyPlan::Existing(id) | KeyPlan::Throttled { id, .. } => {
                return Ok(p.answer()?.unwrap_or(Enqueued::existing(id)));
            }
        }
    }
    Err(StoreError::Conflict(format!(
        "{}: the key {key:?} kept changing while the enqueue read it; try again",
        policy.field()
    )))
}

/// Check a task's policy where it enters (the builder and again after the
/// insert middleware): a unique key held while unfinished, no schedule
/// slot, a period in range, and for debounce a due time the policy sets.
pub(crate) fn check_key_policy(t: &NewTask) -> Result<(), InvalidInput> {
    let Some(p) = t.key_policy else {
        return Ok(());
    };
    let field = p.field();
    if t.unique_key.is_none() {
        return Err(InvalidInput::new(
            field,
            "needs a unique key to act on; give one (TaskBuilder::unique_key, \
             `--unique-key`, or unique by args)",
        ));
    }
    if t.unique_hold != UniqueHold::Unfinished {
        return Err(InvalidInput::new(
            "unique_hold",
            format!(
                "{} cannot be used with {field}, which acts on the task holding the key \
                 while it is unfinished; use unfinished (the default)",
                t.unique_hold
            ),
        ));
    }
    if t.job.is_some() || t.slot.is_some() {
        return Err(InvalidInput::new(
            field,
            "a schedule slot's task cannot be debounced or throttled; the scheduler \
             runs each slot once",
        ));
    }
    let (d, min, max, eg) = match p {
        KeyPolicy::Debounce(d) => (d, Duration::from_millis(1), MAX_DEBOUNCE, "5s"),
        KeyPolicy::Throttle(d) => (d, Duration::from_secs(1), MAX_THROTTLE, "1h"),
    };
    if d < min || d > max {
        return Err(InvalidInput::new(
            field,
            format!(
                "{} is out of range; use {} to {} (e.g. {eg})",
                crate::format_duration(d),
                crate::format_duration(min),
                crate::format_duration(max)
            ),
        ));
    }
    if let KeyPolicy::Debounce(d) = p {
        if t.run_at != RunAt::Delay(d) {
            return Err(InvalidInput::new(
                "run_at",
                "a debounced task is due its debounce after the last enqueue; \
                 leave out delay and run_at",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(holder: Option<(i64, TaskState)>, last: Option<(i64, i64)>) -> KeySeen {
        KeySeen {
            holder,
            last_start: last,
            now_ms: 10_000,
        }
    }

    #[test]
    fn plans_follow_the_table() {
        let d = KeyPolicy::Debounce(Duration::from_secs(5));
        let t = KeyPolicy::Throttle(Duration::from_secs(60));
        assert_eq!(plan(d, seen(None, None)), KeyPlan::Insert);
        assert_eq!(
            plan(d, seen(Some((3, TaskState::Pending)), None)),
            KeyPlan::Replace {
                id: 3,
                run_at_ms: 15_000
            }
        );
        assert_eq!(
            plan(d, seen(Some((3, TaskState::Running)), Some((3, 9_000)))),
            KeyPlan::HandOver(3)
        );
        assert_eq!(plan(t, seen(None, None)), KeyPlan::Insert);
        assert_eq!(
            plan(t, seen(Some((4, TaskState::Pending)), Some((2, 9_999)))),
            KeyPlan::Existing(4)
        );
        assert_eq!(
            plan(t, seen(None, Some((2, 9_999)))),
            KeyPlan::Throttled {
                id: 2,
                until_ms: 69_999
            }
        );
        assert_eq!(plan(t, seen(None, Some((2, -50_000)))), KeyPlan::Insert);
        // Exactly the period after the start is allowed again.
        assert_eq!(
            plan(t, seen(None, Some((2, -50_000 + 1))))
                .answer()
                .unwrap()
                .map(|e| e.id),
            Some(2)
        );
        assert_eq!(
            plan(t, seen(Some((5, TaskState::Running)), Some((5, -60_000)))),
            KeyPlan::Existing(5)
        );
    }
}
