//! The task state machine of `baton::store::state` held against the store.
//!
//! For every state a task can be in (with each combination of "cancel
//! requested" and "attempts left" it can be reached with) and every
//! operation of the seam, drive a fresh task into that state on the real
//! store, apply the operation, and compare with the library's table: where
//! the table has a row, the operation is accepted and the task ends in the
//! row's state; where it has none, the operation is refused and the task is
//! left exactly as it was (every field). Every birth of the table (an
//! insert, and `job_advance` recording a skipped slot or a run) is made on
//! the store too, and the task it makes must be in the row's state.

use std::time::Duration;

use baton::queue::TaskBuilder;
use baton::store::state::{born, next, Facts, Op, Target};
use baton::store::{
    Backend, CancelOutcome, Claim, FencingToken, Finish, Heartbeat, TaskClaim, TaskHeartbeatMany,
    TaskInfo, TaskSetProgress, TaskState,
};
use serde_json::json;

use crate::TestStore;

const LONG: Duration = Duration::from_secs(600);

/// How a case's task is put into its from-state.
#[derive(Debug, Clone, Copy)]
struct Setup {
    from: TaskState,
    /// 1: the first attempt is the last; 3: attempts are left after it.
    max_attempts: u32,
    /// Running only: cancel the task while it runs.
    cancel_requested: bool,
}

fn setups() -> Vec<Setup> {
    let mut out = vec![
        Setup {
            from: TaskState::Pending,
            max_attempts: 3,
            cancel_requested: false,
        },
        Setup {
            from: TaskState::Cancelled,
            max_attempts: 3,
            cancel_requested: false,
        },
    ];
    for max_attempts in [1, 3] {
        for cancel_requested in [false, true] {
            out.push(Setup {
                from: TaskState::Running,
                max_attempts,
                cancel_requested,
            });
        }
        for from in [TaskState::Succeeded, TaskState::Failed] {
            out.push(Setup {
                from,
                max_attempts,
                cancel_requested: false,
            });
        }
    }
    out
}

async fn get(b: &dyn Backend, id: i64) -> Option<TaskInfo> {
    b.task_get(id).await.unwrap()
}

async fn claim_one(b: &dyn Backend, queue: &str, lease: Duration) -> Vec<baton::store::Task> {
    b.task_claim(&TaskClaim {
        queue,
        worker: "states",
        limit: 1,
        lease,
        max_running: None,
        per_key_max_running: None,
        buffered: 0,
        fair: false,
    })
    .await
    .unwrap()
}

async fn finish(b: &dyn Backend, claim: Claim, f: Finish) -> bool {
    b.task_finish_many(&[(claim, f)]).await.unwrap() == [true]
}

/// A fresh task in `s.from`; returns its id and the claim a worker would
/// hold (a made-up one for a task never claimed).
async fn drive(b: &dyn Backend, queue: &str, s: Setup) -> (i64, Claim) {
    let t = TaskBuilder::new("state", json!({}))
        .queue(queue)
        .max_attempts(s.max_attempts)
        .build()
        .unwrap();
    let id = b.task_insert_many(&[t]).await.unwrap()[0].id;
    let mut claim = Claim {
        id,
        attempt: 1,
        token: FencingToken(1),
    };
    match s.from {
        TaskState::Pending => {}
        TaskState::Cancelled => {
            assert_eq!(b.task_cancel(id).await.unwrap(), CancelOutcome::Cancelled);
        }
        _ => {
            let got = claim_one(b, queue, LONG).await;
            assert_eq!(got.len(), 1, "setup {s:?}: claim");
            claim = got[0].claim();
            let done = match s.from {
                TaskState::Running => true,
                TaskState::Succeeded => finish(b, claim, Finish::Succeeded).await,
                _ => {
                    let f = Finish::Failed {
                        error: "final".into(),
                        retry_in: None,
                    };
                    finish(b, claim, f).await
                }
            };
            assert!(done, "setup {s:?}: finish");
            if s.cancel_requested {
                assert_eq!(b.task_cancel(id).await.unwrap(), CancelOutcome::Requested);
            }
        }
    }
    let info = get(b, id).await.expect("set up");
    assert_eq!(info.state, s.from, "setup {s:?}");
    assert_eq!(info.cancel_requested, s.cancel_requested, "setup {s:?}");
    (id, claim)
}

/// Apply `op`; true when the store accepted it.
async fn apply(b: &dyn Backend, queue: &str, id: i64, claim: Claim, op: Op) -> bool {
    match op {
        Op::Claim => !claim_one(b, queue, LONG).await.is_empty(),
        Op::Heartbeat => {
            let beat = b
                .task_heartbeat_many(&TaskHeartbeatMany {
                    claims: &[claim],
                    lease: LONG,
                })
                .await
                .unwrap();
            beat != [Heartbeat::Lost]
        }
        Op::SetProgress => b
            .task_set_progress(&TaskSetProgress {
                claim,
                progress: &json!({"at": 1}),
            })
            .await
            .unwrap(),
        Op::FinishSucceeded => finish(b, claim, Finish::Succeeded).await,
        Op::FinishFailedRetry | Op::FinishFailedFinal => {
            let retry_in = (op == Op::FinishFailedRetry).then_some(Duration::ZERO);
            let f = Finish::Failed {
                error: "boom".into(),
                retry_in,
            };
            finish(b, claim, f).await
        }
        Op::FinishCancelled => {
            let f = Finish::Cancelled {
                reason: "stop".into(),
            };
            finish(b, claim, f).await
        }
        Op::FinishHandBack => finish(b, claim, Finish::HandBack).await,
        Op::FinishSnoozed => {
            let run_in = Duration::from_secs(60);
            finish(b, claim, Finish::Snoozed { run_in }).await
        }
        Op::Rescue => {
            // Let the lease lapse (refused unless the claim is current).
            let beat = b
                .task_heartbeat_many(&TaskHeartbeatMany {
                    claims: &[claim],
                    lease: Duration::from_millis(1),
                })
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
            let r = b.task_rescue_many().await.unwrap();
            let n = r.requeued + r.failed + r.cancelled;
            assert!(n <= 1, "one task at most could lapse: {r:?}");
            beat != [Heartbeat::Lost] && n == 1
        }
        Op::Cancel => matches!(
            b.task_cancel(id).await.unwrap(),
            CancelOutcome::Cancelled | CancelOutcome::Requested
        ),
        Op::Retry => b.task_retry(id).await.unwrap(),
        Op::Insert | Op::AdvanceSkip | Op::AdvanceRun => panic!("{op:?} makes a task"),
        Op::Prune => {
            // Prune takes every finished task of this test's store; accepted
            // means ours is gone.
            tokio::time::sleep(Duration::from_millis(20)).await;
            b.task_prune_many(Duration::ZERO).await.unwrap();
            get(b, id).await.is_none()
        }
    }
}

pub async fn every_transition_matches_the_table(ts: TestStore) {
    let b = ts.store.backend();
    let mut checked = 0;
    let mut rows = std::collections::HashSet::new();
    for (i, s) in setups().into_iter().enumerate() {
        for op in Op::ALL {
            let queue = format!("st-{i}-{op:?}");
            let (id, claim) = drive(b, &queue, s).await;
            let before = get(b, id).await.expect("set up");
            let facts = Facts {
                cancel_requested: before.cancel_requested,
                attempts_left: before.attempt < before.max_attempts,
            };
            let want = next(s.from, op, facts);
            let accepted = apply(b, &queue, id, claim, op).await;
            let after = get(b, id).await;
            let case = format!("{s:?} {op:?} {facts:?} on {:?}", ts.kind);
            match want {
                Some(to) => {
                    assert!(accepted, "{case}: the table has a row, the store refused");
                    let got = match &after {
                        Some(t) => Target::State(t.state),
                        None => Target::Deleted,
                    };
                    assert_eq!(got, to, "{case}: wrong next state");
                    rows.insert((s.from, op, facts.cancel_requested, facts.attempts_left));
                }
                None => {
                    assert!(!accepted, "{case}: not in the table, yet accepted");
                    assert_eq!(
                        after.as_ref(),
                        Some(&before),
                        "{case}: refused, yet changed"
                    );
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, setups().len() * Op::ALL.len());
    // Every row of the table was reached by some case (births below).
    for t in baton::store::TRANSITIONS {
        let Some(t_from) = t.from else { continue };
        assert!(
            rows.iter().any(|&(from, op, c, a)| from == t_from
                && op == t.op
                && t.guard.admits(Facts {
                    cancel_requested: c,
                    attempts_left: a
                })),
            "row {t:?} never exercised"
        );
    }
}

/// Make a task by the birth `op`; its id.
async fn give_birth(b: &dyn Backend, op: Op, n: usize) -> i64 {
    use baton::schedule::{spec::Schedule, Job};
    use baton::store::{Advanced, JobAdvance, JobRegister, Overlap, SlotRecord};
    let name = format!("births-{n}");
    let every = Schedule::every(Duration::from_secs(1)).unwrap();
    let job = Job::new(&name, every).queue(&name);
    let cursor = b
        .job_register(&JobRegister::new(&name).queue(&name))
        .await
        .unwrap()
        .last_slot
        .unwrap();
    let slot = cursor + chrono::Duration::seconds(1);
    let task = job.task(slot, false).unwrap();
    let advance = |record| JobAdvance {
        record,
        ..JobAdvance::new(&name, Some(cursor), slot, Some(&task))
    };
    let got = match op {
        Op::Insert => {
            let t = TaskBuilder::new("state", json!({}))
                .queue(&name)
                .build()
                .unwrap();
            return b.task_insert_many(&[t]).await.unwrap()[0].id;
        }
        Op::AdvanceSkip if n % 2 == 0 => b
            .job_advance(&advance(SlotRecord::Skip { reason: "skipped" }))
            .await
            .unwrap(),
        Op::AdvanceSkip => {
            // The other skip: an unfinished previous run under
            // Overlap::Skip.
            let earlier = job.task(cursor, false).unwrap();
            b.task_insert_many(&[earlier]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
            let adv = JobAdvance {
                overlap: Overlap::Skip,
                ..advance(SlotRecord::Enqueue)
            };
            b.job_advance(&adv).await.unwrap()
        }
        Op::AdvanceRun => b
            .job_advance(&advance(SlotRecord::Run {
                worker: "states",
                lease: LONG,
            }))
            .await
            .unwrap(),
        other => panic!("{other:?} is no birth"),
    };
    match (op, got) {
        (Op::AdvanceSkip, Advanced::Skipped(e)) | (Op::AdvanceRun, Advanced::Enqueued(e)) => {
            assert!(e.inserted, "{op:?}: a new task");
            e.id
        }
        (op, got) => panic!("{op:?}: job_advance answered {got:?}"),
    }
}

pub async fn every_birth_matches_the_table(ts: TestStore) {
    let b = ts.store.backend();
    let mut made = std::collections::HashSet::new();
    for (n, op) in [Op::Insert, Op::AdvanceSkip, Op::AdvanceSkip, Op::AdvanceRun]
        .into_iter()
        .enumerate()
    {
        let want = born(op).unwrap_or_else(|| panic!("{op:?} has a birth row"));
        let id = give_birth(b, op, n).await;
        let info = get(b, id).await.expect("born");
        assert_eq!(
            info.state, want,
            "{op:?} on {:?}: born in the wrong state",
            ts.kind
        );
        assert_eq!(
            info.finished_at.is_some(),
            want.is_terminal(),
            "{op:?} on {:?}: finished_at",
            ts.kind
        );
        made.insert(op);
    }
    for op in Op::BIRTHS {
        assert!(made.contains(&op), "birth {op:?} never made");
    }
}
