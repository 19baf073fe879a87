//! Fair claiming across concurrency keys (`TaskClaim::fair`,
//! `WorkerConfig::fair`): a backlog of one key does not hold back the few
//! tasks of other keys (nor the tasks without a key), each key's tasks keep
//! their order, priority still wins, and racing fair claimers never
//! overshoot the per-key cap. Every store claims fairly.

use std::time::Duration;

use baton::queue::{Queue, TaskBuilder, Worker, WorkerConfig};
use baton::store::{Finish, Task, TaskClaim, TaskState};
use baton::Store;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::TestStore;

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
    crate::keys::per_key_cap_holds_under_racing_claimers(ts, true).await
}

/// Workers on a fair queue: a backlog of one key, then 5 tasks of another
/// key; the 5 run long before the backlog is through.
pub async fn fair_workers_run_a_small_key_past_a_backlog(ts: TestStore) {
    let cfg = || {
        WorkerConfig::default()
            .queue("fairw", 4)
            .fair("fairw")
            .poll_interval(Duration::from_millis(200))
            .shutdown_grace(Duration::from_millis(300))
            .stop_grace(Duration::from_millis(300))
    };
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

/// The fair claiming step (SQLite 9 → 10, PostgreSQL 10 → 11, MySQL
/// 13 → 14, Redis 14 → 15) on a store with due tasks: each store is put
/// back as the step found it (SQL: no cursor column, no
/// `tasks_key_pending`; Redis: no group index of `ready`) with the version
/// set back; after the upgrade, fair claims see the tasks enqueued before
/// it: the 2 tasks of a small key and the 2 without a key all start within
/// the first 6 claims of one, past a backlog of 30 of one key.
pub async fn fair_claims_see_the_tasks_enqueued_before_the_fair_upgrade(ts: TestStore) {
    use crate::harness::{exec_sql, Kind};
    let q = Queue::new(ts.store.clone());
    enqueue(&q, "fu", Some("big"), 30, 0).await;
    let b = enqueue(&q, "fu", Some("b"), 2, 0).await;
    let free = enqueue(&q, "fu", None, 2, 0).await;
    let p = ts.prefix.clone();
    let before = match ts.kind {
        Kind::Sqlite => 9,
        Kind::Postgres => 10,
        Kind::Mysql => 13,
        Kind::Redis => 14,
    };
    match ts.kind {
        Kind::Sqlite | Kind::Postgres => {
            exec_sql(&ts, &format!("DROP INDEX \"{p}tasks_key_pending\"")).await;
            exec_sql(
                &ts,
                &format!("ALTER TABLE \"{p}queues\" DROP COLUMN fair_cursor"),
            )
            .await;
        }
        Kind::Mysql => {
            exec_sql(&ts, &format!("DROP INDEX tasks_key_pending ON `{p}tasks`")).await;
            exec_sql(
                &ts,
                &format!("ALTER TABLE `{p}queues` DROP COLUMN fair_cursor"),
            )
            .await;
        }
        Kind::Redis => {
            let mut c = crate::upgrade::redis_conn(&ts).await;
            for k in ["fk:", "fk:big", "fk:b", "fkeys"] {
                let _: i64 = redis::cmd("DEL")
                    .arg(format!("{p}{{baton:q:fu}}:{k}"))
                    .query_async(&mut c)
                    .await
                    .unwrap();
            }
        }
    }
    let expected = ts.store.backend().schema_status().await.unwrap().expected;
    crate::harness::set_schema_version(&ts, &p, Some(before)).await;
    let opts = baton::store::StoreOptions {
        prefix: Some(p.clone()),
        max_connections: 2,
        ..baton::store::StoreOptions::default()
    };
    let store = Store::connect_with(&ts.url, opts).await.unwrap();
    let status = store.backend().schema_status().await.unwrap();
    assert_eq!(status.found, Some(expected), "upgraded");
    let mut order: Vec<Task> = Vec::new();
    for _ in 0..6 {
        let got = claim(&store, "fu", 1).await;
        assert_eq!(got.len(), 1, "one task per claim, after {order:?}");
        succeed(&store, &got).await;
        order.extend(got);
    }
    let ids_of = |kind: &str| -> Vec<i64> {
        order
            .iter()
            .filter(|t| t.kind == kind)
            .map(|t| t.id)
            .collect()
    };
    assert_eq!(ids_of("b"), b, "key b within 6 claims");
    assert_eq!(ids_of("free"), free, "no key within 6 claims");
}

/// Fair claims see every due task however it became due — a task a
/// capped claim that is not fair met at its key's cap (Redis parks it)
/// and its key's finish let go, a task handed back, a failed task
/// retried — beside tasks never claimed; and not a task cancelled while
/// pending. (On Redis each path keeps fair claiming's group index.)
pub async fn fair_claims_see_every_due_task(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let b = ts.store.backend();
    let k = enqueue(&q, "fs", Some("k"), 2, 0).await;
    let h = enqueue(&q, "fs", Some("h"), 1, 0).await;
    let capped = TaskClaim {
        per_key_max_running: Some(1),
        fair: false,
        ..fair_claim("fs", 2)
    };
    let got = b.task_claim(&capped).await.unwrap();
    let mut ids: Vec<i64> = got.iter().map(|t| t.id).collect();
    ids.sort();
    assert_eq!(ids, [k[0], h[0]], "one of k (the cap), then h");
    let k1 = got.iter().find(|t| t.id == k[0]).unwrap();
    let h1 = got.iter().find(|t| t.id == h[0]).unwrap();
    succeed(&ts.store, std::slice::from_ref(k1)).await;
    let back = b
        .task_finish_many(&[(h1.claim(), Finish::HandBack)])
        .await
        .unwrap();
    assert_eq!(back, [true]);
    let r = enqueue(&q, "fs", Some("r"), 1, -1).await;
    let got = b.task_claim(&fair_claim("fs", 1)).await.unwrap();
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), r);
    let failed = Finish::Failed {
        error: "boom".into(),
        retry_in: None,
    };
    let done = b
        .task_finish_many(&[(got[0].claim(), failed)])
        .await
        .unwrap();
    assert_eq!(done, [true]);
    b.task_retry(r[0]).await.unwrap();
    let c = enqueue(&q, "fs", None, 1, 0).await;
    b.task_cancel(c[0]).await.unwrap();
    let n = enqueue(&q, "fs", None, 2, 0).await;
    let got = claim(&ts.store, "fs", 20).await;
    let mut ids: Vec<i64> = got.iter().map(|t| t.id).collect();
    ids.sort();
    let mut want = vec![k[1], h[0], r[0], n[0], n[1]];
    want.sort();
    assert_eq!(ids, want, "every due task, not the cancelled one");
    assert!(claim(&ts.store, "fs", 20).await.is_empty(), "nothing left");
}

/// Within one priority the group with the fewest tasks running goes
/// first, wherever the rotation stands: key m runs 2 (its claim left
/// running, the cursor on m), then keys a (before m) and x (after m)
/// arrive; a claim of 3 takes x, a and x again — no m, though the
/// rotation alone would serve m before a second x.
pub async fn fair_claims_serve_the_fewest_running_first(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let m = enqueue(&q, "few", Some("m"), 4, 0).await;
    let first = claim(&ts.store, "few", 2).await;
    let ids: Vec<i64> = first.iter().map(|t| t.id).collect();
    assert_eq!(ids, m[..2].to_vec(), "m's first two, left running");
    let a = enqueue(&q, "few", Some("a"), 3, 0).await;
    let x = enqueue(&q, "few", Some("x"), 3, 0).await;
    let got = claim(&ts.store, "few", 3).await;
    let ids: Vec<i64> = got.iter().map(|t| t.id).collect();
    assert_eq!(ids, [x[0], a[0], x[1]], "x, a, x: m waits ({m:?})");
}

/// Fair and rated, with `max_running`: a rated fair claim of 10 under 3
/// starts a minute takes 3, one of each key with a backlog of 6 and then
/// the fewest-running key's next (a, b, c in rotation), and the next
/// rated claim takes none and says when a start is next allowed; a fair
/// claim capped at 4 running queue-wide takes the one place left.
pub async fn fair_claims_keep_the_rate_limit_and_max_running(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let b = ts.store.backend();
    let a = enqueue(&q, "fr", Some("a"), 6, 0).await;
    let bb = enqueue(&q, "fr", Some("b"), 6, 0).await;
    let c = enqueue(&q, "fr", Some("c"), 6, 0).await;
    let rated = |limit| baton::store::TaskClaimRated {
        claim: fair_claim("fr", limit),
        name: None,
        max: 3,
        per: Duration::from_secs(60),
        finish: &[],
    };
    let got = b.task_claim_rated(&rated(10)).await.unwrap();
    let ids: Vec<i64> = got.tasks.iter().map(|t| t.id).collect();
    assert_eq!(ids, [a[0], bb[0], c[0]], "one of each key, 3 in all");
    let again = b.task_claim_rated(&rated(10)).await.unwrap();
    assert!(again.tasks.is_empty(), "the limit is used up");
    assert!(again.next_start.is_some(), "and says until when");
    let capped = TaskClaim {
        max_running: Some(4),
        ..fair_claim("fr", 10)
    };
    let got = b.task_claim(&capped).await.unwrap();
    assert_eq!(got.len(), 1, "4 running at most: {got:?}");
}
