//! Smoke tests of the PostgreSQL backend.
//!
//! They read `BATON_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`). When the server does not
//! answer they print one `SKIPPED` line, unless `BATON_REQUIRE_BACKENDS=1`.
//! Each test uses its own table prefix and drops its tables at the end.
#![cfg(feature = "postgres")]

use std::time::{Duration, Instant};

use baton::store::postgres;
use baton::store::{Backend, Finish, NewTask, RunAt, TaskClaim, TaskState};
use baton::{Store, StoreOptions};
use sqlx::Connection;

fn url() -> String {
    std::env::var("BATON_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

struct Fixture {
    store: Store,
    prefix: String,
}

impl Fixture {
    fn b(&self) -> &dyn Backend {
        self.store.backend()
    }

    async fn drop_tables(self) {
        if let Ok(mut c) = sqlx::PgConnection::connect(&url()).await {
            let p = &self.prefix;
            let sql = format!(
                "DROP TABLE IF EXISTS \"{p}tasks\", \"{p}locks\", \"{p}jobs\", \"{p}meta\"; \
                 DROP SEQUENCE IF EXISTS \"{p}tasks_id_seq\""
            );
            let _ = sqlx::Executor::execute(&mut c, sql.as_str()).await;
        }
    }
}

async fn setup() -> Option<Fixture> {
    let prefix = format!("t{:08x}_", fastrand::u32(..));
    let opts = StoreOptions {
        prefix: Some(prefix.clone()),
        max_connections: 20,
        migrate: true,
        ..Default::default()
    };
    match Store::connect_with(&url(), opts).await {
        Ok(store) => Some(Fixture { store, prefix }),
        Err(e) if std::env::var("BATON_REQUIRE_BACKENDS").as_deref() != Ok("1") => {
            eprintln!("SKIPPED postgres: {e}");
            None
        }
        Err(e) => panic!("postgres required but unavailable: {e}"),
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

fn claim_req<'a>(queue: &'a str, limit: u32, lease: Duration) -> TaskClaim<'a> {
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

const MIN: Duration = Duration::from_secs(60);

#[tokio::test]
async fn subscribe_gets_due_queues_once_per_batch() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let mut rx = b.wake_subscribe().await.unwrap();
    let mut rx2 = b.wake_subscribe().await.unwrap();
    // The session listens once it says so.
    let resync = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the listener did not start")
        .unwrap();
    assert!(resync.is_resync(), "{resync:?}");
    assert!(rx2.recv().await.unwrap().is_resync());
    let mut later = task("later");
    later.run_at = RunAt::Delay(Duration::from_secs(60));
    b.task_insert_many(&[task("a"), task("a"), later, task("b")])
        .await
        .unwrap();
    let before = b.now().await.unwrap();
    let mut got = Vec::new();
    let mut later = Vec::new();
    while let Ok(Ok(w)) = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
        match w.due {
            None => got.push(w.queue),
            Some(due) => later.push((w.queue, due)),
        }
    }
    got.sort();
    assert_eq!(got, vec!["a", "b"]);
    // The delayed task is announced once, with its due time.
    assert_eq!(later.len(), 1, "{later:?}");
    assert_eq!(later[0].0, "later");
    let due = later[0].1 - before;
    assert!(
        (58_000..61_000).contains(&due.num_milliseconds()),
        "due in {due}"
    );
    assert!(rx2.try_recv().is_ok());
    f.drop_tables().await;
}

#[tokio::test]
async fn unreachable_store_fails_fast() {
    let t = Instant::now();
    let r = Store::connect("postgres://postgres@127.0.0.1:1/test").await;
    assert!(matches!(r, Err(ref e) if e.is_retryable()), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(8));
}

/// Claim plans stay index walks over 100k and 200k pending tasks, with and
/// without statistics, custom and generic. (The claim and insert rates are
/// `baton-bench claim-scale`'s and `queue-throughput`'s to measure.)
#[tokio::test]
async fn claim_plan_is_an_index_walk() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let mut conn = sqlx::PgConnection::connect(&url()).await.unwrap();
    let batch: Vec<NewTask> = (0..100_000)
        .map(|i| {
            let mut t = task("bulk");
            t.payload = serde_json::json!({ "i": i });
            t
        })
        .collect();
    let r = b.task_insert_many(&batch).await.unwrap();
    assert_eq!(r.len(), 100_000);
    let check = |plan: &str, what: &str| {
        println!("--- {what}\n{plan}");
        assert!(
            plan.contains("tasks_claim"),
            "{what}: no claim index:\n{plan}"
        );
        // (The test clock's one-row table, read by every `now`, is
        // scanned; no task table may be.)
        let task_scan = plan
            .lines()
            .any(|l| l.contains("Seq Scan") && !l.contains("test_clock_"));
        assert!(!task_scan, "{what}: seq scan:\n{plan}");
    };
    let p = Some(f.prefix.as_str());
    // No statistics yet (unless autovacuum got there first).
    check(
        &postgres::explain_claim(&mut conn, p, "bulk", 100, false, false)
            .await
            .unwrap(),
        "custom plan, no ANALYZE",
    );
    check(
        &postgres::explain_claim(&mut conn, p, "bulk", 100, true, false)
            .await
            .unwrap(),
        "generic plan, no ANALYZE",
    );
    // Fresh statistics after the bulk insert, then 100k more.
    b.task_insert_many(&batch).await.unwrap();
    sqlx::Executor::execute(&mut conn, format!("ANALYZE \"{}tasks\"", f.prefix).as_str())
        .await
        .unwrap();
    check(
        &postgres::explain_claim(&mut conn, p, "bulk", 100, false, false)
            .await
            .unwrap(),
        "custom plan, ANALYZE with 200k pending",
    );
    check(
        &postgres::explain_claim(&mut conn, p, "bulk", 100, true, false)
            .await
            .unwrap(),
        "generic plan, ANALYZE with 200k pending",
    );
    f.drop_tables().await;
}

/// A large claim from a small, analyzed table still updates its rows
/// where its walk locked them, by tuple id (a TID scan), under a custom
/// and a generic plan: with the picked ids as `id IN (…)`, the custom plan
/// of a 512-task claim over 20,000 pending tasks hashed the ids and
/// scanned the whole table (25 ms of 35, measured with `EXPLAIN ANALYZE`).
#[tokio::test]
async fn large_claim_from_a_small_table_updates_by_tuple_id() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let mut conn = sqlx::PgConnection::connect(&url()).await.unwrap();
    let batch: Vec<NewTask> = (0..20_000).map(|_| task("small")).collect();
    assert_eq!(b.task_insert_many(&batch).await.unwrap().len(), 20_000);
    sqlx::Executor::execute(&mut conn, format!("ANALYZE \"{}tasks\"", f.prefix).as_str())
        .await
        .unwrap();
    let p = Some(f.prefix.as_str());
    for generic in [false, true] {
        let plan = postgres::explain_claim(&mut conn, p, "small", 512, generic, false)
            .await
            .unwrap();
        println!("--- generic: {generic}\n{plan}");
        let task_scan = plan
            .lines()
            .any(|l| l.contains("Seq Scan") && !l.contains("test_clock_"));
        assert!(!task_scan, "generic: {generic}: seq scan:\n{plan}");
        assert!(
            plan.contains("Tid Scan"),
            "generic: {generic}: the picked rows not found by tuple id:\n{plan}"
        );
    }
    f.drop_tables().await;
}

/// How many times the table was analyzed (by `ANALYZE`, not autovacuum).
async fn analyze_count(conn: &mut sqlx::PgConnection, query: &str) -> i64 {
    sqlx::query_scalar(query).fetch_one(conn).await.unwrap()
}

/// The statement a slow limited claim (fair, capped, rated per key) sends
/// (`store/postgres/statistics.rs`): it analyzes a tasks table that was
/// never analyzed, and only such a table. Without statistics the fair
/// claim function's plans read the whole pending set at each step of its
/// key walk (a fair queue of 10 keys and 20,000 tasks drained at ~550
/// tasks/s; ~4,500 once analyzed, docs/BENCHMARKS.md session 27).
#[tokio::test]
async fn a_never_analyzed_tasks_table_is_analyzed_once() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let mut conn = sqlx::PgConnection::connect(&url()).await.unwrap();
    let batch: Vec<NewTask> = (0..1_000).map(|_| task("stats")).collect();
    b.task_insert_many(&batch).await.unwrap();
    let count = format!(
        "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = '{}tasks'",
        f.prefix
    );
    assert_eq!(analyze_count(&mut conn, &count).await, 0);
    let sql = postgres::analyze_if_never_sql(Some(&f.prefix));
    sqlx::Executor::execute(&mut conn, sqlx::raw_sql(&sql))
        .await
        .unwrap();
    assert_eq!(analyze_count(&mut conn, &count).await, 1, "analyzed");
    let reltuples: f32 = sqlx::query_scalar(&format!(
        "SELECT reltuples FROM pg_class WHERE relname = '{}tasks'",
        f.prefix
    ))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(reltuples, 1000.0);
    // Analyzed once: the next slow claim's statement does nothing.
    sqlx::Executor::execute(&mut conn, sqlx::raw_sql(&sql))
        .await
        .unwrap();
    assert_eq!(analyze_count(&mut conn, &count).await, 1, "analyzed again");
    f.drop_tables().await;
}

#[tokio::test]
async fn listener_reconnects_after_its_connection_is_killed() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let mut rx = b.wake_subscribe().await.unwrap();
    // Once it listens it says so (what was sent before was missed).
    let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the listener did not start")
        .unwrap();
    assert!(first.is_resync(), "{first:?}");
    let mut admin = sqlx::PgConnection::connect(&url()).await.unwrap();
    let listening = format!("LISTEN \"{}tasks\"", f.prefix);
    let find = format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = '{listening}'"
    );
    // Wait for the LISTEN session, then kill it.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let killed: Vec<bool> = sqlx::query_scalar(&find)
            .fetch_all(&mut admin)
            .await
            .unwrap();
        if !killed.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "no LISTEN session found");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Back, it says so: notifications sent while it reconnected were
    // lost, so its subscribers look again (a resync wake-up, whose queue
    // no queue can be named: a control character leads it).
    let back = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("listener did not come back")
        .unwrap();
    assert!(back.is_resync(), "{back:?}");
    // And it listens: the next enqueue is heard.
    b.task_insert_many(&[task("again")]).await.unwrap();
    let q = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the enqueue after the reconnect was not heard")
        .unwrap();
    assert_eq!(q.queue, "again");
    f.drop_tables().await;
}

/// `Store::from_pg_pool`: baton's schema on the application's pool, and
/// `enqueue_in` in a transaction of that pool: nothing on rollback; on
/// commit the task, and a wake-up through the store's listener (opened with
/// the pool's connect options).
#[tokio::test]
async fn from_pool_and_enqueue_in_share_the_pool() {
    let pool = match sqlx::PgPool::connect(&url()).await {
        Ok(p) => p,
        Err(e) if std::env::var("BATON_REQUIRE_BACKENDS").as_deref() != Ok("1") => {
            eprintln!("SKIPPED postgres: {e}");
            return;
        }
        Err(e) => panic!("postgres required but unavailable: {e}"),
    };
    let prefix = format!("p{:08x}_", fastrand::u32(..));
    let store = Store::from_pg_pool(pool.clone(), baton::StoreOptions::prefixed(&prefix))
        .await
        .expect("migrated on the pool");
    let f = Fixture {
        store,
        prefix: prefix.clone(),
    };
    let mut tx = pool.begin().await.unwrap();
    let r = postgres::enqueue_in(&mut tx, Some(&prefix), &[task("o")])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(f.b().task_get(r[0].id).await.unwrap().is_none());

    let mut rx = f.b().wake_subscribe().await.unwrap();
    // LISTEN has started once the session says so.
    let resync = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the listener did not start")
        .unwrap();
    assert!(resync.is_resync(), "{resync:?}");
    let mut tx = pool.begin().await.unwrap();
    let r = postgres::enqueue_in(&mut tx, Some(&prefix), &[task("o")])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(f.b().task_get(r[0].id).await.unwrap().is_some());
    let w = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("notification within 5s")
        .unwrap();
    assert_eq!(w, baton::store::Wake::now("o"));
    assert!(
        f.store.url().starts_with("postgres://"),
        "{}",
        f.store.url()
    );
    f.drop_tables().await;
}

/// `keep_succeeded = false`: a success deletes a plain task, still fenced by
/// its claim token (a stale token deletes nothing), and keeps a task holding
/// a unique key or a job's run as `succeeded`.
#[tokio::test]
async fn delete_on_success_is_fenced_and_keeps_keyed_tasks() {
    let prefix = format!("t{:08x}_", fastrand::u32(..));
    let opts = StoreOptions {
        prefix: Some(prefix.clone()),
        max_connections: 4,
        keep_succeeded: false,
        ..Default::default()
    };
    let store = match Store::connect_with(&url(), opts).await {
        Ok(s) => s,
        Err(e) if std::env::var("BATON_REQUIRE_BACKENDS").as_deref() != Ok("1") => {
            eprintln!("SKIPPED postgres: {e}");
            return;
        }
        Err(e) => panic!("postgres required but unavailable: {e}"),
    };
    let f = Fixture { store, prefix };
    let b = f.b();
    let mut keyed = task("d");
    keyed.unique_key = Some("once".into());
    let mut scheduled = task("d");
    scheduled.job = Some("nightly".into());
    let ids: Vec<i64> = b
        .task_insert_many(&[task("d"), keyed, scheduled, task("d")])
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let got = b.task_claim(&claim_req("d", 4, MIN)).await.unwrap();
    assert_eq!(got.len(), 4);
    let claim_of = |id: i64| got.iter().find(|t| t.id == id).unwrap().claim();
    // A stale token is refused and deletes nothing.
    let mut stale = claim_of(ids[0]);
    stale.token = baton::store::FencingToken(stale.token.0 - 1);
    assert!(!b
        .task_finish_many(&[(stale, Finish::Succeeded)])
        .await
        .map(|r| r == [true])
        .unwrap());
    assert!(b.task_get(ids[0]).await.unwrap().is_some());
    let items: Vec<_> = ids[..3]
        .iter()
        .map(|&id| (claim_of(id), Finish::Succeeded))
        .collect();
    assert_eq!(b.task_finish_many(&items).await.unwrap(), vec![true; 3]);
    assert!(
        b.task_get(ids[0]).await.unwrap().is_none(),
        "plain task deleted"
    );
    for &id in &ids[1..3] {
        let t = b
            .task_get(id)
            .await
            .unwrap()
            .expect("keyed/scheduled task kept");
        assert_eq!(t.state, TaskState::Succeeded);
    }
    // A single finish deletes too; a second one is refused.
    assert!(b
        .task_finish_many(&[(claim_of(ids[3]), Finish::Succeeded)])
        .await
        .map(|r| r == [true])
        .unwrap());
    assert!(b.task_get(ids[3]).await.unwrap().is_none());
    assert!(!b
        .task_finish_many(&[(claim_of(ids[3]), Finish::Succeeded)])
        .await
        .map(|r| r == [true])
        .unwrap());
    f.drop_tables().await;
}

/// A claim under a cap per key alone, while the queue runs tasks of 32
/// keys or more, takes each planned key's own turn (`capped.rs`): a claim
/// of a key still in flight in another transaction (that key's lock held,
/// its task running but not committed, as the first claim leaves it)
/// makes it wait, and once that claim commits it counts the task and
/// claims nothing over the cap. Without the key's turn it would count the
/// uncommitted claim as nothing and start a second task of the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_capped_claim_waits_for_the_keys_claim_in_flight() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let capped = |worker| TaskClaim {
        worker,
        per_key_max_running: Some(1),
        ..claim_req("kc", 40, MIN)
    };
    // 32 keys running, so the next claims take the keys' turns.
    let mut batch: Vec<NewTask> = (0..32)
        .map(|i| {
            let mut t = task("kc");
            t.concurrency_key = Some(format!("filler:{i}"));
            t
        })
        .collect();
    for _ in 0..2 {
        let mut t = task("kc");
        t.concurrency_key = Some("hot".into());
        t.priority = 1;
        batch.push(t);
    }
    let ids = b.task_insert_many(&batch).await.unwrap();
    let first = b
        .task_claim(&TaskClaim {
            limit: 32,
            ..capped("w0")
        })
        .await
        .unwrap();
    assert_eq!(first.len(), 32, "the fillers, one of each key");
    let hot = ids[32].id;

    // A claim of `hot` in flight: its key's lock held and its first task
    // made running, not committed.
    let mut a = sqlx::PgConnection::connect(&url()).await.unwrap();
    let p = &f.prefix;
    sqlx::Executor::execute(&mut a, "BEGIN").await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("{p}tasks:kc\u{1f}hot"))
        .execute(&mut a)
        .await
        .unwrap();
    sqlx::query(&format!(
        "UPDATE \"{p}tasks\" SET state = 'running', attempt = attempt + 1, \
             claim_token = claim_token + 1, worker = 'a', started_at = now(), \
             lease_until = now() + interval '1 minute' WHERE id = $1"
    ))
    .bind(hot)
    .execute(&mut a)
    .await
    .unwrap();

    let store = f.store.clone();
    let b_claim = tokio::spawn(async move { store.backend().task_claim(&capped("w1")).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b_claim.is_finished(), "the claim waits for the key's turn");
    sqlx::Executor::execute(&mut a, "COMMIT").await.unwrap();
    let got = b_claim.await.unwrap().unwrap();
    assert!(
        got.is_empty(),
        "nothing over the cap of 1: claimed {:?}",
        got.iter().map(|t| t.id).collect::<Vec<_>>()
    );
    f.drop_tables().await;
}

/// A connect that waited for another process's migration lock reads the
/// version that process committed, and so runs no DDL. PostgreSQL's
/// catalog cache keeps a backend's earlier "no such table" through an
/// advisory lock's wait (the lock processes no catalog invalidations), so
/// a `to_regclass` read under the lock said "absent" and the base DDL ran
/// on the live schema (its `CREATE INDEX` locks deadlocked with workers
/// behind PgBouncer, whose server connections carry such earlier looks).
/// Here the pool's one connection looked first; the other process records
/// the current version and creates no other table, so a connect that ran
/// the DDL leaves a tasks table behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_that_waited_for_the_migration_lock_reads_the_committed_version() {
    let Some(f) = setup().await else { return };
    let version = f.store.schema_status().await.unwrap().expected;
    let p = format!("w{:08x}_", fastrand::u32(..));
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url())
        .await
        .unwrap();
    let absent: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NULL")
        .bind(format!("\"{p}meta\""))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(absent);
    let mut other = sqlx::PgConnection::connect(&url()).await.unwrap();
    sqlx::Executor::execute(&mut other, "BEGIN").await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("baton-migrate:{p}"))
        .execute(&mut other)
        .await
        .unwrap();
    sqlx::Executor::execute(
        &mut other,
        format!(
            "CREATE TABLE \"{p}meta\" (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
             INSERT INTO \"{p}meta\" VALUES ('schema_version', '{version}')"
        )
        .as_str(),
    )
    .await
    .unwrap();
    let opts = StoreOptions::prefixed(p.clone());
    let connect = tokio::spawn(Store::from_pg_pool(pool, opts));
    // Until the connect waits for this prefix's migration lock (after its
    // look for the schema); other tests' advisory locks do not count.
    let mut admin = sqlx::PgConnection::connect(&url()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND ((classid::int8 << 32) | objid::int8) = hashtextextended($1, 0)",
        )
        .bind(format!("baton-migrate:{p}"))
        .fetch_one(&mut admin)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the connect never waited for the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sqlx::Executor::execute(&mut other, "COMMIT").await.unwrap();
    let store = connect.await.unwrap();
    let tasks: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(format!("\"{p}tasks\""))
        .fetch_one(&mut admin)
        .await
        .unwrap();
    if let Ok(s) = store {
        let _ = s.remove_schema().await;
    }
    let _ = sqlx::Executor::execute(
        &mut admin,
        format!("DROP TABLE IF EXISTS \"{p}meta\" CASCADE").as_str(),
    )
    .await;
    assert!(
        !tasks,
        "the connect ran the base DDL on a schema recorded at version {version}"
    );
    f.drop_tables().await;
}
