//! [`TaskError`]: what a handler (or a lock-mode job) returns when it does
//! not succeed, and what the worker does with it ([`TaskAction`]): retry
//! (after the kind's or the worker's backoff, or a delay of its own), fail
//! for good, cancel, or snooze without using up an attempt.
//!
//! There is no blanket conversion from every error: a `?` on an error of
//! another type does not compile until the handler says what it means
//! (`.map_err(TaskError::retry)?`, `.map_err(TaskError::permanent)?`).
//! The conversions that exist are the principled ones:
//!
//! - [`crate::Error`] and [`StoreError`]: a store that failed or a lease
//!   that was lost is worth another attempt (a retry); bad input
//!   ([`crate::Error::Invalid`], [`InvalidInput`]) is the same input the
//!   next time, so it fails the task for good.
//! - `Box<dyn Error + Send + Sync>`: an error of unknown meaning, a retry
//!   (attempts are bounded by the task's `max_attempts`). An
//!   `anyhow::Error` goes through [`TaskError::retry`], which takes
//!   anything that converts into such a box.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, InvalidInput, StoreError};

/// A boxed error, as [`TaskError::retry`] and [`TaskError::permanent`]
/// take (a `&str`, a `String`, any `std::error::Error`, an
/// `anyhow::Error` convert into it).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A handler's result: `Ok(())` or a [`TaskError`].
pub type TaskResult<T = ()> = Result<T, TaskError>;

/// What the worker does with a [`TaskError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskAction {
    /// Run the task again while attempts are left, `after` the store's now
    /// (`None`: the kind's backoff, else the worker's); then `failed`.
    Retry {
        /// The delay this error asks for, if any.
        after: Option<Duration>,
    },
    /// Fail the task now, whatever attempts are left (a dead letter).
    Fail,
    /// Cancel the task for good, its reason kept as its last error.
    Cancel,
    /// Put the task back, due `after` the store's now, without counting the
    /// attempt (a snooze never fails a task, however often it comes).
    Snooze {
        /// How long to wait before the next run.
        after: Duration,
    },
}

/// An error from a handler: what went wrong (its text is kept on the task)
/// and what to do about it ([`TaskError::action`]).
///
/// ```
/// use std::time::Duration;
/// use baton::queue::{TaskAction, TaskError};
///
/// // A failure worth another attempt, after the backoff of the kind (or the worker):
/// let e = TaskError::retry("upstream answered 503");
/// assert_eq!(e.action(), TaskAction::Retry { after: None });
/// // ... or after a delay of its own (a Retry-After header):
/// let e = TaskError::retry("rate limited").retry_in(Duration::from_secs(30));
/// assert_eq!(e.action(), TaskAction::Retry { after: Some(Duration::from_secs(30)) });
/// // Not yet: run again in a minute, without using up an attempt.
/// let e = TaskError::snooze(Duration::from_secs(60));
/// assert_eq!(e.action(), TaskAction::Snooze { after: Duration::from_secs(60) });
/// // Never: cancel it, or fail it for good.
/// assert_eq!(TaskError::cancel("account closed").action(), TaskAction::Cancel);
/// let bad = serde_json::from_str::<u32>("x").unwrap_err();
/// let e = TaskError::permanent(bad);
/// assert_eq!(e.action(), TaskAction::Fail);
/// assert!(e.to_string().starts_with("expected value"));
/// ```
#[derive(Debug, Clone)]
pub struct TaskError {
    action: TaskAction,
    /// The text kept on the task: the error's message and its causes.
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl TaskError {
    fn of(action: TaskAction, e: BoxError) -> TaskError {
        let message = crate::error::chain(&*e);
        TaskError {
            action,
            message,
            source: Some(Arc::from(e)),
        }
    }

    /// A failure that is retried while attempts are left, after the kind's
    /// backoff ([`Worker::backoff_for`](super::Worker::backoff_for),
    /// [`TaskArgs::backoff`](super::TaskArgs::backoff)) or else the
    /// worker's ([`WorkerConfig::backoff`](super::WorkerConfig::backoff)).
    /// Takes text or any error (an `anyhow::Error` too):
    /// `.map_err(TaskError::retry)?`.
    pub fn retry(e: impl Into<BoxError>) -> TaskError {
        TaskError::of(TaskAction::Retry { after: None }, e.into())
    }

    /// A failure that ends the task as `failed` at once, without further
    /// attempts (its error kept as the last one).
    pub fn permanent(e: impl Into<BoxError>) -> TaskError {
        TaskError::of(TaskAction::Fail, e.into())
    }

    /// Cancel the task for good (state `cancelled`, `reason` kept as its
    /// last error); like an operator's cancel, it is not retried.
    pub fn cancel(reason: impl Into<String>) -> TaskError {
        TaskError {
            action: TaskAction::Cancel,
            message: reason.into(),
            source: None,
        }
    }

    /// Run the task again `after` the store's now, without counting this
    /// attempt (River's `JobSnooze`, Oban's `{:snooze, s}`): for work that
    /// is not ready yet (a file not uploaded, a rate limit's window). The
    /// task is pending meanwhile, keeps its last error, and a cancel
    /// requested while it ran cancels it instead.
    ///
    /// A snooze longer than [`MAX_DELAY`](super::MAX_DELAY) is shortened
    /// to it.
    pub fn snooze(after: Duration) -> TaskError {
        let after = after.min(super::MAX_DELAY);
        TaskError {
            action: TaskAction::Snooze { after },
            message: format!("snoozed for {}", crate::format_duration(after)),
            source: None,
        }
    }

    /// Retry this failure `after` the store's now (instead of the
    /// backoff), while attempts are left; at most
    /// [`MAX_DELAY`](super::MAX_DELAY).
    #[must_use]
    pub fn retry_in(mut self, after: Duration) -> TaskError {
        self.action = TaskAction::Retry {
            after: Some(after.min(super::MAX_DELAY)),
        };
        self
    }

    /// What the worker does with it.
    pub fn action(&self) -> TaskAction {
        self.action
    }

    /// Whether another attempt may follow ([`TaskAction::Retry`]).
    pub fn is_retry(&self) -> bool {
        matches!(self.action, TaskAction::Retry { .. })
    }

    /// The text kept on the task (the error's message and its causes, on
    /// one line; a cancel's reason; `snoozed for …`).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for TaskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TaskError {
    /// The error it was made from (its text already in the message).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A store failure or a lost lease is retried; bad input fails the task
/// for good (it would be the same input the next time).
impl From<Error> for TaskError {
    fn from(e: Error) -> Self {
        match e {
            Error::Task(t) => t,
            Error::Invalid(i) => TaskError::permanent(i),
            other => TaskError::retry(other),
        }
    }
}

/// Retried: attempts are bounded, and most store failures pass.
impl From<StoreError> for TaskError {
    fn from(e: StoreError) -> Self {
        TaskError::retry(e)
    }
}

/// Fails the task for good: the same input fails the same way again.
impl From<InvalidInput> for TaskError {
    fn from(e: InvalidInput) -> Self {
        TaskError::permanent(e)
    }
}

/// An error of unknown meaning: retried while attempts are left.
impl From<BoxError> for TaskError {
    fn from(e: BoxError) -> Self {
        TaskError::retry(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn the_message_holds_the_causes_once_and_the_source_is_kept() {
        let io = std::io::Error::other("disk full");
        let e = TaskError::retry(StoreError::Driver {
            retryable: true,
            context: "writing".into(),
            source: Box::new(io),
        });
        assert_eq!(e.message(), "store unavailable: writing: disk full");
        assert_eq!(e.to_string(), e.message());
        let src = e.source().expect("the store error is the source");
        assert!(src.downcast_ref::<StoreError>().is_some(), "{src:?}");
    }

    #[test]
    fn conversions_say_what_retrying_can_fix() {
        let bad: TaskError = Error::Invalid(InvalidInput::new("queue", "too long")).into();
        assert_eq!(bad.action(), TaskAction::Fail);
        assert_eq!(bad.message(), "queue: too long");
        let lost: TaskError = Error::LeaseLost("task 7".into()).into();
        assert!(lost.is_retry());
        let boxed: TaskError = BoxError::from("odd").into();
        assert_eq!(boxed.action(), TaskAction::Retry { after: None });
        let d = Duration::from_millis(1500);
        assert_eq!(
            TaskError::permanent("x").retry_in(d).action(),
            TaskAction::Retry { after: Some(d) }
        );
        assert_eq!(TaskError::snooze(d).message(), "snoozed for 1500ms");
        assert_eq!(TaskError::cancel("gone").message(), "gone");
    }

    #[test]
    fn a_snooze_or_retry_delay_is_at_most_max_delay() {
        let forever = Duration::MAX;
        let max = crate::queue::MAX_DELAY;
        assert_eq!(
            TaskError::snooze(forever).action(),
            TaskAction::Snooze { after: max }
        );
        assert_eq!(
            TaskError::retry("x").retry_in(forever).action(),
            TaskAction::Retry { after: Some(max) }
        );
    }
}
