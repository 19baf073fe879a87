//! Smoke tests of the Redis backend against `BATON_TEST_REDIS`
//! (default `redis://127.0.0.1:6379`), each test under its own key prefix,
//! plus one test with a private `redis-server` that is restarted.
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use baton::store::{Acquire, Backend, LockAcquire, NewTask, RunAt, TaskClaim, TaskState};
use baton::{FencingToken, Store, StoreOptions};
use chrono::Utc;
use serde_json::json;

fn redis_url() -> String {
    std::env::var("BATON_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// An isolated store, or `None` (after a loud SKIPPED) without a server.
async fn open(prefix: Option<&str>) -> Option<Store> {
    let opts = StoreOptions {
        prefix: prefix.map(str::to_string),
        ..StoreOptions::default()
    };
    match Store::connect_with(&redis_url(), opts).await {
        Ok(s) => Some(s),
        Err(e) => {
            if std::env::var("BATON_REQUIRE_BACKENDS").is_ok_and(|v| v == "1") {
                panic!("redis required but unavailable: {e}");
            }
            eprintln!("SKIPPED redis: {e}");
            None
        }
    }
}

fn new_prefix() -> String {
    format!("t{}:", fastrand::u64(..))
}

async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn cleanup(prefix: &str) {
    let mut c = raw().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut c)
        .await
        .unwrap();
    for k in keys.chunks(1000) {
        let _: () = redis::cmd("DEL").arg(k).query_async(&mut c).await.unwrap();
    }
}

fn nt(queue: &str) -> NewTask {
    NewTask {
        queue: queue.into(),
        kind: "k".into(),
        payload: json!({"n": 1}),
        priority: 0,
        run_at: RunAt::Now,
        max_attempts: 3,
        timeout: None,
        unique_key: None,
        unique_hold: baton::queue::UniqueHold::Unfinished,
        job: None,
        slot: None,
        traceparent: None,
        concurrency_key: None,
        key_policy: None,
    }
}

fn creq<'a>(queue: &'a str, limit: u32, lease_ms: u64) -> TaskClaim<'a> {
    TaskClaim {
        queue,
        worker: "w1",
        limit,
        lease: Duration::from_millis(lease_ms),
        max_running: None,
        per_key_max_running: None,
        buffered: 0,
        fair: false,
    }
}

fn lreq<'a>(name: &'a str, holder: &'a str, ms: u64) -> LockAcquire<'a> {
    LockAcquire {
        name,
        holder,
        at_most: Duration::from_millis(ms),
    }
}

fn granted(a: Acquire) -> FencingToken {
    match a {
        Acquire::Granted { token, .. } => token,
        Acquire::Busy(i) => panic!("expected grant, busy: {i:?}"),
    }
}

#[tokio::test]
async fn lock_record_is_a_hash_without_ttl() {
    let p = new_prefix();
    let Some(s) = open(Some(&p)).await else {
        return;
    };
    let b = s.backend();
    let t1 = granted(b.lock_acquire(&lreq("job", "a", 10_000)).await.unwrap());
    match b.lock_acquire(&lreq("job", "b", 10_000)).await.unwrap() {
        Acquire::Busy(i) => {
            assert_eq!(i.holder, "a");
            assert_eq!(i.token, t1);
            assert!(i.held);
        }
        other => panic!("expected busy: {other:?}"),
    }
    // The key and its fields.
    let mut c = raw().await;
    let h: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{p}{{baton:lock:job}}"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(h.get("token"), Some(&t1.0.to_string()));
    assert_eq!(h.get("holder").map(String::as_str), Some("a"));
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("{p}{{baton:lock:job}}"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(ttl, -1, "the record keeps the last token: no TTL");
    cleanup(&p).await;
}

#[tokio::test]
async fn default_prefix_lock_key() {
    let Some(s) = open(None).await else { return };
    let name = format!("smoke-{}", fastrand::u64(..));
    let t = granted(
        s.backend()
            .lock_acquire(&lreq(&name, "a", 10_000))
            .await
            .unwrap(),
    );
    let mut c = raw().await;
    let tok: Option<String> = redis::cmd("HGET")
        .arg(format!("{{baton:lock:{name}}}"))
        .arg("token")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(tok, Some(t.0.to_string()));
    let _: () = redis::cmd("DEL")
        .arg(format!("{{baton:lock:{name}}}"))
        .query_async(&mut c)
        .await
        .unwrap();
}

/// A value baton did not write where a lock would be (a string, a hash
/// without baton's fields) is "held by something else": acquire answers
/// busy with token 0 and a holder saying what it is (no WRONGTYPE);
/// extend and release refuse; `lock_get` sees no lock; the value and its
/// TTL are left as they were.
#[tokio::test]
async fn foreign_value_at_a_lock_key_is_held_by_something_else() {
    let p = new_prefix();
    let Some(s) = open(Some(&p)).await else {
        return;
    };
    let b = s.backend();
    let mut c = raw().await;
    let string_key = format!("{p}{{baton:lock:shed}}");
    let hash_key = format!("{p}{{baton:lock:other}}");
    let _: () = redis::cmd("SET")
        .arg(&string_key)
        .arg("ADDED:2026-12-01T20:00:00.000Z@pod-a")
        .arg("PX")
        .arg(900_000)
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&hash_key)
        .arg(&["owner", "someone"])
        .query_async(&mut c)
        .await
        .unwrap();
    for (name, kind) in [("shed", "string"), ("other", "hash")] {
        match b.lock_acquire(&lreq(name, "a", 10_000)).await.unwrap() {
            Acquire::Busy(i) => {
                assert_eq!(i.token, FencingToken(0), "{i:?}");
                assert!(i.held, "{i:?}");
                assert!(
                    i.holder.contains("something else") && i.holder.contains(kind),
                    "{}",
                    i.holder
                );
            }
            other => panic!("{name}: expected busy: {other:?}"),
        }
        let ext = b
            .lock_extend(&baton::store::LockExtend {
                name,
                token: FencingToken(0),
                at_most: Duration::from_secs(10),
            })
            .await
            .unwrap();
        assert_eq!(ext, None);
        let rel = b
            .lock_release(&baton::store::LockRelease {
                name,
                token: FencingToken(0),
                at_least: Duration::ZERO,
                record: false,
            })
            .await
            .unwrap();
        assert!(!rel);
        assert!(b.lock_get(name).await.unwrap().is_none());
    }
    let indexed: Vec<String> = redis::cmd("SMEMBERS")
        .arg(format!("{p}{{baton}}:locks"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(indexed.is_empty(), "foreign names not indexed: {indexed:?}");
    assert!(b.lock_list().await.unwrap().is_empty());
    let v: String = redis::cmd("GET")
        .arg(&string_key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(v, "ADDED:2026-12-01T20:00:00.000Z@pod-a");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&string_key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(ttl > 800_000 && ttl <= 900_000, "TTL kept: {ttl}");
    let h: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&hash_key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(h.len(), 1, "{h:?}");
    cleanup(&p).await;
}

#[tokio::test]
async fn subscribe_wakes_and_warnings() {
    let p = new_prefix();
    let Some(s) = open(Some(&p)).await else {
        return;
    };
    let b = s.backend();
    let mut rx = b.wake_subscribe().await.unwrap();
    b.task_insert_many(&[nt("wq")]).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(3), rx.recv())
        .await
        .expect("wake-up arrives")
        .unwrap();
    assert_eq!(got, baton::store::Wake::now("wq"));
    // A delayed task is announced with its due time.
    let mut d = nt("later");
    d.run_at = RunAt::Delay(Duration::from_secs(60));
    let before = b.now().await.unwrap();
    b.task_insert_many(&[d]).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(3), rx.recv())
        .await
        .expect("wake-up arrives")
        .unwrap();
    assert_eq!(got.queue, "later");
    let due = got.due.expect("a due time") - before;
    assert!(
        (59_000..61_000).contains(&due.num_milliseconds()),
        "due in {due}"
    );
    // Multi-chunk batch: one wake-up per queue.
    let many: Vec<NewTask> = (0..1200).map(|_| nt("big")).collect();
    b.task_insert_many(&many).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(3), rx.recv())
        .await
        .expect("wake-up arrives")
        .unwrap();
    assert_eq!(got, baton::store::Wake::now("big"));
    assert!(tokio::time::timeout(Duration::from_millis(200), rx.recv())
        .await
        .is_err());

    let mut c = raw().await;
    let aof: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .query_async(&mut c)
        .await
        .unwrap_or_default();
    let w = b.warnings().await.unwrap();
    if aof.get(1).map(String::as_str) == Some("no") {
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("appendonly"));
    }
    cleanup(&p).await;
}

// ---------------------------------------------------------------------------
// A private server that goes away and comes back.
// ---------------------------------------------------------------------------

struct Server {
    child: std::process::Child,
    port: u16,
}

fn start_server(port: u16, dir: &std::path::Path) -> Server {
    let child = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--dir",
            dir.to_str().unwrap(),
            "--bind",
            "127.0.0.1",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server runs");
    Server { child, port }
}

impl Server {
    async fn wait_ready(&self) {
        let url = format!("redis://127.0.0.1:{}", self.port);
        for _ in 0..100 {
            if let Ok(c) = redis::Client::open(url.as_str()) {
                if let Ok(mut c) = c.get_multiplexed_async_connection().await {
                    if redis::cmd("PING")
                        .query_async::<String>(&mut c)
                        .await
                        .is_ok()
                    {
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("private redis did not start");
    }

    fn stop(&mut self) {
        let _ = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "shutdown", "nosave"])
            .output();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

use baton_testkit::free_port;

/// A private server on a free port with its data in a new directory,
/// ready, and a store connected to it.
async fn private_store() -> (tempfile::TempDir, Server, Store) {
    let dir = tempfile::tempdir().unwrap();
    let srv = start_server(free_port(), dir.path());
    srv.wait_ready().await;
    let url = format!("redis://127.0.0.1:{}", srv.port);
    let s = Store::connect(&url).await.unwrap();
    (dir, srv, s)
}

/// Retry `f` until it succeeds or `limit` passes.
async fn eventually<T, F, Fut>(limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, baton::StoreError>>,
{
    baton_testkit::wait::until_ok(limit, "the store answers again", || {
        let call = f();
        async move {
            let r = call.await;
            if let Err(e) = &r {
                assert!(e.is_retryable(), "unexpected error kind: {e}");
            }
            r
        }
    })
    .await
}

#[tokio::test]
async fn private_server_restart() {
    if !baton_testkit::need("redis restart test", &["redis-server", "redis-cli"]) {
        return;
    }
    let (dir, mut srv, s) = private_store().await;
    let port = srv.port;
    let b = s.backend();
    assert!(b.warnings().await.unwrap().is_empty(), "AOF is on");
    let t1 = granted(
        b.lock_acquire(&lreq("daemon-runner", "a", 60_000))
            .await
            .unwrap(),
    );
    assert!(b
        .lock_release(&baton::store::LockRelease {
            name: "daemon-runner",
            token: t1,
            at_least: Duration::ZERO,
            record: false,
        })
        .await
        .unwrap());
    let id = b.task_insert_many(&[nt("q")]).await.unwrap()[0].id;
    // Give AOF its fsync (everysec) before the shutdown.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    srv.stop();
    for i in 0..3 {
        let t0 = Instant::now();
        let r = b.lock_acquire(&lreq("daemon-runner", "a", 60_000)).await;
        assert!(r.is_err(), "acquire while down #{i}: {r:?}");
        assert!(r.unwrap_err().is_retryable());
        let r = b.task_insert_many(&[nt("q")]).await;
        assert!(r.is_err());
        let r = b.task_claim(&creq("q", 1, 1000)).await;
        assert!(r.is_err());
        let r = b.task_get(id).await;
        assert!(r.is_err());
        assert!(
            t0.elapsed() < Duration::from_secs(8),
            "errors come quickly: {:?}",
            t0.elapsed()
        );
    }

    // Back with its AOF: data kept, tokens continue.
    let mut srv = start_server(port, dir.path());
    srv.wait_ready().await;
    let info = eventually(Duration::from_secs(10), || b.task_get(id)).await;
    assert_eq!(info.unwrap().state, TaskState::Pending);
    let t2 = granted(
        eventually(Duration::from_secs(10), || async {
            b.lock_acquire(&lreq("daemon-runner", "a", 60_000)).await
        })
        .await,
    );
    assert!(t2 > t1, "{t2} > {t1}");
    assert!(b
        .lock_release(&baton::store::LockRelease {
            name: "daemon-runner",
            token: t2,
            at_least: Duration::ZERO,
            record: false,
        })
        .await
        .unwrap());
    let got = b.task_claim(&creq("q", 10, 10_000)).await.unwrap();
    assert_eq!(got[0].id, id);

    // Back without its data: tokens still rise (floored at TIME in µs).
    srv.stop();
    let empty = tempfile::tempdir().unwrap();
    let mut srv = start_server(port, empty.path());
    srv.wait_ready().await;
    let t3 = granted(
        eventually(Duration::from_secs(10), || async {
            b.lock_acquire(&lreq("daemon-runner", "a", 60_000)).await
        })
        .await,
    );
    assert!(t3 > t2, "{t3} > {t2} after data loss");
    assert!(b.task_get(id).await.unwrap().is_none());
    srv.stop();
    let _ = Utc::now();
}

#[allow(dead_code)]
fn assert_backend_object_safe(_: &dyn Backend) {}

/// The enqueue script is sent by hash alone; after the server lost its
/// script cache (a restart, `SCRIPT FLUSH`) the NOSCRIPT answer has it
/// loaded and sent again, and each task is inserted exactly once — for one
/// task and for a batch of several script calls. On a private server: a
/// flush of the shared one's cache makes another test's marked script
/// call answer `NOSCRIPT` instead of running (`enqueue_whose_reply_is_lost_…`
/// failed so under the whole suite).
#[tokio::test]
async fn enqueue_after_script_flush_inserts_once() {
    if !baton_testkit::need("script flush test", &["redis-server"]) {
        return;
    }
    let (_dir, srv, s) = private_store().await;
    let url = format!("redis://127.0.0.1:{}", srv.port);
    let b = s.backend();
    let flush = || async {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut c)
            .await
            .unwrap();
    };
    let pending = || async {
        let st = b.queue_stats().await.unwrap();
        st.iter().find(|q| q.queue == "sf").map_or(0, |q| q.pending)
    };
    flush().await;
    let one = b.task_insert_many(&[nt("sf")]).await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(pending().await, 1, "one task after a NOSCRIPT retry");
    b.task_insert_many(&[nt("sf")]).await.unwrap();
    assert_eq!(pending().await, 2);
    flush().await;
    let many: Vec<NewTask> = (0..1001).map(|_| nt("sf")).collect();
    let ids = b.task_insert_many(&many).await.unwrap();
    assert_eq!(ids.len(), 1001);
    assert_eq!(pending().await, 1003, "a multi-chunk batch inserted once");
}

/// Script calls go on while another client keeps emptying the server's
/// script cache (`SCRIPT FLUSH` every 2 ms, as a failover to a replica that
/// never saw the loads would): a `NOSCRIPT` answer after redis-rs's one
/// reload is tried again, so none of the lock calls errs, and each lock
/// call did what it says (on a private server: the flushes would disturb
/// the shared one's other tests).
#[tokio::test]
async fn script_calls_survive_a_script_cache_flushed_under_them() {
    if !baton_testkit::need("script flush test", &["redis-server", "redis-cli"]) {
        return;
    }
    let (_dir, srv, s) = private_store().await;
    let url = format!("redis://127.0.0.1:{}", srv.port);
    let b = s.backend();
    let stop = tokio_util::sync::CancellationToken::new();
    let flusher = {
        let (stop, url) = (stop.clone(), url.clone());
        tokio::spawn(async move {
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut c = client.get_multiplexed_async_connection().await.unwrap();
            let mut flushes = 0u64;
            while !stop.is_cancelled() {
                let _: () = redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query_async(&mut c)
                    .await
                    .unwrap();
                flushes += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            flushes
        })
    };
    for i in 0..1000 {
        let name = format!("flushed-{}", i % 7);
        let t = granted(b.lock_acquire(&lreq(&name, "a", 60_000)).await.unwrap());
        let ext = b
            .lock_extend(&baton::store::LockExtend {
                name: &name,
                token: t,
                at_most: Duration::from_secs(60),
            })
            .await
            .unwrap();
        assert!(ext.is_some(), "extend #{i}");
        assert!(b
            .lock_release(&baton::store::LockRelease {
                name: &name,
                token: t,
                at_least: Duration::ZERO,
                record: false,
            })
            .await
            .unwrap());
    }
    stop.cancel();
    let flushes = flusher.await.unwrap();
    assert!(flushes > 10, "the cache was flushed {flushes} times");
}

/// The wake-up subscription, lost (its connection killed) and made again,
/// says so with a resync wake-up (what was published in the gap was
/// missed, so workers and schedulers look again), then hears the next
/// enqueue. A private server: killing pub/sub clients on the shared one
/// would cut other tests' subscriptions.
#[tokio::test]
async fn subscription_back_after_a_gap_sends_a_resync() {
    if !baton_testkit::need("redis resubscribe test", &["redis-server", "redis-cli"]) {
        return;
    }
    let (_dir, srv, s) = private_store().await;
    let port = srv.port;
    let b = s.backend();
    let mut rx = b.wake_subscribe().await.unwrap();
    let killed = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "client", "kill", "type", "pubsub"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&killed.stdout).trim(),
        "1",
        "one pub/sub client killed"
    );
    let back = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the subscription did not come back")
        .unwrap();
    assert!(back.is_resync(), "{back:?}");
    b.task_insert_many(&[nt("after")]).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the enqueue after the resubscribe was not heard")
        .unwrap();
    assert_eq!(got.queue, "after");
}

/// A scheduler started while its store is down (or this process is out of
/// file descriptors) waits for the store instead of returning an error:
/// `baton serve` ended when its scheduler's first clock reading failed.
/// Here the store is a private server stopped before the scheduler starts
/// and started again 2 s later; the job's runs start once it is back.
#[tokio::test]
async fn scheduler_started_while_the_store_is_down_waits_for_it() {
    use baton::schedule::{Job, Schedule, Scheduler};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    if !baton_testkit::need("scheduler start test", &["redis-server", "redis-cli"]) {
        return;
    }
    let (dir, mut srv, store) = private_store().await;
    let port = srv.port;
    srv.stop();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut s = Scheduler::new(store);
    let job = Job::new("tick", Schedule::every(Duration::from_secs(1)).unwrap())
        .lock_mode(Duration::from_secs(5), Duration::ZERO);
    let r = runs.clone();
    s.add_locked(job, move |_| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    })
    .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(s.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !run.is_finished(),
        "the scheduler ended while the store was down: {:?}",
        run.await
    );
    let mut srv = start_server(port, dir.path());
    srv.wait_ready().await;
    baton_testkit::wait::until(
        Duration::from_secs(15),
        "a run once the store is back",
        || {
            let n = runs.load(Ordering::SeqCst);
            async move { (n > 0).then_some(()) }
        },
    )
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
    srv.stop();
}

/// An enqueue whose reply is lost after its insert reached the server (a
/// connection dropped mid-call, a response timeout, or, with
/// `wait_replicas`, a `WAIT` the replica promoted by a failover did not
/// answer in time) fails, but its tasks may exist: their ids stay
/// findable (`B where`, written with the reservation). With a unique key
/// the retry answers the first call's task, which a read by id then finds
/// (the sentinel failover test once saw it answer `None`); a batch's
/// earlier script calls, which did insert, stay findable too. The fault
/// proxy passes the request carrying a marker to the server and loses the
/// reply.
#[tokio::test]
async fn enqueue_whose_reply_is_lost_keeps_its_tasks_findable() {
    use baton::queue::{Queue, TaskBuilder};
    use baton::store::TaskFilter;
    use baton_testkit::proxy::{host_port, Proxy};

    let prefix = new_prefix();
    let Some(direct) = open(Some(&prefix)).await else {
        return;
    };
    let proxy = Proxy::start(&host_port(&redis_url()));
    let opts = StoreOptions {
        prefix: Some(prefix.clone()),
        ..StoreOptions::default()
    };
    let s = Store::connect_with(&proxy.url(&redis_url()), opts)
        .await
        .unwrap();

    // One task with a unique key: the lost call inserted it, and the
    // retry answers it.
    let q = Queue::new(s.clone());
    let task = || {
        TaskBuilder::new("k", json!("lost-reply-one"))
            .queue("lr")
            .unique_key("once")
            .unique_forever(true)
    };
    proxy.lose_reply_to(b"lost-reply-one");
    let lost = q.enqueue(task()).await;
    assert!(lost.is_err(), "the reply was lost: {lost:?}");
    let again = baton_testkit::wait::until_ok(Duration::from_secs(10), "the enqueue again", || {
        q.enqueue(task())
    })
    .await;
    assert!(
        !again.inserted,
        "the lost call inserted the task: {again:?}"
    );
    let found = Queue::new(direct.clone()).task(again.id).await.unwrap();
    assert!(
        found.is_some(),
        "task {} answered by the retry is not found by its id",
        again.id
    );

    // A batch of two pipelined round trips whose second's reply is lost:
    // every task exists, and each is found by its id.
    let n = 4001;
    let many: Vec<NewTask> = (0..n)
        .map(|i| {
            let mut t = nt("lr2");
            if i == n - 1 {
                t.payload = json!("lost-reply-many");
            }
            t
        })
        .collect();
    proxy.lose_reply_to(b"lost-reply-many");
    let lost = s.backend().task_insert_many(&many).await;
    assert!(lost.is_err(), "the reply was lost: {lost:?}");
    let b = direct.backend();
    let mut ids = Vec::new();
    let mut before = None;
    loop {
        let page = b
            .task_list(&TaskFilter {
                queue: Some("lr2".into()),
                before_id: before,
                limit: 1000,
                ..TaskFilter::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        ids.extend(page.iter().map(|t| t.id));
    }
    assert_eq!(ids.len(), n, "every task of the batch was inserted");
    let mut missing = Vec::new();
    for id in &ids {
        if b.task_get(*id).await.unwrap().is_none() {
            missing.push(*id);
        }
    }
    assert!(
        missing.is_empty(),
        "{} of the batch's {n} tasks are not found by their id (e.g. {:?})",
        missing.len(),
        missing.first()
    );
    cleanup(&prefix).await;
}
