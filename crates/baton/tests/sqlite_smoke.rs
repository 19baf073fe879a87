//! Smoke tests of what only the SQLite backend has, each on its own
//! temporary file: wake-ups shared by handles on one file, the outbox helper,
//! query plans, concurrent first connects, bad URLs, bulk speed. Every
//! `Backend` operation is proven by the shared conformance suite
//! (`tests/conformance/`), which runs on SQLite too.
#![cfg(feature = "sqlite")]

use std::sync::Arc;
use std::time::Duration;

use baton::store::sqlite::{enqueue_in, SqliteBackend};
use baton::store::{Backend, NewTask, RunAt, TaskClaim, TaskFilter};
use baton::{Store, StoreOptions};
use tempfile::TempDir;

struct Db {
    _dir: TempDir,
    url: String,
    store: Store,
}

impl Db {
    fn b(&self) -> &dyn Backend {
        self.store.backend()
    }

    async fn open(&self) -> Store {
        Store::connect_with(&self.url, StoreOptions::default())
            .await
            .expect("second handle")
    }
}

async fn db() -> Db {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let store = Store::connect_with(&url, StoreOptions::default())
        .await
        .expect("connect");
    Db {
        _dir: dir,
        url,
        store,
    }
}

fn task(queue: &str) -> NewTask {
    NewTask {
        queue: queue.into(),
        kind: "k".into(),
        payload: serde_json::json!({"n": 1}),
        priority: 0,
        run_at: RunAt::Now,
        max_attempts: 3,
        timeout: Some(Duration::from_secs(30)),
        unique_key: None,
        unique_hold: baton::queue::UniqueHold::Unfinished,
        job: None,
        slot: None,
        traceparent: None,
        concurrency_key: None,
        key_policy: None,
    }
}

fn claim_req(queue: &str, limit: u32, lease: Duration) -> TaskClaim<'_> {
    TaskClaim {
        queue,
        worker: "w1",
        limit,
        lease,
        max_running: None,
        per_key_max_running: None,
        buffered: 0,
        fair: false,
    }
}

const LONG: Duration = Duration::from_secs(60);

// ---- locks -------------------------------------------------------------------

// ---- tasks -------------------------------------------------------------------

// ---- schedules -----------------------------------------------------------------

// ---- SQLite specifics ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subscribe_is_shared_by_handles_on_one_file() {
    let db = db().await;
    let other = db.open().await;
    let mut rx = db.b().wake_subscribe().await.unwrap();
    other
        .backend()
        .task_insert_many(&[task("mail")])
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(1), rx.recv())
        .await
        .expect("woken")
        .unwrap();
    assert_eq!(got, baton::store::Wake::now("mail"));
    // Delayed tasks are announced with their due time.
    let before = other.backend().now().await.unwrap();
    other
        .backend()
        .task_insert_many(&[NewTask {
            run_at: RunAt::Delay(LONG),
            ..task("later")
        }])
        .await
        .unwrap();
    let got = rx.try_recv().expect("a wake-up for the delayed task");
    assert_eq!(got.queue, "later");
    let due = got.due.expect("a due time") - before;
    let long = chrono::Duration::from_std(LONG).unwrap();
    assert!(
        due >= long && due < long + chrono::Duration::seconds(2),
        "due in {due}"
    );
    assert!(rx.try_recv().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outbox_enqueue_in_caller_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("o.db").display());
    let opts = StoreOptions {
        prefix: Some("app:x-".into()),
        ..StoreOptions::default()
    };
    let backend = Arc::new(SqliteBackend::connect(&url, &opts).await.unwrap());
    backend.migrate().await.unwrap();
    let pool = backend.pool().clone();

    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let r = enqueue_in(&mut tx, Some("app:x-"), &[task("q"), task("q")])
        .await
        .unwrap();
    assert_eq!(r.len(), 2);
    tx.rollback().await.unwrap();
    assert!(backend
        .task_list(&TaskFilter::default())
        .await
        .unwrap()
        .is_empty());

    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    enqueue_in(&mut tx, Some("app:x-"), &[task("q")])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        backend
            .task_claim(&claim_req("q", 5, LONG))
            .await
            .unwrap()
            .len(),
        1
    );
}

/// The `sqlite:PATH` form (no `//`) connects too. (Concurrent first
/// connects are the conformance suite's
/// `upgrade::concurrent_first_connects_migrate_once`, on every store.)
#[tokio::test]
async fn sqlite_path_url_connects() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("fresh.db").display());
    let s = Store::connect(&url).await.unwrap();
    s.backend().task_insert_many(&[task("q")]).await.unwrap();
    assert_eq!(s.backend().queue_stats().await.unwrap()[0].pending, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_plan_is_an_index_walk() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("p.db").display());
    let b = SqliteBackend::connect(&url, &StoreOptions::default())
        .await
        .unwrap();
    b.migrate().await.unwrap();
    let ts: Vec<NewTask> = (0..2000)
        .map(|i| task(if i % 2 == 0 { "a" } else { "b" }))
        .collect();
    b.task_insert_many(&ts).await.unwrap();
    let plan = |pool: sqlx::SqlitePool| async move {
        let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(
            "EXPLAIN QUERY PLAN SELECT id FROM \"baton_tasks\" \
             WHERE state = 'pending' AND queue = ?1 \
               AND run_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER) \
             ORDER BY priority, run_at, id LIMIT 10",
        )
        .bind("a")
        .fetch_all(&pool)
        .await
        .unwrap();
        rows.into_iter()
            .map(|r| r.3)
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let without = plan(b.pool().clone()).await;
    sqlx::query("ANALYZE").execute(b.pool()).await.unwrap();
    let with = plan(b.pool().clone()).await;
    for p in [&without, &with] {
        assert!(p.contains("baton_tasks_claim"), "plan: {p}");
        assert!(!p.contains("TEMP B-TREE"), "plan sorts: {p}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_urls_are_config_errors() {
    for url in ["sqlite://", "sqlite:file:x.db?mode=memory"] {
        let err = Store::connect(url).await.unwrap_err();
        assert!(matches!(err, baton::StoreError::Config(_)), "{url}: {err}");
    }
}

/// `sqlite::memory:` (and `sqlite://:memory:`): a private database per
/// connect, shared by the store's clones, that holds its tasks across
/// many concurrent calls on its one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_memory_stores_are_private_and_shared_by_clones() {
    use baton::queue::{Queue, TaskBuilder};
    let a = Store::connect("sqlite::memory:").await.unwrap();
    let b = Store::connect("sqlite://:memory:").await.unwrap();
    let qa = Queue::new(a.clone());
    let calls = (0..20).map(|i| {
        let q = Queue::new(a.clone());
        async move {
            q.enqueue(TaskBuilder::new("m", serde_json::json!({ "i": i })))
                .await
        }
    });
    for r in futures_util::future::join_all(calls).await {
        assert!(r.unwrap().inserted);
    }
    let pending = |q: Queue| async move {
        q.stats()
            .await
            .unwrap()
            .iter()
            .map(|s| s.pending)
            .sum::<u64>()
    };
    assert_eq!(pending(qa).await, 20);
    assert_eq!(
        pending(Queue::new(b)).await,
        0,
        "another connect, another database"
    );
}

/// `Store::from_sqlite_pool`: baton's schema on the application's pool,
/// `enqueue_in` inside the application's transaction on that pool (a
/// rollback leaves nothing, a commit the task), and wake-ups shared with a
/// `Store::connect` handle on the same file.
#[tokio::test]
async fn from_pool_shares_the_pool_and_the_wake_ups() {
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.db");
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true),
        )
        .await
        .unwrap();
    let store = Store::from_sqlite_pool(pool.clone(), StoreOptions::prefixed("app_"))
        .await
        .expect("migrated on the pool");
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name LIKE 'app\\_%' ESCAPE '\\'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(tables >= 4, "baton's tables with the prefix: {tables}");

    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let r = enqueue_in(&mut tx, Some("app_"), &[task("o")])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(store.backend().task_get(r[0].id).await.unwrap().is_none());
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let r = enqueue_in(&mut tx, Some("app_"), &[task("o")])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        store
            .backend()
            .task_get(r[0].id)
            .await
            .unwrap()
            .unwrap()
            .queue,
        "o"
    );

    // A handle opened by URL on the same file hears this store's wake-ups.
    let other = Store::connect_with(
        &format!("sqlite://{}", path.display()),
        StoreOptions {
            prefix: Some("app_".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut rx = other.backend().wake_subscribe().await.unwrap();
    store
        .backend()
        .task_insert_many(&[task("w")])
        .await
        .unwrap();
    let w = tokio::time::timeout(Duration::from_secs(2), rx.recv())
        .await
        .expect("a wake-up within 2 s")
        .unwrap();
    assert_eq!(w.queue, "w");
    // A bad prefix is refused before anything is written.
    let e = Store::from_sqlite_pool(pool.clone(), StoreOptions::prefixed("bad prefix"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("prefix"), "{e}");
    // Options a pool cannot honour are refused naming the field, and
    // `migrate = false` leaves a new prefix's tables uncreated.
    let opts = StoreOptions {
        keep_succeeded: false,
        ..StoreOptions::default()
    };
    let e = Store::from_sqlite_pool(pool.clone(), opts)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("keep_succeeded"), "{e}");
    let opts = StoreOptions {
        migrate: false,
        ..StoreOptions::prefixed("unmade_")
    };
    let store = Store::from_sqlite_pool(pool.clone(), opts).await.unwrap();
    assert_eq!(store.prefix(), Some("unmade_"));
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name LIKE 'unmade_%'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(tables, 0, "migrate = false created tables");
}

/// A writer that meets the write lock held by another connection (another
/// process's, here a raw connection's) waits for it: it goes on once the
/// lock is let go, and gives up, retryably (`StoreError::Unavailable`),
/// once it has waited the store's statement timeout, not before and not
/// much after (`sqlite::connect`'s busy timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writer_waits_for_the_write_lock_up_to_the_statement_timeout() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let timeout = Duration::from_millis(400);
    let store = Store::connect_with(
        &url,
        StoreOptions {
            statement_timeout: timeout,
            ..StoreOptions::default()
        },
    )
    .await
    .expect("connect");
    let q = baton::queue::Queue::new(store.clone());
    let task = || baton::queue::TaskBuilder::new("t", serde_json::json!({}));
    q.enqueue(task()).await.expect("a first task");

    let mut holder = sqlx::SqliteConnection::connect(&url).await.expect("holder");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut holder)
        .await
        .expect("the write lock");
    let started = std::time::Instant::now();
    let err = q.enqueue(task()).await.expect_err("the lock is held");
    let waited = started.elapsed();
    assert!(
        matches!(&err, baton::Error::Store(e) if e.is_retryable()),
        "busy is retryable: {err}"
    );
    assert!(
        waited >= timeout && waited < timeout + Duration::from_millis(600),
        "gave up after {waited:?}, the timeout being {timeout:?}"
    );

    // Let go 150 ms after the writer starts waiting: it goes on.
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        sqlx::query("COMMIT")
            .execute(&mut holder)
            .await
            .expect("let go");
    });
    q.enqueue(task())
        .await
        .expect("written once the lock is free");
    release.await.expect("released");
}

/// The process's writers share one writer connection: a write made
/// while the application's own transaction holds it (`SqliteBackend::pool`,
/// the outbox's way) waits for it up to the statement timeout, as a write
/// waits for another process's lock, then fails retryably; once the
/// transaction ends, writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_waits_for_the_processs_writer_connection_up_to_the_statement_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let timeout = Duration::from_millis(400);
    let opts = StoreOptions {
        statement_timeout: timeout,
        ..StoreOptions::default()
    };
    let backend = Arc::new(SqliteBackend::connect(&url, &opts).await.expect("connect"));
    backend.migrate().await.expect("migrate");
    let b: &dyn Backend = &*backend;
    b.task_insert_many(&[task("own")])
        .await
        .expect("a first task");

    let tx = backend
        .pool()
        .begin_with("BEGIN IMMEDIATE")
        .await
        .expect("the application's transaction");
    let started = std::time::Instant::now();
    let err = b
        .task_insert_many(&[task("own")])
        .await
        .expect_err("the writer connection is held");
    let waited = started.elapsed();
    assert!(err.is_retryable(), "waiting is retryable: {err}");
    assert!(
        waited >= timeout && waited < timeout + Duration::from_millis(600),
        "gave up after {waited:?}, the timeout being {timeout:?}"
    );
    tx.commit().await.expect("the application's commit");
    b.task_insert_many(&[task("own")])
        .await
        .expect("written once the connection is back");
}

/// A claim is its own write transaction (`BEGIN IMMEDIATE` … `COMMIT`,
/// answered in one row): a caller that stops waiting for it part-way (a
/// timeout, a shutdown) must not leave that transaction open on a pooled
/// connection, where it would hold SQLite's write lock and turn the
/// connection's next `BEGIN` into an error. Claims abandoned at every
/// point along the way, then every later claim and finish still works and
/// every task is claimed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_abandoned_part_way_leaves_no_transaction_open() {
    abandon_claims(false).await;
}

/// [`a_claim_abandoned_part_way_leaves_no_transaction_open`] for the claim
/// under a rate per key, whose write transaction spans two calls (the walk,
/// then the claim and its `COMMIT`), each abandoned claim carrying the
/// successes of the previous one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_rated_claim_abandoned_part_way_leaves_no_transaction_open() {
    abandon_claims(true).await;
}

/// Claims (under a rate per key when `key_rated`) abandoned after 0, 10,
/// 20, … µs, then claims until none is left (see
/// [`a_claim_abandoned_part_way_leaves_no_transaction_open`]).
async fn abandon_claims(key_rated: bool) {
    use baton::store::{Claim, Finish, KeyRate, Task, TaskClaimKeyRated};
    let db = db().await;
    let b = db.b();
    let n = 900;
    let ts: Vec<NewTask> = (0..n)
        .map(|i| NewTask {
            concurrency_key: Some(format!("k{}", i % 30)),
            ..task("abandon")
        })
        .collect();
    b.task_insert_many(&ts).await.unwrap();
    let claim = |limit: u32, finish: Vec<(Claim, Finish)>| async move {
        let req = claim_req("abandon", limit, LONG);
        if !key_rated {
            return b.task_claim(&req).await.map(|t| (Vec::new(), t));
        }
        let r = b
            .task_claim_key_rated(&TaskClaimKeyRated {
                claim: req,
                key_rate: KeyRate {
                    max: 1000,
                    per: Duration::from_secs(1),
                },
                rate: None,
                finish: &finish,
            })
            .await?;
        Ok::<_, baton::StoreError>((r.finished, r.tasks))
    };
    let succeed = |got: &[Task]| -> Vec<(Claim, Finish)> {
        got.iter().map(|t| (t.claim(), Finish::Succeeded)).collect()
    };
    let mut claimed = std::collections::HashSet::new();
    let mut carried = Vec::new();
    // Abandon claims after 0, 10, 20, … µs: some before the connection
    // is had, some inside the statements, some after.
    for i in 0..200u64 {
        let wait = Duration::from_micros(i * 10 % 2000);
        if let Ok(done) = tokio::time::timeout(wait, claim(3, carried.clone())).await {
            let (_, got) = done.expect("claim");
            for t in &got {
                assert!(claimed.insert(t.id), "task {} claimed twice", t.id);
            }
            carried = if key_rated { succeed(&got) } else { Vec::new() };
        }
    }
    // The tasks an abandoned claim took are running under its lease; the
    // rest are claimable, by claims that neither fail nor hang.
    let mut more = 0;
    loop {
        let got = tokio::time::timeout(Duration::from_secs(10), claim(50, Vec::new()))
            .await
            .expect("a claim after the abandoned ones hung")
            .expect("a claim after the abandoned ones failed")
            .1;
        if got.is_empty() {
            break;
        }
        let done = b.task_finish_many(&succeed(&got)).await.expect("finish");
        assert!(
            done.iter().all(|d| *d),
            "a fresh claim's finish was refused"
        );
        for t in got {
            assert!(claimed.insert(t.id), "task {} claimed twice", t.id);
            more += 1;
        }
    }
    let stats = b.queue_stats().await.unwrap();
    let q = stats
        .iter()
        .find(|s| s.queue == "abandon")
        .expect("the queue's stats");
    let unseen = n - claimed.len();
    eprintln!("abandoned claims took {unseen} tasks; {more} claimed after");
    assert!(
        more > 0,
        "nothing was left to claim after the abandoned claims"
    );
    assert_eq!(q.pending, 0, "every task claimed");
    assert_eq!(
        q.succeeded + q.running,
        n as u64,
        "every task succeeded or still running"
    );
    assert!(
        q.succeeded >= more as u64,
        "every later claim's task finished"
    );
    if !key_rated {
        // No claim carried successes: exactly the later claims' tasks
        // succeeded, and every abandoned claim's task is still running.
        assert_eq!(
            q.succeeded, more as u64,
            "every later claim's task finished"
        );
        assert_eq!(
            q.running,
            (n - more) as u64,
            "the earlier claims' tasks, abandoned ones' too, are running"
        );
    }
}
