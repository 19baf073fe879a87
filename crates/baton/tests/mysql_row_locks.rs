//! MySQL-only: a worker's heartbeats, finishes of successes (one batch)
//! and hand-backs (the general path) lock only the rows they name and
//! answer stale claims per item. Another worker's running task, held by its
//! own open transaction (a claim or a finish in flight), does not make them
//! wait, also when a batch names more ids than there are running rows (the
//! shape in which MariaDB would rather walk the `lease` index's running
//! rows). That holds with or without the statements' `FORCE INDEX
//! (PRIMARY)` (tried: index condition pushdown filters the ids before it
//! locks), so this pins the behaviour, not the hint; the hint saves the
//! walk and its sort.
//!
//! Runs on the server from `BATON_TEST_MYSQL` (default
//! `mysql://root@127.0.0.1:3306/test`).

use std::time::Duration;

use baton::queue::{Queue, TaskBuilder};
use baton::store::{Finish, Heartbeat, TaskClaim, TaskHeartbeatMany};
use baton_testkit::harness;

/// Long enough for a loaded machine, far shorter than InnoDB's lock wait.
const PATIENCE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_writes_do_not_wait_on_another_workers_running_row() {
    let Some(ts) = harness::connect(harness::Kind::Mysql).await else {
        return;
    };
    let q = Queue::new(ts.store.clone());
    for i in 0..9 {
        q.enqueue(TaskBuilder::new("k", serde_json::json!({ "i": i })).queue("rl"))
            .await
            .unwrap();
    }
    let b = ts.store.backend();
    let claim = |worker: &'static str, limit| TaskClaim {
        queue: "rl",
        worker,
        limit,
        lease: Duration::from_secs(60),
        max_running: None,
        per_key_max_running: None,
        buffered: 0,
        fair: false,
    };
    let other = b.task_claim(&claim("other", 1)).await.unwrap();
    let mine = b.task_claim(&claim("mine", 8)).await.unwrap();
    assert_eq!((other.len(), mine.len()), (1, 8));
    let claims: Vec<_> = mine.iter().map(|t| t.claim()).collect();
    // Six of mine finished already: the batches below name them again
    // (stale), so they name more ids than there are running rows, the
    // shape in which the server prefers the `lease` index's few rows.
    let early: Vec<_> = claims[..6]
        .iter()
        .map(|c| (*c, Finish::Succeeded))
        .collect();
    assert_eq!(b.task_finish_many(&early).await.unwrap(), [true; 6]);

    // The other worker's row, locked by a transaction left open.
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&ts.url)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT id FROM `{}tasks` WHERE id = ? FOR UPDATE",
        ts.prefix
    ))
    .bind(other[0].id)
    .fetch_all(&mut *tx)
    .await
    .unwrap();

    let beat = tokio::time::timeout(
        PATIENCE,
        b.task_heartbeat_many(&TaskHeartbeatMany {
            claims: &claims,
            lease: Duration::from_secs(60),
        }),
    )
    .await
    .expect("a heartbeat waited on another worker's row")
    .unwrap();
    assert_eq!(beat[6..], [Heartbeat::Extended, Heartbeat::Extended]);
    let stale = || claims[..6].iter().map(|c| (*c, Finish::Succeeded));
    // Successes (the one-batch form), then a hand-back (the general path):
    // the six stale claims refused, the live one taken.
    for (last, what) in [
        ((claims[6], Finish::Succeeded), "a finish of successes"),
        ((claims[7], Finish::HandBack), "a hand-back"),
    ] {
        let items: Vec<_> = stale().chain([last]).collect();
        let done = tokio::time::timeout(PATIENCE, b.task_finish_many(&items))
            .await
            .unwrap_or_else(|_| panic!("{what} waited on another worker's row"))
            .unwrap();
        assert_eq!(
            done,
            [false, false, false, false, false, false, true],
            "{what}"
        );
    }
    tx.rollback().await.unwrap();
    pool.close().await;
}
