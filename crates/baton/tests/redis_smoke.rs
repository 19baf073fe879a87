//! Smoke tests of the Redis backend against `BATON_TEST_REDIS`
//! (default `redis://127.0.0.1:6379`), each test under its own key prefix,
//! plus one test with a private `redis-server` that is restarted.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use baton::store::{
    Acquire, Advanced, Backend, CancelOutcome, Claim, ClaimRequest, Finish, Heartbeat, LockRequest,
    NewTask, Overlap, RunAt, SlotAdvance, TaskFilter, TaskState, LEASE_EXPIRED, OVERLAP_SKIPPED,
};
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
        unique_forever: false,
        job: None,
        slot: None,
    }
}

fn creq<'a>(queue: &'a str, limit: u32, lease_ms: u64) -> ClaimRequest<'a> {
    ClaimRequest {
        queue,
        worker: "w1",
        limit,
        lease: Duration::from_millis(lease_ms),
        max_running: None,
    }
}

fn lreq<'a>(name: &'a str, holder: &'a str, ms: u64) -> LockRequest<'a> {
    LockRequest {
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
async fn locks() {
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
        .arg(format!("{p}lock:job"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(h.get("token"), Some(&t1.0.to_string()));
    assert_eq!(h.get("holder").map(String::as_str), Some("a"));
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("{p}lock:job"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(ttl, -1, "the record keeps the last token: no TTL");

    assert!(b
        .lock_extend("job", FencingToken(t1.0 + 1), Duration::from_secs(5))
        .await
        .unwrap()
        .is_none());
    assert!(b
        .lock_extend("job", t1, Duration::from_secs(20))
        .await
        .unwrap()
        .is_some());
    assert!(!b
        .lock_release("job", FencingToken(t1.0 - 1), Duration::ZERO)
        .await
        .unwrap());
    // at_least keeps it until 1.5 s after the grant.
    let granted_at = b.lock_get("job").await.unwrap().unwrap().locked_at;
    assert!(b
        .lock_release("job", t1, Duration::from_millis(1500))
        .await
        .unwrap());
    let info = b.lock_get("job").await.unwrap().unwrap();
    assert_eq!(
        info.lock_until,
        granted_at + chrono::Duration::milliseconds(1500)
    );
    if info.held {
        assert!(matches!(
            b.lock_acquire(&lreq("job", "b", 10_000)).await.unwrap(),
            Acquire::Busy(_)
        ));
    }
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let t2 = granted(b.lock_acquire(&lreq("job", "b", 10_000)).await.unwrap());
    assert!(t2 > t1);
    // A lapsed holder cannot extend or release.
    let t3 = granted(b.lock_acquire(&lreq("short", "a", 30)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(b
        .lock_extend("short", t3, Duration::from_secs(5))
        .await
        .unwrap()
        .is_none());
    assert!(!b.lock_release("short", t3, Duration::ZERO).await.unwrap());
    // Tokens rise on every grant.
    let mut last = FencingToken(0);
    for _ in 0..20 {
        let t = granted(b.lock_acquire(&lreq("fence", "x", 10_000)).await.unwrap());
        assert!(t > last);
        last = t;
        assert!(b.lock_release("fence", t, Duration::ZERO).await.unwrap());
    }
    let info = b.lock_get("job").await.unwrap().unwrap();
    assert_eq!(info.token, t2);
    assert!(info.held);
    assert!(b.lock_get("nope").await.unwrap().is_none());
    let names: Vec<String> = b
        .lock_list()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert_eq!(names, vec!["fence", "job", "short"]);
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
        .arg(format!("lock:{name}"))
        .arg("token")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(tok, Some(t.0.to_string()));
    let _: () = redis::cmd("DEL")
        .arg(format!("lock:{name}"))
        .query_async(&mut c)
        .await
        .unwrap();
}

#[tokio::test]
async fn claim_order_heartbeat_finish() {
    let p = new_prefix();
    let Some(s) = open(Some(&p)).await else {
        return;
    };
    let b = s.backend();
    let now = b.now().await.unwrap();
    let past = |ms: i64| RunAt::At(now - chrono::Duration::milliseconds(ms));
    let mut tasks = Vec::new();
    // (priority, run_at) pairs; ids rise in this order.
    for (prio, run_at) in [
        (5, RunAt::Now),
        (0, past(1000)),
        (0, past(5000)),
        (-3, RunAt::Now),
        (0, past(5000)),
        (0, RunAt::Delay(Duration::from_secs(60))),
    ] {
        let mut t = nt("q");
        t.priority = prio;
        t.run_at = run_at;
        tasks.push(t);
    }
    let ids: Vec<i64> = b
        .enqueue(&tasks)
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            assert!(e.inserted);
            e.id
        })
        .collect();
    let got = b.claim(&creq("q", 10, 30_000)).await.unwrap();
    let order: Vec<i64> = got.iter().map(|t| t.id).collect();
    assert_eq!(order, vec![ids[3], ids[2], ids[4], ids[1], ids[0]]);
    assert!(got.iter().all(|t| t.attempt == 1));
    assert!(b.claim(&creq("q", 10, 30_000)).await.unwrap().is_empty());

    let c0 = got[0].claim();
    let c1 = got[1].claim();
    let stale = Claim {
        token: FencingToken(got[2].token.0 + 7),
        ..got[2].claim()
    };
    assert_eq!(b.cancel(c1.id).await.unwrap(), CancelOutcome::Requested);
    let hb = b
        .heartbeat(&[c0, c1, stale], Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        hb,
        vec![
            Heartbeat::Extended,
            Heartbeat::CancelRequested,
            Heartbeat::Lost
        ]
    );
    assert!(!b.finish(stale, &Finish::Succeeded).await.unwrap());
    assert!(b.progress(c0, &json!({"done": 50})).await.unwrap());
    assert!(b.finish(c0, &Finish::Succeeded).await.unwrap());
    assert!(
        !b.finish(c0, &Finish::Succeeded).await.unwrap(),
        "finish is a CAS"
    );
    assert_eq!(
        b.heartbeat(&[c0], Duration::from_secs(1)).await.unwrap(),
        vec![Heartbeat::Lost]
    );
    let info = b.task(c0.id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Succeeded);
    assert_eq!(info.progress, Some(json!({"done": 50})));
    assert!(info.lease_until.is_none() && info.finished_at.is_some());
    assert_eq!(info.worker.as_deref(), Some("w1"));

    assert!(b
        .finish(
            c1,
            &Finish::Cancelled {
                reason: "asked".into()
            }
        )
        .await
        .unwrap());
    assert_eq!(
        b.task(c1.id).await.unwrap().unwrap().last_error.as_deref(),
        Some("asked")
    );

    // Failed with retry goes back to pending later; HandBack does not count.
    let c2 = got[2].claim();
    assert!(b
        .finish(
            c2,
            &Finish::Failed {
                error: "boom \"quoted\" ü".into(),
                retry_in: Some(Duration::from_millis(100)),
            }
        )
        .await
        .unwrap());
    let c3 = got[3].claim();
    assert!(b.finish(c3, &Finish::HandBack).await.unwrap());
    let again = b.claim(&creq("q", 10, 30_000)).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].id, again[0].attempt), (c3.id, 1));
    tokio::time::sleep(Duration::from_millis(150)).await;
    let again = b.claim(&creq("q", 10, 30_000)).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].id, again[0].attempt), (c2.id, 2));
    let info = b.task(c2.id).await.unwrap().unwrap();
    assert_eq!(info.errors.len(), 1);
    assert_eq!(info.errors[0].attempt, 1);
    assert_eq!(info.errors[0].error, "boom \"quoted\" ü");
    assert!((info.errors[0].at - now).num_seconds().abs() < 60);
    // Failing without retry is terminal.
    assert!(b
        .finish(
            again[0].claim(),
            &Finish::Failed {
                error: "again".into(),
                retry_in: None
            }
        )
        .await
        .unwrap());
    let info = b.task(c2.id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Failed);
    assert_eq!(info.errors.len(), 2);
    assert_eq!(info.last_error.as_deref(), Some("again"));
    cleanup(&p).await;
}

#[tokio::test]
async fn rescue_cancel_retry() {
    let p = new_prefix();
    let Some(s) = open(Some(&p)).await else {
        return;
    };
    let b = s.backend();
    let mut t = nt("r");
    t.max_attempts = 2;
    let id = b.enqueue(&[t.clone()]).await.unwrap()[0].id;
    let c = b.claim(&creq("r", 1, 50)).await.unwrap();
    assert_eq!((c.len(), c[0].id), (1, id));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = b.rescue().await.unwrap();
    assert_eq!((r.requeued, r.failed, r.cancelled), (1, 0, 0));
    assert!(!b.finish(c[0].claim(), &Finish::Succeeded).await.unwrap());
    let c = b.claim(&creq("r", 1, 50)).await.unwrap();
    assert_eq!(c[0].attempt, 2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = b.rescue().await.unwrap();
    assert_eq!((r.requeued, r.failed, r.cancelled), (0, 1, 0));
    let info = b.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Failed);
    assert_eq!(info.last_error.as_deref(), Some(LEASE_EXPIRED));
    assert_eq!(info.errors.len(), 2);
    assert!(info.lease_until.is_none());

    // Retry: back to pending with one more attempt allowed.
    assert!(b.retry(id).await.unwrap());
    assert!(!b.retry(id).await.unwrap());
    let info = b.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Pending);
    assert_eq!(info.max_attempts, 3);
    assert!(info.finished_at.is_none());

    // Cancel outcomes, and rescue of a cancel-requested task.
    assert_eq!(b.cancel(id).await.unwrap(), CancelOutcome::Cancelled);
    assert_eq!(
        b.cancel(id).await.unwrap(),
        CancelOutcome::AlreadyFinished(TaskState::Cancelled)
    );
    assert_eq!(b.cancel(999_999).await.unwrap(), CancelOutcome::NotFound);
    assert!(b.claim(&creq("r", 5, 50)).await.unwrap().is_empty());
    let id2 = b.enqueue(&[nt("r")]).await.unwrap()[0].id;
    b.claim(&creq("r", 1, 50)).await.unwrap();
    assert_eq!(b.cancel(id2).await.unwrap(), CancelOutcome::Requested);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = b.rescue().await.unwrap();
    assert_eq!((r.requeued, r.failed, r.cancelled), (0, 0, 1));
    assert_eq!(
        b.task(id2).await.unwrap().unwrap().state,
        TaskState::Cancelled
    );

    // Retry conflicts when another unfinished task took the key.
    let mut u = nt("r");
    u.unique_key = Some("uk".into());
    let a = b.enqueue(&[u.clone()]).await.unwrap()[0];
    assert_eq!(b.cancel(a.id).await.unwrap(), CancelOutcome::Cancelled);
    let a2 = b.enqueue(&[u.clone()]).await.unwrap()[0];
    assert!(a2.inserted && a2.id != a.id, "key freed by the cancel");
    assert!(matches!(
        b.retry(a.id).await,
        Err(baton::StoreError::Conflict(_))
    ));
    cleanup(&p).await;
}

#[tokio::test]
async fn unique_keys_race() {
    let p = new_prefix();
    let Some(s) = open(Some(&p)).await else {
        return;
    };
    let mut handles = Vec::new();
    for _ in 0..16 {
        let st = open(Some(&p)).await.unwrap();
        handles.push(tokio::spawn(async move {
            let mut t = nt("u");
            t.unique_key = Some("same".into());
            st.backend().enqueue(&[t]).await.unwrap()[0]
        }));
    }
    let mut ids = HashSet::new();
    let mut inserted = 0;
    for h in handles {
        let e = h.await.unwrap();
        ids.insert(e.id);
        inserted += e.inserted as u32;
    }
    assert_eq!(ids.len(), 1);
    assert_eq!(inserted, 1);
    let b = s.backend();
    // Same key twice in one batch.
    let mut t = nt("u");
    t.unique_key = Some("batch".into());
    let r = b.enqueue(&[t.clone(), t.clone()]).await.unwrap();
    assert!(r[0].inserted && !r[1].inserted && r[0].id == r[1].id);
    // A non-forever key frees on success; a forever key does not.
    let mut f = nt("u2");
    f.unique_key = Some("forever".into());
    f.unique_forever = true;
    let fid = b.enqueue(&[f.clone()]).await.unwrap()[0].id;
    let claimed = b.claim(&creq("u2", 1, 10_000)).await.unwrap();
    assert!(b
        .finish(claimed[0].claim(), &Finish::Succeeded)
        .await
        .unwrap());
    let again = b.enqueue(&[f.clone()]).await.unwrap()[0];
    assert_eq!((again.id, again.inserted), (fid, false));
    // Prune frees the forever key.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(b.prune(Duration::ZERO).await.unwrap() >= 1);
    assert!(b.task(fid).await.unwrap().is_none());
    let fresh = b.enqueue(&[f]).await.unwrap()[0];
    assert!(fresh.inserted && fresh.id != fid);
    cleanup(&p).await;
}

#[tokio::test]
async fn stats_list_prune() {
    let p = new_prefix();
    let Some(s) = open(Some(&p)).await else {
        return;
    };
    let b = s.backend();
    let now = b.now().await.unwrap();
    let mut old = nt("a");
    old.run_at = RunAt::At(now - chrono::Duration::seconds(10));
    let mut later = nt("a");
    later.run_at = RunAt::Delay(Duration::from_secs(3600));
    b.enqueue(&[old, later, nt("a"), nt("b"), nt("b")])
        .await
        .unwrap();
    let c = b.claim(&creq("b", 1, 10_000)).await.unwrap();
    b.finish(c[0].claim(), &Finish::Succeeded).await.unwrap();
    let st = b.stats().await.unwrap();
    assert_eq!(st.len(), 2);
    assert_eq!((st[0].queue.as_str(), st[0].pending), ("a", 3));
    let age = st[0].oldest_pending_ms.unwrap();
    assert!((10_000..20_000).contains(&age), "age {age}");
    assert_eq!((st[1].pending, st[1].succeeded, st[1].running), (1, 1, 0));

    let all = b.tasks(&TaskFilter::default()).await.unwrap();
    assert_eq!(all.len(), 5);
    assert!(all.windows(2).all(|w| w[0].id > w[1].id));
    let page = b
        .tasks(&TaskFilter {
            limit: 2,
            before_id: Some(all[1].id),
            ..TaskFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![all[2].id, all[3].id]
    );
    let done = b
        .tasks(&TaskFilter {
            state: Some(TaskState::Succeeded),
            ..TaskFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(done.len(), 1);
    let qa = b
        .tasks(&TaskFilter {
            queue: Some("a".into()),
            ..TaskFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(qa.len(), 3);

    assert_eq!(b.prune(Duration::from_secs(3600)).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(b.prune(Duration::ZERO).await.unwrap(), 1);
    let st = b.stats().await.unwrap();
    assert_eq!(st[1].succeeded, 0);
    cleanup(&p).await;
}

#[tokio::test]
async fn jobs() {
    let p = new_prefix();
    let Some(s) = open(Some(&p)).await else {
        return;
    };
    let b = s.backend();
    let j = b.job_register("nightly").await.unwrap();
    let cur = j.last_slot.expect("cursor set at registration");
    assert!(!j.paused);
    assert_eq!(b.job_register("nightly").await.unwrap(), j);
    let slot1 = cur + chrono::Duration::seconds(60);
    let mut task = nt("sched");
    task.job = Some("nightly".into());
    task.slot = Some(slot1);
    task.unique_key = Some(format!("nightly|{}", slot1.timestamp_millis()));
    task.unique_forever = true;
    let adv = |expected, slot, task, overlap| SlotAdvance {
        job: "nightly",
        expected,
        slot,
        task: Some(task),
        overlap,
        record: baton::store::SlotRecord::Enqueue,
        batch_after: None,
        due_only: false,
        until: None,
    };
    // Wrong expectation → Moved(current).
    let r = b
        .job_advance(&adv(None, slot1, &task, Overlap::Forbid))
        .await
        .unwrap();
    assert_eq!(r, Advanced::Moved(Some(cur)));
    let r = b
        .job_advance(&adv(Some(cur), slot1, &task, Overlap::Forbid))
        .await
        .unwrap();
    let Advanced::Enqueued(e1) = r else {
        panic!("{r:?}")
    };
    assert!(e1.inserted);
    // The previous run is pending: the next slot is skipped.
    let slot2 = slot1 + chrono::Duration::seconds(60);
    let mut task2 = task.clone();
    task2.slot = Some(slot2);
    task2.unique_key = Some(format!("nightly|{}", slot2.timestamp_millis()));
    let r = b
        .job_advance(&adv(Some(slot1), slot2, &task2, Overlap::Forbid))
        .await
        .unwrap();
    let Advanced::Skipped(sk) = r else {
        panic!("{r:?}")
    };
    let info = b.task(sk.id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Cancelled);
    assert_eq!(info.last_error.as_deref(), Some(OVERLAP_SKIPPED));
    assert_eq!(info.job.as_deref(), Some("nightly"));
    // Allow enqueues anyway.
    let slot3 = slot2 + chrono::Duration::seconds(60);
    let mut task3 = task.clone();
    task3.slot = Some(slot3);
    task3.unique_key = Some(format!("nightly|{}", slot3.timestamp_millis()));
    let r = b
        .job_advance(&adv(Some(slot2), slot3, &task3, Overlap::Allow))
        .await
        .unwrap();
    assert!(matches!(r, Advanced::Enqueued(e) if e.inserted));
    // A trigger already made the slot's task: returned, not inserted.
    let slot4 = slot3 + chrono::Duration::seconds(60);
    let mut task4 = task.clone();
    task4.slot = Some(slot4);
    task4.unique_key = Some(format!("nightly|{}", slot4.timestamp_millis()));
    let trig = b.enqueue(&[task4.clone()]).await.unwrap()[0];
    let r = b
        .job_advance(&adv(Some(slot3), slot4, &task4, Overlap::Allow))
        .await
        .unwrap();
    assert_eq!(
        r,
        Advanced::Enqueued(baton::store::Enqueued {
            id: trig.id,
            inserted: false
        })
    );
    // Paused and unknown.
    assert!(b.job_set_paused("nightly", true).await.unwrap());
    assert!(!b.job_set_paused("nope", true).await.unwrap());
    let r = b
        .job_advance(&adv(Some(slot4), slot4, &task4, Overlap::Allow))
        .await
        .unwrap();
    assert_eq!(r, Advanced::Paused);
    let mut other = adv(None, slot1, &task, Overlap::Allow);
    other.job = "nope";
    assert_eq!(b.job_advance(&other).await.unwrap(), Advanced::UnknownJob);
    let list = b.job_list().await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].last_slot, Some(slot4));
    assert!(list[0].paused);
    cleanup(&p).await;
}

#[tokio::test]
async fn subscribe_wakes_and_warnings() {
    let p = new_prefix();
    let Some(s) = open(Some(&p)).await else {
        return;
    };
    let b = s.backend();
    let mut rx = b.subscribe().await.unwrap();
    b.enqueue(&[nt("wq")]).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(3), rx.recv())
        .await
        .expect("wake-up arrives")
        .unwrap();
    assert_eq!(got, baton::store::Wake::now("wq"));
    // A delayed task is announced with its due time.
    let mut d = nt("later");
    d.run_at = RunAt::Delay(Duration::from_secs(60));
    let before = b.now().await.unwrap();
    b.enqueue(&[d]).await.unwrap();
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
    b.enqueue(&many).await.unwrap();
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

#[tokio::test]
async fn bulk_enqueue_and_claim_timing() {
    let p = new_prefix();
    let Some(s) = open(Some(&p)).await else {
        return;
    };
    let b = s.backend();
    let n = 100_000;
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| {
            let mut t = nt("bulk");
            t.payload = json!({"i": i});
            t
        })
        .collect();
    let s0 = eval_usec().await;
    let t0 = Instant::now();
    let r = b.enqueue(&tasks).await.unwrap();
    let enq = t0.elapsed();
    let s1 = eval_usec().await;
    assert_eq!(r.len(), n);
    assert!(r.windows(2).all(|w| w[0].id < w[1].id));
    let t0 = Instant::now();
    let mut claimed = 0;
    loop {
        let got = b.claim(&creq("bulk", 100, 60_000)).await.unwrap();
        if got.is_empty() {
            break;
        }
        claimed += got.len();
    }
    let cl = t0.elapsed();
    let s2 = eval_usec().await;
    assert_eq!(claimed, n);
    println!(
        "redis bulk: server script time (all clients) enqueue {:.1} µs/task, claim {:.1} µs/task",
        (s1 - s0) as f64 / n as f64,
        (s2 - s1) as f64 / n as f64
    );
    println!(
        "redis bulk: enqueue {n} in {enq:?} ({:.0}/s); claim all in batches of 100 in {cl:?} ({:.0}/s)",
        n as f64 / enq.as_secs_f64(),
        n as f64 / cl.as_secs_f64()
    );
    cleanup(&p).await;
}

/// Total µs the server spent in EVALSHA so far (all clients).
async fn eval_usec() -> u64 {
    let mut c = raw().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("usec=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Retry `f` until it succeeds or `limit` passes.
async fn eventually<T, F, Fut>(limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, baton::StoreError>>,
{
    let start = Instant::now();
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if start.elapsed() < limit => {
                assert!(e.is_retryable(), "unexpected error kind: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("still failing after {limit:?}: {e}"),
        }
    }
}

#[tokio::test]
async fn private_server_restart() {
    if std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED redis restart test: no redis-server binary");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut srv = start_server(port, dir.path());
    srv.wait_ready().await;
    let url = format!("redis://127.0.0.1:{port}");
    let s = Store::connect(&url).await.unwrap();
    let b = s.backend();
    assert!(b.warnings().await.unwrap().is_empty(), "AOF is on");
    let t1 = granted(
        b.lock_acquire(&lreq("daemon-runner", "a", 60_000))
            .await
            .unwrap(),
    );
    assert!(b
        .lock_release("daemon-runner", t1, Duration::ZERO)
        .await
        .unwrap());
    let id = b.enqueue(&[nt("q")]).await.unwrap()[0].id;
    // Give AOF its fsync (everysec) before the shutdown.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    srv.stop();
    for i in 0..3 {
        let t0 = Instant::now();
        let r = b.lock_acquire(&lreq("daemon-runner", "a", 60_000)).await;
        assert!(r.is_err(), "acquire while down #{i}: {r:?}");
        assert!(r.unwrap_err().is_retryable());
        let r = b.enqueue(&[nt("q")]).await;
        assert!(r.is_err());
        let r = b.claim(&creq("q", 1, 1000)).await;
        assert!(r.is_err());
        let r = b.task(id).await;
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
    let info = eventually(Duration::from_secs(10), || b.task(id)).await;
    assert_eq!(info.unwrap().state, TaskState::Pending);
    let t2 = granted(
        eventually(Duration::from_secs(10), || async {
            b.lock_acquire(&lreq("daemon-runner", "a", 60_000)).await
        })
        .await,
    );
    assert!(t2 > t1, "{t2} > {t1}");
    assert!(b
        .lock_release("daemon-runner", t2, Duration::ZERO)
        .await
        .unwrap());
    let got = b.claim(&creq("q", 10, 10_000)).await.unwrap();
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
    assert!(b.task(id).await.unwrap().is_none());
    srv.stop();
    let _ = Utc::now();
}

#[allow(dead_code)]
fn assert_backend_object_safe(_: &dyn Backend) {}
