//! Smoke tests of the SQLite backend: every `Backend` operation on its own
//! temporary file. The shared conformance suite (`tests/conformance/`) is the
//! full proof; these tests pin the SQLite specifics (wake-ups, the outbox
//! helper, query plans, concurrent first connects) and measure bulk speed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton::store::sqlite::{enqueue_in, SqliteBackend};
use baton::store::{
    Acquire, Advanced, Backend, CancelOutcome, Claim, ClaimRequest, Enqueued, Finish, Heartbeat,
    LockRequest, NewTask, Overlap, RunAt, SlotAdvance, TaskFilter, TaskState, LEASE_EXPIRED,
    OVERLAP_SKIPPED,
};
use baton::{FencingToken, Store, StoreOptions};
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
        unique_forever: false,
        job: None,
        slot: None,
    }
}

fn claim_req(queue: &str, limit: u32, lease: Duration) -> ClaimRequest<'_> {
    ClaimRequest {
        queue,
        worker: "w1",
        limit,
        lease,
        max_running: None,
    }
}

const LONG: Duration = Duration::from_secs(60);

// ---- locks -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locks_acquire_busy_extend_release() {
    let db = db().await;
    let b = db.b();
    let req = |holder, at_most| LockRequest {
        name: "job-a",
        holder,
        at_most,
    };
    let Acquire::Granted {
        token: t1,
        locked_at,
        lock_until,
    } = b.lock_acquire(&req("h1", LONG)).await.unwrap()
    else {
        panic!("first acquire must be granted")
    };
    // The first token is the store clock in µs (the floor of every grant).
    assert_eq!(t1.0 / 1000, locked_at.timestamp_millis() as u64);
    assert_eq!(lock_until - locked_at, chrono::Duration::seconds(60));

    match b.lock_acquire(&req("h2", LONG)).await.unwrap() {
        Acquire::Busy(info) => {
            assert_eq!(info.holder, "h1");
            assert_eq!(info.token, t1);
            assert!(info.held);
        }
        other => panic!("expected busy, got {other:?}"),
    }

    let until = b
        .lock_extend("job-a", t1, Duration::from_secs(120))
        .await
        .unwrap()
        .expect("extend by holder");
    assert!(until > lock_until);
    assert!(b
        .lock_extend("job-a", FencingToken(7), LONG)
        .await
        .unwrap()
        .is_none());

    // Release with at_least: the lease stays until locked_at + at_least.
    assert!(b
        .lock_release("job-a", t1, Duration::from_millis(1000))
        .await
        .unwrap());
    assert!(matches!(
        b.lock_acquire(&req("h2", LONG)).await.unwrap(),
        Acquire::Busy(_)
    ));
    tokio::time::sleep(Duration::from_millis(1050)).await;
    let Acquire::Granted { token: t2, .. } = b.lock_acquire(&req("h2", LONG)).await.unwrap() else {
        panic!("granted after at_least")
    };
    assert!(t2 > t1);
    // The old holder cannot touch the new lease.
    assert!(b.lock_extend("job-a", t1, LONG).await.unwrap().is_none());
    assert!(!b.lock_release("job-a", t1, Duration::ZERO).await.unwrap());

    // Release without at_least frees at once; tokens keep rising.
    assert!(b.lock_release("job-a", t2, Duration::ZERO).await.unwrap());
    let Acquire::Granted { token: t3, .. } = b.lock_acquire(&req("h3", LONG)).await.unwrap() else {
        panic!("granted after release")
    };
    assert!(t3 > t2);

    // A lease lapses by itself after at_most; the lapsed holder is refused.
    let short = LockRequest {
        name: "job-b",
        holder: "h1",
        at_most: Duration::from_millis(50),
    };
    let Acquire::Granted { token: s1, .. } = b.lock_acquire(&short).await.unwrap() else {
        panic!()
    };
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert!(b.lock_extend("job-b", s1, LONG).await.unwrap().is_none());
    assert!(!b.lock_release("job-b", s1, Duration::ZERO).await.unwrap());
    let info = b.lock_get("job-b").await.unwrap().unwrap();
    assert!(!info.held);
    let list = b.lock_list().await.unwrap();
    assert_eq!(
        list.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
        ["job-a", "job-b"]
    );
    assert!(b.lock_get("nope").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locks_16_contenders_one_winner() {
    let db = db().await;
    let mut handles = Vec::new();
    for i in 0..16 {
        let s = db.open().await;
        handles.push(tokio::spawn(async move {
            let holder = format!("h{i}");
            s.backend()
                .lock_acquire(&LockRequest {
                    name: "x",
                    holder: &holder,
                    at_most: LONG,
                })
                .await
                .unwrap()
        }));
    }
    let mut granted = 0;
    for h in handles {
        if matches!(h.await.unwrap(), Acquire::Granted { .. }) {
            granted += 1;
        }
    }
    assert_eq!(granted, 1);
}

// ---- tasks -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn enqueue_and_claim_order() {
    let db = db().await;
    let b = db.b();
    let mut ts = Vec::new();
    for p in [5, -3, 0, -3] {
        ts.push(NewTask {
            priority: p,
            ..task("q")
        });
    }
    ts.push(NewTask {
        run_at: RunAt::Delay(Duration::from_secs(3600)),
        ..task("q")
    });
    ts.push(task("other"));
    let ids: Vec<i64> = b.enqueue(&ts).await.unwrap().iter().map(|e| e.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids rise in order");

    let got = b.claim(&claim_req("q", 3, LONG)).await.unwrap();
    assert_eq!(
        got.iter().map(|t| t.id).collect::<Vec<_>>(),
        [ids[1], ids[3], ids[2]]
    );
    assert!(got.iter().all(|t| t.attempt == 1 && t.queue == "q"));
    assert_eq!(got[0].payload, serde_json::json!({"n": 1}));
    assert_eq!(got[0].timeout, Some(Duration::from_secs(30)));
    let rest = b.claim(&claim_req("q", 10, LONG)).await.unwrap();
    assert_eq!(rest.iter().map(|t| t.id).collect::<Vec<_>>(), [ids[0]]);
    assert!(b.claim(&claim_req("q", 10, LONG)).await.unwrap().is_empty());

    let info = b.task(ids[0]).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Running);
    assert_eq!(info.worker.as_deref(), Some("w1"));
    assert!(info.lease_until.is_some() && info.started_at.is_some());

    // RunAt::At in the past is due now.
    let past = b
        .enqueue(&[NewTask {
            run_at: RunAt::At(chrono::Utc::now() - chrono::Duration::seconds(5)),
            ..task("q")
        }])
        .await
        .unwrap();
    let got = b.claim(&claim_req("q", 10, LONG)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, past[0].id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeat_finish_and_cas() {
    let db = db().await;
    let b = db.b();
    b.enqueue(&[task("q"), task("q")]).await.unwrap();
    let got = b.claim(&claim_req("q", 2, LONG)).await.unwrap();
    let c0 = got[0].claim();
    let c1 = got[1].claim();
    let stale = Claim {
        token: FencingToken(c1.token.0 + 1),
        ..c1
    };
    assert_eq!(b.cancel(c1.id).await.unwrap(), CancelOutcome::Requested);
    let hb = b.heartbeat(&[c0, c1, stale], LONG).await.unwrap();
    assert_eq!(
        hb,
        [
            Heartbeat::Extended,
            Heartbeat::CancelRequested,
            Heartbeat::Lost
        ]
    );
    assert!(b
        .progress(c0, &serde_json::json!({"pct": 50}))
        .await
        .unwrap());
    assert!(!b.progress(stale, &serde_json::json!(1)).await.unwrap());

    assert!(b.finish(c0, &Finish::Succeeded).await.unwrap());
    assert!(!b.finish(c0, &Finish::Succeeded).await.unwrap(), "CAS");
    let i0 = b.task(c0.id).await.unwrap().unwrap();
    assert_eq!(i0.state, TaskState::Succeeded);
    assert!(i0.finished_at.is_some() && i0.lease_until.is_none());
    assert_eq!(i0.progress, Some(serde_json::json!({"pct": 50})));

    assert!(!b
        .finish(stale, &Finish::Cancelled { reason: "x".into() })
        .await
        .unwrap());
    assert!(b
        .finish(
            c1,
            &Finish::Cancelled {
                reason: "asked".into()
            }
        )
        .await
        .unwrap());
    let i1 = b.task(c1.id).await.unwrap().unwrap();
    assert_eq!(i1.state, TaskState::Cancelled);
    assert_eq!(i1.last_error.as_deref(), Some("asked"));
    assert_eq!(b.heartbeat(&[c1], LONG).await.unwrap(), [Heartbeat::Lost]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_retries_and_handback() {
    let db = db().await;
    let b = db.b();
    let id = b
        .enqueue(&[NewTask {
            max_attempts: 2,
            ..task("q")
        }])
        .await
        .unwrap()[0]
        .id;
    // Attempt 1 fails with a retry: pending again, later.
    let got = b.claim(&claim_req("q", 1, LONG)).await.unwrap();
    assert!(b
        .finish(
            got[0].claim(),
            &Finish::Failed {
                error: "boom 1".into(),
                retry_in: Some(Duration::from_millis(500)),
            }
        )
        .await
        .unwrap());
    let info = b.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Pending);
    assert!(info.finished_at.is_none() && info.lease_until.is_none());
    assert!(b.claim(&claim_req("q", 1, LONG)).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(550)).await;

    // Hand back: the attempt does not count.
    let got = b.claim(&claim_req("q", 1, LONG)).await.unwrap();
    assert_eq!(got[0].attempt, 2);
    assert!(b.finish(got[0].claim(), &Finish::HandBack).await.unwrap());
    let info = b.task(id).await.unwrap().unwrap();
    assert_eq!((info.state, info.attempt), (TaskState::Pending, 1));
    assert_eq!(info.errors.len(), 1);

    // Attempt 2 fails: out of attempts → failed, even with a retry_in.
    let got = b.claim(&claim_req("q", 1, LONG)).await.unwrap();
    assert_eq!(got[0].attempt, 2);
    assert!(b
        .finish(
            got[0].claim(),
            &Finish::Failed {
                error: "boom 2".into(),
                retry_in: Some(Duration::from_millis(1)),
            }
        )
        .await
        .unwrap());
    let info = b.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Failed);
    assert_eq!(info.last_error.as_deref(), Some("boom 2"));
    assert!(info.finished_at.is_some());
    assert_eq!(
        info.errors
            .iter()
            .map(|e| (e.attempt, e.error.as_str()))
            .collect::<Vec<_>>(),
        [(1, "boom 1"), (2, "boom 2")]
    );
    assert!(info.errors[0].at <= info.errors[1].at);

    // Retry from failed: one more attempt allowed.
    assert!(b.retry(id).await.unwrap());
    assert!(!b.retry(id).await.unwrap(), "pending is not retryable");
    let info = b.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Pending);
    assert_eq!(info.max_attempts, 3);
    assert!(info.finished_at.is_none());
    let got = b.claim(&claim_req("q", 1, LONG)).await.unwrap();
    assert_eq!(got[0].attempt, 3);
    // A failure without retry_in is final.
    assert!(b
        .finish(
            got[0].claim(),
            &Finish::Failed {
                error: "boom 3".into(),
                retry_in: None,
            }
        )
        .await
        .unwrap());
    assert_eq!(b.task(id).await.unwrap().unwrap().state, TaskState::Failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rescue_expired_leases() {
    let db = db().await;
    let b = db.b();
    let ids: Vec<i64> = b
        .enqueue(&[
            task("q"),
            NewTask {
                max_attempts: 1,
                ..task("q")
            },
            task("q"),
        ])
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let got = b
        .claim(&claim_req("q", 3, Duration::from_millis(300)))
        .await
        .unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(b.cancel(ids[2]).await.unwrap(), CancelOutcome::Requested);
    // Nothing expired yet.
    assert_eq!(b.rescue().await.unwrap(), Default::default());
    let mut rx = b.subscribe().await.unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await;
    let r = b.rescue().await.unwrap();
    assert_eq!((r.requeued, r.failed, r.cancelled), (1, 1, 1));
    assert_eq!(rx.try_recv().ok().map(|w| w.queue).as_deref(), Some("q"));

    let i0 = b.task(ids[0]).await.unwrap().unwrap();
    assert_eq!((i0.state, i0.attempt), (TaskState::Pending, 1));
    assert_eq!(i0.errors.len(), 1);
    assert_eq!(i0.errors[0].error, LEASE_EXPIRED);
    assert!(i0.lease_until.is_none());
    let i1 = b.task(ids[1]).await.unwrap().unwrap();
    assert_eq!(i1.state, TaskState::Failed);
    assert_eq!(i1.last_error.as_deref(), Some(LEASE_EXPIRED));
    assert_eq!(
        b.task(ids[2]).await.unwrap().unwrap().state,
        TaskState::Cancelled
    );

    // The rescued worker's late result is refused; the next attempt is 2.
    let late = got.iter().find(|t| t.id == ids[0]).unwrap().claim();
    assert!(!b.finish(late, &Finish::Succeeded).await.unwrap());
    assert_eq!(b.heartbeat(&[late], LONG).await.unwrap(), [Heartbeat::Lost]);
    let got = b.claim(&claim_req("q", 3, LONG)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].id, got[0].attempt), (ids[0], 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_outcomes_and_retry() {
    let db = db().await;
    let b = db.b();
    let id = b.enqueue(&[task("q")]).await.unwrap()[0].id;
    assert_eq!(b.cancel(id).await.unwrap(), CancelOutcome::Cancelled);
    assert_eq!(
        b.cancel(id).await.unwrap(),
        CancelOutcome::AlreadyFinished(TaskState::Cancelled)
    );
    assert_eq!(b.cancel(9999).await.unwrap(), CancelOutcome::NotFound);
    assert!(b.claim(&claim_req("q", 1, LONG)).await.unwrap().is_empty());
    assert!(b.retry(id).await.unwrap());
    let got = b.claim(&claim_req("q", 1, LONG)).await.unwrap();
    assert_eq!(got[0].id, id);
    assert!(!b.retry(id).await.unwrap(), "running is not retryable");
    assert!(!b.retry(9999).await.unwrap());

    // Retrying a keyed task whose key was taken again meanwhile conflicts.
    let keyed = NewTask {
        unique_key: Some("k1".into()),
        ..task("u")
    };
    let a = b.enqueue(std::slice::from_ref(&keyed)).await.unwrap()[0].id;
    assert_eq!(b.cancel(a).await.unwrap(), CancelOutcome::Cancelled);
    let second = b.enqueue(std::slice::from_ref(&keyed)).await.unwrap()[0];
    assert!(second.inserted && second.id != a);
    let err = b.retry(a).await.unwrap_err();
    assert!(matches!(err, baton::StoreError::Conflict(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unique_keys() {
    let db = db().await;
    let b = db.b();
    let keyed = |k: &str| NewTask {
        unique_key: Some(k.into()),
        ..task("q")
    };
    // In one batch: duplicates of a key and plain tasks, in order.
    let r = b
        .enqueue(&[keyed("a"), task("q"), keyed("a"), keyed("b"), task("q")])
        .await
        .unwrap();
    assert!(r[0].inserted && r[1].inserted && !r[2].inserted && r[3].inserted && r[4].inserted);
    assert_eq!(r[2].id, r[0].id);
    assert!(r[0].id < r[1].id && r[1].id < r[3].id && r[3].id < r[4].id);
    // Across calls.
    let again = b.enqueue(&[keyed("a")]).await.unwrap()[0];
    assert_eq!((again.id, again.inserted), (r[0].id, false));

    // Running still holds the key; finishing frees it.
    let got = b.claim(&claim_req("q", 1, LONG)).await.unwrap();
    assert_eq!(got[0].id, r[0].id);
    assert_eq!(b.enqueue(&[keyed("a")]).await.unwrap()[0].id, r[0].id);
    b.finish(got[0].claim(), &Finish::Succeeded).await.unwrap();
    let fresh = b.enqueue(&[keyed("a")]).await.unwrap()[0];
    assert!(fresh.inserted && fresh.id != r[0].id);

    // unique_forever keeps the key after the task finished.
    let forever = NewTask {
        unique_forever: true,
        ..keyed("f")
    };
    let f = b.enqueue(std::slice::from_ref(&forever)).await.unwrap()[0];
    assert_eq!(b.cancel(f.id).await.unwrap(), CancelOutcome::Cancelled);
    let f2 = b.enqueue(std::slice::from_ref(&forever)).await.unwrap()[0];
    assert_eq!((f2.id, f2.inserted), (f.id, false));
    // ...until pruned.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(b.prune(Duration::from_millis(1)).await.unwrap() >= 1);
    assert!(b.enqueue(&[forever]).await.unwrap()[0].inserted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn unique_key_16_racing_enqueuers() {
    let db = db().await;
    let mut handles = Vec::new();
    for _ in 0..16 {
        let s = db.open().await;
        handles.push(tokio::spawn(async move {
            let t = NewTask {
                unique_key: Some("race".into()),
                ..task("q")
            };
            s.backend().enqueue(&[t]).await.unwrap()[0]
        }));
    }
    let mut ids = std::collections::HashSet::new();
    let mut inserted = 0;
    for h in handles {
        let e = h.await.unwrap();
        ids.insert(e.id);
        inserted += usize::from(e.inserted);
    }
    assert_eq!(ids.len(), 1);
    assert_eq!(inserted, 1);
    let all = db.b().tasks(&TaskFilter::default()).await.unwrap();
    assert_eq!(all.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stats_tasks_and_prune() {
    let db = db().await;
    let b = db.b();
    let r = b
        .enqueue(&[
            task("a"),
            task("a"),
            task("a"),
            NewTask {
                run_at: RunAt::Delay(LONG),
                ..task("a")
            },
            task("b"),
        ])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let got = b.claim(&claim_req("a", 1, LONG)).await.unwrap();
    b.finish(got[0].claim(), &Finish::Succeeded).await.unwrap();
    b.claim(&claim_req("a", 1, LONG)).await.unwrap();
    b.cancel(r[4].id).await.unwrap();
    let stats = b.stats().await.unwrap();
    assert_eq!(stats.len(), 2);
    let a = &stats[0];
    assert_eq!(a.queue, "a");
    assert_eq!((a.pending, a.running, a.succeeded), (2, 1, 1));
    assert!(a.oldest_pending_ms.unwrap() >= 20, "{a:?}");
    let sb = &stats[1];
    assert_eq!((sb.queue.as_str(), sb.cancelled, sb.pending), ("b", 1, 0));
    assert_eq!(sb.oldest_pending_ms, None);

    // Listing: newest first, filters, paging.
    let all = b.tasks(&TaskFilter::default()).await.unwrap();
    assert_eq!(all.len(), 5);
    assert!(all.windows(2).all(|w| w[0].id > w[1].id));
    let page = b
        .tasks(&TaskFilter {
            queue: Some("a".into()),
            before_id: Some(r[3].id),
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|t| t.id).collect::<Vec<_>>(),
        [r[2].id, r[1].id]
    );
    let pend = b
        .tasks(&TaskFilter {
            state: Some(TaskState::Pending),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(pend.len(), 2);

    // Prune only terminal tasks past the age.
    assert_eq!(b.prune(LONG).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(b.prune(Duration::from_millis(5)).await.unwrap(), 2);
    assert_eq!(b.tasks(&TaskFilter::default()).await.unwrap().len(), 3);
}

// ---- schedules -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_register_and_advance() {
    let db = db().await;
    let b = db.b();
    let before = b.now().await.unwrap();
    let j = b.job_register("nightly").await.unwrap();
    assert!(!j.paused);
    let start = j.last_slot.expect("registered at now");
    assert!(start >= before - chrono::Duration::milliseconds(5));
    // Registering again returns the same cursor.
    assert_eq!(b.job_register("nightly").await.unwrap(), j);

    let slot_task = |slot: chrono::DateTime<chrono::Utc>| NewTask {
        unique_key: Some(format!("nightly|{}", slot.timestamp_millis())),
        unique_forever: true,
        job: Some("nightly".into()),
        slot: Some(slot),
        ..task("q")
    };
    let s1 = start + chrono::Duration::seconds(1);
    let t1 = slot_task(s1);
    let adv = |expected, slot, task: &'static NewTask, overlap| SlotAdvance {
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
    let t1: &'static NewTask = Box::leak(Box::new(t1));
    let a1 = b
        .job_advance(&adv(Some(start), s1, t1, Overlap::Forbid))
        .await
        .unwrap();
    let Advanced::Enqueued(e1) = a1 else {
        panic!("{a1:?}")
    };
    assert!(e1.inserted);
    // A second scheduler with the old cursor is told it moved.
    assert_eq!(
        b.job_advance(&adv(Some(start), s1, t1, Overlap::Forbid))
            .await
            .unwrap(),
        Advanced::Moved(Some(s1))
    );
    // Next slot while the first is pending: skipped (Forbid).
    let s2 = s1 + chrono::Duration::seconds(1);
    let t2: &'static NewTask = Box::leak(Box::new(slot_task(s2)));
    let Advanced::Skipped(e2) = b
        .job_advance(&adv(Some(s1), s2, t2, Overlap::Forbid))
        .await
        .unwrap()
    else {
        panic!("expected skipped")
    };
    let i2 = b.task(e2.id).await.unwrap().unwrap();
    assert_eq!(i2.state, TaskState::Cancelled);
    assert_eq!(i2.last_error.as_deref(), Some(OVERLAP_SKIPPED));
    assert_eq!(i2.slot, Some(s2));
    assert_eq!(i2.job.as_deref(), Some("nightly"));
    // With Allow it is enqueued.
    let s3 = s2 + chrono::Duration::seconds(1);
    let t3: &'static NewTask = Box::leak(Box::new(slot_task(s3)));
    assert!(matches!(
        b.job_advance(&adv(Some(s2), s3, t3, Overlap::Allow))
            .await
            .unwrap(),
        Advanced::Enqueued(Enqueued { inserted: true, .. })
    ));
    // A trigger made slot 4's task already: advance returns it.
    let s4 = s3 + chrono::Duration::seconds(1);
    let t4: &'static NewTask = Box::leak(Box::new(slot_task(s4)));
    let trig = b.enqueue(std::slice::from_ref(t4)).await.unwrap()[0];
    assert_eq!(
        b.job_advance(&adv(Some(s3), s4, t4, Overlap::Allow))
            .await
            .unwrap(),
        Advanced::Enqueued(Enqueued {
            id: trig.id,
            inserted: false
        })
    );

    // Paused jobs do not move.
    assert!(b.job_set_paused("nightly", true).await.unwrap());
    assert!(!b.job_set_paused("nope", true).await.unwrap());
    let s5 = s4 + chrono::Duration::seconds(1);
    assert_eq!(
        b.job_advance(&adv(Some(s4), s5, t4, Overlap::Allow))
            .await
            .unwrap(),
        Advanced::Paused
    );
    let list = b.job_list().await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].last_slot, Some(s4));
    assert!(list[0].paused);
    assert_eq!(
        b.job_advance(&SlotAdvance {
            job: "unknown",
            ..adv(None, s5, t4, Overlap::Allow)
        })
        .await
        .unwrap(),
        Advanced::UnknownJob
    );
}

// ---- SQLite specifics ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subscribe_is_shared_by_handles_on_one_file() {
    let db = db().await;
    let other = db.open().await;
    let mut rx = db.b().subscribe().await.unwrap();
    other.backend().enqueue(&[task("mail")]).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(1), rx.recv())
        .await
        .expect("woken")
        .unwrap();
    assert_eq!(got, baton::store::Wake::now("mail"));
    // Delayed tasks are announced with their due time.
    let before = other.backend().now().await.unwrap();
    other
        .backend()
        .enqueue(&[NewTask {
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
        .tasks(&TaskFilter::default())
        .await
        .unwrap()
        .is_empty());

    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    enqueue_in(&mut tx, Some("app:x-"), &[task("q")])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        backend.claim(&claim_req("q", 5, LONG)).await.unwrap().len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_first_connects_migrate_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("fresh.db").display());
    let mut handles = Vec::new();
    for _ in 0..12 {
        let url = url.clone();
        handles.push(tokio::spawn(async move {
            let b = SqliteBackend::connect(&url, &StoreOptions::default()).await?;
            b.migrate().await?;
            b.enqueue(&[task("q")]).await
        }));
    }
    for h in handles {
        h.await.unwrap().unwrap();
    }
    // `sqlite:PATH` works through Store::connect too.
    let s = Store::connect(&url).await.unwrap();
    assert_eq!(s.backend().stats().await.unwrap()[0].pending, 12);
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
    b.enqueue(&ts).await.unwrap();
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
    for url in ["sqlite://", "sqlite::memory:", "sqlite://:memory:"] {
        let err = Store::connect(url).await.unwrap_err();
        assert!(matches!(err, baton::StoreError::Config(_)), "{url}: {err}");
    }
}

/// Measures (prints, does not assert) a 100k-task enqueue and claiming all
/// of them in batches of 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bulk_100k_enqueue_and_claim_timing() {
    let db = db().await;
    let b = db.b();
    let n = 100_000;
    let ts: Vec<NewTask> = (0..n)
        .map(|i| NewTask {
            payload: serde_json::json!({"i": i}),
            ..task("bulk")
        })
        .collect();
    let t0 = Instant::now();
    let r = b.enqueue(&ts).await.unwrap();
    let enq = t0.elapsed();
    assert_eq!(r.len(), n);
    let t1 = Instant::now();
    let mut claimed = 0;
    loop {
        let got = b.claim(&claim_req("bulk", 100, LONG)).await.unwrap();
        if got.is_empty() {
            break;
        }
        claimed += got.len();
    }
    let cl = t1.elapsed();
    assert_eq!(claimed, n);
    println!(
        "sqlite bulk: enqueue {n} in {:.3}s ({:.0}/s); claim all in batches of 100 in {:.3}s ({:.0}/s)",
        enq.as_secs_f64(),
        n as f64 / enq.as_secs_f64(),
        cl.as_secs_f64(),
        n as f64 / cl.as_secs_f64()
    );

    // Unique-keyed bulk enqueue, for comparison.
    let ts: Vec<NewTask> = (0..n)
        .map(|i| NewTask {
            unique_key: Some(format!("k{i}")),
            ..task("bulk2")
        })
        .collect();
    let t2 = Instant::now();
    b.enqueue(&ts).await.unwrap();
    let e2 = t2.elapsed();
    let t3 = Instant::now();
    let again = b.enqueue(&ts).await.unwrap();
    let e3 = t3.elapsed();
    assert!(again.iter().all(|e| !e.inserted));
    println!(
        "sqlite bulk keyed: enqueue {n} new keys in {:.3}s ({:.0}/s); all {n} taken in {:.3}s ({:.0}/s)",
        e2.as_secs_f64(),
        n as f64 / e2.as_secs_f64(),
        e3.as_secs_f64(),
        n as f64 / e3.as_secs_f64()
    );
}

/// Measures (prints, does not assert) 8 concurrent workers on one handle,
/// each claiming 10 at a time and finishing every task on its own: the shape
/// of a worker pool, where in-process writers contend for SQLite's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_workers_timing() {
    let db = db().await;
    let n = 20_000;
    let ts: Vec<NewTask> = (0..n).map(|_| task("cw")).collect();
    db.b().enqueue(&ts).await.unwrap();
    let t0 = Instant::now();
    let mut handles = Vec::new();
    for w in 0..8 {
        let s = db.store.clone();
        handles.push(tokio::spawn(async move {
            let worker = format!("w{w}");
            let mut done = 0usize;
            loop {
                let got = s
                    .backend()
                    .claim(&ClaimRequest {
                        queue: "cw",
                        worker: &worker,
                        limit: 10,
                        lease: LONG,
                        max_running: None,
                    })
                    .await
                    .unwrap();
                if got.is_empty() {
                    return done;
                }
                for t in got {
                    let c = t.claim();
                    assert!(s.backend().finish(c, &Finish::Succeeded).await.unwrap());
                    done += 1;
                }
            }
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    let el = t0.elapsed();
    assert_eq!(total, n);
    println!(
        "sqlite 8 workers: {n} tasks claimed (by 10) and finished one by one in {:.3}s ({:.0}/s)",
        el.as_secs_f64(),
        n as f64 / el.as_secs_f64()
    );
}
