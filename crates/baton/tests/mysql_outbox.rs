//! MySQL-only: `store::mysql::enqueue_in`, the transactional outbox, and
//! the byte-exact comparison of names and keys. The server comes from
//! `BATON_TEST_MYSQL` (default `mysql://root@127.0.0.1:3306/test`); a server
//! that does not answer prints SKIPPED (or fails with
//! `BATON_REQUIRE_BACKENDS=1`).
#![cfg(feature = "mysql")]

use baton_testkit::harness;

use std::time::Duration;

use baton::store::{mysql, NewTask, RunAt, TaskClaim, TaskFilter};

fn task(queue: &str, key: Option<&str>) -> NewTask {
    NewTask {
        queue: queue.into(),
        kind: "k".into(),
        payload: serde_json::json!({"n": 1}),
        priority: 0,
        run_at: RunAt::Now,
        max_attempts: 1,
        timeout: None,
        unique_key: key.map(Into::into),
        unique_hold: baton::queue::UniqueHold::Unfinished,
        job: None,
        slot: None,
        traceparent: None,
        concurrency_key: None,
        key_policy: None,
    }
}

/// Keys and queue names compare byte for byte: no case folding, no
/// trailing-space padding (MySQL's default collations do both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_names_are_byte_exact() {
    let Some(ts) = harness::connect(harness::Kind::Mysql).await else {
        return;
    };
    let b = ts.store.backend();
    let r = b
        .task_insert_many(&[
            task("q", Some("key")),
            task("q", Some("KEY")),
            task("q", Some("key ")),
            task("Q", None),
        ])
        .await
        .unwrap();
    assert!(r.iter().all(|e| e.inserted), "{r:?}");
    let ids: std::collections::BTreeSet<i64> = r.iter().map(|e| e.id).collect();
    assert_eq!(ids.len(), 4);
    let stats = b.queue_stats().await.unwrap();
    let names: Vec<&str> = stats.iter().map(|s| s.queue.as_str()).collect();
    assert_eq!(names, ["Q", "q"]);
}

/// Many claimers on separate handles racing for a capped queue never
/// overshoot the cap (the claimers take turns on the queue's row).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_capped_claims_never_overshoot() {
    let Some(ts) = harness::connect(harness::Kind::Mysql).await else {
        return;
    };
    let tasks: Vec<NewTask> = (0..200).map(|_| task("capped", None)).collect();
    ts.store.backend().task_insert_many(&tasks).await.unwrap();
    for round in 0..5 {
        let mut stores = Vec::new();
        for _ in 0..8 {
            let s = ts.open().await;
            s.now().await.unwrap(); // a warm connection
            stores.push(s);
        }
        let go = std::sync::Arc::new(tokio::sync::Barrier::new(8));
        let mut hs = Vec::new();
        for (i, store) in stores.into_iter().enumerate() {
            let go = go.clone();
            hs.push(tokio::spawn(async move {
                let worker = format!("w{round}-{i}");
                go.wait().await;
                store
                    .backend()
                    .task_claim(&TaskClaim {
                        queue: "capped",
                        worker: &worker,
                        limit: 10,
                        lease: Duration::from_secs(30),
                        max_running: Some(3 * (round + 1)),
                        per_key_max_running: None,
                        buffered: 0,
                        fair: false,
                    })
                    .await
                    .unwrap()
                    .len()
            }));
        }
        let mut total = 0;
        for h in hs {
            total += h.await.unwrap();
        }
        let running = ts
            .store
            .backend()
            .queue_stats()
            .await
            .unwrap()
            .iter()
            .find(|s| s.queue == "capped")
            .map(|s| s.running)
            .unwrap();
        assert_eq!(
            running,
            3 * (round as u64 + 1),
            "round {round}: claimed {total}"
        );
    }
}

/// `Store::from_mysql_pool`: baton's schema on the application's pool (at
/// the server's default isolation level, not baton's), `enqueue_in` inside
/// the application's transaction on that pool: a rollback leaves nothing,
/// a commit the task, which a store on the pool then claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_pool_and_enqueue_in_share_the_pool() {
    let url = harness::mysql_url();
    let pool = match sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(3)
        .connect(&url)
        .await
    {
        Ok(p) => p,
        Err(e) if !harness::required() => {
            eprintln!("SKIPPED mysql: {url} does not answer ({e}); set BATON_REQUIRE_BACKENDS=1 to fail instead");
            return;
        }
        Err(e) => panic!("mysql required but unavailable at {url}: {e}"),
    };
    let prefix = format!("p{:08x}_", fastrand::u32(..));
    let store = baton::Store::from_mysql_pool(pool.clone(), baton::StoreOptions::prefixed(&prefix))
        .await
        .expect("migrated on the pool");
    assert!(store.url().starts_with("mysql://"), "{}", store.url());
    let b = store.backend();

    let mut tx = pool.begin().await.unwrap();
    let r = mysql::enqueue_in(&mut tx, Some(&prefix), &[task("o", Some("K"))])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(b.task_get(r[0].id).await.unwrap().is_none());
    assert!(b
        .task_list(&TaskFilter::default())
        .await
        .unwrap()
        .is_empty());

    // Committed: the task is there and claimable, the key taken (the same
    // key twice in one call is one task); nothing is visible before the
    // commit.
    let mut tx = pool.begin().await.unwrap();
    let r = mysql::enqueue_in(
        &mut tx,
        Some(&prefix),
        &[task("o", Some("K")), task("o", Some("K"))],
    )
    .await
    .unwrap();
    assert!(r[0].inserted && !r[1].inserted);
    assert_eq!(r[0].id, r[1].id, "the same key gives the same task");
    assert!(b.task_get(r[0].id).await.unwrap().is_none());
    tx.commit().await.unwrap();
    assert_eq!(b.task_get(r[0].id).await.unwrap().unwrap().queue, "o");
    let again = b.task_insert_many(&[task("o", Some("K"))]).await.unwrap();
    assert_eq!((again[0].id, again[0].inserted), (r[0].id, false));
    let claimed = b
        .task_claim(&TaskClaim {
            queue: "o",
            worker: "w",
            limit: 10,
            lease: Duration::from_secs(30),
            max_running: None,
            per_key_max_running: None,
            buffered: 0,
            fair: false,
        })
        .await
        .unwrap();
    assert_eq!(claimed.iter().map(|t| t.id).collect::<Vec<_>>(), [r[0].id]);

    // A bad prefix is refused before anything is written.
    let e = baton::Store::from_mysql_pool(pool, baton::StoreOptions::prefixed("bad prefix"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("prefix"), "{e}");
}
