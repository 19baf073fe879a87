//! DESIGN.md E1 and T1 across a store restart: a private `redis-server` or
//! `postgres` on a free port is stopped and started again while locks and
//! workers use it. Operations fail with errors (never a panic or a hang),
//! and afterwards every invariant still holds and no task is lost.
//!
//! SQLite is embedded — there is no server to go down — so it is not here.

use baton_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton::lock::{LockOptions, Locker};
use baton::queue::{Queue, TaskBuilder, Worker, WorkerConfig};
use baton::{Error, Store, StoreOptions};
use support::{Kind, Private};
use tokio_util::sync::CancellationToken;

/// The first connect to a server just started: retried while it fails
/// (a fresh server can accept a connection and drop it while it loads);
/// the restarts these tests make come after it.
async fn connect(url: &str) -> Store {
    let opts = StoreOptions {
        prefix: Some("chaos_".into()),
        max_connections: 8,
        ..Default::default()
    };
    support::wait::until_ok(Duration::from_secs(20), "the first connect", || {
        Store::connect_with(url, opts.clone())
    })
    .await
}

async fn locks_survive_a_restart(kind: Kind) {
    let Some(mut srv) = Private::new(kind) else {
        return;
    };
    srv.start();
    let store = connect(&srv.url()).await;
    let locker = Locker::new(store.clone());
    let opts = LockOptions::new(Duration::from_secs(2));
    let lease = locker.try_lock("chaos", &opts).await.unwrap().unwrap();
    let before = lease.token();
    lease.release().await.unwrap();
    let held = locker.try_lock("chaos", &opts).await.unwrap().unwrap();

    srv.stop();
    // Down: every call errors, quickly, and nothing panics.
    for _ in 0..3 {
        let t0 = Instant::now();
        match locker.try_lock("chaos-2", &opts).await {
            Err(Error::Store(e)) => assert!(e.is_retryable(), "{e}"),
            other => panic!("expected a store error while down, got {other:?}"),
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "an error, not a hang ({:?})",
            t0.elapsed()
        );
    }
    // The holder's keep-alive cannot extend: the lease is reported lost
    // before its at_most runs out on the store.
    let t0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .expect("lease lost signalled");
    assert!(t0.elapsed() <= Duration::from_millis(2_100));

    srv.start();
    // Back: locks work again (after the client reconnects) and tokens still rise.
    let t0 = Instant::now();
    let again = loop {
        match locker.try_lock("chaos", &opts).await {
            Ok(Some(l)) => break l,
            Ok(None) => {} // the old lease is still in its at_most
            Err(e) => assert!(matches!(&e, Error::Store(s) if s.is_retryable()), "{e}"),
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "locks did not come back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        again.token() > held.token() && held.token() > before,
        "tokens keep rising across the restart"
    );
    again.release().await.unwrap();
}

/// PostgreSQL commits a release without waiting for its WAL flush (a lost
/// release only keeps the lease until its `lock_until`), but grants and
/// extensions must survive a crash: otherwise a second holder could get in,
/// or a token be issued twice, after the server comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_grants_and_extensions_survive_a_crash() {
    let Some(mut srv) = Private::new(Kind::Postgres) else {
        return;
    };
    srv.start();
    let store = connect(&srv.url()).await;
    let locker = Locker::new(store.clone());
    let opts = LockOptions::new(Duration::from_secs(60)).keep_alive(false);
    // A released lease first, so the grant below is not the row's first.
    let first = locker.try_lock("crash", &opts).await.unwrap().unwrap();
    let first_token = first.token();
    first.release().await.unwrap();

    // 1. A grant is the last commit before the crash.
    let lease = locker.try_lock("crash", &opts).await.unwrap().unwrap();
    let info = crash_and_get(&mut srv, &store, "crash").await;
    assert!(
        info.held && info.token == lease.token() && info.token > first_token,
        "grant lost in the crash: {info:?}"
    );
    assert!(
        locker.try_lock("crash", &opts).await.unwrap().is_none(),
        "a second holder got in after the crash"
    );

    // 2. An extension is the last commit before the crash.
    let until = store
        .backend()
        .lock_extend(&baton::store::LockExtend {
            name: "crash",
            token: lease.token(),
            at_most: Duration::from_secs(120),
        })
        .await
        .unwrap()
        .expect("extended");
    let info = crash_and_get(&mut srv, &store, "crash").await;
    assert_eq!(info.lock_until, until, "extension lost in the crash");
}

/// Crash the private PostgreSQL at once (`pg_ctl -m immediate`; its WAL
/// writer sleeps 10 s, so only a commit that waited for its flush
/// survives), start it again and read the lock record.
async fn crash_and_get(srv: &mut Private, store: &Store, name: &str) -> baton::store::LockInfo {
    srv.stop();
    srv.start();
    let t0 = Instant::now();
    loop {
        match store.backend().lock_get(name).await {
            Ok(Some(info)) => return info,
            Ok(None) => panic!("lock record {name} vanished in the crash"),
            Err(e) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "store did not return: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn no_task_lost_across_a_restart(kind: Kind) {
    const N: usize = 300;
    let Some(mut srv) = Private::new(kind) else {
        return;
    };
    srv.start();
    let store = connect(&srv.url()).await;
    let q = Queue::new(store.clone());
    let batch: Vec<_> = (0..N)
        .map(|i| TaskBuilder::new("t", serde_json::json!(i)).max_attempts(50))
        .collect();
    q.enqueue_many(batch).await.unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let cfg = WorkerConfig::default()
            .queue("default", 4)
            .lease(Duration::from_millis(1_500))
            .poll_interval(Duration::from_millis(100));
        let mut w = Worker::new(connect(&srv.url()).await, cfg).unwrap();
        let r = ran.clone();
        w.handle("t", move |_| {
            let r = r.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        });
        runs.push(tokio::spawn(w.run(stop.clone())));
    }
    while ran.load(Ordering::SeqCst) < N / 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    srv.stop();
    tokio::time::sleep(Duration::from_secs(2)).await;
    srv.start();
    let t0 = Instant::now();
    loop {
        if let Ok(st) = q.stats().await {
            if st.first().is_some_and(|s| s.succeeded as usize == N) {
                break;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "tasks lost or stuck: {:?}",
            q.stats().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.cancel();
    for r in runs {
        r.await.unwrap().unwrap();
    }
    let st = &q.stats().await.unwrap()[0];
    assert_eq!((st.pending, st.running, st.failed), (0, 0, 0), "{st:?}");
    // At least once: a task whose result was lost in the outage ran again.
    assert!(ran.load(Ordering::SeqCst) >= N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_locks_survive_a_restart() {
    locks_survive_a_restart(Kind::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_locks_survive_a_restart() {
    locks_survive_a_restart(Kind::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_no_task_lost_across_a_restart() {
    no_task_lost_across_a_restart(Kind::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_no_task_lost_across_a_restart() {
    no_task_lost_across_a_restart(Kind::Postgres).await
}
