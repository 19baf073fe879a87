//! MySQL-only: the ids `enqueue` returns for multi-row inserts are the ids
//! of the rows it inserted, in order, while other connections insert at the
//! same time. MySQL 8's default `innodb_autoinc_lock_mode = 2`
//! (interleaved) does not promise a multi-row insert consecutive ids, so
//! the backend must not compute them from `LAST_INSERT_ID()`.
//!
//! Runs on the server from `BATON_TEST_MYSQL` (default
//! `mysql://root@127.0.0.1:3306/test`) and on a private `mariadbd` started
//! with `--innodb-autoinc-lock-mode=2` (skipped when `mariadbd` is not
//! installed, a failure under `BATON_REQUIRE_BACKENDS=1`).

use baton_testkit::harness;

use std::collections::HashMap;

use baton::store::{NewTask, RunAt};
use baton::{Store, StoreOptions};

/// Connections inserting at once, batches each, tasks per batch.
const WRITERS: usize = 6;
const BATCHES: usize = 8;
const PER_BATCH: usize = 700;

fn task(w: usize, b: usize, k: usize) -> NewTask {
    NewTask {
        queue: "ids".into(),
        kind: "k".into(),
        payload: serde_json::json!({ "w": w, "b": b, "k": k }),
        priority: 0,
        run_at: RunAt::Now,
        max_attempts: 1,
        timeout: None,
        // A keyed task now and then splits a batch into several inserts.
        unique_key: (k % 250 == 249).then(|| format!("{w}-{b}-{k}")),
        unique_hold: baton::queue::UniqueHold::Unfinished,
        job: None,
        slot: None,
        traceparent: None,
        concurrency_key: None,
        key_policy: None,
    }
}

async fn open(url: &str, prefix: &str) -> Store {
    Store::connect_with(
        url,
        StoreOptions {
            prefix: Some(prefix.to_string()),
            max_connections: 2,
            ..StoreOptions::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("connect {url}: {}", baton::error::chain(&e)))
}

/// `WRITERS` handles enqueue batches at once; every returned id must be
/// the row holding that task's payload, and no id may repeat.
async fn returned_ids_are_the_inserted_rows(url: &str) {
    let prefix = format!("ids{:08x}_", fastrand::u32(..));
    // Migrate once before the writers start.
    let first = open(url, &prefix).await;
    let mut stores = Vec::new();
    for _ in 0..WRITERS {
        stores.push(open(url, &prefix).await);
    }
    let go = std::sync::Arc::new(tokio::sync::Barrier::new(WRITERS));
    let mut hs = Vec::new();
    for (w, store) in stores.into_iter().enumerate() {
        let go = go.clone();
        hs.push(tokio::spawn(async move {
            go.wait().await;
            let mut out = Vec::new();
            for b in 0..BATCHES {
                let tasks: Vec<NewTask> = (0..PER_BATCH).map(|k| task(w, b, k)).collect();
                let r = store.backend().task_insert_many(&tasks).await.unwrap();
                assert_eq!(r.len(), tasks.len());
                for (t, e) in tasks.iter().zip(r) {
                    assert!(e.inserted, "a fresh task was inserted");
                    out.push((e.id, t.payload.clone()));
                }
            }
            out
        }));
    }
    let mut returned = Vec::new();
    for h in hs {
        returned.extend(h.await.unwrap());
    }
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap();
    let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(&format!(
        "SELECT id, CAST(payload AS BINARY) FROM `{prefix}tasks`"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    let stored: HashMap<i64, serde_json::Value> = rows
        .into_iter()
        .map(|(id, p)| (id, serde_json::from_slice(&p).unwrap()))
        .collect();
    assert_eq!(stored.len(), WRITERS * BATCHES * PER_BATCH);
    let mut seen = std::collections::HashSet::new();
    let mut wrong = 0;
    for (id, payload) in &returned {
        assert!(seen.insert(*id), "id {id} returned twice");
        if stored.get(id) != Some(payload) {
            wrong += 1;
        }
    }
    assert_eq!(
        wrong,
        0,
        "{wrong} of {} returned ids name another task's row",
        returned.len()
    );
    for t in ["meta", "locks", "tasks", "jobs", "queues"] {
        sqlx::query(&format!("DROP TABLE IF EXISTS `{prefix}{t}`"))
            .execute(&pool)
            .await
            .unwrap();
    }
    pool.close().await;
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_batch_ids_on_the_test_server() {
    // Only to learn whether the server answers (and print SKIPPED if not).
    let Some(ts) = harness::connect(harness::Kind::Mysql).await else {
        return;
    };
    returned_ids_are_the_inserted_rows(&ts.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_batch_ids_with_interleaved_autoinc() {
    let Some(server) = baton_testkit::PrivateMariadb::start(&["--innodb-autoinc-lock-mode=2"])
    else {
        return;
    };
    let url = server.url();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    let mode: i64 = sqlx::query_scalar("SELECT CAST(@@innodb_autoinc_lock_mode AS SIGNED)")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        mode, 2,
        "the private server runs interleaved auto-increment"
    );
    pool.close().await;
    returned_ids_are_the_inserted_rows(&url).await;
}
