//! MySQL-only: claims into a backlog run at `REPEATABLE READ`, whose gap
//! locks let two claims that both reach the end of the due tasks deadlock
//! over their rows' new entries in the claim index (`store::mysql::claim`,
//! `BEGIN_IN_BACKLOG`). Racing finish-and-claim loops over a backlog's
//! end, with tasks enqueued meanwhile, must still end every task once and
//! surface no error: a deadlock's victim (its carried finishes with it)
//! runs again whole.
//!
//! Runs on the server from `BATON_TEST_MYSQL` (default
//! `mysql://root@127.0.0.1:3306/test`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::queue::{Queue, TaskBuilder};
use baton::store::{Finish, TaskClaim, TaskFinishAndClaim};
use baton_testkit::harness;

/// Claimers racing over the backlog's end.
const CLAIMERS: usize = 8;
/// Tasks enqueued before the claimers start, and while they run.
const BEFORE: usize = 300;
const DURING: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claims_over_a_backlogs_end_end_every_task_once() {
    let Some(ts) = harness::connect(harness::Kind::Mysql).await else {
        return;
    };
    let q = Queue::new(ts.store.clone());
    let batch: Vec<_> = (0..BEFORE)
        .map(|i| TaskBuilder::new("k", serde_json::json!({ "i": i })).queue("bl"))
        .collect();
    q.enqueue_many(batch).await.unwrap();
    // Per task id: how many claims took it, how many finishes held.
    let seen: Arc<Mutex<HashMap<i64, (u32, u32)>>> = Arc::default();
    let mut loops = tokio::task::JoinSet::new();
    for c in 0..CLAIMERS {
        let (store, seen) = (ts.store.clone(), seen.clone());
        loops.spawn(async move {
            let b = store.backend();
            let worker = format!("w{c}");
            let mut held = Vec::new();
            let mut idle = 0;
            // Until the queue has stayed empty a while (the enqueuer below
            // adds tasks as the claimers run).
            while idle < 20 {
                let claim = TaskClaim {
                    queue: "bl",
                    worker: &worker,
                    limit: 5,
                    lease: Duration::from_secs(60),
                    max_running: None,
                    per_key_max_running: None,
                    buffered: 5,
                    fair: false,
                };
                let finish: Vec<_> = held
                    .iter()
                    .map(|t: &baton::store::Task| (t.claim(), Finish::Succeeded))
                    .collect();
                let got = b
                    .task_finish_and_claim(&TaskFinishAndClaim {
                        finish: &finish,
                        claim: &claim,
                    })
                    .await
                    .unwrap_or_else(|e| panic!("claimer {c}: {e}"));
                {
                    let mut s = seen.lock().unwrap();
                    for (t, ok) in held.iter().zip(&got.finished) {
                        s.entry(t.id).or_default().1 += u32::from(*ok);
                    }
                    for t in &got.tasks {
                        s.entry(t.id).or_default().0 += 1;
                    }
                }
                idle = if got.tasks.is_empty() { idle + 1 } else { 0 };
                held = got.tasks;
                if held.is_empty() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
    }
    for i in 0..DURING {
        q.enqueue(TaskBuilder::new("k", serde_json::json!({ "late": i })).queue("bl"))
            .await
            .unwrap();
    }
    while let Some(r) = loops.join_next().await {
        r.unwrap();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(seen.len(), BEFORE + DURING, "every task claimed");
    let wrong: Vec<_> = seen.iter().filter(|(_, n)| **n != (1, 1)).collect();
    assert!(
        wrong.is_empty(),
        "claimed or finished other than once: {wrong:?}"
    );
    let stats = q.stats().await.unwrap();
    let bl = stats.iter().find(|s| s.queue == "bl").unwrap();
    assert_eq!((bl.pending, bl.running), (0, 0));
}
