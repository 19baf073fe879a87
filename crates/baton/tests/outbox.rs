//! The transactional outbox on `Queue` (`enqueue_in`, `enqueue_many_in`,
//! `insert_in`) on each SQL store, through `baton::sqlx` only (this test
//! names no `sqlx` of its own): a rollback leaves nothing, not even a
//! unique key; a commit makes the task visible and its key taken; the
//! store's prefix is known without being repeated; a connection of another
//! store kind, or any on a Redis store, is refused naming `connection`.
//! Stores come from `BATON_TEST_POSTGRES` / `BATON_TEST_MYSQL` /
//! `BATON_TEST_REDIS`; one that does not answer is SKIPPED (a failure with
//! `BATON_REQUIRE_BACKENDS=1`).

use baton::queue::{OutboxConnection, Queue, TaskArgs, TaskBuilder};
use baton::sqlx;
use baton::{Error, Store, StoreOptions};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Receipt {
    order: u32,
}

impl TaskArgs for Receipt {
    const KIND: &'static str = "receipt";
}

fn prefix(tag: &str) -> String {
    format!("ob{tag}{}_", std::process::id())
}

/// Connect `Queue` with its own prefix, or `None` (SKIPPED, or a panic
/// with `BATON_REQUIRE_BACKENDS=1`).
async fn queue(env: &str, default: &str, tag: &str) -> Option<Queue> {
    let url = std::env::var(env).unwrap_or_else(|_| default.to_string());
    let opts = StoreOptions {
        prefix: Some(prefix(tag)),
        ..Default::default()
    };
    match Store::connect_with(&url, opts).await {
        Ok(s) => Some(Queue::new(s)),
        Err(e) => {
            assert!(
                !baton_testkit::required(),
                "{env} {url}: {e} (BATON_REQUIRE_BACKENDS=1)"
            );
            baton_testkit::skipped(&format!("outbox on {url}: {e}"));
            None
        }
    }
}

/// A rolled-back and a committed outbox transaction on `pool`.
async fn roll_back_then_commit<DB>(q: &Queue, pool: &sqlx::Pool<DB>, begin: Option<&str>)
where
    DB: sqlx::Database,
    for<'c> sqlx::Transaction<'c, DB>: OutboxConnection,
{
    let key = "order-7";
    let start = || async {
        match begin {
            Some(stmt) => pool.begin_with(stmt.to_string()).await.unwrap(),
            None => pool.begin().await.unwrap(),
        }
    };
    let mut tx = start().await;
    let e = q
        .enqueue_in(
            &mut tx,
            TaskBuilder::from_args(&Receipt { order: 7 })
                .unwrap()
                .unique_key(key),
        )
        .await
        .unwrap();
    assert!(e.inserted);
    let again = q
        .enqueue_many_in(
            &mut tx,
            vec![
                TaskBuilder::from_args(&Receipt { order: 7 })
                    .unwrap()
                    .unique_key(key),
                TaskBuilder::from_args(&Receipt { order: 8 }).unwrap(),
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        (again[0].id, again[0].inserted),
        (e.id, false),
        "the key is taken in the transaction"
    );
    assert!(again[1].inserted);
    tx.rollback().await.unwrap();
    assert!(
        q.task(e.id).await.unwrap().is_none(),
        "rolled back: no task"
    );
    assert!(
        q.task(again[1].id).await.unwrap().is_none(),
        "rolled back: no task"
    );

    let mut tx = start().await;
    let e = q
        .enqueue_in(
            &mut tx,
            TaskBuilder::from_args(&Receipt { order: 7 })
                .unwrap()
                .unique_key(key),
        )
        .await
        .unwrap();
    assert!(e.inserted, "the rolled-back key is free");
    let typed = q.insert_in(&mut tx, &Receipt { order: 9 }).await.unwrap();
    tx.commit().await.unwrap();
    let t = q.task(e.id).await.unwrap().expect("committed: the task");
    assert_eq!(t.kind, "receipt");
    assert!(q.task(typed.id).await.unwrap().is_some());
    let dup = q
        .enqueue(
            TaskBuilder::from_args(&Receipt { order: 7 })
                .unwrap()
                .unique_key(key),
        )
        .await
        .unwrap();
    assert_eq!(
        (dup.id, dup.inserted),
        (e.id, false),
        "committed: the key is taken"
    );

    // Bad input: nothing written, the transaction still usable.
    let mut tx = start().await;
    let bad = q
        .enqueue_many_in(
            &mut tx,
            vec![
                TaskBuilder::from_args(&Receipt { order: 1 }).unwrap(),
                TaskBuilder::new("", serde_json::json!({})),
            ],
        )
        .await;
    match bad {
        Err(Error::Invalid(e)) => assert!(e.field.starts_with("task 1"), "{e}"),
        other => panic!("a bad task: {other:?}"),
    }
    tx.rollback().await.unwrap();
}

/// A SQLite transaction offered to `q` (another store kind) is refused.
async fn refuses_sqlite(q: &Queue, store: &str) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/other.db?mode=rwc", dir.path().display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    match q.insert_in(&mut tx, &Receipt { order: 1 }).await {
        Err(Error::Invalid(e)) => {
            assert_eq!(e.field, "connection");
            assert!(e.problem.contains(store), "{e}");
        }
        other => panic!("a sqlite connection on a {store} queue: {other:?}"),
    }
}

#[tokio::test]
async fn sqlite_outbox_commits_with_the_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/app.db", dir.path().display());
    let q = Queue::new(
        Store::connect_with(
            &url,
            StoreOptions {
                prefix: Some(prefix("s")),
                ..Default::default()
            },
        )
        .await
        .unwrap(),
    );
    // The application's own pool on the same file.
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    roll_back_then_commit(&q, &pool, Some("BEGIN IMMEDIATE")).await;
}

#[tokio::test]
async fn postgres_outbox_commits_with_the_transaction() {
    let Some(q) = queue(
        "BATON_TEST_POSTGRES",
        "postgres://postgres@127.0.0.1:5432/test",
        "p",
    )
    .await
    else {
        return;
    };
    let url = std::env::var("BATON_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    roll_back_then_commit(&q, &pool, None).await;
    refuses_sqlite(&q, "postgres").await;
}

#[tokio::test]
async fn mysql_outbox_commits_with_the_transaction() {
    let Some(q) = queue("BATON_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test", "m").await else {
        return;
    };
    let url = std::env::var("BATON_TEST_MYSQL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    // READ COMMITTED, as the store's own sessions (see `enqueue_in`).
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .after_connect(|c, _| {
            Box::pin(async move {
                sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .execute(c)
                    .await
                    .map(|_| ())
            })
        })
        .connect(&url)
        .await
        .unwrap();
    roll_back_then_commit(&q, &pool, None).await;
}

#[tokio::test]
async fn redis_refuses_the_outbox() {
    let Some(q) = queue("BATON_TEST_REDIS", "redis://127.0.0.1:6379", "r").await else {
        return;
    };
    refuses_sqlite(&q, "redis").await;
}
