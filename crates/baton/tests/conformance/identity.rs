//! A store that forgot is noticed: the identity written at migrate, read
//! again by `Store::check_identity`, tells a store that lost its data
//! (another identity or none) and one that went back in time (its task id
//! counter below the highest read before) from the store connected to;
//! each change is said once, counted and kept. On Redis, where a restart
//! without AOF loses the id counter, new task ids are floored at the
//! server's clock in µs, so they never repeat.

use baton::queue::{Queue, TaskBuilder};
use baton::{Store, StoreOptions};

use crate::harness::{exec_sql, Kind};
use crate::upgrade::redis_conn;
use crate::TestStore;

/// Enqueue one task, returning its id.
async fn enqueue(store: &Store) -> i64 {
    Queue::new(store.clone())
        .enqueue(TaskBuilder::new("k", serde_json::json!({})).queue("ident"))
        .await
        .unwrap()
        .id
}

/// Set the task id counter back to 1 (and drop the tasks), as restoring
/// an older backup would.
async fn counter_back(ts: &TestStore) {
    let p = &ts.prefix;
    match ts.kind {
        Kind::Sqlite => {
            exec_sql(
                ts,
                &format!(
                    "DELETE FROM \"{p}tasks\"; \
                     UPDATE sqlite_sequence SET seq = 1 WHERE name = '{p}tasks';"
                ),
            )
            .await
        }
        Kind::Postgres => {
            exec_sql(
                ts,
                &format!("DELETE FROM \"{p}tasks\"; SELECT setval('\"{p}tasks_id_seq\"', 1);"),
            )
            .await
        }
        Kind::Mysql => {
            exec_sql(
                ts,
                &format!("DELETE FROM `{p}tasks`; ALTER TABLE `{p}tasks` AUTO_INCREMENT = 1;"),
            )
            .await
        }
        Kind::Redis => {
            let mut c = redis_conn(ts).await;
            let _: () = redis::cmd("SET")
                .arg(format!("{p}{{baton}}:seq"))
                .arg(1)
                .query_async(&mut c)
                .await
                .unwrap();
        }
    }
}

/// Lose everything, as a Redis restarted without AOF does (every key
/// under the prefix gone); on SQL the identity row is gone, as in a
/// database dropped and created again by hand.
async fn lose_everything(ts: &TestStore) {
    let p = &ts.prefix;
    match ts.kind {
        Kind::Sqlite | Kind::Postgres => {
            exec_sql(
                ts,
                &format!("DELETE FROM \"{p}meta\" WHERE key = 'store_id'"),
            )
            .await
        }
        Kind::Mysql => {
            exec_sql(
                ts,
                &format!("DELETE FROM `{p}meta` WHERE `key` = 'store_id'"),
            )
            .await
        }
        Kind::Redis => {
            let mut c = redis_conn(ts).await;
            let keys = c.keys(&format!("{p}*")).await;
            c.del(&keys).await;
        }
    }
}

pub async fn a_store_that_forgot_is_noticed(ts: TestStore) {
    let store = &ts.store;
    let seen = store
        .identity()
        .id()
        .expect("an identity written at migrate");
    assert_eq!(seen.len(), 32, "{seen}");
    assert_eq!(store.check_identity().await.unwrap(), None, "unchanged");
    // Another connection to the same store sees the same identity.
    let opts = StoreOptions {
        prefix: Some(ts.prefix.clone()),
        max_connections: 2,
        ..StoreOptions::default()
    };
    let other = Store::connect_with(&ts.url, opts.clone()).await.unwrap();
    assert_eq!(other.identity().id().as_deref(), Some(seen.as_str()));

    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(enqueue(store).await);
    }
    assert_eq!(store.check_identity().await.unwrap(), None);
    assert_eq!(
        store.backend().store_identity().await.unwrap().last_task_id,
        *ids.iter().max().unwrap(),
        "the counter is the highest id handed out"
    );

    // Restored from an older backup: the same identity, a counter gone back.
    counter_back(&ts).await;
    let why = store.check_identity().await.unwrap().expect("noticed");
    assert!(
        why.contains("went back in time") && why.contains("backup"),
        "{why}"
    );
    assert_eq!(store.identity_lost().as_deref(), Some(why.as_str()));
    assert_eq!(store.identity().changes(), 1);
    assert_eq!(store.check_identity().await.unwrap(), None, "said once");
    assert_eq!(store.identity().changes(), 1);

    // Lost its data: the identity is gone.
    lose_everything(&ts).await;
    let why2 = other.check_identity().await.unwrap().expect("noticed");
    assert!(
        why2.contains(&format!("store identity changed from {seen} to none"))
            && why2.contains("lost its data"),
        "{why2}"
    );
    assert_eq!(other.identity().changes(), 1);
    assert_eq!(other.check_identity().await.unwrap(), None, "said once");
    assert_eq!(other.identity_lost().as_deref(), Some(why2.as_str()));

    // A process connecting now writes a new identity: the store as it is.
    let fresh = Store::connect_with(&ts.url, opts).await.unwrap();
    let new_id = fresh.identity().id().expect("a new identity");
    assert_ne!(new_id, seen);
    assert_eq!(fresh.identity_lost(), None);
    // The old processes keep saying the store is not theirs (sticky).
    assert_eq!(other.check_identity().await.unwrap(), None);
    assert!(other.identity_lost().is_some());

    // Task ids never repeat across the loss on Redis (floored at the
    // server clock in µs, as fencing tokens are).
    if let Kind::Redis = ts.kind {
        let floor = fresh.now().await.unwrap().timestamp_micros();
        let id = enqueue(&fresh).await;
        assert!(
            ids.iter().all(|&old| id > old) && id >= floor,
            "new id {id} after the loss; ids before {ids:?}; store clock {floor} µs"
        );
        let next = enqueue(&fresh).await;
        assert!(next > id, "and rising: {next} after {id}");
    }
}
