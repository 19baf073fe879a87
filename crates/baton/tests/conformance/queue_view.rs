//! Issue 25 item 5: what an operator sees of a queue's limits — the
//! limits each worker declares (`queue_declare`, listed with the queue's
//! counts by `Queue::stats`) and the load of its concurrency keys
//! (`queue_keys`: running and pending per key, busiest first).

use baton::queue::{Queue, TaskBuilder, Worker, WorkerConfig};
use baton::store::{KeyLoad, QueueDeclare, QueueLimits};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::keys::claim_capped;
use crate::TestStore;

fn load(key: &str, running: u64, pending: u64) -> KeyLoad {
    KeyLoad {
        key: key.into(),
        running,
        pending,
        recent_starts: Vec::new(),
        rate: None,
    }
}

/// Running and pending per key, exact, with a key at its cap (its waiting
/// tasks parked on Redis) and tasks without a key left out.
pub async fn key_load_counts_running_and_pending_per_key(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            TaskBuilder::new("big", json!(i))
                .queue("view")
                .concurrency_key("tenant:big")
        })
        .chain((0..2).map(|i| {
            TaskBuilder::new("small", json!(i))
                .queue("view")
                .concurrency_key("tenant:small")
        }))
        .chain((0..3).map(|i| {
            TaskBuilder::new("late", json!(i))
                .queue("view")
                .concurrency_key("tenant:late")
                .delay(std::time::Duration::from_secs(3600))
        }))
        .chain((0..3).map(|i| TaskBuilder::new("free", json!(i)).queue("view")))
        .collect();
    q.enqueue_many(tasks).await.unwrap();
    // Two claims under a cap of 2 per key: big 2 (the rest met at the
    // cap), small 2, the keyless 3.
    let mut got = claim_capped(&ts.store, "view", "w", 10, false).await;
    got.extend(claim_capped(&ts.store, "view", "w", 10, false).await);
    assert_eq!(got.len(), 7, "{got:?}");

    let k = q.keys("view", 10).await.unwrap();
    assert_eq!(
        k.keys,
        vec![
            load("tenant:big", 2, 38),
            load("tenant:small", 2, 0),
            load("tenant:late", 0, 3),
        ]
    );
    assert_eq!((k.keys_running, k.keys_pending), (2, 2));
    assert!(!k.truncated);
    // The cut keeps the busiest; the totals count every key.
    let one = q.keys("view", 1).await.unwrap();
    assert_eq!(one.keys, vec![load("tenant:big", 2, 38)]);
    assert_eq!((one.keys_running, one.keys_pending), (2, 2));
    // A queue without keyed tasks, and bad input.
    let none = q.keys("elsewhere", 5).await.unwrap();
    assert!(none.keys.is_empty() && none.keys_running == 0 && none.keys_pending == 0);
    let e = q.keys("view", 0).await.unwrap_err().to_string();
    assert!(e.contains("limit"), "{e}");
    let e = q.keys("view", 1001).await.unwrap_err().to_string();
    assert!(e.contains("limit") && e.contains("1000"), "{e}");
}

/// A declaration replaces the last one and answers it; `Queue::stats`
/// lists each queue's declared limits, a declared queue without tasks
/// too; a worker declares its queues' limits when it starts.
pub async fn declared_limits_are_kept_and_listed(ts: TestStore) {
    let b = ts.store.backend();
    let a = QueueLimits {
        per_key_max_running: Some(2),
        rate: Some("100/1m".into()),
        ..Default::default()
    };
    let first = b
        .queue_declare(&QueueDeclare {
            queue: "declared",
            limits: &a,
            by: "w1",
        })
        .await
        .unwrap();
    assert_eq!(first, None, "nothing declared before");
    let c = QueueLimits {
        max_running: Some(5),
        rate: Some("10/1s".into()),
        rate_name: Some("partner".into()),
        per_key_rate: Some("3/1m".into()),
        fair: true,
        ..Default::default()
    };
    let before = b
        .queue_declare(&QueueDeclare {
            queue: "declared",
            limits: &c,
            by: "w2",
        })
        .await
        .unwrap()
        .expect("the first declaration is answered");
    let now = ts.store.now().await.unwrap();
    assert_eq!((before.limits, before.by.as_str()), (a, "w1"));
    let age = now - before.at;
    assert!(
        age >= chrono::Duration::zero() && age < chrono::Duration::seconds(5),
        "declared at {} (store now {now})",
        before.at
    );

    let q = Queue::new(ts.store.clone());
    q.enqueue(TaskBuilder::new("k", json!(1)).queue("plain"))
        .await
        .unwrap();
    let stats = q.stats().await.unwrap();
    let names: Vec<&str> = stats.iter().map(|s| s.queue.as_str()).collect();
    assert_eq!(
        names,
        vec!["declared", "plain"],
        "sorted, the empty declared queue listed"
    );
    let d = stats[0].limits.as_ref().expect("declared limits shown");
    assert_eq!((&d.limits, d.by.as_str()), (&c, "w2"));
    assert_eq!(stats[1].limits, None);
    assert_eq!(stats[1].pending, 1);

    // A worker declares what it claims with, at its start.
    let cfg = WorkerConfig::default()
        .queue("plain", 2)
        .per_key_max_running("plain", 3)
        .poll_interval(std::time::Duration::from_millis(100));
    let worker = Worker::new(ts.store.clone(), cfg).unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(worker.run(stop.clone()));
    let mut declared = None;
    for _ in 0..100 {
        let s = q.stats().await.unwrap();
        declared = s
            .into_iter()
            .find(|s| s.queue == "plain")
            .and_then(|s| s.limits);
        if declared.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    let d = declared.expect("the worker declared its limits");
    assert_eq!(d.limits.per_key_max_running, Some(3));
    assert_eq!(d.limits.describe(), "per key 3");
}
