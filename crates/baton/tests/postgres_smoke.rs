//! Smoke tests of the PostgreSQL backend.
//!
//! They read `BATON_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`). When the server does not
//! answer they print one `SKIPPED` line, unless `BATON_REQUIRE_BACKENDS=1`.
//! Each test uses its own table prefix and drops its tables at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton::store::postgres;
use baton::store::{
    Acquire, Advanced, Backend, CancelOutcome, Claim, ClaimRequest, FencingToken, Finish,
    Heartbeat, LockRequest, NewTask, Overlap, RunAt, SlotAdvance, TaskFilter, TaskState,
    LEASE_EXPIRED, OVERLAP_SKIPPED,
};
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
        unique_forever: false,
        job: None,
        slot: None,
    }
}

fn claim_req<'a>(queue: &'a str, limit: u32, lease: Duration) -> ClaimRequest<'a> {
    ClaimRequest {
        queue,
        worker: "w1",
        limit,
        lease,
        max_running: None,
    }
}

const MIN: Duration = Duration::from_secs(60);

#[tokio::test]
async fn locks() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let req = |holder: &'static str, at_most| LockRequest {
        name: "L",
        holder,
        at_most,
    };
    let Acquire::Granted { token: t1, .. } = b.lock_acquire(&req("a", MIN)).await.unwrap() else {
        panic!("first acquire must be granted")
    };
    assert!(
        t1.0 > 1_000_000_000_000_000,
        "floored at the store clock in µs"
    );
    match b.lock_acquire(&req("b", MIN)).await.unwrap() {
        Acquire::Busy(info) => {
            assert_eq!(info.holder, "a");
            assert_eq!(info.token, t1);
            assert!(info.held);
        }
        other => panic!("expected busy, got {other:?}"),
    }
    assert!(b
        .lock_extend("L", FencingToken(99), MIN)
        .await
        .unwrap()
        .is_none());
    assert!(b.lock_extend("L", t1, MIN).await.unwrap().is_some());
    assert!(!b
        .lock_release("L", FencingToken(7), Duration::ZERO)
        .await
        .unwrap());
    // Release with at_least: the lease stays until locked_at + 400ms.
    assert!(b
        .lock_release("L", t1, Duration::from_millis(400))
        .await
        .unwrap());
    assert!(matches!(
        b.lock_acquire(&req("b", MIN)).await.unwrap(),
        Acquire::Busy(_)
    ));
    tokio::time::sleep(Duration::from_millis(450)).await;
    let Acquire::Granted { token: t2, .. } = b
        .lock_acquire(&req("b", Duration::from_millis(50)))
        .await
        .unwrap()
    else {
        panic!("acquire after at_least must be granted")
    };
    assert!(t2 > t1);
    // A lapsed lease: its holder can neither extend nor release it.
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert!(b.lock_extend("L", t2, MIN).await.unwrap().is_none());
    assert!(!b.lock_release("L", t2, Duration::ZERO).await.unwrap());
    let info = b.lock_get("L").await.unwrap().unwrap();
    assert!(!info.held);
    let Acquire::Granted { token: t3, .. } = b.lock_acquire(&req("c", MIN)).await.unwrap() else {
        panic!("acquire after lapse must be granted")
    };
    assert!(t3 > t2);
    assert_eq!(b.lock_list().await.unwrap().len(), 1);
    assert!(b.lock_get("nope").await.unwrap().is_none());
    // Racing acquirers: exactly one wins.
    let store = f.store.clone();
    let mut hs = Vec::new();
    for i in 0..16 {
        let s = store.clone();
        hs.push(tokio::spawn(async move {
            let holder = format!("h{i}");
            let r = s
                .backend()
                .lock_acquire(&LockRequest {
                    name: "race",
                    holder: &holder,
                    at_most: MIN,
                })
                .await
                .unwrap();
            matches!(r, Acquire::Granted { .. })
        }));
    }
    let mut wins = 0;
    for h in hs {
        wins += usize::from(h.await.unwrap());
    }
    assert_eq!(wins, 1);
    f.drop_tables().await;
}

#[tokio::test]
async fn enqueue_claim_heartbeat_finish() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let mut tasks = Vec::new();
    for p in [5, -3, 0, 0] {
        let mut t = task("q");
        t.priority = p;
        tasks.push(t);
    }
    let mut later = task("q");
    later.run_at = RunAt::Delay(Duration::from_secs(3600));
    tasks.push(later);
    let mut other = task("other");
    other.priority = -100;
    tasks.push(other);
    let ids = b.enqueue(&tasks).await.unwrap();
    assert_eq!(ids.len(), 6);
    assert!(ids.iter().all(|e| e.inserted));
    assert!(
        ids.windows(2).all(|w| w[0].id < w[1].id),
        "ids rise in input order"
    );

    let claimed = b.claim(&claim_req("q", 10, MIN)).await.unwrap();
    let got: Vec<i64> = claimed.iter().map(|t| t.id).collect();
    assert_eq!(got, vec![ids[1].id, ids[2].id, ids[3].id, ids[0].id]);
    assert!(claimed.iter().all(|t| t.attempt == 1));
    assert_eq!(claimed[0].timeout, Some(Duration::from_secs(30)));
    assert!(b.claim(&claim_req("q", 10, MIN)).await.unwrap().is_empty());

    let c0 = claimed[0].claim();
    let stale = Claim {
        token: FencingToken(c0.token.0 + 1),
        ..c0
    };
    let hb = b.heartbeat(&[c0, stale], MIN).await.unwrap();
    assert_eq!(hb, vec![Heartbeat::Extended, Heartbeat::Lost]);
    assert!(b
        .progress(c0, &serde_json::json!({"pct": 50}))
        .await
        .unwrap());
    assert!(!b.finish(stale, &Finish::Succeeded).await.unwrap());
    assert!(b.finish(c0, &Finish::Succeeded).await.unwrap());
    assert!(!b.finish(c0, &Finish::Succeeded).await.unwrap());
    assert_eq!(
        b.heartbeat(&[c0], MIN).await.unwrap(),
        vec![Heartbeat::Lost]
    );
    let info = b.task(c0.id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Succeeded);
    assert!(info.finished_at.is_some() && info.lease_until.is_none());
    assert_eq!(info.progress, Some(serde_json::json!({"pct": 50})));

    // HandBack: back to pending, the attempt does not count.
    let c1 = claimed[1].claim();
    assert!(b.finish(c1, &Finish::HandBack).await.unwrap());
    let info = b.task(c1.id).await.unwrap().unwrap();
    assert_eq!((info.state, info.attempt), (TaskState::Pending, 0));
    assert!(info.errors.is_empty());

    // Listing pages newest first.
    let page = b
        .tasks(&TaskFilter {
            queue: Some("q".into()),
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.len(), 2);
    assert_eq!(page[0].id, ids[4].id);
    let next = b
        .tasks(&TaskFilter {
            queue: Some("q".into()),
            before_id: Some(page[1].id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(next.len(), 3);
    let pending = b
        .tasks(&TaskFilter {
            state: Some(TaskState::Pending),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(pending.len(), 3);

    let stats = b.stats().await.unwrap();
    assert_eq!(stats.len(), 2);
    let q = &stats[1];
    assert_eq!(q.queue, "q");
    assert_eq!(
        (q.pending, q.running, q.succeeded, q.failed, q.cancelled),
        (2, 2, 1, 0, 0)
    );
    assert!(q.oldest_pending_ms.is_some());
    f.drop_tables().await;
}

#[tokio::test]
async fn failure_retry_and_errors() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let mut t = task("q");
    t.max_attempts = 2;
    let id = b.enqueue(&[t]).await.unwrap()[0].id;
    let c = b.claim(&claim_req("q", 1, MIN)).await.unwrap();
    let c1 = c[0].claim();
    let fail = |retry| Finish::Failed {
        error: "boom".into(),
        retry_in: retry,
    };
    assert!(b
        .finish(c1, &fail(Some(Duration::from_millis(200))))
        .await
        .unwrap());
    let info = b.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Pending);
    assert_eq!(info.last_error.as_deref(), Some("boom"));
    assert_eq!(info.errors.len(), 1);
    assert_eq!(info.errors[0].attempt, 1);
    assert_eq!(info.errors[0].error, "boom");
    assert!(b.claim(&claim_req("q", 1, MIN)).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(250)).await;
    let c = b.claim(&claim_req("q", 1, MIN)).await.unwrap();
    assert_eq!(c[0].attempt, 2);
    let c2 = c[0].claim();
    // Out of attempts: failed, whatever retry_in says.
    assert!(b
        .finish(c2, &fail(Some(Duration::from_millis(1))))
        .await
        .unwrap());
    let info = b.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Failed);
    assert_eq!(info.errors.len(), 2);
    assert!(info.errors[0].at <= info.errors[1].at);
    assert!(info.finished_at.is_some());
    // retry: back to pending with one more attempt allowed.
    assert!(b.retry(id).await.unwrap());
    assert!(!b.retry(id).await.unwrap());
    let info = b.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Pending);
    assert_eq!(info.max_attempts, 3);
    assert!(info.finished_at.is_none());
    let c = b.claim(&claim_req("q", 1, MIN)).await.unwrap();
    assert_eq!(c[0].attempt, 3);
    f.drop_tables().await;
}

#[tokio::test]
async fn rescue_and_cancel() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let short = Duration::from_millis(50);
    let mut t = task("q");
    t.max_attempts = 2;
    let id = b.enqueue(&[t]).await.unwrap()[0].id;
    let first = b.claim(&claim_req("q", 1, short)).await.unwrap();
    assert_eq!(b.rescue().await.unwrap().requeued, 0);
    tokio::time::sleep(Duration::from_millis(120)).await;
    let r = b.rescue().await.unwrap();
    assert_eq!((r.requeued, r.failed, r.cancelled), (1, 0, 0));
    let old = first[0].claim();
    assert_eq!(old.id, id);
    assert!(!b.finish(old, &Finish::Succeeded).await.unwrap());
    assert_eq!(
        b.heartbeat(&[old], MIN).await.unwrap(),
        vec![Heartbeat::Lost]
    );
    let c = b.claim(&claim_req("q", 1, short)).await.unwrap();
    assert_eq!(c[0].attempt, 2);
    tokio::time::sleep(Duration::from_millis(120)).await;
    let r = b.rescue().await.unwrap();
    assert_eq!((r.requeued, r.failed, r.cancelled), (0, 1, 0));
    let info = b.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Failed);
    assert_eq!(info.last_error.as_deref(), Some(LEASE_EXPIRED));
    assert_eq!(info.errors.len(), 2);
    assert_eq!(info.errors[1].attempt, 2);
    assert_eq!(info.errors[1].error, LEASE_EXPIRED);

    // cancel: pending, running (then rescue of a cancel-requested lease),
    // finished, missing.
    let ids = b.enqueue(&[task("c"), task("c")]).await.unwrap();
    assert_eq!(b.cancel(ids[0].id).await.unwrap(), CancelOutcome::Cancelled);
    assert_eq!(
        b.cancel(ids[0].id).await.unwrap(),
        CancelOutcome::AlreadyFinished(TaskState::Cancelled)
    );
    assert_eq!(b.cancel(-1).await.unwrap(), CancelOutcome::NotFound);
    let c = b.claim(&claim_req("c", 5, short)).await.unwrap();
    assert_eq!(c.len(), 1);
    let cl = c[0].claim();
    assert_eq!(b.cancel(cl.id).await.unwrap(), CancelOutcome::Requested);
    assert_eq!(
        b.heartbeat(&[cl], short).await.unwrap(),
        vec![Heartbeat::CancelRequested]
    );
    tokio::time::sleep(Duration::from_millis(120)).await;
    let r = b.rescue().await.unwrap();
    assert_eq!((r.requeued, r.failed, r.cancelled), (0, 0, 1));
    assert_eq!(
        b.task(cl.id).await.unwrap().unwrap().state,
        TaskState::Cancelled
    );
    // A worker that stops on request finishes as cancelled.
    let id = b.enqueue(&[task("c")]).await.unwrap()[0].id;
    let got = b.claim(&claim_req("c", 1, MIN)).await.unwrap();
    b.cancel(id).await.unwrap();
    assert!(b
        .finish(
            got[0].claim(),
            &Finish::Cancelled {
                reason: "asked".into()
            }
        )
        .await
        .unwrap());
    let info = b.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Cancelled);
    assert_eq!(info.last_error.as_deref(), Some("asked"));
    f.drop_tables().await;
}

#[tokio::test]
async fn unique_keys() {
    let Some(f) = setup().await else { return };
    let mut hs = Vec::new();
    for _ in 0..16 {
        let s = f.store.clone();
        hs.push(tokio::spawn(async move {
            let mut t = task("u");
            t.unique_key = Some("K".into());
            s.backend().enqueue(&[t]).await.unwrap()[0]
        }));
    }
    let mut got = Vec::new();
    for h in hs {
        got.push(h.await.unwrap());
    }
    let id = got[0].id;
    assert!(got.iter().all(|e| e.id == id));
    assert_eq!(got.iter().filter(|e| e.inserted).count(), 1);
    let b = f.b();
    // Duplicates inside one batch.
    let mut t = task("u");
    t.unique_key = Some("K".into());
    let mut t2 = task("u");
    t2.unique_key = Some("K2".into());
    let r = b
        .enqueue(&[t.clone(), t2.clone(), t2.clone()])
        .await
        .unwrap();
    assert_eq!(r[0].id, id);
    assert!(!r[0].inserted);
    assert!(r[1].inserted);
    assert_eq!(r[2].id, r[1].id);
    assert!(!r[2].inserted);
    // Finishing frees a plain key...
    let c = b.claim(&claim_req("u", 10, MIN)).await.unwrap();
    for t in &c {
        b.finish(
            t.claim(),
            &Finish::Failed {
                error: "x".into(),
                retry_in: None,
            },
        )
        .await
        .unwrap();
    }
    let again = b.enqueue(&[t.clone()]).await.unwrap()[0];
    assert!(again.inserted);
    assert_ne!(again.id, id);
    // ...so retrying the old task conflicts with the new holder.
    assert!(matches!(
        b.retry(id).await,
        Err(baton::StoreError::Conflict(_))
    ));
    // A forever key stays taken after the task finished.
    let mut fv = task("u");
    fv.unique_key = Some("F".into());
    fv.unique_forever = true;
    let first = b.enqueue(&[fv.clone()]).await.unwrap()[0];
    let c = b.claim(&claim_req("u", 10, MIN)).await.unwrap();
    for t in &c {
        b.finish(t.claim(), &Finish::Succeeded).await.unwrap();
    }
    let second = b.enqueue(&[fv]).await.unwrap()[0];
    assert_eq!(second.id, first.id);
    assert!(!second.inserted);
    f.drop_tables().await;
}

#[tokio::test]
async fn prune_and_stats() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let ids = b.enqueue(&[task("p"), task("p"), task("p")]).await.unwrap();
    let c = b.claim(&claim_req("p", 2, MIN)).await.unwrap();
    for t in &c {
        b.finish(t.claim(), &Finish::Succeeded).await.unwrap();
    }
    assert_eq!(b.prune(Duration::from_secs(3600)).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(b.prune(Duration::from_millis(10)).await.unwrap(), 2);
    assert!(b.task(ids[0].id).await.unwrap().is_none());
    let s = b.stats().await.unwrap();
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].pending, s[0].succeeded), (1, 0));
    f.drop_tables().await;
}

#[tokio::test]
async fn jobs() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    assert_eq!(b.job_list().await.unwrap(), vec![]);
    let j = b.job_register("nightly").await.unwrap();
    assert!(!j.paused);
    let start = j.last_slot.unwrap();
    assert_eq!(b.job_register("nightly").await.unwrap(), j);
    let slot_task = |slot: chrono::DateTime<chrono::Utc>| {
        let mut t = task("sched");
        t.job = Some("nightly".into());
        t.slot = Some(slot);
        t.unique_key = Some(format!("nightly|{}", slot.to_rfc3339()));
        t.unique_forever = true;
        t
    };
    let s1 = start + chrono::Duration::seconds(10);
    let t1 = slot_task(s1);
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
    let r = b
        .job_advance(&adv(Some(start), s1, &t1, Overlap::Forbid))
        .await
        .unwrap();
    let Advanced::Enqueued(e1) = r else {
        panic!("expected Enqueued, got {r:?}")
    };
    assert!(e1.inserted);
    // Stale cursor.
    let r = b
        .job_advance(&adv(Some(start), s1, &t1, Overlap::Forbid))
        .await
        .unwrap();
    assert_eq!(r, Advanced::Moved(Some(s1)));
    // Overlap: the slot-1 task is still pending.
    let s2 = s1 + chrono::Duration::seconds(10);
    let t2 = slot_task(s2);
    let r = b
        .job_advance(&adv(Some(s1), s2, &t2, Overlap::Forbid))
        .await
        .unwrap();
    let Advanced::Skipped(e2) = r else {
        panic!("expected Skipped, got {r:?}")
    };
    let info = b.task(e2.id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Cancelled);
    assert_eq!(info.last_error.as_deref(), Some(OVERLAP_SKIPPED));
    assert!(info.finished_at.is_some());
    // Allow: enqueued although slot 1 is pending.
    let s3 = s2 + chrono::Duration::seconds(10);
    let t3 = slot_task(s3);
    let r = b
        .job_advance(&adv(Some(s2), s3, &t3, Overlap::Allow))
        .await
        .unwrap();
    assert!(matches!(r, Advanced::Enqueued(e) if e.inserted));
    // A slot whose task a trigger already made: enqueued, not inserted.
    let s4 = s3 + chrono::Duration::seconds(10);
    let t4 = slot_task(s4);
    let pre = b.enqueue(std::slice::from_ref(&t4)).await.unwrap()[0];
    let r = b
        .job_advance(&adv(Some(s3), s4, &t4, Overlap::Allow))
        .await
        .unwrap();
    assert_eq!(
        r,
        Advanced::Enqueued(baton::store::Enqueued {
            id: pre.id,
            inserted: false
        })
    );
    // Paused and unknown.
    assert!(b.job_set_paused("nightly", true).await.unwrap());
    let s5 = s4 + chrono::Duration::seconds(10);
    let r = b
        .job_advance(&adv(Some(s4), s5, &slot_task(s5), Overlap::Allow))
        .await
        .unwrap();
    assert_eq!(r, Advanced::Paused);
    assert!(!b.job_set_paused("nope", true).await.unwrap());
    let r = b
        .job_advance(&SlotAdvance {
            job: "nope",
            expected: None,
            slot: s5,
            task: Some(&t1),
            overlap: Overlap::Allow,
            record: baton::store::SlotRecord::Enqueue,
            batch_after: None,
            due_only: false,
            until: None,
        })
        .await
        .unwrap();
    assert_eq!(r, Advanced::UnknownJob);
    let list = b.job_list().await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].last_slot, Some(s4));
    assert!(list[0].paused);
    let jobs = b
        .tasks(&TaskFilter {
            job: Some("nightly".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), 4);
    f.drop_tables().await;
}

#[tokio::test]
async fn job_advance_races_once_per_slot() {
    let Some(f) = setup().await else { return };
    let j = f.b().job_register("race").await.unwrap();
    let start = j.last_slot;
    let slot = start.unwrap() + chrono::Duration::seconds(1);
    let mut hs = Vec::new();
    for _ in 0..8 {
        let s = f.store.clone();
        hs.push(tokio::spawn(async move {
            let mut t = task("sched");
            t.job = Some("race".into());
            t.slot = Some(slot);
            t.unique_key = Some(format!("race|{slot}"));
            t.unique_forever = true;
            s.backend()
                .job_advance(&SlotAdvance {
                    job: "race",
                    expected: start,
                    slot,
                    task: Some(&t),
                    overlap: Overlap::Forbid,
                    record: baton::store::SlotRecord::Enqueue,
                    batch_after: None,
                    due_only: false,
                    until: None,
                })
                .await
                .unwrap()
        }));
    }
    let mut enq = 0;
    for h in hs {
        match h.await.unwrap() {
            Advanced::Enqueued(_) => enq += 1,
            Advanced::Moved(m) => assert_eq!(m, Some(slot)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(enq, 1);
    f.drop_tables().await;
}

#[tokio::test]
async fn outbox_rolled_back_leaves_nothing() {
    let Some(f) = setup().await else { return };
    let mut conn = sqlx::PgConnection::connect(&url()).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let r = postgres::enqueue_in(&mut tx, Some(&f.prefix), &[task("o"), task("o")])
        .await
        .unwrap();
    assert_eq!(r.len(), 2);
    tx.rollback().await.unwrap();
    assert!(f.b().task(r[0].id).await.unwrap().is_none());
    assert!(f
        .b()
        .tasks(&TaskFilter::default())
        .await
        .unwrap()
        .is_empty());
    // Committed, it is there and wakes subscribers at commit.
    let mut rx = f.b().subscribe().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // let LISTEN start
    let mut tx = conn.begin().await.unwrap();
    let r = postgres::enqueue_in(&mut tx, Some(&f.prefix), &[task("o")])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(f.b().task(r[0].id).await.unwrap().is_some());
    let q = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("notification within 5s")
        .unwrap();
    assert_eq!(q, baton::store::Wake::now("o"));
    f.drop_tables().await;
}

#[tokio::test]
async fn subscribe_gets_due_queues_once_per_batch() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let mut rx = b.subscribe().await.unwrap();
    let mut rx2 = b.subscribe().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut later = task("later");
    later.run_at = RunAt::Delay(Duration::from_secs(60));
    b.enqueue(&[task("a"), task("a"), later, task("b")])
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
async fn migrations_concurrent_and_idempotent() {
    let prefix = format!("t{:08x}_", fastrand::u32(..));
    let mut hs = Vec::new();
    for _ in 0..8 {
        let p = prefix.clone();
        hs.push(tokio::spawn(async move {
            Store::connect_with(
                &url(),
                StoreOptions {
                    prefix: Some(p),
                    max_connections: 2,
                    migrate: true,
                    ..Default::default()
                },
            )
            .await
        }));
    }
    let mut stores = Vec::new();
    for h in hs {
        match h.await.unwrap() {
            Ok(s) => stores.push(s),
            Err(e) if std::env::var("BATON_REQUIRE_BACKENDS").as_deref() != Ok("1") => {
                eprintln!("SKIPPED postgres: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        }
    }
    stores[0].backend().migrate().await.unwrap();
    Fixture {
        store: stores[0].clone(),
        prefix,
    }
    .drop_tables()
    .await;
}

#[tokio::test]
async fn unreachable_store_fails_fast() {
    let t = Instant::now();
    let r = Store::connect("postgres://postgres@127.0.0.1:1/test").await;
    assert!(matches!(r, Err(ref e) if e.is_retryable()), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(8));
}

/// Claim plans stay index walks, with and without statistics, custom and
/// generic; then a timed 100k enqueue and claim-all (printed, not asserted).
#[tokio::test]
async fn claim_plan_and_throughput() {
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
    let t0 = Instant::now();
    let r = b.enqueue(&batch).await.unwrap();
    let el = t0.elapsed();
    assert_eq!(r.len(), 100_000);
    println!(
        "postgres: enqueue 100k in one call: {:?} ({:.0} tasks/s)",
        el,
        100_000.0 / el.as_secs_f64()
    );
    let check = |plan: &str, what: &str| {
        println!("--- {what}\n{plan}");
        assert!(
            plan.contains("tasks_claim"),
            "{what}: no claim index:\n{plan}"
        );
        assert!(!plan.contains("Seq Scan"), "{what}: seq scan:\n{plan}");
    };
    let p = Some(f.prefix.as_str());
    // No statistics yet (unless autovacuum got there first).
    check(
        &postgres::explain_claim(&mut conn, p, "bulk", 100, false)
            .await
            .unwrap(),
        "custom plan, no ANALYZE",
    );
    check(
        &postgres::explain_claim(&mut conn, p, "bulk", 100, true)
            .await
            .unwrap(),
        "generic plan, no ANALYZE",
    );
    // Fresh statistics after the bulk insert, then 100k more.
    b.enqueue(&batch).await.unwrap();
    sqlx::Executor::execute(&mut conn, format!("ANALYZE \"{}tasks\"", f.prefix).as_str())
        .await
        .unwrap();
    check(
        &postgres::explain_claim(&mut conn, p, "bulk", 100, false)
            .await
            .unwrap(),
        "custom plan, ANALYZE with 200k pending",
    );
    check(
        &postgres::explain_claim(&mut conn, p, "bulk", 100, true)
            .await
            .unwrap(),
        "generic plan, ANALYZE with 200k pending",
    );
    // Claim all 200k in batches of 100.
    let b = Arc::new(f.store.clone());
    let t0 = Instant::now();
    let mut n = 0usize;
    loop {
        let c = b
            .backend()
            .claim(&claim_req("bulk", 100, MIN))
            .await
            .unwrap();
        if c.is_empty() {
            break;
        }
        n += c.len();
    }
    let el = t0.elapsed();
    assert_eq!(n, 200_000);
    println!(
        "postgres: claim {n} in batches of 100, one worker: {:?} ({:.0} tasks/s)",
        el,
        n as f64 / el.as_secs_f64()
    );
    f.drop_tables().await;
}

#[tokio::test]
async fn listener_reconnects_after_its_connection_is_killed() {
    let Some(f) = setup().await else { return };
    let b = f.b();
    let mut rx = b.subscribe().await.unwrap();
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
    // Notifications sent while it reconnects may be lost: keep enqueueing
    // until one arrives.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        b.enqueue(&[task("again")]).await.unwrap();
        if let Ok(Ok(q)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            assert_eq!(q.queue, "again");
            break;
        }
        assert!(Instant::now() < deadline, "listener did not come back");
    }
    f.drop_tables().await;
}
