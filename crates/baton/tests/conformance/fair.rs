//! Fair claiming across concurrency keys (`TaskClaim::fair`,
//! `WorkerConfig::fair`): a backlog of one key does not hold back the few
//! tasks of other keys (nor the tasks without a key), each key's tasks keep
//! their order, priority still wins, and racing fair claimers never
//! overshoot the per-key cap. A store without fair claiming refuses it
//! (the claim, and a worker at start naming the field `fair`).

use std::time::Duration;

use baton::queue::{Queue, TaskBuilder, Worker, WorkerConfig};
use baton::store::{Finish, Task, TaskClaim, TaskState};
use baton::Store;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::harness::Kind;
use crate::TestStore;

/// The stores whose claims are fair; the others refuse the setting.
fn supported(ts: &TestStore) -> bool {
    matches!(ts.kind, Kind::Sqlite | Kind::Postgres)
}

fn fair_claim(queue: &str, limit: u32) -> TaskClaim<'_> {
    TaskClaim {
        queue,
        worker: "w",
        limit,
        lease: Duration::from_secs(30),
        max_running: None,
        per_key_max_running: None,
        buffered: 0,
        fair: true,
    }
}

async fn claim(store: &Store, queue: &str, limit: u32) -> Vec<Task> {
    store
        .backend()
        .task_claim(&fair_claim(queue, limit))
        .await
        .unwrap()
}

async fn succeed(store: &Store, tasks: &[Task]) {
    let done: Vec<_> = tasks
        .iter()
        .map(|t| (t.claim(), Finish::Succeeded))
        .collect();
    let ok = store.backend().task_finish_many(&done).await.unwrap();
    assert!(ok.iter().all(|b| *b), "finishes {ok:?}");
}

/// Enqueue `n` tasks of `key` (kind `key`, or `free` without one) at
/// `priority`, in order; their ids in enqueue order.
async fn enqueue(q: &Queue, queue: &str, key: Option<&str>, n: usize, priority: i32) -> Vec<i64> {
    let mut ids = Vec::new();
    let all: Vec<usize> = (0..n).collect();
    for chunk in all.chunks(1000) {
        let batch = chunk.iter().map(|i| {
            let t = TaskBuilder::new(key.unwrap_or("free"), json!(i))
                .queue(queue)
                .priority(priority);
            match key {
                Some(k) => t.concurrency_key(k),
                None => t,
            }
        });
        ids.extend(
            q.enqueue_many(batch.collect())
                .await
                .unwrap()
                .iter()
                .map(|e| e.id),
        );
    }
    ids
}

/// A backlog of 3000 tasks of one key enqueued first, then 4 tasks each of
/// two other keys and 3 without a key. Claims of one task each, finished
/// at once (so nothing runs between claims and only the rotation decides):
/// every 4 consecutive claims serve the 4 groups, so the 11 small tasks are
/// all started within the first 16 claims (in order claims, the backlog
/// would take the first 3000); each key's tasks come in enqueue order.
/// Then claims of 4 left running: each takes one task of every group.
pub async fn backlog_of_one_key_does_not_hold_back_the_others(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    if !supported(&ts) {
        enqueue(&q, "fair", Some("big"), 1, 0).await;
        let e = ts.store.backend().task_claim(&fair_claim("fair", 1)).await;
        let e = e.expect_err("a store without fair claiming refuses it");
        assert!(e.to_string().contains("fair"), "{e}");
        return;
    }
    let big = enqueue(&q, "fair", Some("big"), 3000, 0).await;
    let b = enqueue(&q, "fair", Some("b"), 4, 0).await;
    let c = enqueue(&q, "fair", Some("c"), 4, 0).await;
    let free = enqueue(&q, "fair", None, 3, 0).await;
    let mut order: Vec<Task> = Vec::new();
    for _ in 0..16 {
        let got = claim(&ts.store, "fair", 1).await;
        assert_eq!(got.len(), 1, "one task per claim");
        succeed(&ts.store, &got).await;
        order.extend(got);
    }
    let ids_of = |kind: &str| -> Vec<i64> {
        order
            .iter()
            .filter(|t| t.kind == kind)
            .map(|t| t.id)
            .collect()
    };
    assert_eq!(ids_of("b"), b, "key b: all 4, in order, within 16 claims");
    assert_eq!(ids_of("c"), c, "key c: all 4, in order");
    assert_eq!(ids_of("free"), free, "no key: all 3, in order");
    assert_eq!(ids_of("big"), big[..5].to_vec(), "the backlog in order");
    for w in order[..12].chunks(4) {
        let mut kinds: Vec<&str> = w.iter().map(|t| t.kind.as_str()).collect();
        kinds.sort();
        assert_eq!(
            kinds,
            ["b", "big", "c", "free"],
            "one of each group per round"
        );
    }
    // Claims left running: the group with the fewest running goes first.
    let b2 = enqueue(&q, "fair", Some("b"), 5, 0).await;
    let c2 = enqueue(&q, "fair", Some("c"), 5, 0).await;
    let first = claim(&ts.store, "fair", 3).await;
    let mut kinds: Vec<&str> = first.iter().map(|t| t.kind.as_str()).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        ["b", "big", "c"],
        "one task of each group: {first:?}"
    );
    let second = claim(&ts.store, "fair", 3).await;
    let mut kinds: Vec<&str> = second.iter().map(|t| t.kind.as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, ["b", "big", "c"], "again one of each: {second:?}");
    let taken = |kind: &str| -> Vec<i64> {
        first
            .iter()
            .chain(&second)
            .filter(|t| t.kind == kind)
            .map(|t| t.id)
            .collect()
    };
    assert_eq!(taken("b"), b2[..2].to_vec(), "key b in order");
    assert_eq!(taken("c"), c2[..2].to_vec(), "key c in order");
}

/// Priority wins across priorities: a key's urgent tasks (smaller
/// priority) come before every other key's, however the rotation stands;
/// within one priority the keys alternate.
pub async fn fair_claim_keeps_priority_first(ts: TestStore) {
    if !supported(&ts) {
        return;
    }
    let q = Queue::new(ts.store.clone());
    let a = enqueue(&q, "prio", Some("a"), 20, 1).await;
    let c = enqueue(&q, "prio", Some("c"), 2, 1).await;
    let urgent = enqueue(&q, "prio", Some("b"), 2, 0).await;
    let got = claim(&ts.store, "prio", 2).await;
    assert_eq!(
        got.iter().map(|t| t.id).collect::<Vec<_>>(),
        urgent,
        "priority 0 first"
    );
    succeed(&ts.store, &got).await;
    let mut next = Vec::new();
    for _ in 0..4 {
        let got = claim(&ts.store, "prio", 1).await;
        succeed(&ts.store, &got).await;
        next.extend(got.iter().map(|t| t.id));
    }
    let mut want = vec![a[0], a[1], c[0], c[1]];
    want.sort();
    let mut seen = next.clone();
    seen.sort();
    assert_eq!(seen, want, "a and c alternate: {next:?}");
    assert_ne!(
        q.task(a[2]).await.unwrap().unwrap().state,
        TaskState::Running
    );
}

/// The 16 racing claimers of the per-key cap test, fair: the peak of every
/// key is at most the cap, and every task runs once.
pub async fn fair_claims_keep_the_per_key_cap_under_16_racing_claimers(ts: TestStore) {
    if !supported(&ts) {
        return;
    }
    crate::keys::per_key_cap_holds_under_racing_claimers(ts, true).await
}

/// Workers on a fair queue: a backlog of one key, then 5 tasks of another
/// key; the 5 run long before the backlog is through. On a store without
/// fair claiming the worker refuses to start, naming the field.
pub async fn fair_workers_run_a_small_key_past_a_backlog(ts: TestStore) {
    let cfg = || {
        WorkerConfig::default()
            .queue("fairw", 4)
            .fair("fairw")
            .poll_interval(Duration::from_millis(200))
            .shutdown_grace(Duration::from_millis(300))
            .stop_grace(Duration::from_millis(300))
    };
    if !supported(&ts) {
        let w = Worker::new(ts.store.clone(), cfg()).unwrap();
        let e = w.run(CancellationToken::new()).await.unwrap_err();
        assert!(e.to_string().contains("fair"), "{e}");
        return;
    }
    let q = Queue::new(ts.store.clone());
    let bad = WorkerConfig::default().queue("x", 1).fair("y");
    assert_eq!(
        Worker::new(ts.store.clone(), bad).err().unwrap().field,
        "fair"
    );
    let big = enqueue(&q, "fairw", Some("big"), 400, 0).await;
    let small = enqueue(&q, "fairw", Some("small"), 5, 0).await;
    let mut w = Worker::new(ts.open().await, cfg()).unwrap();
    for kind in ["big", "small"] {
        w.handle(kind, |_ctx| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok(())
        });
    }
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    for id in &small {
        baton_testkit::wait::task_state(&q, *id, TaskState::Succeeded, Duration::from_secs(30))
            .await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    let mut done = 0;
    for id in &big {
        if q.task(*id).await.unwrap().unwrap().state == TaskState::Succeeded {
            done += 1;
        }
    }
    assert!(
        done < big.len() / 2,
        "the small key ran before half the backlog: {done} of {} big ran first",
        big.len()
    );
}
