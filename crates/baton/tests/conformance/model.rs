//! A model checker for the store contract (docs/STORE.md).
//!
//! Random sequences of operations go to a backend through `Backend` and to
//! a small in-memory reference model of the contract; after every
//! operation the answers and the whole observable state (every task, every
//! lock, the per-queue counts) must agree. On a difference the sequence is
//! shrunk, each candidate replayed against a fresh store, and the shortest
//! failing sequence is printed with what each step answered.
//!
//! The sequences come from a fixed seed, so CI runs are reproducible:
//! `BATON_MODEL_SEED=S` picks another search, `BATON_MODEL_CASES=N` runs
//! more cases, `BATON_MODEL_OPS=N` makes them longer. The model implements
//! the *intended* contract: a claim's identity never repeats (a stale call
//! from a handed-back claim is refused) and a requested cancel sticks
//! through a retryable failure or a hand-back. `BATON_MODEL_LEGACY=1`
//! switches those two rules to the older behaviour (hand-back reuses
//! `(id, attempt)`; both go back to pending), `=fencing` or `=cancel` only
//! one of them. A `finish_many` batch may carry two outcomes for one task
//! (each must get `finish`'s answer, in order); `BATON_MODEL_DUP_BATCH=0`
//! keeps batches to one item per task.
//!
//! Time is made predictable: every lease is 10 minutes except a deliberate
//! lapse (a heartbeat or extension of 1 ms, then a short sleep), and every
//! operation that can set `run_at = now` is followed by a short sleep, so
//! claim order by `(priority, run_at, id)` never meets a tie the model
//! could not predict.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use baton::store::state::{born, next, Facts, Op as StateOp, Target};
use baton::store::{
    Acquire, Backend, CancelOutcome, Claim, FencingToken, Finish, Heartbeat, LockAcquire, NewTask,
    RunAt, Task, TaskClaim, TaskFilter, TaskState, UniqueHold,
};
use baton::StoreError;
use serde_json::json;

use crate::harness::{self, Kind};
use crate::TestStore;

/// The one place that turns a claimed task into the claim a worker keeps.
fn claim_of(t: &Task) -> Claim {
    t.claim()
}

const LONG: Duration = Duration::from_secs(600);
const FUTURE: Duration = Duration::from_secs(3600);
const TINY: Duration = Duration::from_millis(1);
/// The store's clock moves this much (the test clock) after an operation
/// that may set `run_at = now` (SQLite keeps ms).
const TICK: Duration = Duration::from_millis(3);
/// The store's clock moves this much after a 1 ms lease, before anything
/// relies on it having lapsed.
const LAPSE: Duration = Duration::from_millis(8);
const QUEUES: [&str; 2] = ["q", "r"];
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
const LOCKS: [&str; 2] = ["L0", "L1"];
/// The model's `run_at` for a task due in an hour.
const LATER: u64 = u64::MAX;

// ---- operations ----------------------------------------------------------------

/// Which claim an operation uses: the k-th most recent, or any (modulo).
#[derive(Debug, Clone, Copy)]
enum ClaimRef {
    Latest(usize),
    Any(usize),
}

/// Which task an operation uses.
#[derive(Debug, Clone, Copy)]
enum TaskRef {
    /// The task of the k-th most recent claim.
    OfClaim(usize),
    /// The k-th most recently created task.
    Latest(usize),
    Any(usize),
}

#[derive(Debug, Clone)]
struct Spec {
    queue: usize,
    prio: i32,
    later: bool,
    max_attempts: u32,
    key: Option<usize>,
    hold: UniqueHold,
}

#[derive(Debug, Clone, PartialEq)]
enum Fin {
    Succeeded,
    /// Failed; retry_in: None, Some(false) = now, Some(true) = in an hour.
    Failed(Option<bool>),
    Cancelled,
    HandBack,
}

impl Fin {
    fn finish(&self) -> Finish {
        match self {
            Fin::Succeeded => Finish::Succeeded,
            Fin::Failed(r) => Finish::Failed {
                error: "boom".into(),
                retry_in: r.map(|later| if later { FUTURE } else { Duration::ZERO }),
            },
            Fin::Cancelled => Finish::Cancelled {
                reason: "stop".into(),
            },
            Fin::HandBack => Finish::HandBack,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Enqueue(Vec<Spec>),
    Claim {
        queue: usize,
        limit: u32,
        cap: Option<u32>,
    },
    Heartbeat(Vec<ClaimRef>),
    Finish(ClaimRef, Fin),
    FinishMany(Vec<(ClaimRef, Fin)>),
    Progress(ClaimRef),
    /// Heartbeat one claim with a 1 ms lease, then sleep past it.
    Lapse(ClaimRef),
    Rescue,
    Cancel(TaskRef),
    Retry(TaskRef),
    Prune,
    LockAcquire(usize),
    /// Extend the lock's k-th most recent grant.
    LockExtend(usize, usize),
    /// Release the lock's k-th most recent grant, keeping it `at_least` long.
    LockRelease(usize, usize, bool),
    /// Extend the latest grant to 1 ms, then sleep past it.
    LockLapse(usize),
}

fn gen_ops(rng: &mut fastrand::Rng, n: usize) -> Vec<Op> {
    fn claim_ref(rng: &mut fastrand::Rng) -> ClaimRef {
        match rng.u32(0..100) {
            0..=59 => ClaimRef::Latest(0),
            60..=84 => ClaimRef::Latest(rng.usize(1..4)),
            _ => ClaimRef::Any(rng.usize(0..1000)),
        }
    }
    fn task_ref(rng: &mut fastrand::Rng) -> TaskRef {
        match rng.u32(0..100) {
            0..=39 => TaskRef::OfClaim(rng.usize(0..2)),
            40..=69 => TaskRef::Latest(rng.usize(0..3)),
            _ => TaskRef::Any(rng.usize(0..1000)),
        }
    }
    fn fin(rng: &mut fastrand::Rng) -> Fin {
        match rng.u32(0..100) {
            0..=29 => Fin::Succeeded,
            30..=44 => Fin::Failed(None),
            45..=64 => Fin::Failed(Some(false)),
            65..=69 => Fin::Failed(Some(true)),
            70..=79 => Fin::Cancelled,
            _ => Fin::HandBack,
        }
    }
    let mut ops = Vec::with_capacity(n);
    while ops.len() < n {
        // Now and then a short scenario that random ops rarely line up;
        // its ops are ordinary ops, so shrinking treats them one by one.
        if rng.u32(0..100) < 7 {
            let fresh = Op::Enqueue(vec![Spec {
                queue: 0,
                prio: -1,
                later: false,
                max_attempts: rng.u32(1..4),
                key: Some(rng.usize(0..KEYS.len())),
                hold: UniqueHold::Unfinished,
            }]);
            let take = Op::Claim {
                queue: 0,
                limit: 1,
                cap: None,
            };
            let stale = match rng.u32(0..3) {
                0 => Op::Heartbeat(vec![ClaimRef::Latest(1)]),
                1 => Op::Finish(ClaimRef::Latest(1), fin(rng)),
                _ => Op::Progress(ClaimRef::Latest(1)),
            };
            let snippet = match rng.u32(0..4) {
                // A running task is cancelled, then its worker goes on.
                0 => vec![
                    fresh,
                    take,
                    Op::Cancel(TaskRef::OfClaim(0)),
                    if rng.bool() {
                        Op::Lapse(ClaimRef::Latest(0))
                    } else {
                        Op::Heartbeat(vec![ClaimRef::Latest(0)])
                    },
                    if rng.bool() {
                        Op::Rescue
                    } else {
                        Op::Finish(ClaimRef::Latest(0), fin(rng))
                    },
                ],
                // A lease lapses and is rescued, then the old claim speaks.
                1 => vec![
                    fresh,
                    take.clone(),
                    Op::Lapse(ClaimRef::Latest(0)),
                    Op::Rescue,
                    take,
                    stale,
                ],
                // Hand-back, re-claim, then the first claim speaks.
                2 => vec![
                    fresh,
                    take.clone(),
                    Op::Finish(ClaimRef::Latest(0), Fin::HandBack),
                    take,
                    stale,
                ],
                // A finished task's key is taken again, then it is retried.
                _ => vec![
                    fresh.clone(),
                    take,
                    Op::Finish(ClaimRef::Latest(0), Fin::Failed(None)),
                    fresh,
                    Op::Retry(TaskRef::Latest(1)),
                ],
            };
            ops.extend(snippet);
            continue;
        }
        let op = match rng.u32(0..100) {
            0..=14 => {
                let count = if rng.u32(0..4) == 0 {
                    rng.usize(2..4)
                } else {
                    1
                };
                Op::Enqueue(
                    (0..count)
                        .map(|_| {
                            let key = (rng.bool()).then(|| rng.usize(0..KEYS.len()));
                            Spec {
                                queue: usize::from(rng.u32(0..5) == 0),
                                prio: rng.i32(-1..2),
                                later: rng.u32(0..7) == 0,
                                max_attempts: rng.u32(1..4),
                                key,
                                hold: match key.map(|_| rng.u32(0..3)) {
                                    Some(0) => UniqueHold::Forever,
                                    Some(1) => UniqueHold::UntilFailed,
                                    _ => UniqueHold::Unfinished,
                                },
                            }
                        })
                        .collect(),
                )
            }
            15..=26 => Op::Claim {
                queue: usize::from(rng.u32(0..7) == 0),
                limit: rng.u32(1..4),
                cap: (rng.u32(0..10) < 3).then(|| rng.u32(1..4)),
            },
            27..=31 => Op::Heartbeat((0..rng.usize(1..4)).map(|_| claim_ref(rng)).collect()),
            32..=45 => Op::Finish(claim_ref(rng), fin(rng)),
            46..=50 => Op::FinishMany(
                (0..rng.usize(1..4))
                    .map(|_| (claim_ref(rng), fin(rng)))
                    .collect(),
            ),
            51..=53 => Op::Progress(claim_ref(rng)),
            54..=60 => Op::Lapse(claim_ref(rng)),
            61..=66 => Op::Rescue,
            67..=72 => Op::Cancel(task_ref(rng)),
            73..=76 => Op::Retry(if rng.bool() {
                // An older task: the newer ones may have taken its key.
                TaskRef::Latest(rng.usize(1..4))
            } else {
                task_ref(rng)
            }),
            77..=78 => Op::Prune,
            79..=85 => Op::LockAcquire(rng.usize(0..LOCKS.len())),
            86..=89 => Op::LockExtend(rng.usize(0..LOCKS.len()), rng.usize(0..3)),
            90..=95 => Op::LockRelease(rng.usize(0..LOCKS.len()), rng.usize(0..3), rng.bool()),
            _ => Op::LockLapse(rng.usize(0..LOCKS.len())),
        };
        ops.push(op);
    }
    ops.truncate(n);
    ops
}

// ---- the reference model ---------------------------------------------------

#[derive(Debug, Clone)]
struct MTask {
    queue: usize,
    prio: i32,
    /// Logical time (the op index) when it became due, or [`LATER`].
    run_at: u64,
    state: TaskState,
    attempt: u32,
    max_attempts: u32,
    key: Option<usize>,
    hold: UniqueHold,
    cancel_requested: bool,
    last_error: bool,
    errors: usize,
    progress: Option<i64>,
    /// The claim that holds it (intended rule: only this one is current).
    cur: Option<usize>,
    /// Its lease was made to lapse and no heartbeat renewed it since.
    lapsed: bool,
    pruned: bool,
    /// After a hand-back of a cancel-requested task (intended rule), the
    /// contract leaves open whether the attempt counts and whether an error
    /// is recorded: the next comparison accepts either and adopts it.
    loose: bool,
}

impl MTask {
    fn terminal(&self) -> bool {
        self.state.is_terminal()
    }
    fn takes_key(&self, k: usize) -> bool {
        self.key == Some(k)
            && !self.pruned
            && match self.hold {
                UniqueHold::Forever => true,
                UniqueHold::UntilFailed => matches!(
                    self.state,
                    TaskState::Pending | TaskState::Running | TaskState::Succeeded
                ),
                UniqueHold::Unfinished => {
                    matches!(self.state, TaskState::Pending | TaskState::Running)
                }
            }
    }
}

#[derive(Debug, Clone, Copy)]
struct MClaim {
    task: usize,
    attempt: u32,
}

#[derive(Debug, Clone, Default)]
struct MLock {
    grants: usize,
    held: bool,
}

/// Which of the two intended rules the model applies. Each can be switched
/// back to the older behaviour: `BATON_MODEL_LEGACY=1` both, `=fencing` or
/// `=cancel` one.
#[derive(Debug, Clone, Copy)]
struct Rules {
    /// A hand-back lets the next claim reuse `(id, attempt)`, so a stale
    /// call from the handed-back claim matches it.
    old_fencing: bool,
    /// A requested cancel is dropped by a retryable failure or a hand-back
    /// (back to pending), and a claim may take a cancel-requested task.
    old_cancel: bool,
    /// `finish_many` batches may hold two outcomes for one task (unless
    /// `BATON_MODEL_DUP_BATCH=0`).
    dup_batch: bool,
    /// Unique keys are scoped by queue (Redis since schema 8: a queue's
    /// keys share one hash tag, so one script checks and takes a key);
    /// elsewhere a key is taken store-wide.
    queue_keys: bool,
}

impl Rules {
    fn from_env() -> Rules {
        let dup_batch = std::env::var("BATON_MODEL_DUP_BATCH").map_or(true, |v| v != "0");
        let v = std::env::var("BATON_MODEL_LEGACY").unwrap_or_default();
        let (old_fencing, old_cancel) = match v.trim() {
            "" | "0" => (false, false),
            "1" => (true, true),
            "fencing" => (true, false),
            "cancel" => (false, true),
            other => panic!("BATON_MODEL_LEGACY={other:?}: expected 0, 1, fencing or cancel"),
        };
        Rules {
            old_fencing,
            old_cancel,
            dup_batch,
            queue_keys: false,
        }
    }
}

/// A comparable answer. Task and claim numbers are the model's.
#[derive(Debug, Clone, PartialEq)]
enum Ans {
    Skip,
    Enqueued(Vec<(usize, bool)>),
    Claimed(Vec<(usize, u32)>),
    Beats(Vec<Heartbeat>),
    Done(Vec<bool>),
    Rescued(u64, u64, u64),
    Cancel(CancelOutcome),
    Retry(Option<bool>),
    Pruned(u64),
    /// Granted, or busy with the holder of grant number n.
    Acquire(Option<usize>),
}

struct Model {
    rules: Rules,
    tasks: Vec<MTask>,
    claims: Vec<MClaim>,
    locks: Vec<MLock>,
}

/// An operation with its references resolved against the model's lists.
#[derive(Debug, Clone)]
enum Step {
    Noop,
    Enqueue(Vec<Spec>),
    Claim {
        queue: usize,
        limit: u32,
        cap: Option<u32>,
    },
    Heartbeat(Vec<usize>),
    Finish(usize, Fin),
    FinishMany(Vec<(usize, Fin)>),
    Progress(usize),
    Lapse(usize),
    Rescue,
    Cancel(usize),
    Retry(usize),
    Prune,
    LockAcquire(usize),
    LockExtend(usize, usize),
    LockRelease(usize, usize, bool),
    LockLapse(usize),
}

impl Model {
    fn new(rules: Rules) -> Model {
        Model {
            rules,
            tasks: Vec::new(),
            claims: Vec::new(),
            locks: vec![MLock::default(); LOCKS.len()],
        }
    }

    fn claim_ix(&self, r: ClaimRef) -> Option<usize> {
        let n = self.claims.len();
        if n == 0 {
            return None;
        }
        Some(match r {
            ClaimRef::Latest(k) => n - 1 - k.min(n - 1),
            ClaimRef::Any(u) => u % n,
        })
    }

    fn task_ix(&self, r: TaskRef) -> Option<usize> {
        let n = self.tasks.len();
        if n == 0 {
            return None;
        }
        Some(match r {
            TaskRef::OfClaim(k) => self.claims[self.claim_ix(ClaimRef::Latest(k))?].task,
            TaskRef::Latest(k) => n - 1 - k.min(n - 1),
            TaskRef::Any(u) => u % n,
        })
    }

    fn resolve(&self, op: &Op) -> Step {
        let c = |r| self.claim_ix(r);
        let t = |r| self.task_ix(r);
        match op {
            Op::Enqueue(specs) => Step::Enqueue(specs.clone()),
            Op::Claim { queue, limit, cap } => Step::Claim {
                queue: *queue,
                limit: *limit,
                cap: *cap,
            },
            Op::Heartbeat(refs) => {
                let v: Vec<usize> = refs.iter().filter_map(|r| c(*r)).collect();
                if v.is_empty() {
                    Step::Noop
                } else {
                    Step::Heartbeat(v)
                }
            }
            Op::Finish(r, f) => c(*r).map_or(Step::Noop, |i| Step::Finish(i, f.clone())),
            Op::FinishMany(items) => {
                // Two outcomes of one task in a batch (a worker never
                // sends that, a resent batch might) unless
                // BATON_MODEL_DUP_BATCH=0.
                // At most one item may set run_at = now: PostgreSQL ends
                // the other outcomes one transaction each (each its own
                // now), SQLite and Redis in one (one now), so two such
                // tasks would tie or not depending on the backend.
                let mut seen = HashSet::new();
                let mut due_now = false;
                let v: Vec<(usize, Fin)> = items
                    .iter()
                    .filter_map(|(r, f)| c(*r).map(|i| (i, f.clone())))
                    .filter(|(i, _)| seen.insert(self.claims[*i].task) || self.rules.dup_batch)
                    .map(|(i, f)| match f {
                        Fin::Failed(Some(false)) if std::mem::replace(&mut due_now, true) => {
                            (i, Fin::Failed(Some(true)))
                        }
                        f => (i, f),
                    })
                    .collect();
                if v.is_empty() {
                    Step::Noop
                } else {
                    Step::FinishMany(v)
                }
            }
            Op::Progress(r) => c(*r).map_or(Step::Noop, Step::Progress),
            Op::Lapse(r) => c(*r).map_or(Step::Noop, Step::Lapse),
            Op::Rescue => Step::Rescue,
            Op::Cancel(r) => t(*r).map_or(Step::Noop, Step::Cancel),
            Op::Retry(r) => t(*r).map_or(Step::Noop, Step::Retry),
            Op::Prune => Step::Prune,
            Op::LockAcquire(l) => Step::LockAcquire(*l),
            Op::LockExtend(l, k) | Op::LockRelease(l, k, _) if self.locks[*l].grants > 0 => {
                let g = self.locks[*l].grants;
                let g = g - 1 - (*k).min(g - 1);
                match op {
                    Op::LockRelease(_, _, keep) => Step::LockRelease(*l, g, *keep),
                    _ => Step::LockExtend(*l, g),
                }
            }
            Op::LockExtend(..) | Op::LockRelease(..) => Step::Noop,
            Op::LockLapse(l) => Step::LockLapse(*l),
        }
    }

    /// Whether claim `c` is still the task's current claim.
    fn current(&self, c: usize) -> bool {
        let cl = self.claims[c];
        let t = &self.tasks[cl.task];
        if t.pruned || t.state != TaskState::Running {
            return false;
        }
        if self.rules.old_fencing {
            t.attempt == cl.attempt
        } else {
            t.cur == Some(c)
        }
    }

    /// The task holding key `k` for a task of `queue`.
    fn key_holder(&self, k: usize, queue: usize) -> Option<usize> {
        self.tasks
            .iter()
            .position(|t| t.takes_key(k) && (!self.rules.queue_keys || t.queue == queue))
    }

    fn leave_running(t: &mut MTask, state: TaskState) {
        t.state = state;
        t.cur = None;
        t.lapsed = false;
    }

    /// The facts the library's state table decides on.
    fn facts(t: &MTask) -> Facts {
        Facts {
            cancel_requested: t.cancel_requested,
            attempts_left: t.attempt < t.max_attempts,
        }
    }

    /// Where the library's table takes a running task; the table has a row
    /// for every operation a current claim makes.
    fn to_state(op: StateOp, facts: Facts) -> TaskState {
        Self::table(TaskState::Running, op, facts)
    }

    /// Where the library's table takes a task in `from` by `op`, for an
    /// operation the model has decided is accepted (the table must have
    /// the row).
    fn table(from: TaskState, op: StateOp, facts: Facts) -> TaskState {
        match next(from, op, facts) {
            Some(Target::State(s)) => s,
            other => panic!("the state table gives {other:?} for {from:?} {op:?} {facts:?}"),
        }
    }

    fn finish(&mut self, c: usize, f: &Fin, now: u64) -> bool {
        if !self.current(c) {
            return false;
        }
        let old_cancel = self.rules.old_cancel;
        let t = &mut self.tasks[self.claims[c].task];
        let op = match f {
            Fin::Succeeded => StateOp::FinishSucceeded,
            Fin::Failed(Some(_)) => StateOp::FinishFailedRetry,
            Fin::Failed(None) => StateOp::FinishFailedFinal,
            Fin::Cancelled => StateOp::FinishCancelled,
            Fin::HandBack => StateOp::FinishHandBack,
        };
        let mut facts = Self::facts(t);
        // Legacy rules: a requested cancel did not stick through a
        // retryable failure or a hand-back.
        facts.cancel_requested &= !old_cancel;
        let to = Self::to_state(op, facts);
        match f {
            Fin::Failed(retry) => {
                t.errors += 1;
                t.last_error = true;
                if to == TaskState::Pending {
                    t.run_at = if *retry == Some(true) { LATER } else { now };
                }
            }
            Fin::Cancelled => t.last_error = true,
            // A hand-back does not count the attempt; one that ends the
            // task (cancel requested) leaves it as it was.
            Fin::HandBack if to == TaskState::Pending => t.attempt -= 1,
            Fin::HandBack => t.loose = true,
            Fin::Succeeded => {}
        }
        Self::leave_running(t, to);
        true
    }

    fn heartbeat(&mut self, c: usize, lapse: bool) -> Heartbeat {
        if !self.current(c) {
            return Heartbeat::Lost;
        }
        let t = &mut self.tasks[self.claims[c].task];
        t.lapsed = lapse;
        if t.cancel_requested {
            Heartbeat::CancelRequested
        } else {
            Heartbeat::Extended
        }
    }

    /// Apply a step; `now` is the op's index, the model's clock.
    fn apply(&mut self, step: &Step, now: u64) -> Ans {
        match step {
            Step::Noop => Ans::Skip,
            Step::Enqueue(specs) => {
                let mut out = Vec::new();
                for s in specs {
                    if let Some(h) = s.key.and_then(|k| self.key_holder(k, s.queue)) {
                        out.push((h, false));
                        continue;
                    }
                    self.tasks.push(MTask {
                        queue: s.queue,
                        prio: s.prio,
                        run_at: if s.later { LATER } else { now },
                        state: born(StateOp::Insert).expect("the table has the insert's birth"),
                        attempt: 0,
                        max_attempts: s.max_attempts,
                        key: s.key,
                        hold: s.hold,
                        cancel_requested: false,
                        last_error: false,
                        errors: 0,
                        progress: None,
                        cur: None,
                        lapsed: false,
                        pruned: false,
                        loose: false,
                    });
                    out.push((self.tasks.len() - 1, true));
                }
                Ans::Enqueued(out)
            }
            Step::Claim { queue, limit, cap } => {
                let running = self
                    .tasks
                    .iter()
                    .filter(|t| !t.pruned && t.queue == *queue && t.state == TaskState::Running)
                    .count() as i64;
                let limit = match cap {
                    None => i64::from(*limit),
                    Some(m) => i64::from(*limit).min(i64::from(*m) - running).max(0),
                };
                let mut due: Vec<usize> = (0..self.tasks.len())
                    .filter(|&i| {
                        let t = &self.tasks[i];
                        !t.pruned
                            && t.queue == *queue
                            && t.state == TaskState::Pending
                            && t.run_at != LATER
                            && (self.rules.old_cancel || !t.cancel_requested)
                    })
                    .collect();
                due.sort_by_key(|&i| (self.tasks[i].prio, self.tasks[i].run_at, i));
                due.truncate(usize::try_from(limit).unwrap_or(0));
                let mut out = Vec::new();
                for i in due {
                    let c = self.claims.len();
                    let t = &mut self.tasks[i];
                    t.state = Self::table(t.state, StateOp::Claim, Self::facts(t));
                    t.attempt += 1;
                    t.cur = Some(c);
                    t.lapsed = false;
                    self.claims.push(MClaim {
                        task: i,
                        attempt: t.attempt,
                    });
                    out.push((i, t.attempt));
                }
                Ans::Claimed(out)
            }
            Step::Heartbeat(cs) => {
                Ans::Beats(cs.iter().map(|&c| self.heartbeat(c, false)).collect())
            }
            Step::Lapse(c) => Ans::Beats(vec![self.heartbeat(*c, true)]),
            Step::Finish(c, f) => Ans::Done(vec![self.finish(*c, f, now)]),
            Step::FinishMany(items) => {
                Ans::Done(items.iter().map(|(c, f)| self.finish(*c, f, now)).collect())
            }
            Step::Progress(c) => {
                let ok = self.current(*c);
                if ok {
                    self.tasks[self.claims[*c].task].progress = Some(now as i64);
                }
                Ans::Done(vec![ok])
            }
            Step::Rescue => {
                let (mut rq, mut fl, mut cn) = (0, 0, 0);
                for t in &mut self.tasks {
                    if t.pruned || t.state != TaskState::Running || !t.lapsed {
                        continue;
                    }
                    t.errors += 1;
                    t.last_error = true;
                    let to = Self::to_state(StateOp::Rescue, Self::facts(t));
                    match to {
                        TaskState::Cancelled => cn += 1,
                        TaskState::Failed => fl += 1,
                        _ => rq += 1,
                    }
                    Self::leave_running(t, to);
                }
                Ans::Rescued(rq, fl, cn)
            }
            Step::Cancel(i) => {
                let t = &mut self.tasks[*i];
                Ans::Cancel(if t.pruned {
                    CancelOutcome::NotFound
                } else {
                    // The table decides: a cancel that ends the task, one
                    // that leaves it running (requested), or none.
                    match next(t.state, StateOp::Cancel, Self::facts(t)) {
                        Some(Target::State(TaskState::Running)) => {
                            t.cancel_requested = true;
                            CancelOutcome::Requested
                        }
                        Some(Target::State(to)) => {
                            t.state = to;
                            CancelOutcome::Cancelled
                        }
                        _ => CancelOutcome::AlreadyFinished(t.state),
                    }
                })
            }
            Step::Retry(i) => {
                let t = &self.tasks[*i];
                let Some(Target::State(to)) = next(t.state, StateOp::Retry, Self::facts(t)) else {
                    return Ans::Retry(Some(false));
                };
                if t.pruned {
                    return Ans::Retry(Some(false));
                }
                if let Some(k) = t.key {
                    if self.key_holder(k, t.queue).is_some_and(|h| h != *i) {
                        return Ans::Retry(None);
                    }
                }
                let t = &mut self.tasks[*i];
                t.state = to;
                t.run_at = now;
                t.cancel_requested = false;
                t.max_attempts = t.max_attempts.max(t.attempt + 1);
                Ans::Retry(Some(true))
            }
            Step::Prune => {
                let mut n = 0;
                for t in &mut self.tasks {
                    let gone =
                        next(t.state, StateOp::Prune, Self::facts(t)) == Some(Target::Deleted);
                    if !t.pruned && gone {
                        t.pruned = true;
                        n += 1;
                    }
                }
                Ans::Pruned(n)
            }
            Step::LockAcquire(l) => {
                let lk = &mut self.locks[*l];
                if lk.held {
                    Ans::Acquire(Some(lk.grants - 1))
                } else {
                    lk.grants += 1;
                    lk.held = true;
                    Ans::Acquire(None)
                }
            }
            Step::LockExtend(l, g) => {
                let lk = &self.locks[*l];
                Ans::Done(vec![lk.held && *g == lk.grants - 1])
            }
            Step::LockRelease(l, g, keep) => {
                let lk = &mut self.locks[*l];
                let ok = lk.held && *g == lk.grants - 1;
                if ok && !keep {
                    lk.held = false;
                }
                Ans::Done(vec![ok])
            }
            Step::LockLapse(l) => {
                let lk = &mut self.locks[*l];
                let ok = lk.held;
                lk.held = false;
                Ans::Done(vec![ok])
            }
        }
    }
}

/// What is compared per task: (state, attempt, max_attempts,
/// cancel_requested, last_error?, errors, due, key, progress, queue,
/// priority, leased?, finished?).
#[derive(Debug, PartialEq)]
struct Seen(
    TaskState,
    u32,
    u32,
    bool,
    bool,
    usize,
    bool,
    Option<String>,
    Option<serde_json::Value>,
    String,
    i32,
    bool,
    bool,
);

// ---- the store side ------------------------------------------------------------

struct Real<'a> {
    /// The store: finishes go through [`Store::task_finish_many`] (which
    /// splits a batch that repeats a task), every other step through the seam.
    store: &'a baton::Store,
    b: &'a dyn Backend,
    /// Check that claim identities never repeat.
    unique_claims: bool,
    /// Store id of each model task.
    ids: Vec<i64>,
    of_id: HashMap<i64, usize>,
    claims: Vec<Claim>,
    seen_claims: HashSet<Claim>,
    /// Per lock, every granted token and its holder, in order.
    grants: Vec<Vec<(FencingToken, String)>>,
    holders: usize,
    /// Moves the store's clock (the test clock) where time must pass.
    clock: baton_testkit::clock::Mover,
}

fn err(what: &str, e: StoreError) -> String {
    format!("{what}: unexpected error {e}")
}

impl Real<'_> {
    fn task_of(&self, id: i64) -> Result<usize, String> {
        self.of_id
            .get(&id)
            .copied()
            .ok_or_else(|| format!("store answered with unknown task id {id}"))
    }

    async fn apply(&mut self, step: &Step, now: u64) -> Result<Ans, String> {
        let b = self.b;
        Ok(match step {
            Step::Noop => Ans::Skip,
            Step::Enqueue(specs) => {
                let tasks: Vec<NewTask> = specs
                    .iter()
                    .map(|s| NewTask {
                        queue: QUEUES[s.queue].into(),
                        kind: "m".into(),
                        payload: json!({}),
                        priority: s.prio,
                        run_at: if s.later {
                            RunAt::Delay(FUTURE)
                        } else {
                            RunAt::Now
                        },
                        max_attempts: s.max_attempts,
                        timeout: None,
                        unique_key: s.key.map(|k| KEYS[k].to_string()),
                        unique_hold: s.hold,
                        job: None,
                        slot: None,
                        traceparent: None,
                        concurrency_key: None,
                        key_policy: None,
                    })
                    .collect();
                let got = b
                    .task_insert_many(&tasks)
                    .await
                    .map_err(|e| err("enqueue", e))?;
                self.clock.advance(TICK).await;
                let mut out = Vec::new();
                for e in got {
                    let ix = match self.of_id.get(&e.id) {
                        Some(&ix) => ix,
                        None => {
                            self.ids.push(e.id);
                            self.of_id.insert(e.id, self.ids.len() - 1);
                            self.ids.len() - 1
                        }
                    };
                    out.push((ix, e.inserted));
                }
                Ans::Enqueued(out)
            }
            Step::Claim { queue, limit, cap } => {
                let got = b
                    .task_claim(&TaskClaim {
                        queue: QUEUES[*queue],
                        worker: "model",
                        limit: *limit,
                        lease: LONG,
                        max_running: *cap,
                        per_key_max_running: None,
                        buffered: 0,
                        fair: false,
                    })
                    .await
                    .map_err(|e| err("claim", e))?;
                let mut out = Vec::new();
                for t in &got {
                    let c = claim_of(t);
                    if self.unique_claims && !self.seen_claims.insert(c) {
                        return Err(format!("claim identity repeated: {c:?}"));
                    }
                    self.claims.push(c);
                    out.push((self.task_of(t.id)?, t.attempt));
                }
                Ans::Claimed(out)
            }
            Step::Heartbeat(cs) => {
                let claims: Vec<Claim> = cs.iter().map(|&c| self.claims[c]).collect();
                Ans::Beats(
                    b.task_heartbeat_many(&baton::store::TaskHeartbeatMany {
                        claims: &claims,
                        lease: LONG,
                    })
                    .await
                    .map_err(|e| err("heartbeat", e))?,
                )
            }
            Step::Lapse(c) => {
                let got = b
                    .task_heartbeat_many(&baton::store::TaskHeartbeatMany {
                        claims: &[self.claims[*c]],
                        lease: TINY,
                    })
                    .await
                    .map_err(|e| err("heartbeat", e))?;
                self.clock.advance(LAPSE).await;
                Ans::Beats(got)
            }
            Step::Finish(c, f) => {
                let ok = self
                    .store
                    .task_finish_many(&[(self.claims[*c], f.finish())])
                    .await
                    .map(|r| r == [true])
                    .map_err(|e| err("finish", e))?;
                self.clock.advance(TICK).await;
                Ans::Done(vec![ok])
            }
            Step::FinishMany(items) => {
                let items: Vec<(Claim, Finish)> = items
                    .iter()
                    .map(|(c, f)| (self.claims[*c], f.finish()))
                    .collect();
                let ok = self
                    .store
                    .task_finish_many(&items)
                    .await
                    .map_err(|e| err("finish_many", e))?;
                self.clock.advance(TICK).await;
                Ans::Done(ok)
            }
            Step::Progress(c) => Ans::Done(vec![b
                .task_set_progress(&baton::store::TaskSetProgress {
                    claim: self.claims[*c],
                    progress: &json!(now),
                })
                .await
                .map_err(|e| err("progress", e))?]),
            Step::Rescue => {
                let r = b.task_rescue_many().await.map_err(|e| err("rescue", e))?;
                Ans::Rescued(r.requeued, r.failed, r.cancelled)
            }
            Step::Cancel(i) => Ans::Cancel(
                b.task_cancel(self.ids[*i])
                    .await
                    .map_err(|e| err("cancel", e))?,
            ),
            Step::Retry(i) => {
                let r = match b.task_retry(self.ids[*i]).await {
                    Ok(ok) => Some(ok),
                    Err(StoreError::Conflict(_)) => None,
                    Err(e) => return Err(err("retry", e)),
                };
                self.clock.advance(TICK).await;
                Ans::Retry(r)
            }
            Step::Prune => {
                self.clock.advance(LAPSE).await;
                Ans::Pruned(
                    b.task_prune_many(Duration::ZERO)
                        .await
                        .map_err(|e| err("prune", e))?,
                )
            }
            Step::LockAcquire(l) => {
                self.holders += 1;
                let holder = format!("h{}", self.holders);
                let got = b
                    .lock_acquire(&LockAcquire {
                        name: LOCKS[*l],
                        holder: &holder,
                        at_most: LONG,
                    })
                    .await
                    .map_err(|e| err("lock_acquire", e))?;
                match got {
                    Acquire::Granted { token, .. } => {
                        if let Some((last, _)) = self.grants[*l].last() {
                            if token <= *last {
                                return Err(format!(
                                    "lock {}: token {token} does not rise above {last}",
                                    LOCKS[*l]
                                ));
                            }
                        }
                        self.grants[*l].push((token, holder));
                        Ans::Acquire(None)
                    }
                    Acquire::Busy(info) => Ans::Acquire(Some(
                        self.grants[*l]
                            .iter()
                            .position(|(t, h)| *t == info.token && *h == info.holder)
                            .ok_or_else(|| format!("busy with an unknown grant {info:?}"))?,
                    )),
                }
            }
            Step::LockExtend(l, g) => Ans::Done(vec![b
                .lock_extend(&baton::store::LockExtend {
                    name: LOCKS[*l],
                    token: self.grants[*l][*g].0,
                    at_most: LONG,
                })
                .await
                .map_err(|e| err("lock_extend", e))?
                .is_some()]),
            Step::LockRelease(l, g, keep) => Ans::Done(vec![b
                .lock_release(&baton::store::LockRelease {
                    name: LOCKS[*l],
                    token: self.grants[*l][*g].0,
                    at_least: if *keep { LONG } else { Duration::ZERO },
                    record: *keep,
                })
                .await
                .map_err(|e| err("lock_release", e))?]),
            Step::LockLapse(l) => {
                let ok = match self.grants[*l].last() {
                    Some((t, _)) => b
                        .lock_extend(&baton::store::LockExtend {
                            name: LOCKS[*l],
                            token: *t,
                            at_most: TINY,
                        })
                        .await
                        .map_err(|e| err("lock_extend", e))?
                        .is_some(),
                    None => false,
                };
                self.clock.advance(LAPSE).await;
                Ans::Done(vec![ok])
            }
        })
    }

    /// Compare every task, every lock and the per-queue counts with the model.
    async fn check(&self, m: &mut Model) -> Result<(), String> {
        let b = self.b;
        let now = b.now().await.map_err(|e| err("now", e))?;
        let all = b
            .task_list(&TaskFilter {
                limit: 10_000,
                ..TaskFilter::default()
            })
            .await
            .map_err(|e| err("tasks", e))?;
        let mut by_id: HashMap<i64, _> = all.into_iter().map(|t| (t.id, t)).collect();
        for (i, mt) in m.tasks.iter_mut().enumerate() {
            let Some(&id) = self.ids.get(i) else {
                return Err(format!("task #{i} was never created in the store"));
            };
            let got = by_id.remove(&id);
            let Some(got) = got else {
                if mt.pruned {
                    continue;
                }
                return Err(format!("task #{i} (id {id}) is missing"));
            };
            if mt.pruned {
                return Err(format!("task #{i} should have been pruned: {got:?}"));
            }
            if mt.loose {
                // Adopt what the store chose among the allowed outcomes.
                if got.attempt == mt.attempt || got.attempt + 1 == mt.attempt {
                    mt.attempt = got.attempt;
                }
                if got.errors.len() == mt.errors + 1 {
                    mt.errors += 1;
                }
                mt.last_error = got.last_error.is_some();
                mt.loose = false;
            }
            let due = got.run_at <= now;
            let exp = Seen(
                mt.state,
                mt.attempt,
                mt.max_attempts,
                mt.cancel_requested,
                mt.last_error,
                mt.errors,
                mt.run_at != LATER,
                mt.key.map(|k| KEYS[k].to_string()),
                mt.progress.map(|p| json!(p)),
                QUEUES[mt.queue].to_string(),
                mt.prio,
                mt.state == TaskState::Running,
                mt.terminal(),
            );
            let seen = Seen(
                got.state,
                got.attempt,
                got.max_attempts,
                got.cancel_requested,
                got.last_error.is_some(),
                got.errors.len(),
                due,
                got.unique_key.clone(),
                got.progress.clone(),
                got.queue.clone(),
                got.priority,
                got.lease_until.is_some(),
                got.finished_at.is_some(),
            );
            if exp != seen {
                return Err(format!(
                    "task #{i} differs.\n  (state, attempt, max_attempts, cancel_requested, \
                     last_error?, errors, due, key, progress, queue, priority, leased?, finished?)\n  \
                     model: {exp:?}\n  store: {seen:?}"
                ));
            }
        }
        if let Some(extra) = by_id.values().next() {
            return Err(format!("the store has a task the model lacks: {extra:?}"));
        }
        // Per-queue counts.
        let mut exp: BTreeMap<String, [u64; 5]> = BTreeMap::new();
        for t in m.tasks.iter().filter(|t| !t.pruned) {
            let c = exp.entry(QUEUES[t.queue].to_string()).or_default();
            c[TaskState::ALL
                .iter()
                .position(|s| *s == t.state)
                .unwrap_or(0)] += 1;
        }
        let seen: BTreeMap<String, [u64; 5]> = b
            .queue_stats()
            .await
            .map_err(|e| err("stats", e))?
            .into_iter()
            .map(|s| {
                (
                    s.queue,
                    [s.pending, s.running, s.succeeded, s.failed, s.cancelled],
                )
            })
            .filter(|(_, c)| c.iter().any(|n| *n > 0))
            .collect();
        if exp != seen {
            return Err(format!(
                "stats differ (pending, running, succeeded, failed, cancelled)\n  \
                 model: {exp:?}\n  store: {seen:?}"
            ));
        }
        // Locks.
        // lock_get per name: on Redis, lock_list scans the whole keyspace.
        for (l, name) in LOCKS.iter().enumerate() {
            let got = b.lock_get(name).await.map_err(|e| err("lock_get", e))?;
            match (self.grants[l].last(), got) {
                (None, None) => {}
                (Some((token, holder)), Some(ref info)) => {
                    let exp = (*token, holder.as_str(), m.locks[l].held);
                    let seen = (info.token, info.holder.as_str(), info.held);
                    if exp != seen {
                        return Err(format!(
                            "lock {name} (token, holder, held): model {exp:?}, store {seen:?}"
                        ));
                    }
                }
                (e, g) => return Err(format!("lock {name}: model {e:?}, store {g:?}")),
            }
        }
        Ok(())
    }
}

/// Replay `ops` on a fresh store of `kind` and on a fresh model. On the
/// first difference: the index of the op and a transcript ending in what
/// differed.
async fn replay(
    kind: Kind,
    ops: &[Op],
    rules: Rules,
    cov: &mut BTreeMap<String, u64>,
) -> Result<(), (usize, String)> {
    let ts = harness::connect(kind)
        .await
        .expect("the store answered a moment ago");
    let mut model = Model::new(rules);
    let mut real = Real {
        store: &ts.store,
        b: ts.store.backend(),
        unique_claims: !rules.old_fencing,
        ids: Vec::new(),
        of_id: HashMap::new(),
        claims: Vec::new(),
        seen_claims: HashSet::new(),
        grants: vec![Vec::new(); LOCKS.len()],
        holders: 0,
        clock: baton_testkit::clock::Mover::new(&ts).await,
    };
    let mut log = String::new();
    for (i, op) in ops.iter().enumerate() {
        let now = i as u64;
        let step = model.resolve(op);
        let stale = stale_claims(&step, &model);
        let exp = model.apply(&step, now);
        note(&step, &exp, stale, cov);
        let _ = write!(log, "  {i:>3}: {}", describe(&step, &model));
        let got = match real.apply(&step, now).await {
            Ok(got) => got,
            Err(e) => return Err((i, format!("{log}\n  => {e}"))),
        };
        if got != exp {
            return Err((
                i,
                format!("{log}\n  => answer differs: model {exp:?}, store {got:?}"),
            ));
        }
        let _ = writeln!(log, " -> {exp:?}");
        if let Err(e) = real.check(&mut model).await {
            return Err((i, format!("{log}  => after this step: {e}")));
        }
    }
    Ok(())
}

/// The claims of a step that are no longer current (before it runs).
fn stale_claims(step: &Step, m: &Model) -> usize {
    let cs: Vec<usize> = match step {
        Step::Heartbeat(cs) => cs.clone(),
        Step::Finish(c, _) | Step::Progress(c) | Step::Lapse(c) => vec![*c],
        Step::FinishMany(items) => items.iter().map(|(c, _)| *c).collect(),
        _ => Vec::new(),
    };
    cs.into_iter().filter(|c| !m.current(*c)).count()
}

/// Count what the sequences exercised, to show the search reaches the
/// interesting cases (printed at the end).
fn note(step: &Step, ans: &Ans, stale: usize, cov: &mut BTreeMap<String, u64>) {
    let mut add = |k: String| *cov.entry(k).or_default() += 1;
    if stale > 0 {
        add("call with a stale claim".into());
    }
    match (step, ans) {
        (Step::Enqueue(_), Ans::Enqueued(v)) if v.iter().any(|(_, ins)| !ins) => {
            add("enqueue of a taken key".into())
        }
        (Step::Claim { cap: Some(_), .. }, Ans::Claimed(v)) => {
            add(format!("capped claim took {}", v.len()))
        }
        (Step::Claim { .. }, Ans::Claimed(v)) => add(format!("claim took {}", v.len())),
        (Step::Finish(_, f), Ans::Done(v)) => add(format!("finish {f:?} -> {}", v[0])),
        (Step::FinishMany(items), Ans::Done(v)) => add(format!(
            "finish_many of {} ({} true)",
            items.len(),
            v.iter().filter(|b| **b).count()
        )),
        (Step::Heartbeat(_) | Step::Lapse(_), Ans::Beats(v)) => {
            for h in v {
                add(format!("heartbeat {h:?}"));
            }
        }
        (Step::Rescue, Ans::Rescued(r, f, c)) if r + f + c > 0 => add(format!(
            "rescue requeued/failed/cancelled {}/{}/{}",
            r.min(&1),
            f.min(&1),
            c.min(&1)
        )),
        (Step::Cancel(_), Ans::Cancel(o)) => add(format!("cancel {o:?}")),
        (Step::Retry(_), Ans::Retry(r)) => add(format!("retry {r:?}")),
        (Step::Prune, Ans::Pruned(n)) if *n > 0 => add("prune deleted some".into()),
        (Step::LockAcquire(_), Ans::Acquire(a)) => {
            add(format!("lock acquire busy={}", a.is_some()))
        }
        (Step::LockExtend(..), Ans::Done(v)) => add(format!("lock extend {}", v[0])),
        (Step::LockRelease(..), Ans::Done(v)) => add(format!("lock release {}", v[0])),
        _ => {}
    }
}

/// A step in the model's terms, for transcripts.
fn describe(step: &Step, m: &Model) -> String {
    let cl = |c: &usize| {
        let x = m.claims[*c];
        format!("claim#{c}(task#{} attempt {})", x.task, x.attempt)
    };
    match step {
        Step::Noop => "(nothing to refer to)".into(),
        Step::Enqueue(specs) => {
            let v: Vec<String> = specs
                .iter()
                .map(|s| {
                    format!(
                        "{{queue {} prio {} {} max {}{}}}",
                        QUEUES[s.queue],
                        s.prio,
                        if s.later { "in 1h" } else { "now" },
                        s.max_attempts,
                        match s.key {
                            Some(k) if s.hold != UniqueHold::Unfinished => {
                                format!(" key {} {}", KEYS[k], s.hold)
                            }
                            Some(k) => format!(" key {}", KEYS[k]),
                            None => String::new(),
                        }
                    )
                })
                .collect();
            format!("enqueue {}", v.join(" "))
        }
        Step::Claim { queue, limit, cap } => {
            format!(
                "claim queue {} limit {limit} max_running {cap:?}",
                QUEUES[*queue]
            )
        }
        Step::Heartbeat(cs) => format!(
            "heartbeat [{}]",
            cs.iter().map(cl).collect::<Vec<_>>().join(", ")
        ),
        Step::Finish(c, f) => format!("finish {} {f:?}", cl(c)),
        Step::FinishMany(items) => format!(
            "finish_many [{}]",
            items
                .iter()
                .map(|(c, f)| format!("{} {f:?}", cl(c)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Step::Progress(c) => format!("progress {}", cl(c)),
        Step::Lapse(c) => format!("heartbeat {} with a 1 ms lease, sleep", cl(c)),
        Step::Rescue => "rescue".into(),
        Step::Cancel(t) => format!("cancel task#{t}"),
        Step::Retry(t) => format!("retry task#{t}"),
        Step::Prune => "sleep, prune(0)".into(),
        Step::LockAcquire(l) => format!("lock_acquire {}", LOCKS[*l]),
        Step::LockExtend(l, g) => format!("lock_extend {} grant#{g}", LOCKS[*l]),
        Step::LockRelease(l, g, keep) => format!(
            "lock_release {} grant#{g} at_least {}",
            LOCKS[*l],
            if *keep { "10min" } else { "0" }
        ),
        Step::LockLapse(l) => format!("lock_extend {} latest grant to 1 ms, sleep", LOCKS[*l]),
    }
}

/// Shrink a failing sequence: drop chunks (halves, quarters, … single ops)
/// while the rest still fails against a fresh store.
async fn shrink(
    kind: Kind,
    mut ops: Vec<Op>,
    rules: Rules,
    mut fail: (usize, String),
) -> (Vec<Op>, String) {
    ops.truncate(fail.0 + 1);
    let mut chunk = ops.len().div_ceil(2).max(1);
    loop {
        let mut i = 0;
        let mut progressed = false;
        while i < ops.len() {
            let mut cand = ops.clone();
            cand.drain(i..(i + chunk).min(ops.len()));
            if cand.is_empty() {
                i += chunk;
                continue;
            }
            match replay(kind, &cand, rules, &mut BTreeMap::new()).await {
                Err(f) => {
                    cand.truncate(f.0 + 1);
                    ops = cand;
                    fail = f;
                    progressed = true;
                }
                Ok(()) => i += chunk,
            }
        }
        if chunk == 1 && !progressed {
            // Then drop single items of the batch operations.
            for i in 0..ops.len() {
                for cand_op in fewer_items(&ops[i]) {
                    let mut cand = ops.clone();
                    cand[i] = cand_op;
                    if let Err(f) = replay(kind, &cand, rules, &mut BTreeMap::new()).await {
                        cand.truncate(f.0 + 1);
                        ops = cand;
                        fail = f;
                        progressed = true;
                        break;
                    }
                }
                if progressed {
                    break;
                }
            }
            if !progressed {
                break;
            }
        }
        if !progressed {
            chunk = chunk.div_ceil(2);
        }
    }
    (ops, fail.1)
}

/// The op with one item of its batch removed, each way (none for single ops).
fn fewer_items(op: &Op) -> Vec<Op> {
    fn drop_each<T: Clone>(v: &[T], f: impl Fn(Vec<T>) -> Op) -> Vec<Op> {
        if v.len() < 2 {
            return Vec::new();
        }
        (0..v.len())
            .map(|i| {
                let mut w = v.to_vec();
                w.remove(i);
                f(w)
            })
            .collect()
    }
    match op {
        Op::Enqueue(v) => drop_each(v, Op::Enqueue),
        Op::Heartbeat(v) => drop_each(v, Op::Heartbeat),
        Op::FinishMany(v) => drop_each(v, Op::FinishMany),
        _ => Vec::new(),
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?}: expected a non-negative integer")),
        Err(_) => default,
    }
}

/// The model checker: `cases` random sequences of `ops` operations each.
pub async fn store_agrees_with_the_model(ts: TestStore) {
    let mut rules = Rules::from_env();
    rules.queue_keys = matches!(ts.kind, Kind::Redis);
    let seed = env_u64("BATON_MODEL_SEED", 0xba70_0008);
    let cases = env_u64("BATON_MODEL_CASES", 20);
    let len = usize::try_from(env_u64("BATON_MODEL_OPS", 40)).unwrap_or(40);
    let kind = ts.kind;
    drop(ts);
    let t0 = Instant::now();
    let mut cov = BTreeMap::new();
    for case in 0..cases {
        let case_seed = seed.wrapping_add(case);
        let mut rng = fastrand::Rng::with_seed(case_seed);
        let ops = gen_ops(&mut rng, len);
        if let Err(fail) = replay(kind, &ops, rules, &mut cov).await {
            let (short, transcript) = shrink(kind, ops, rules, fail).await;
            panic!(
                "{kind:?} differs from the model ({:?}), case seed {case_seed} \
                 (BATON_MODEL_SEED={case_seed} BATON_MODEL_CASES=1 reproduces it); \
                 shortest failing sequence, {} ops:\n{transcript}\n",
                rules,
                short.len()
            );
        }
    }
    eprintln!(
        "model: {kind:?} agreed on {cases} cases x {len} ops (seed {seed}, {rules:?}) in {:.1?}",
        t0.elapsed()
    );
    let cov: Vec<String> = cov.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    eprintln!("model: {kind:?} exercised {}", cov.join("; "));
}
