//! Redis Sentinel against real servers: a private master, one replica and
//! three sentinels (`baton_testkit::sentinel`), with a forced failover, a
//! failover that loses the last writes, and a time with no writable master.
//!
//! One test, in phases, to spend the set's start-up (about 2 s) once:
//!
//! 1. `SENTINEL FAILOVER` while two workers run: every task (enqueued
//!    before and during) runs exactly once, and the workers are on the
//!    new master within a bound.
//!    Then a second forced failover with the old master taking writes
//!    (no `min-replicas-to-write`) while it still answers `ROLE` as a
//!    master: a write a second later lands on the new master (the
//!    connection asks the sentinels again).
//! 2. The master is cut off from its replica, takes a lock grant and a
//!    task, and dies; the replica is promoted without them. The lock's
//!    next token and the next task id are still above the lost ones (the
//!    store-clock floor, DESIGN.md E1 and I1).
//! 3. The sentinels die and the master is demoted (`REPLICAOF`): no
//!    writable master. The readiness read (`schema_status`) fails, through
//!    the sentinels and through a plain `redis://` URL to the demoted node
//!    (`StoreError::ReadOnly`); it passes again once a master is back.
#![cfg(feature = "redis")]

use baton_testkit as support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::lock::{LockOptions, Locker};
use baton::queue::{Queue, TaskBuilder, Worker, WorkerConfig};
use baton::store::TaskState;
use baton::{Store, StoreError, StoreOptions};
use support::sentinel::{cli, SentinelSet};
use tokio_util::sync::CancellationToken;

async fn connect(url: &str) -> Store {
    let opts = StoreOptions {
        prefix: Some("sentinel_".into()),
        connect_timeout: Duration::from_secs(1),
        statement_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    Store::connect_with(url, opts).await.unwrap()
}

/// Retry `f` until it succeeds (a failover followed).
async fn until_ok<T, F, Fut>(what: &str, within: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, baton::Error>>,
{
    baton_testkit::wait::until_ok(within, what, f).await
}

/// A little more than the connection's check interval (one second).
fn conn_check() -> Duration {
    Duration::from_millis(1300)
}

fn worker(store: Store, runs: Arc<Mutex<Vec<i64>>>) -> Worker {
    let cfg = WorkerConfig::default()
        .queue("default", 4)
        // Longer than the failover's write outage (measured below), so a
        // claim survives it: a lease that lapses mid-outage is rescued and
        // its task runs again, as designed.
        .lease(Duration::from_secs(15))
        .poll_interval(Duration::from_millis(200));
    let mut w = Worker::new(store, cfg).unwrap();
    w.handle("t", move |ctx| {
        let runs = runs.clone();
        async move {
            runs.lock().unwrap().push(ctx.task().id);
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(())
        }
    });
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_failover_is_followed() {
    let Some(mut set) = SentinelSet::start() else {
        return;
    };
    // Every write waits until the replica has it (`wait_replicas=1`):
    // without it, a write the old master acknowledged while its stream to
    // the replica was in flight when the replica was promoted is lost (a
    // task enqueued but gone, a result recorded but gone and the task run
    // again; both seen here without the parameter).
    let base = set.url();
    let url = format!("{base}?wait_replicas=1");
    let store = connect(&url).await;
    let q = Queue::new(store.clone());

    // ---- 1. a forced failover mid-run ------------------------------------
    const BEFORE: usize = 300;
    const DURING: usize = 100;
    let mut ids: Vec<i64> = q
        .enqueue_many(
            (0..BEFORE)
                .map(|i| TaskBuilder::new("t", serde_json::json!(i)))
                .collect(),
        )
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let mut workers = Vec::new();
    for _ in 0..2 {
        let w = worker(connect(&url).await, runs.clone());
        workers.push(tokio::spawn(w.run(stop.clone())));
    }
    while runs.lock().unwrap().len() < BEFORE / 4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let old = set.start_failover();
    // The sentinels make the old master the new one's replica only when
    // they next look at it (up to 10 s later); until then the new master
    // has no replica to acknowledge writes. Do it as soon as they name the
    // new master, as they would.
    let ports = set.ports();
    let promote = tokio::task::spawn_blocking(move || {
        let new = ports.wait_new_master(old);
        ports.rejoin(old, new);
        new
    });
    // Enqueue while the failover runs (each retried until a master takes
    // it). A write can land while its answer is lost to the failover, so
    // each enqueue has a key of its own, held for good, as an application
    // retrying enqueues would: the retry then answers the task the lost
    // answer was for instead of making a second one (without the key, a
    // rehearsal once saw 402 tasks run for 401 enqueues).
    let failover_at = Instant::now();
    let mut outage = Duration::ZERO;
    let mut during = Vec::new();
    for i in 0..DURING {
        let t = Instant::now();
        let e = until_ok(
            "enqueue during the failover",
            Duration::from_secs(30),
            || {
                q.enqueue(
                    TaskBuilder::new("t", serde_json::json!(BEFORE + i))
                        .unique_key(format!("during-{i}"))
                        .unique_forever(true),
                )
            },
        )
        .await;
        outage = outage.max(t.elapsed());
        during.push(e.id);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let new = promote.await.unwrap();
    eprintln!(
        "sentinel: failover: the longest enqueue took {outage:?}; the sentinels named the new master after {:?}",
        failover_at.elapsed()
    );
    assert_ne!(new, old);
    ids.extend(during);
    // The sentinels name the new master: how soon does work run there?
    let named = Instant::now();
    let probe = until_ok("enqueue on the new master", Duration::from_secs(30), || {
        q.enqueue(TaskBuilder::new("t", serde_json::json!("probe")))
    })
    .await;
    ids.push(probe.id);
    loop {
        if runs.lock().unwrap().contains(&probe.id) {
            break;
        }
        assert!(
            named.elapsed() < Duration::from_secs(15),
            "workers did not follow the failover within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let followed = named.elapsed();
    eprintln!(
        "sentinel: a task enqueued on the new master ran {followed:?} after the sentinels named it"
    );
    // Every task succeeds on the new master (a result written during the
    // failover may still be being retried: wait for it) ...
    let t0 = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        loop {
            // The read's error, if any, is kept for the message (a task
            // gone and a read that fails are different failures).
            let t = q.task(*id).await;
            if t.as_ref()
                .is_ok_and(|t| t.as_ref().is_some_and(|t| t.state == TaskState::Succeeded))
            {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "task {id} (#{i} of {}: {BEFORE} before the failover, {DURING} during, \
                 then the probe) did not succeed: {t:?}",
                ids.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // ... and ran exactly once.
    let mut counts: HashMap<i64, usize> = HashMap::new();
    for id in runs.lock().unwrap().iter() {
        *counts.entry(*id).or_default() += 1;
    }
    for id in &ids {
        if counts.get(id) != Some(&1) {
            let t = q.task(*id).await.unwrap();
            panic!("task {id} ran {:?} times: {t:?}", counts.get(id));
        }
    }
    assert_eq!(counts.len(), ids.len(), "no other task ran");

    stop.cancel();
    for w in workers {
        w.await.unwrap().unwrap();
    }

    // ---- 1b. a demoted master that still answers as one -------------------
    // After a forced failover the sentinels reconfigure the old master only
    // when they next look at it (up to 10 s): until then it answers ROLE
    // as a master and, without min-replicas-to-write, takes writes that
    // are lost. The connection asks the sentinels again within a second.
    let store = connect(&base).await;
    let q = Queue::new(store.clone());
    // Neither node requires a replica now (the next master would have
    // none until the sentinels reconfigure the old one).
    for node in [new, old] {
        assert_eq!(
            cli(node, &["CONFIG", "SET", "min-replicas-to-write", "0"]),
            "OK"
        );
    }
    q.enqueue(TaskBuilder::new("m", serde_json::json!("on the old")))
        .await
        .unwrap();
    let demoted = set.start_failover();
    assert_eq!(demoted, new);
    let new = set.wait_new_master(demoted);
    tokio::time::sleep(conn_check()).await;
    assert!(
        cli(demoted, &["ROLE"]).starts_with("master"),
        "the sentinels reconfigured the old master already: this phase proves nothing"
    );
    let moved = until_ok(
        "enqueue after the second failover",
        Duration::from_secs(10),
        || q.enqueue(TaskBuilder::new("m", serde_json::json!("on the new"))),
    )
    .await;
    let on_new = connect(&format!("redis://127.0.0.1:{new}")).await;
    assert!(
        Queue::new(on_new).task(moved.id).await.unwrap().is_some(),
        "the write went to the demoted master, not to the one the sentinels name"
    );
    set.rejoin(demoted, new);

    // ---- 2. a failover that loses the last writes -------------------------
    let locker = Locker::new(store.clone());
    let opts = LockOptions::new(Duration::from_secs(2));
    let kept = locker
        .try_lock("fence", &opts)
        .await
        .unwrap()
        .expect("free");
    let kept_token = kept.token();
    kept.release().await.unwrap();
    // Replicated before the cut (WAIT: the replica acknowledged it).
    assert_eq!(cli(new, &["WAIT", "1", "5000"]), "1");
    // `wait_replicas=1`: a write succeeds once the replica has it ...
    let waiting = Queue::new(connect(&url).await);
    waiting
        .enqueue(TaskBuilder::new("w", serde_json::json!(1)))
        .await
        .unwrap();
    set.lose_the_next_writes(new);
    // ... and fails, as read-only, while no replica takes it.
    match waiting
        .enqueue(TaskBuilder::new("w", serde_json::json!(2)))
        .await
    {
        Err(baton::Error::Store(StoreError::ReadOnly { context: why, .. })) => {
            assert!(why.contains("0 of the 1 replicas"), "{why}")
        }
        other => panic!("a write no replica acknowledged: {other:?}"),
    }
    let lost = locker
        .try_lock("fence", &opts)
        .await
        .unwrap()
        .expect("free");
    let lost_token = lost.token();
    assert!(lost_token > kept_token);
    lost.release().await.unwrap();
    let lost_task = q
        .enqueue(TaskBuilder::new("t", serde_json::json!("lost")))
        .await
        .unwrap();
    set.kill_node(new);
    set.thaw_replicas(new);
    let promoted = set.wait_new_master(new);
    // The promoted replica does not have them: the lock record is the kept one.
    let info = until_ok(
        "read the lock on the promoted replica",
        Duration::from_secs(30),
        || async { Ok(store.backend().lock_get("fence").await?) },
    )
    .await
    .expect("the kept record");
    assert_eq!(info.token, kept_token, "the grant after the cut was lost");
    assert!(
        q.task(lost_task.id).await.unwrap().is_none(),
        "the task after the cut was lost"
    );
    let next = until_ok(
        "lock on the promoted replica",
        Duration::from_secs(30),
        || locker.try_lock("fence", &opts),
    )
    .await
    .expect("free");
    assert!(
        next.token() > lost_token,
        "tokens rise across a lossy failover: {} after the lost {lost_token}",
        next.token()
    );
    next.release().await.unwrap();
    let after = q
        .enqueue(TaskBuilder::new("t", serde_json::json!("after")))
        .await
        .unwrap();
    assert!(after.id > lost_task.id, "ids rise across a lossy failover");

    // ---- 3. no writable master --------------------------------------------
    let plain = connect(&format!("redis://127.0.0.1:{promoted}")).await;
    plain.backend().schema_status().await.unwrap();
    set.stop_sentinels();
    assert_eq!(cli(promoted, &["REPLICAOF", "127.0.0.1", "1"]), "OK");
    let t0 = Instant::now();
    let (via_sentinels, via_plain) = loop {
        let a = store.backend().schema_status().await;
        let b = plain.backend().schema_status().await;
        if let (Err(a), Err(b)) = (&a, &b) {
            break (a.to_string(), b.to_string());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "readiness still passes on a replica: {a:?} {b:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("sentinel: unready: {via_sentinels} | plain: {via_plain}");
    assert!(via_plain.contains("read-only"), "{via_plain}");
    match q
        .enqueue(TaskBuilder::new("t", serde_json::json!("x")))
        .await
    {
        Err(baton::Error::Store(e)) => assert!(e.is_retryable(), "{e}"),
        other => panic!("a write with no master: {other:?}"),
    }
    let plain_q = Queue::new(plain.clone());
    match plain_q
        .enqueue(TaskBuilder::new("t", serde_json::json!("x")))
        .await
    {
        Err(baton::Error::Store(StoreError::ReadOnly { context: why, .. })) => {
            assert!(why.contains("replica"), "{why}")
        }
        other => panic!("a write to a replica: {other:?}"),
    }
    // A master again: both are ready within seconds, by themselves.
    assert_eq!(cli(promoted, &["REPLICAOF", "NO", "ONE"]), "OK");
    set.start_sentinels();
    let t0 = Instant::now();
    while store.backend().schema_status().await.is_err()
        || plain.backend().schema_status().await.is_err()
    {
        assert!(t0.elapsed() < Duration::from_secs(15), "not ready again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    until_ok(
        "enqueue once a master is back",
        Duration::from_secs(15),
        || q.enqueue(TaskBuilder::new("t", serde_json::json!("back"))),
    )
    .await;
}
