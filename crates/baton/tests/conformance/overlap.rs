//! S7 overlap policies: each decided by `job_advance` with the slot's
//! compare-and-set; a slot that waits is not claimable until
//! `job_release` finds the job's earlier runs finished; each slot not run
//! keeps its reason.

use std::time::Duration;

use baton::schedule::spec::Schedule;
use baton::schedule::Job;
use baton::store::{
    is_waiting, Advanced, Enqueued, Finish, JobAdvance, JobRegister, Overlap, SlotRecord, Task,
    TaskState, OVERLAP_BUFFER_FULL, OVERLAP_REPLACED,
};
use chrono::{DateTime, Utc};

use baton_testkit::clock;

use crate::TestStore;

/// A job on a 1 s interval, registered; its first cursor.
async fn setup(ts: &TestStore, name: &str) -> (Job, DateTime<Utc>) {
    register(ts, name, JobRegister::new(name)).await
}

/// A job on a 1 s interval, registered as `reg` says; its first cursor.
async fn register(ts: &TestStore, name: &str, reg: JobRegister<'_>) -> (Job, DateTime<Utc>) {
    let job = Job::new(name, Schedule::every(Duration::from_secs(1)).unwrap());
    let c0 = ts
        .store
        .backend()
        .job_register(&reg)
        .await
        .unwrap()
        .last_slot
        .unwrap();
    (job, c0)
}

/// Take slot `n` (seconds after `c0`) from the cursor at slot `n - 1`.
async fn take(ts: &TestStore, job: &Job, c0: DateTime<Utc>, n: i64, ov: Overlap) -> Advanced {
    let at = |k: i64| c0 + chrono::Duration::seconds(k);
    let expected = if n == 1 { c0 } else { at(n - 1) };
    let task = job.task(at(n), false).unwrap();
    ts.store
        .backend()
        .job_advance(&JobAdvance {
            job: &job.name,
            expected: Some(expected),
            slot: at(n),
            task: Some(&task),
            overlap: ov,
            record: SlotRecord::Enqueue,
            batch_after: None,
            due_only: false,
            until: None,
            not_before: None,
            source: None,
        })
        .await
        .unwrap()
}

/// Claim what is claimable on the default queue now.
async fn claim(ts: &TestStore) -> Vec<Task> {
    crate::queue::claim(&ts.store, "default", 10, 30_000).await
}

async fn state(ts: &TestStore, id: i64) -> baton::store::TaskInfo {
    ts.store.backend().task_get(id).await.unwrap().unwrap()
}

async fn finish(ts: &TestStore, t: &Task, f: Finish) {
    let ok = ts
        .store
        .backend()
        .task_finish_many(&[(t.claim(), f)])
        .await
        .unwrap();
    assert_eq!(ok, vec![true]);
}

fn enqueued(a: Advanced) -> Enqueued {
    match a {
        Advanced::Enqueued(e) => e,
        other => panic!("expected enqueued, got {other:?}"),
    }
}

fn waiting(a: Advanced) -> Enqueued {
    match a {
        Advanced::Waiting(e) => e,
        other => panic!("expected waiting, got {other:?}"),
    }
}

fn skipped(a: Advanced) -> Enqueued {
    match a {
        Advanced::Skipped(e) => e,
        other => panic!("expected skipped, got {other:?}"),
    }
}

/// The slots are in the future (1-4 s after registering): the first
/// runs with `RunAt::At(slot)`; the store's clock is moved to it (the test
/// clock) and it is claimed.
async fn claim_first(ts: &TestStore, id: i64) -> Task {
    clock::advance_to(ts, state(ts, id).await.run_at).await;
    claim(ts)
        .await
        .into_iter()
        .find(|t| t.id == id)
        .unwrap_or_else(|| panic!("task {id} not claimable at its run_at"))
}

pub async fn buffer_one_waits_for_the_running_run_and_keeps_one(ts: TestStore) {
    let b = ts.store.backend();
    let (job, c0) = setup(&ts, "b1").await;
    let first = enqueued(take(&ts, &job, c0, 1, Overlap::BufferOne).await);
    let running = claim_first(&ts, first.id).await;
    let second = waiting(take(&ts, &job, c0, 2, Overlap::BufferOne).await);
    let info = state(&ts, second.id).await;
    assert_eq!(info.state, TaskState::Pending);
    assert!(is_waiting(info.run_at), "{:?}", info.run_at);
    // The gate: while the first runs, the waiting one is not claimable
    // and not released.
    assert!(claim(&ts).await.is_empty());
    assert_eq!(b.job_release(&job.name).await.unwrap(), None);
    // A further slot while one waits: skipped, saying why.
    let third = skipped(take(&ts, &job, c0, 3, Overlap::BufferOne).await);
    let info = state(&ts, third.id).await;
    assert_eq!(info.state, TaskState::Cancelled);
    assert_eq!(info.last_error.as_deref(), Some(OVERLAP_BUFFER_FULL));
    // The first ends: the waiting one is released once, then claimable.
    finish(&ts, &running, Finish::Succeeded).await;
    assert_eq!(b.job_release(&job.name).await.unwrap(), Some(second.id));
    assert_eq!(b.job_release(&job.name).await.unwrap(), None);
    let got = claim(&ts).await;
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), [second.id]);
}

pub async fn buffer_all_runs_each_waiting_slot_in_order(ts: TestStore) {
    let b = ts.store.backend();
    let (job, c0) = setup(&ts, "ba").await;
    let first = enqueued(take(&ts, &job, c0, 1, Overlap::BufferAll).await);
    let running = claim_first(&ts, first.id).await;
    let w2 = waiting(take(&ts, &job, c0, 2, Overlap::BufferAll).await);
    let w3 = waiting(take(&ts, &job, c0, 3, Overlap::BufferAll).await);
    assert!(claim(&ts).await.is_empty());
    assert_eq!(b.job_release(&job.name).await.unwrap(), None);
    finish(&ts, &running, Finish::Succeeded).await;
    // One at a time, in slot order: w3 waits while w2 is pending or running.
    assert_eq!(b.job_release(&job.name).await.unwrap(), Some(w2.id));
    assert_eq!(b.job_release(&job.name).await.unwrap(), None);
    let got = claim(&ts).await;
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), [w2.id]);
    assert_eq!(b.job_release(&job.name).await.unwrap(), None);
    finish(&ts, &got[0], Finish::Succeeded).await;
    assert_eq!(b.job_release(&job.name).await.unwrap(), Some(w3.id));
}

pub async fn cancel_other_stops_the_previous_and_waits_for_it(ts: TestStore) {
    replaces_the_previous(ts, Overlap::CancelOther).await
}

/// Decided in the store as cancel_other (the stop differs in the worker).
pub async fn terminate_other_is_decided_as_cancel_other(ts: TestStore) {
    replaces_the_previous(ts, Overlap::TerminateOther).await
}

async fn replaces_the_previous(ts: TestStore, ov: Overlap) {
    let b = ts.store.backend();
    let (job, c0) = setup(&ts, "co").await;
    let first = enqueued(take(&ts, &job, c0, 1, ov).await);
    let running = claim_first(&ts, first.id).await;
    let w2 = waiting(take(&ts, &job, c0, 2, ov).await);
    assert!(state(&ts, first.id).await.cancel_requested, "stop asked");
    assert!(claim(&ts).await.is_empty(), "the new run waits");
    // A later slot replaces the waiting one (never started: cancelled,
    // saying why) and waits in its place.
    let w3 = waiting(take(&ts, &job, c0, 3, ov).await);
    let info = state(&ts, w2.id).await;
    assert_eq!(info.state, TaskState::Cancelled);
    assert_eq!(info.last_error.as_deref(), Some(OVERLAP_REPLACED));
    assert_eq!(b.job_release(&job.name).await.unwrap(), None);
    // The previous run stops (its worker saw the request): the new one
    // may start.
    finish(
        &ts,
        &running,
        Finish::Cancelled {
            reason: "cancel requested".into(),
        },
    )
    .await;
    assert_eq!(b.job_release(&job.name).await.unwrap(), Some(w3.id));
    let got = claim(&ts).await;
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), [w3.id]);
    // A previous run that had not started is cancelled, and the new slot
    // runs at once (nothing to wait for).
    let (job2, c2) = setup(&ts, "co2").await;
    let p = enqueued(take(&ts, &job2, c2, 1, ov).await);
    let n = enqueued(take(&ts, &job2, c2, 2, ov).await);
    assert!(n.inserted);
    let info = state(&ts, p.id).await;
    assert_eq!(info.state, TaskState::Cancelled);
    assert_eq!(info.last_error.as_deref(), Some(OVERLAP_REPLACED));
    assert!(!is_waiting(state(&ts, n.id).await.run_at));
}

pub async fn racing_releases_start_a_waiting_slot_once(ts: TestStore) {
    let (job, c0) = setup(&ts, "race").await;
    let first = enqueued(take(&ts, &job, c0, 1, Overlap::BufferAll).await);
    let running = claim_first(&ts, first.id).await;
    let w2 = waiting(take(&ts, &job, c0, 2, Overlap::BufferAll).await);
    waiting(take(&ts, &job, c0, 3, Overlap::BufferAll).await);
    finish(&ts, &running, Finish::Succeeded).await;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let store = ts.open().await;
        let name = job.name.clone();
        set.spawn(async move { store.backend().job_release(&name).await.unwrap() });
    }
    let mut released = Vec::new();
    while let Some(r) = set.join_next().await {
        released.extend(r.unwrap());
    }
    assert_eq!(
        released,
        [w2.id],
        "one release, of the earliest waiting slot"
    );
}

/// Issue 26, the release's hot path: a worker ending a run of a `skip`
/// (or `allow`) job makes no `job_release` call (the job's recorded
/// policy cannot leave a slot waiting), and one ending a run of a
/// `buffer_one` job still starts the slot waiting for it — with no
/// scheduler polling, so the worker's call is what starts it.
pub async fn a_worker_releases_only_for_jobs_that_may_wait(ts: TestStore) {
    use baton::queue::{Worker, WorkerConfig};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let calls: crate::idle::Calls = Arc::default();
    let counted = crate::idle::counted(&ts.store, &calls);
    let gate = Arc::new(AtomicBool::new(false));
    let mut w = Worker::new(
        counted,
        WorkerConfig::default()
            .queue("default", 4)
            .poll_interval(Duration::from_millis(100)),
    )
    .unwrap();
    let open = gate.clone();
    w.handle_any(move |_| {
        let open = open.clone();
        async move {
            // The buffer_one job's first run lasts until the gate opens.
            while !open.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(())
        }
    });
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    let releases = || {
        calls
            .lock()
            .unwrap()
            .get("job_release")
            .copied()
            .unwrap_or(0)
    };
    let ended = |ts: &TestStore, id: i64| {
        let store = ts.store.clone();
        async move {
            for _ in 0..200 {
                let t = store.backend().task_get(id).await.unwrap().unwrap();
                if t.state == TaskState::Succeeded {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("task {id} never succeeded");
        }
    };

    // A skip job: its run ends, and nothing asks for a release.
    gate.store(true, Ordering::SeqCst);
    let name = "gate-skip";
    let (job, c0) = register(&ts, name, JobRegister::new(name).overlap(Overlap::Skip)).await;
    let s1 = enqueued(take(&ts, &job, c0, 1, Overlap::Skip).await);
    ended(&ts, s1.id).await;
    let s2 = enqueued(take(&ts, &job, c0, 2, Overlap::Skip).await);
    ended(&ts, s2.id).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        releases(),
        0,
        "a skip job's runs make no job_release: {:?}",
        calls.lock().unwrap()
    );

    // A buffer_one job: the slot waiting for the running run starts when
    // that run ends, released by the worker.
    gate.store(false, Ordering::SeqCst);
    let name = "gate-b1";
    let (job, c0) = register(
        &ts,
        name,
        JobRegister::new(name).overlap(Overlap::BufferOne),
    )
    .await;
    let first = enqueued(take(&ts, &job, c0, 1, Overlap::BufferOne).await);
    for _ in 0..200 {
        if state(&ts, first.id).await.state == TaskState::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state(&ts, first.id).await.state, TaskState::Running);
    let second = waiting(take(&ts, &job, c0, 2, Overlap::BufferOne).await);
    gate.store(true, Ordering::SeqCst);
    ended(&ts, first.id).await;
    ended(&ts, second.id).await;
    assert!(
        releases() >= 1,
        "the buffer_one job's run released its waiter"
    );
    stop.cancel();
    run.await.unwrap().unwrap();
}

/// The schedulers' release poll (once a second) runs only for jobs under a
/// policy that may leave a slot waiting: a scheduler of a `skip` job makes
/// no `job_release` call, one of a `buffer_one` job does. Each registers
/// its job's policy in the store, which the workers read.
pub async fn schedulers_poll_releases_only_for_waiting_policies(ts: TestStore) {
    use baton::schedule::Scheduler;
    use std::sync::Arc;
    let hourly = || Schedule::every(Duration::from_secs(3600)).unwrap();
    let mut counts = Vec::new();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut runs = Vec::new();
    for (name, ov) in [
        ("poll-skip", Overlap::Skip),
        ("poll-b1", Overlap::BufferOne),
    ] {
        let calls: crate::idle::Calls = Arc::default();
        let mut s = Scheduler::new(crate::idle::counted(&ts.store, &calls));
        s.add(Job::new(name, hourly()).overlap(ov)).unwrap();
        runs.push(tokio::spawn(s.run(stop.clone())));
        counts.push(calls);
    }
    tokio::time::sleep(Duration::from_millis(3500)).await;
    stop.cancel();
    for r in runs {
        r.await.unwrap().unwrap();
    }
    let releases = |c: &crate::idle::Calls| c.lock().unwrap().get("job_release").copied();
    assert_eq!(
        releases(&counts[0]),
        None,
        "skip: {:?}",
        counts[0].lock().unwrap()
    );
    assert!(
        releases(&counts[1]).unwrap_or(0) >= 1,
        "buffer_one: {:?}",
        counts[1].lock().unwrap()
    );
    let b = ts.store.backend();
    let policy =
        |name: &'static str| async move { b.job_get(name).await.unwrap().unwrap().overlap };
    assert_eq!(policy("poll-skip").await, Some(Overlap::Skip));
    assert_eq!(policy("poll-b1").await, Some(Overlap::BufferOne));
}

/// A slot left waiting after its previous run ended with no release asked
/// (the ending worker's ask lost, no scheduler of the job polling: a
/// drain, a job gone from the config) is started by a worker's sweep
/// (every 15 polls) and runs.
pub async fn a_workers_sweep_starts_a_slot_no_one_released(ts: TestStore) {
    use baton::queue::{Worker, WorkerConfig};
    let name = "sweep-b1";
    let (job, c0) = register(
        &ts,
        name,
        JobRegister::new(name).overlap(Overlap::BufferOne),
    )
    .await;
    let first = enqueued(take(&ts, &job, c0, 1, Overlap::BufferOne).await);
    let running = claim_first(&ts, first.id).await;
    let second = waiting(take(&ts, &job, c0, 2, Overlap::BufferOne).await);
    // The run ends; nobody asks the store to start the waiting slot.
    finish(&ts, &running, Finish::Succeeded).await;
    assert!(is_waiting(state(&ts, second.id).await.run_at));
    let mut w = Worker::new(
        ts.store.clone(),
        WorkerConfig::default()
            .queue("default", 2)
            .poll_interval(Duration::from_millis(100)),
    )
    .unwrap();
    w.handle_any(|_| async { Ok(()) });
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    // The sweep's first round is 1.5 s in (15 polls of 100 ms).
    let mut ended = false;
    for _ in 0..150 {
        if state(&ts, second.id).await.state == TaskState::Succeeded {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    assert!(ended, "the waiting slot {} never ran", second.id);
}
