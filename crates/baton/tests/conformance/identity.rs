//! A store that forgot is noticed: the identity written at migrate, read
//! again by `Store::check_identity`, tells a store that lost its data
//! (another identity or none) and one that went back in time (its task id
//! counter below the highest read before) from the store connected to;
//! each change is said once, counted and kept. Task ids never repeat
//! across such a loss (DESIGN.md I1): Redis floors every new id at the
//! server's clock in µs, SQL stores floor their counter there at every
//! connect and after each change a check finds.

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

/// Restore a backup taken when `keep` was the newest task id: the tasks
/// after it are gone and the task id counter is back at `keep`.
async fn restore_to(ts: &TestStore, keep: i64) {
    let p = &ts.prefix;
    match ts.kind {
        Kind::Sqlite => {
            exec_sql(
                ts,
                &format!(
                    "DELETE FROM \"{p}tasks\" WHERE id > {keep}; \
                     UPDATE sqlite_sequence SET seq = {keep} WHERE name = '{p}tasks';"
                ),
            )
            .await
        }
        Kind::Postgres => {
            exec_sql(
                ts,
                &format!(
                    "DELETE FROM \"{p}tasks\" WHERE id > {keep}; \
                     SELECT setval('\"{p}tasks_id_seq\"', {keep});"
                ),
            )
            .await
        }
        Kind::Mysql => {
            exec_sql(
                ts,
                &format!(
                    "DELETE FROM `{p}tasks` WHERE id > {keep}; \
                     ALTER TABLE `{p}tasks` AUTO_INCREMENT = {};",
                    keep + 1
                ),
            )
            .await
        }
        Kind::Redis => {
            let mut c = redis_conn(ts).await;
            let _: () = redis::cmd("SET")
                .arg(format!("{p}{{baton}}:seq"))
                .arg(keep)
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
    restore_to(&ts, ids[0]).await;
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

    // Task ids never repeat across the loss: the fresh process floored
    // the counter at the store's clock in µs when it connected.
    let floor = fresh.now().await.unwrap().timestamp_micros() - 60_000_000;
    let id = enqueue(&fresh).await;
    assert!(
        ids.iter().all(|&old| id > old) && id >= floor,
        "new id {id} after the loss; ids before {ids:?}; store clock {floor} µs"
    );
    let next = enqueue(&fresh).await;
    assert!(next > id, "and rising: {next} after {id}");
}

/// I1 across a restore of an older backup, on every store: every id is
/// floored at the store's clock in µs (16 digits, below 2^53 so exact in
/// JSON and JavaScript), and after the tasks since a backup are gone and
/// the counter is set back, the next id is above every id handed out
/// before — whether the process that notices the restore goes on
/// (`check_identity` floors again) or a process starts after it (every
/// connect floors).
pub async fn task_ids_never_repeat_after_a_restore(ts: TestStore) {
    let store = &ts.store;
    let t0 = store.now().await.unwrap().timestamp_micros();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(enqueue(store).await);
    }
    for &id in &ids {
        // The counter was floored when the store connected, just before.
        assert!(
            id > t0 - 60_000_000 && id < (1 << 53),
            "id {id}: floored at the store clock ({t0} µs) and exact in JavaScript"
        );
    }
    // The process's upkeep read the counter since (a rescue tick).
    assert_eq!(store.check_identity().await.unwrap(), None);
    // A backup taken after the second task, restored now (the counter
    // lags the clock by more than the floor's slack).
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    restore_to(&ts, ids[1]).await;
    let why = store.check_identity().await.unwrap().expect("noticed");
    assert!(why.contains("went back in time"), "{why}");
    let id = enqueue(store).await;
    assert!(
        ids.iter().all(|&old| id > old),
        "the process that noticed the restore: new id {id}, ids before {ids:?}"
    );
    ids.push(id);
    let task = store
        .backend()
        .task_get(id)
        .await
        .unwrap()
        .expect("the new task");
    assert_eq!(task.id, id);

    // Restored again, then a process starts that never saw the newer ids
    // (the usual way: stop, restore, start): it floors at connect.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    restore_to(&ts, ids[1]).await;
    let fresh = ts.open().await;
    let id = enqueue(&fresh).await;
    assert!(
        ids.iter().all(|&old| id > old),
        "a process started after the restore: new id {id}, ids before {ids:?}"
    );
    let next = enqueue(&fresh).await;
    assert!(next > id, "and rising: {next} after {id}");
}
