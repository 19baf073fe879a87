//! The lease bounds the work, not the store (DESIGN.md T2, E1): a worker
//! whose path to the store goes dark mid-task — PostgreSQL and Redis behind
//! a fault proxy that drops every byte, SQLite behind a second connection
//! holding `BEGIN EXCLUSIVE` — stops its handler before its lease can lapse
//! and drops it at the lease's end, so the attempt another worker starts
//! after rescuing the task never overlaps it; and `Worker::run` returns
//! within a bound after shutdown while the store is still dark.

use baton_testkit as support;
use baton_testkit::harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::queue::worker::StopReason;
use baton::queue::{Queue, TaskBuilder, Worker, WorkerConfig};
use baton::{Store, StoreOptions};
use harness::Kind;
use support::proxy::{host_port, Mode, Proxy};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(3);
const STOP_GRACE: Duration = Duration::from_secs(1);

/// What the handlers saw: every tick (attempt, time) and, per attempt, when
/// a stop was first seen and why.
#[derive(Default)]
struct Ledger {
    ticks: Vec<(u32, Instant)>,
    stops: Vec<(u32, Instant, Option<StopReason>)>,
}

impl Ledger {
    fn first(&self, attempt: u32) -> Option<Instant> {
        self.ticks.iter().find(|t| t.0 == attempt).map(|t| t.1)
    }
    fn last(&self, attempt: u32) -> Option<Instant> {
        self.ticks
            .iter()
            .rev()
            .find(|t| t.0 == attempt)
            .map(|t| t.1)
    }
}

fn worker(store: Store, ledger: Arc<Mutex<Ledger>>) -> Worker {
    let cfg = WorkerConfig::default()
        .queue("default", 1)
        .lease(LEASE)
        .poll_interval(Duration::from_millis(200))
        .stop_grace(STOP_GRACE)
        .shutdown_grace(Duration::from_secs(2));
    let mut w = Worker::new(store, cfg).unwrap();
    // An uncooperative handler: it notes the stop but keeps working, so
    // only dropping it ends its ticks.
    w.handle("long", move |ctx| {
        let ledger = ledger.clone();
        async move {
            let attempt = ctx.task().attempt;
            let mut noted = false;
            loop {
                {
                    let now = Instant::now();
                    let mut l = ledger.lock().unwrap();
                    l.ticks.push((attempt, now));
                    if ctx.is_stopped() && !noted {
                        noted = true;
                        l.stops.push((attempt, now, ctx.stop_reason()));
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    w
}

async fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    baton_testkit::wait::until_true(Duration::from_secs(secs), what, || {
        let v = f();
        async move { v }
    })
    .await
}

/// How the test makes worker A's store path go dark.
enum Stall {
    Proxy(Proxy),
    /// A second connection holding the SQLite file's write lock.
    Sqlite(String, Option<sqlx::SqliteConnection>),
}

impl Stall {
    async fn dark(&mut self) {
        match self {
            Stall::Proxy(p) => p.set(Mode::Dark),
            Stall::Sqlite(url, conn) => {
                use sqlx::Connection;
                let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
                sqlx::query("BEGIN EXCLUSIVE")
                    .execute(&mut c)
                    .await
                    .unwrap();
                *conn = Some(c);
            }
        }
    }
    async fn light(&mut self) {
        match self {
            Stall::Proxy(p) => p.set(Mode::Pass),
            Stall::Sqlite(_, conn) => {
                if let Some(mut c) = conn.take() {
                    sqlx::query("COMMIT").execute(&mut c).await.unwrap();
                }
            }
        }
    }
}

/// A store handle on `ts` whose path the returned [`Stall`] can darken:
/// through a fault proxy (with `opts` and the test's prefix), or on SQLite
/// its own handle, stalled by a second connection's write lock.
async fn stallable(ts: &harness::TestStore, opts: StoreOptions) -> (Store, Stall) {
    match ts.kind {
        Kind::Sqlite => (ts.open().await, Stall::Sqlite(ts.url.clone(), None)),
        Kind::Postgres | Kind::Redis | Kind::Mysql => {
            let proxy = Proxy::start(&host_port(&ts.url));
            let opts = StoreOptions {
                prefix: Some(ts.prefix.clone()),
                max_connections: 4,
                ..opts
            };
            let s = Store::connect_with(&proxy.url(&ts.url), opts)
                .await
                .unwrap();
            (s, Stall::Proxy(proxy))
        }
    }
}

async fn stalled_store_stops_the_handler_before_the_lease_lapses(kind: Kind) {
    let Some(ts) = harness::connect(kind).await else {
        return;
    };
    let (store_a, mut stall) = stallable(&ts, StoreOptions::default()).await;
    let q = Queue::new(ts.store.clone());
    let id = q
        .enqueue(TaskBuilder::new("long", serde_json::json!({})).max_attempts(5))
        .await
        .unwrap()
        .id;
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop_a = CancellationToken::new();
    let run_a = tokio::spawn(worker(store_a, ledger.clone()).run(stop_a.clone()));
    wait_for(20, "attempt 1 to start", || {
        ledger.lock().unwrap().first(1).is_some()
    })
    .await;
    // Let heartbeats confirm the lease a few times, then go dark.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let dark = Instant::now();
    stall.dark().await;

    // The handler is stopped `guard` before the lease's local bound (at
    // the latest dark + lease) and dropped at it.
    let lease_end = dark + LEASE;
    wait_for(20, "attempt 1 to be dropped", || {
        ledger
            .lock()
            .unwrap()
            .last(1)
            .is_some_and(|t| t.elapsed() > Duration::from_millis(500))
    })
    .await;
    {
        let l = ledger.lock().unwrap();
        let (_, seen, why) = *l
            .stops
            .iter()
            .find(|s| s.0 == 1)
            .expect("attempt 1 was asked to stop");
        assert_eq!(why, Some(StopReason::LeaseExpiring));
        // Scheduling slack on a loaded machine: 500 ms.
        assert!(
            seen <= lease_end - STOP_GRACE + Duration::from_millis(500),
            "stop seen {:?} after going dark; the lease ends {:?} after",
            seen - dark,
            LEASE
        );
        let last = l.last(1).unwrap();
        assert!(
            last <= lease_end + Duration::from_millis(300),
            "attempt 1 ran {:?} after going dark, past its lease ({LEASE:?})",
            last - dark
        );
    }

    // Shutdown while the store is still dark returns within a bound
    // (shutdown_grace 2 s for the claim in flight, then nothing to wait for).
    let t0 = Instant::now();
    stop_a.cancel();
    tokio::time::timeout(Duration::from_secs(10), run_a)
        .await
        .expect("Worker::run returns within 10 s of shutdown while the store is dark")
        .unwrap()
        .unwrap();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(8), "shutdown took {took:?}");

    // Another worker on a healthy path rescues the task and runs attempt 2
    // (SQLite has one path: the lock is released first).
    if kind == Kind::Sqlite {
        stall.light().await;
    }
    let stop_b = CancellationToken::new();
    let run_b = tokio::spawn(worker(ts.store.clone(), ledger.clone()).run(stop_b.clone()));
    wait_for(30, "attempt 2 to start", || {
        ledger.lock().unwrap().first(2).is_some()
    })
    .await;
    {
        let l = ledger.lock().unwrap();
        let (last1, first2) = (l.last(1).unwrap(), l.first(2).unwrap());
        assert!(
            last1 < first2,
            "attempt 1 ran until {:?} after attempt 2 started: overlap",
            last1 - first2
        );
    }
    stall.light().await;
    stop_b.cancel();
    tokio::time::timeout(Duration::from_secs(15), run_b)
        .await
        .expect("worker B stops")
        .unwrap()
        .unwrap();
    let t = q.task(id).await.unwrap().unwrap();
    assert_eq!(t.state, baton::store::TaskState::Pending, "handed back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_stalled_store_stops_the_handler_before_the_lease_lapses() {
    stalled_store_stops_the_handler_before_the_lease_lapses(Kind::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_stalled_store_stops_the_handler_before_the_lease_lapses() {
    stalled_store_stops_the_handler_before_the_lease_lapses(Kind::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_stalled_store_stops_the_handler_before_the_lease_lapses() {
    stalled_store_stops_the_handler_before_the_lease_lapses(Kind::Redis).await
}

/// A call on a connection gone dark ends, within a bound, as a retryable
/// `Unavailable` that says it timed out (Redis: its response timeout;
/// PostgreSQL: the client-side bound, as the server's statement_timeout
/// cannot reach a client that hears nothing).
async fn dark_call_times_out_as_unavailable(kind: Kind) {
    let Some(ts) = harness::connect(kind).await else {
        return;
    };
    let proxy = Proxy::start(&host_port(&ts.url));
    let opts = StoreOptions {
        prefix: Some(ts.prefix.clone()),
        max_connections: 2,
        connect_timeout: Duration::from_secs(1),
        statement_timeout: Duration::from_secs(1),
        ..StoreOptions::default()
    };
    let store = Store::connect_with(&proxy.url(&ts.url), opts)
        .await
        .unwrap();
    store.now().await.unwrap();
    proxy.set(Mode::Dark);
    let t0 = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(15), store.now())
        .await
        .expect("the call ends within 15 s while dark")
        .expect_err("no answer while dark");
    let took = t0.elapsed();
    assert!(err.is_retryable(), "{err}");
    let why = baton::error::chain(&err);
    assert!(why.contains("timed out"), "{why}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    // Bad values are refused, naming the field.
    let bad = StoreOptions {
        statement_timeout: Duration::ZERO,
        ..StoreOptions::default()
    };
    let err = Store::connect_with(&ts.url, bad).await.unwrap_err();
    assert!(err.to_string().contains("statement_timeout"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_dark_call_times_out_as_unavailable() {
    dark_call_times_out_as_unavailable(Kind::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_dark_call_times_out_as_unavailable() {
    dark_call_times_out_as_unavailable(Kind::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_stalled_store_stops_the_handler_before_the_lease_lapses() {
    stalled_store_stops_the_handler_before_the_lease_lapses(Kind::Mysql).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_dark_call_times_out_as_unavailable() {
    dark_call_times_out_as_unavailable(Kind::Mysql).await
}

/// Releasing a lease while the store stalls returns by the lease's
/// deadline as `LeaseLost` (the lock is free by then without a release),
/// not after the store's 30 s statement timeout: a shutdown is never held
/// by a release that gets no answer.
async fn release_on_a_stalled_store_returns_by_the_deadline(kind: Kind) {
    let Some(ts) = harness::connect(kind).await else {
        return;
    };
    let opts = StoreOptions {
        statement_timeout: Duration::from_secs(30),
        ..StoreOptions::default()
    };
    let (store, mut stall) = stallable(&ts, opts).await;
    let at_most = Duration::from_secs(2);
    let lock = baton::lock::LockOptions::new(at_most).keep_alive(false);
    let lease = baton::lock::Locker::new(store)
        .try_lock("stalled-release", &lock)
        .await
        .unwrap()
        .expect("the lock is free");
    let granted = Instant::now();
    stall.dark().await;
    let r = tokio::time::timeout(Duration::from_secs(15), lease.release())
        .await
        .expect("the release returns within 15 s while the store stalls");
    let took = granted.elapsed();
    assert!(
        matches!(r, Err(baton::Error::LeaseLost(_))),
        "a release the store did not answer: {r:?}"
    );
    assert!(
        took < at_most + Duration::from_secs(1),
        "the release returned {took:?} after the grant (at_most {at_most:?})"
    );
    stall.light().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_release_on_a_stalled_store_returns_by_the_deadline() {
    release_on_a_stalled_store_returns_by_the_deadline(Kind::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_release_on_a_stalled_store_returns_by_the_deadline() {
    release_on_a_stalled_store_returns_by_the_deadline(Kind::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_release_on_a_stalled_store_returns_by_the_deadline() {
    release_on_a_stalled_store_returns_by_the_deadline(Kind::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_release_on_a_stalled_store_returns_by_the_deadline() {
    release_on_a_stalled_store_returns_by_the_deadline(Kind::Mysql).await
}

/// A claim dropped while its answer is on the way (a caller's timeout, a
/// worker shutting down) leaves nothing locked behind: each task it was
/// deciding on is either taken by it (running under its lease, the answer
/// lost — rescued when the lease ends) or claimable by the next claimer at
/// once. A MySQL claim is a transaction over two round trips; a connection
/// handed back to the pool with that transaction open would keep the rows
/// locked (every other claim skips them) and run its next caller's
/// statements inside it. The proxy's latency stretches each round trip so
/// the drop lands in each part of the claim in turn.
async fn dropped_claim_leaves_no_task_locked(kind: Kind) {
    use baton::store::{TaskClaim, TaskFilter, TaskState};
    let Some(ts) = harness::connect(kind).await else {
        return;
    };
    let proxy = Proxy::start(&host_port(&ts.url));
    let opts = StoreOptions {
        prefix: Some(ts.prefix.clone()),
        // One connection, so the one a dropped claim hands back is the one
        // the next call uses.
        max_connections: 1,
        ..StoreOptions::default()
    };
    let a = Store::connect_with(&proxy.url(&ts.url), opts)
        .await
        .unwrap();
    a.now().await.unwrap();
    const HOP: u64 = 60;
    proxy.latency(Duration::from_millis(HOP));
    let q = Queue::new(ts.store.clone());
    // Drops from half a hop to five hops after the call: before the first
    // request arrives, while its answer travels, during the second round
    // trip, after the answer.
    for step in 1..=20u64 {
        let queue = format!("drop{step}");
        for _ in 0..4 {
            q.enqueue(TaskBuilder::new("k", serde_json::json!({})).queue(&queue))
                .await
                .unwrap();
        }
        let req = TaskClaim {
            queue: &queue,
            worker: "dropped",
            limit: 4,
            lease: Duration::from_secs(60),
            max_running: None,
            per_key_max_running: None,
            buffered: 0,
            fair: false,
        };
        let cut = Duration::from_millis(HOP * step / 4);
        let _ = tokio::time::timeout(cut, a.backend().task_claim(&req)).await;
        // The next claimer takes every task the dropped claim did not.
        let b_req = TaskClaim {
            worker: "next",
            ..req.clone()
        };
        let t0 = Instant::now();
        loop {
            ts.store.backend().task_claim(&b_req).await.unwrap();
            let filter = TaskFilter {
                queue: Some(queue.clone()),
                state: Some(TaskState::Pending),
                ..TaskFilter::default()
            };
            let pending = ts.store.backend().task_list(&filter).await.unwrap();
            if pending.is_empty() {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{kind:?}: a claim dropped {cut:?} into its call left {} task(s) \
                 pending but not claimable for 5 s (locked by a transaction left open)",
                pending.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // And the dropped claim's connection serves the next call cleanly.
        a.now().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_dropped_claim_leaves_no_task_locked() {
    dropped_claim_leaves_no_task_locked(Kind::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_dropped_claim_leaves_no_task_locked() {
    dropped_claim_leaves_no_task_locked(Kind::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_dropped_claim_leaves_no_task_locked() {
    dropped_claim_leaves_no_task_locked(Kind::Mysql).await
}
