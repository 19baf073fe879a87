//! The task state machine as one table: from state, operation and condition
//! to the next state. Every backend makes exactly these transitions (each
//! atomic, each operation on a running task a compare-and-set on its claim
//! token); anything not in the table is refused and leaves the task as it
//! was. The conformance suite drives every row on every store
//! (`tests/conformance/states.rs`) and its model checker decides with
//! [`next`]. DESIGN.md ("Task states") lists the same rows with what each
//! one changes besides the state.
//!
//! A task's birth is a row too, with no from-state (`from: None`): an
//! insert ([`Op::Insert`]: `task_insert_many`, or `job_advance` enqueueing
//! a slot) makes it `pending`; `job_advance` makes a skipped slot's task
//! `cancelled` ([`Op::AdvanceSkip`]) and a lock-mode run record `running`
//! ([`Op::AdvanceRun`]), each in the insert's own transaction or script.
//! No backend inserts a task in any other state.

use super::TaskState;
use TaskState::{Cancelled, Failed, Pending, Running, Succeeded};

/// An operation on one task, as the seam names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `task_claim` picks the task (it is due and first in order).
    Claim,
    /// `task_heartbeat_many` with the task's current claim.
    Heartbeat,
    /// `task_set_progress` with the task's current claim.
    SetProgress,
    /// `task_finish_many` with [`Finish::Succeeded`](super::Finish::Succeeded).
    FinishSucceeded,
    /// `task_finish_many` with [`Finish::Failed`](super::Finish::Failed) and
    /// a `retry_in`.
    FinishFailedRetry,
    /// `task_finish_many` with [`Finish::Failed`](super::Finish::Failed) and
    /// no `retry_in`.
    FinishFailedFinal,
    /// `task_finish_many` with [`Finish::Cancelled`](super::Finish::Cancelled).
    FinishCancelled,
    /// `task_finish_many` with [`Finish::HandBack`](super::Finish::HandBack).
    FinishHandBack,
    /// `task_finish_many` with [`Finish::Snoozed`](super::Finish::Snoozed):
    /// a hand-back due later.
    FinishSnoozed,
    /// `task_rescue_many` after the task's lease lapsed.
    Rescue,
    /// `task_cancel`.
    Cancel,
    /// `task_retry` (with the unique key free; else it answers Conflict).
    Retry,
    /// `task_prune_many` once the task finished longer ago than `older_than`.
    Prune,
    /// A birth: `task_insert_many` (or `job_advance` enqueueing the slot's
    /// task) inserts the task.
    Insert,
    /// A birth: `job_advance` records a skipped slot (`SlotRecord::Skip`, or
    /// an unfinished previous run under `Overlap::Skip` (or `BufferOne` with a slot already waiting)), its task
    /// inserted `cancelled` with the reason.
    AdvanceSkip,
    /// A birth: `job_advance` with `SlotRecord::Run` inserts the slot's task
    /// as the caller's running attempt.
    AdvanceRun,
}

impl Op {
    /// Every operation on an existing task, for tests that try each one in
    /// each state.
    pub const ALL: [Op; 13] = [
        Op::Claim,
        Op::Heartbeat,
        Op::SetProgress,
        Op::FinishSucceeded,
        Op::FinishFailedRetry,
        Op::FinishFailedFinal,
        Op::FinishCancelled,
        Op::FinishHandBack,
        Op::FinishSnoozed,
        Op::Rescue,
        Op::Cancel,
        Op::Retry,
        Op::Prune,
    ];

    /// Every birth: the operations that make a task.
    pub const BIRTHS: [Op; 3] = [Op::Insert, Op::AdvanceSkip, Op::AdvanceRun];
}

/// What is true of the task when the operation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Facts {
    /// `cancel_requested` is set (a cancel reached it while running).
    pub cancel_requested: bool,
    /// `attempt < max_attempts`: another attempt is allowed.
    pub attempts_left: bool,
}

/// A condition on [`Facts`]: `None` means either value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guard {
    /// Required value of [`Facts::cancel_requested`].
    pub cancel_requested: Option<bool>,
    /// Required value of [`Facts::attempts_left`].
    pub attempts_left: Option<bool>,
}

impl Guard {
    /// No condition.
    pub const ANY: Guard = Guard {
        cancel_requested: None,
        attempts_left: None,
    };

    /// Whether `facts` satisfy the guard.
    pub fn admits(&self, facts: Facts) -> bool {
        self.cancel_requested
            .is_none_or(|c| c == facts.cancel_requested)
            && self.attempts_left.is_none_or(|a| a == facts.attempts_left)
    }
}

/// Where a transition leaves the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// The task is in this state.
    State(TaskState),
    /// The task is gone (pruned).
    Deleted,
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state the task is in; `None` for a birth (no task yet).
    pub from: Option<TaskState>,
    /// What is done to it.
    pub op: Op,
    /// When the row applies.
    pub guard: Guard,
    /// Where it ends.
    pub to: Target,
}

const fn row(
    from: TaskState,
    op: Op,
    cancel: Option<bool>,
    left: Option<bool>,
    to: Target,
) -> Transition {
    Transition {
        from: Some(from),
        op,
        guard: Guard {
            cancel_requested: cancel,
            attempts_left: left,
        },
        to,
    }
}

/// A birth: `op` makes a task in state `to`.
const fn birth_row(op: Op, to: TaskState) -> Transition {
    Transition {
        from: None,
        op,
        guard: Guard::ANY,
        to: Target::State(to),
    }
}

const fn to(s: TaskState) -> Target {
    Target::State(s)
}

/// Every transition a backend makes: the births, then every transition of
/// an existing task. For one `(from, op)` the guards do not overlap, so at
/// most one row applies.
pub const TRANSITIONS: &[Transition] = &[
    birth_row(Op::Insert, Pending),
    birth_row(Op::AdvanceSkip, Cancelled),
    birth_row(Op::AdvanceRun, Running),
    row(Pending, Op::Claim, None, None, to(Running)),
    row(Pending, Op::Cancel, None, None, to(Cancelled)),
    row(Running, Op::Heartbeat, None, None, to(Running)),
    row(Running, Op::SetProgress, None, None, to(Running)),
    row(Running, Op::FinishSucceeded, None, None, to(Succeeded)),
    row(
        Running,
        Op::FinishFailedRetry,
        Some(false),
        Some(true),
        to(Pending),
    ),
    row(
        Running,
        Op::FinishFailedRetry,
        Some(true),
        Some(true),
        to(Cancelled),
    ),
    row(
        Running,
        Op::FinishFailedRetry,
        None,
        Some(false),
        to(Failed),
    ),
    row(Running, Op::FinishFailedFinal, None, None, to(Failed)),
    row(Running, Op::FinishCancelled, None, None, to(Cancelled)),
    row(Running, Op::FinishHandBack, Some(false), None, to(Pending)),
    row(Running, Op::FinishHandBack, Some(true), None, to(Cancelled)),
    row(Running, Op::FinishSnoozed, Some(false), None, to(Pending)),
    row(Running, Op::FinishSnoozed, Some(true), None, to(Cancelled)),
    row(Running, Op::Rescue, Some(true), None, to(Cancelled)),
    row(Running, Op::Rescue, Some(false), Some(false), to(Failed)),
    row(Running, Op::Rescue, Some(false), Some(true), to(Pending)),
    row(Running, Op::Cancel, None, None, to(Running)),
    row(Failed, Op::Retry, None, None, to(Pending)),
    row(Cancelled, Op::Retry, None, None, to(Pending)),
    row(Succeeded, Op::Prune, None, None, Target::Deleted),
    row(Failed, Op::Prune, None, None, Target::Deleted),
    row(Cancelled, Op::Prune, None, None, Target::Deleted),
];

/// The row that applies, if any.
pub fn transition(from: TaskState, op: Op, facts: Facts) -> Option<&'static Transition> {
    TRANSITIONS
        .iter()
        .find(|t| t.from == Some(from) && t.op == op && t.guard.admits(facts))
}

/// The state `op` makes a new task in, when `op` is a birth.
///
/// ```
/// use baton::store::state::{born, Op};
/// use baton::store::TaskState;
///
/// assert_eq!(born(Op::Insert), Some(TaskState::Pending));
/// assert_eq!(born(Op::AdvanceSkip), Some(TaskState::Cancelled));
/// assert_eq!(born(Op::Claim), None);
/// ```
pub fn born(op: Op) -> Option<TaskState> {
    TRANSITIONS
        .iter()
        .find(|t| t.from.is_none() && t.op == op)
        .and_then(|t| match t.to {
            Target::State(s) => Some(s),
            Target::Deleted => None,
        })
}

/// Where `op` takes a task in `from` given `facts`; `None` when the table
/// has no such row (the store refuses the operation and the task stays as
/// it was).
pub fn next(from: TaskState, op: Op, facts: Facts) -> Option<Target> {
    transition(from, op, facts).map(|t| t.to)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: [TaskState; 5] = [Pending, Running, Succeeded, Failed, Cancelled];

    fn all_facts() -> Vec<Facts> {
        let mut out = Vec::new();
        for cancel_requested in [false, true] {
            for attempts_left in [false, true] {
                out.push(Facts {
                    cancel_requested,
                    attempts_left,
                });
            }
        }
        out
    }

    #[test]
    fn at_most_one_row_applies() {
        for from in STATES {
            for op in Op::ALL {
                for f in all_facts() {
                    let n = TRANSITIONS
                        .iter()
                        .filter(|t| t.from == Some(from) && t.op == op && t.guard.admits(f))
                        .count();
                    assert!(n <= 1, "{from:?} {op:?} {f:?}: {n} rows");
                }
            }
        }
    }

    #[test]
    fn a_row_that_applies_to_some_facts_applies_to_all_for_unguarded_ops() {
        // Failed retries, hand-backs and rescues depend on the facts; every
        // (from, op) pair in the table covers all four combinations.
        for t in TRANSITIONS {
            let Some(from) = t.from else { continue };
            for f in all_facts() {
                assert!(
                    next(from, t.op, f).is_some(),
                    "{:?} {:?} {f:?} has no row",
                    t.from,
                    t.op
                );
            }
        }
    }

    #[test]
    fn terminal_states_only_retry_or_prune() {
        for from in [Succeeded, Failed, Cancelled] {
            for t in TRANSITIONS.iter().filter(|t| t.from == Some(from)) {
                assert!(matches!(t.op, Op::Retry | Op::Prune), "{t:?}");
            }
        }
    }

    #[test]
    fn births_have_no_from_state_and_each_one_row() {
        for t in TRANSITIONS {
            assert_eq!(t.from.is_none(), Op::BIRTHS.contains(&t.op), "{t:?}");
        }
        for op in Op::BIRTHS {
            let rows = TRANSITIONS.iter().filter(|t| t.op == op).count();
            assert_eq!(rows, 1, "{op:?}");
            assert!(born(op).is_some(), "{op:?}");
        }
        for op in Op::ALL {
            assert_eq!(born(op), None, "{op:?}");
        }
    }
}
