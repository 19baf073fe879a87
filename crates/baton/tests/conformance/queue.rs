//! T1 no loss, T2 one attempt at a time, T3 bounded retries, T4 idempotent
//! enqueue, and the queue API around them.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton::queue::{Backoff, Queue, TaskBuilder, TaskError, Worker, WorkerConfig};
use baton::store::{
    CancelOutcome, Claim, FencingToken, Finish, Heartbeat, TaskClaim, TaskFilter, TaskState,
    CANCEL_REQUESTED, LEASE_EXPIRED,
};
use baton::Store;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use baton_testkit::clock;

use crate::TestStore;

fn task(kind: &str) -> TaskBuilder {
    TaskBuilder::new(kind, json!({"k": kind}))
}

pub(crate) async fn claim(
    store: &Store,
    queue: &str,
    n: u32,
    lease_ms: u64,
) -> Vec<baton::store::Task> {
    store
        .backend()
        .task_claim(&TaskClaim {
            queue,
            worker: "test-worker",
            limit: n,
            lease: Duration::from_millis(lease_ms),
            max_running: None,
            per_key_max_running: None,
            buffered: 0,
            fair: false,
        })
        .await
        .unwrap()
}

fn fast_config(queue: &str, concurrency: usize) -> WorkerConfig {
    WorkerConfig::default()
        .queue(queue, concurrency)
        .lease(Duration::from_millis(600))
        .poll_interval(Duration::from_millis(100))
        .shutdown_grace(Duration::from_millis(300))
        .stop_grace(Duration::from_millis(300))
        .backoff(Backoff {
            base: Duration::from_millis(50),
            factor: 2.0,
            max: Duration::from_millis(200),
            jitter: 0.0,
        })
}

/// Wait until the task reaches `state` (or panic after `secs`).
async fn wait_state(q: &Queue, id: i64, state: TaskState, secs: u64) -> baton::store::TaskInfo {
    baton_testkit::wait::task_state(q, id, state, Duration::from_secs(secs)).await
}

pub async fn claim_order_priority_run_at_id(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let low = q.enqueue(task("a").priority(5)).await.unwrap().id;
    let high1 = q.enqueue(task("b").priority(-5)).await.unwrap().id;
    let high2 = q.enqueue(task("c").priority(-5)).await.unwrap().id;
    let later = q
        .enqueue(task("d").priority(-50).delay(Duration::from_secs(60)))
        .await
        .unwrap()
        .id;
    let other_queue = q.enqueue(task("e").queue("other")).await.unwrap().id;
    let got: Vec<i64> = claim(&ts.store, "default", 10, 10_000)
        .await
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(
        got,
        [high1, high2, low],
        "priority, then run_at, then id; delayed and other-queue tasks not claimed"
    );
    // Due at run_at on the store's clock, not before.
    clock::advance(&ts, Duration::from_secs(58)).await;
    assert!(claim(&ts.store, "default", 10, 10_000).await.is_empty());
    clock::advance(&ts, Duration::from_secs(3)).await;
    let got = claim(&ts.store, "default", 10, 10_000).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, later);
    assert_eq!(got[0].attempt, 1);
    assert!(got[0].lease_until > got[0].run_at);
    assert_eq!(
        claim(&ts.store, "other", 10, 10_000).await[0].id,
        other_queue
    );
    assert!(claim(&ts.store, "default", 10, 10_000).await.is_empty());
}

/// `TaskClaim::buffered`: the first `limit - buffered` due tasks are
/// taken as usual; the buffer's share only among tasks with an attempt to
/// spare, so a task on its last attempt never waits unstarted in a worker
/// (whose crash would have it failed by the rescue without a run). Tasks
/// stepped over stay pending, untouched, for the next claim.
pub async fn claim_buffer_share_skips_last_attempts(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let retried = q.enqueue(task("g").max_attempts(2)).await.unwrap().id;
    let c = claim(&ts.store, "default", 1, 10_000).await;
    assert_eq!(c[0].id, retried);
    let mut ids = Vec::new();
    for (kind, max) in [("a", 1), ("b", 1), ("c", 3), ("d", 1), ("e", 2), ("f", 3)] {
        ids.push(q.enqueue(task(kind).max_attempts(max)).await.unwrap().id);
    }
    let [a, b, c_, d, e, f] = ids[..] else {
        unreachable!()
    };
    // Failed once with a retry: attempt 1 of 2, due after the others; its
    // next attempt is its last.
    clock::advance(&ts, Duration::from_millis(5)).await;
    let failed = Finish::Failed {
        error: "once".into(),
        retry_in: Some(Duration::ZERO),
    };
    let done = ts
        .store
        .backend()
        .task_finish_many(&[(c[0].claim(), failed)])
        .await;
    assert_eq!(done.unwrap(), [true]);
    let req = |limit, buffered| TaskClaim {
        queue: "default",
        worker: "test-worker",
        limit,
        lease: Duration::from_secs(10),
        max_running: None,
        per_key_max_running: None,
        buffered,
        fair: false,
    };
    let claim_ids = |limit, buffered| {
        let store = ts.store.clone();
        async move {
            let mut v: Vec<i64> = store
                .backend()
                .task_claim(&req(limit, buffered))
                .await
                .unwrap()
                .iter()
                .map(|t| t.id)
                .collect();
            v.sort_unstable();
            v
        }
    };
    assert_eq!(
        claim_ids(5, 4).await,
        [a, c_, e, f],
        "the first task starts at once whatever its attempts; the buffer's share \
         steps over b, d (one attempt) and the retried task (on its second of two)"
    );
    // The ones stepped over: pending, attempt not counted, claimable.
    for (id, attempt) in [(b, 0), (d, 0), (retried, 1)] {
        let t = q.task(id).await.unwrap().expect("task exists");
        assert_eq!(
            (t.state, t.attempt),
            (TaskState::Pending, attempt),
            "task {id}"
        );
    }
    assert_eq!(
        claim_ids(10, 10).await,
        Vec::<i64>::new(),
        "only last attempts are due: a claim all for the buffer takes none"
    );
    let mut rest = vec![b, d, retried];
    rest.sort_unstable();
    assert_eq!(
        claim_ids(10, 0).await,
        rest,
        "without a buffer share: anything due"
    );
}

/// The buffer's share of a claim takes the first tasks in claim order
/// (priority, run_at, id), not any: more spare-attempt tasks are due than
/// the share, their priorities against their ids' order.
pub async fn claim_buffer_share_takes_the_first_in_order(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let mut by_priority = Vec::new();
    // Enqueued lowest priority first: id order is the reverse of claim order.
    for p in (0..8).rev() {
        let id = q
            .enqueue(task("o").queue("share").priority(p).max_attempts(3))
            .await
            .unwrap()
            .id;
        by_priority.push((p, id));
    }
    by_priority.sort_unstable();
    let claimed = ts
        .store
        .backend()
        .task_claim(&TaskClaim {
            queue: "share",
            worker: "test-worker",
            limit: 4,
            lease: Duration::from_secs(10),
            max_running: None,
            per_key_max_running: None,
            buffered: 3,
            fair: false,
        })
        .await
        .unwrap();
    let mut got: Vec<i64> = claimed.iter().map(|t| t.id).collect();
    got.sort_unstable();
    let mut want: Vec<i64> = by_priority[..4].iter().map(|&(_, id)| id).collect();
    want.sort_unstable();
    assert_eq!(
        got, want,
        "the four first by priority (one at once, three for the buffer)"
    );
}

pub async fn unique_key_race_gives_one_task(ts: TestStore) {
    let mut stores = vec![ts.store.clone()];
    for _ in 0..3 {
        stores.push(ts.open().await);
    }
    let mut hs = Vec::new();
    for i in 0..16 {
        let q = Queue::new(stores[i % 4].clone());
        hs.push(tokio::spawn(async move {
            q.enqueue(task("u").unique_key("report-42")).await.unwrap()
        }));
    }
    let mut ids = Vec::new();
    let mut inserted = 0;
    for h in hs {
        let e = h.await.unwrap();
        ids.push(e.id);
        inserted += e.inserted as usize;
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "one task for one key: {ids:?}");
    assert_eq!(inserted, 1);
    let q = Queue::new(ts.store.clone());
    let stats = q.stats().await.unwrap();
    assert_eq!(stats[0].pending, 1);
    // Once that task finished, the key is free again (not unique_forever)...
    let c = claim(&ts.store, "default", 1, 10_000).await;
    assert!(ts
        .store
        .backend()
        .task_finish_many(&[(c[0].claim(), Finish::Succeeded)])
        .await
        .map(|r| r == [true])
        .unwrap());
    let again = q.enqueue(task("u").unique_key("report-42")).await.unwrap();
    assert!(again.inserted && again.id != ids[0]);
    // ...but a unique_forever key stays taken after it finished.
    let f1 = q
        .enqueue(task("f").unique_key("once").unique_forever(true))
        .await
        .unwrap();
    let c = claim(&ts.store, "default", 5, 10_000).await;
    for t in &c {
        ts.store
            .backend()
            .task_finish_many(&[(t.claim(), Finish::Succeeded)])
            .await
            .map(|r| r == [true])
            .unwrap();
    }
    let f2 = q
        .enqueue(task("f").unique_key("once").unique_forever(true))
        .await
        .unwrap();
    assert_eq!(f2, baton::store::Enqueued::existing(f1.id));
}

pub async fn batch_enqueue_is_idempotent_per_key(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let batch: Vec<_> = (0..1_000)
        .map(|i| task("b").unique_key(format!("k{}", i % 500)))
        .collect();
    let out = q.enqueue_many(batch).await.unwrap();
    assert_eq!(out.len(), 1_000);
    assert_eq!(out.iter().filter(|e| e.inserted).count(), 500);
    for i in 0..500 {
        assert_eq!(out[i].id, out[i + 500].id, "same key, same task");
    }
    let stats = q.stats().await.unwrap();
    assert_eq!(stats[0].pending, 500);
    // A bad task anywhere in the batch writes nothing.
    let bad = vec![task("ok"), task("bad").priority(1_000)];
    let err = q.enqueue_many(bad).await.unwrap_err().to_string();
    assert!(err.contains("task 1: priority"), "{err}");
    assert_eq!(q.stats().await.unwrap()[0].pending, 500);
}

pub async fn finish_is_compare_and_set(ts: TestStore) {
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    let id = q.enqueue(task("cas").max_attempts(3)).await.unwrap().id;
    let queued_at = q.task(id).await.unwrap().unwrap().run_at;
    let t = claim(&ts.store, "default", 1, 60_000).await.remove(0);
    let first = t.claim();
    assert_eq!(
        b.task_heartbeat_many(&baton::store::TaskHeartbeatMany {
            claims: &[first],
            lease: Duration::from_secs(60)
        })
        .await
        .unwrap(),
        [Heartbeat::Extended]
    );
    // A live lease is not rescued, on the store's clock.
    clock::advance(&ts, Duration::from_secs(58)).await;
    assert_eq!(b.task_rescue_many().await.unwrap(), Default::default());
    // The worker freezes past its lease; any instance rescues it.
    clock::advance(&ts, Duration::from_secs(3)).await;
    let r = b.task_rescue_many().await.unwrap();
    assert_eq!(r.requeued, 1);
    let info = q.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Pending);
    assert_eq!(info.attempt, 1, "the lost attempt counts");
    assert_eq!(
        info.run_at, queued_at,
        "a rescued task keeps its place in line"
    );
    assert_eq!(info.errors.len(), 1);
    assert_eq!(info.errors[0].error, LEASE_EXPIRED);
    assert_eq!(
        info.last_error.as_deref(),
        Some(LEASE_EXPIRED),
        "the last error says why it was requeued"
    );
    let t2 = claim(&ts.store, "default", 1, 10_000).await.remove(0);
    assert_eq!(t2.attempt, 2);
    let second = t2.claim();
    // The frozen worker wakes up: its heartbeat and its result are refused.
    assert_eq!(
        b.task_heartbeat_many(&baton::store::TaskHeartbeatMany {
            claims: &[first, second],
            lease: Duration::from_secs(10)
        })
        .await
        .unwrap(),
        [Heartbeat::Lost, Heartbeat::Extended]
    );
    assert!(
        !b.task_finish_many(&[(first, Finish::Succeeded)])
            .await
            .map(|r| r == [true])
            .unwrap(),
        "stale result refused"
    );
    assert!(!b
        .task_set_progress(&baton::store::TaskSetProgress {
            claim: first,
            progress: &json!({"p": 1})
        })
        .await
        .unwrap());
    assert_eq!(q.task(id).await.unwrap().unwrap().state, TaskState::Running);
    assert!(b
        .task_set_progress(&baton::store::TaskSetProgress {
            claim: second,
            progress: &json!({"done": 50})
        })
        .await
        .unwrap());
    assert!(b
        .task_finish_many(&[(second, Finish::Succeeded)])
        .await
        .map(|r| r == [true])
        .unwrap());
    assert!(
        !b.task_finish_many(&[(second, Finish::Succeeded)])
            .await
            .map(|r| r == [true])
            .unwrap(),
        "finishing twice is refused"
    );
    let info = q.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Succeeded);
    assert_eq!(info.progress, Some(json!({"done": 50})));
    assert!(info.finished_at.is_some() && info.lease_until.is_none());
}

pub async fn rescue_out_of_attempts_fails_with_reason(ts: TestStore) {
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    let id = q.enqueue(task("x").max_attempts(1)).await.unwrap().id;
    claim(&ts.store, "default", 1, 60_000).await;
    let cancel_me = q.enqueue(task("y")).await.unwrap().id;
    claim(&ts.store, "default", 1, 60_000).await;
    assert_eq!(q.cancel(cancel_me).await.unwrap(), CancelOutcome::Requested);
    clock::advance(&ts, Duration::from_secs(61)).await;
    let r = b.task_rescue_many().await.unwrap();
    assert_eq!((r.requeued, r.failed, r.cancelled), (0, 1, 1));
    let info = q.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Failed);
    assert_eq!(info.last_error.as_deref(), Some(LEASE_EXPIRED));
    // The rescued attempt's record says who ran it and when it started.
    let rec = &info.errors[0];
    assert_eq!(
        (rec.attempt, rec.worker.as_deref()),
        (1, Some("test-worker"))
    );
    let started = rec.started_at.expect("the attempt's start is recorded");
    assert!(info.created_at <= started && started < rec.at, "{rec:?}");
    assert_eq!(
        q.task(cancel_me).await.unwrap().unwrap().state,
        TaskState::Cancelled
    );
    assert_eq!(
        b.task_rescue_many().await.unwrap(),
        Default::default(),
        "rescue is idempotent"
    );
}

pub async fn retries_with_backoff_then_succeeds(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let id = q.enqueue(task("flaky").max_attempts(5)).await.unwrap().id;
    let calls = Arc::new(AtomicU32::new(0));
    let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut w = Worker::new(ts.store.clone(), fast_config("default", 2)).unwrap();
    let (c2, s2) = (calls.clone(), starts.clone());
    w.handle("flaky", move |ctx| {
        let (c, s) = (c2.clone(), s2.clone());
        async move {
            s.lock().unwrap().push(Instant::now());
            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
            assert_eq!(ctx.task().attempt, n);
            if n < 3 {
                Err(TaskError::retry(format!("boom {n}")))
            } else {
                Ok(())
            }
        }
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    let info = wait_state(&q, id, TaskState::Succeeded, 10).await;
    stop.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(info.attempt, 3);
    assert_eq!(
        info.errors
            .iter()
            .map(|e| e.error.as_str())
            .collect::<Vec<_>>(),
        ["boom 1", "boom 2"]
    );
    let s = starts.lock().unwrap();
    assert!(
        s[1] - s[0] >= Duration::from_millis(45),
        "backoff before attempt 2: {:?}",
        s[1] - s[0]
    );
    assert!(
        s[2] - s[1] >= Duration::from_millis(90),
        "longer backoff before attempt 3: {:?}",
        s[2] - s[1]
    );
}

pub async fn out_of_attempts_is_dead_lettered_and_retryable(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let id = q.enqueue(task("bad").max_attempts(2)).await.unwrap().id;
    let perm = q.enqueue(task("fatal").max_attempts(5)).await.unwrap().id;
    let mut w = Worker::new(ts.store.clone(), fast_config("default", 2)).unwrap();
    w.handle("bad", |ctx| async move {
        Err(TaskError::retry(format!(
            "always fails (attempt {})",
            ctx.task().attempt
        )))
    });
    w.handle("fatal", |_| async move {
        Err(TaskError::permanent("no point retrying"))
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    let info = wait_state(&q, id, TaskState::Failed, 10).await;
    assert_eq!(info.attempt, 2, "attempts never exceed max_attempts");
    assert_eq!(info.last_error.as_deref(), Some("always fails (attempt 2)"));
    assert_eq!(info.errors.len(), 2);
    let p = wait_state(&q, perm, TaskState::Failed, 10).await;
    assert_eq!(p.attempt, 1, "a permanent error is not retried");
    // Retry from the dead letter: one more attempt.
    assert!(q.retry(id).await.unwrap());
    let info = wait_state(&q, id, TaskState::Failed, 10).await;
    assert_eq!(info.attempt, 3);
    assert_eq!(info.errors.len(), 3);
    // Every attempt's record: its number, worker, start before its end.
    for (n, rec) in info.errors.iter().enumerate() {
        assert_eq!(rec.attempt as usize, n + 1, "{rec:?}");
        assert!(
            rec.worker.as_deref().is_some_and(|w| !w.is_empty()),
            "{rec:?}"
        );
        assert!(rec.started_at.is_some_and(|s| s <= rec.at), "{rec:?}");
    }
    assert!(!q.retry(id + 1_000_000).await.unwrap());
    stop.cancel();
    run.await.unwrap().unwrap();
}

pub async fn cancel_pending_and_running(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let later = q
        .enqueue(task("slow").delay(Duration::from_secs(60)))
        .await
        .unwrap()
        .id;
    assert_eq!(q.cancel(later).await.unwrap(), CancelOutcome::Cancelled);
    assert_eq!(
        q.task(later).await.unwrap().unwrap().state,
        TaskState::Cancelled
    );
    assert_eq!(
        q.cancel(later).await.unwrap(),
        CancelOutcome::AlreadyFinished(TaskState::Cancelled)
    );
    assert_eq!(q.cancel(9_999_999).await.unwrap(), CancelOutcome::NotFound);

    let id = q.enqueue(task("slow")).await.unwrap().id;
    let saw_stop = Arc::new(AtomicU32::new(0));
    let mut w = Worker::new(ts.store.clone(), fast_config("default", 1)).unwrap();
    let s2 = saw_stop.clone();
    w.handle("slow", move |ctx| {
        let s = s2.clone();
        async move {
            ctx.stopped().await;
            s.fetch_add(1, Ordering::SeqCst);
            Err(TaskError::retry("stopped"))
        }
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    wait_state(&q, id, TaskState::Running, 5).await;
    let t0 = Instant::now();
    assert_eq!(q.cancel(id).await.unwrap(), CancelOutcome::Requested);
    let info = wait_state(&q, id, TaskState::Cancelled, 5).await;
    assert!(
        t0.elapsed() < Duration::from_millis(1_500),
        "cancelled at the next heartbeat"
    );
    assert_eq!(
        saw_stop.load(Ordering::SeqCst),
        1,
        "the handler got the signal"
    );
    assert_eq!(info.attempt, 1);
    stop.cancel();
    run.await.unwrap().unwrap();
}

pub async fn shutdown_hands_back_without_burning_an_attempt(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let id = q.enqueue(task("long").max_attempts(1)).await.unwrap().id;
    let mut a = Worker::new(ts.store.clone(), fast_config("default", 1)).unwrap();
    a.handle("long", |ctx| async move {
        ctx.stopped().await;
        Err(TaskError::retry("interrupted"))
    });
    let stop_a = CancellationToken::new();
    let run_a = tokio::spawn(a.run(stop_a.clone()));
    wait_state(&q, id, TaskState::Running, 5).await;
    stop_a.cancel();
    tokio::time::timeout(Duration::from_secs(5), run_a)
        .await
        .expect("shutdown within grace")
        .unwrap()
        .unwrap();
    let info = q.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Pending, "handed back");
    assert_eq!(info.attempt, 0, "the interrupted attempt does not count");
    // Another instance resumes it at once, with its single attempt intact.
    let mut b = Worker::new(ts.open().await, fast_config("default", 1)).unwrap();
    b.handle("long", |_| async move { Ok(()) });
    let stop_b = CancellationToken::new();
    let run_b = tokio::spawn(b.run(stop_b.clone()));
    let info = wait_state(&q, id, TaskState::Succeeded, 5).await;
    assert_eq!(info.attempt, 1);
    stop_b.cancel();
    run_b.await.unwrap().unwrap();
}

pub async fn shutdown_lets_short_handlers_finish(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let id = q.enqueue(task("short")).await.unwrap().id;
    let mut a = Worker::new(ts.store.clone(), fast_config("default", 1)).unwrap();
    a.handle("short", |_| async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        Ok(())
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(a.run(stop.clone()));
    wait_state(&q, id, TaskState::Running, 5).await;
    stop.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(
        q.task(id).await.unwrap().unwrap().state,
        TaskState::Succeeded
    );
}

pub async fn heartbeats_keep_a_long_task_alive(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let id = q.enqueue(task("long")).await.unwrap().id;
    // A lease of 2.4 s under a 6 s handler: two and a half leases' worth,
    // so only heartbeats keep it. The lease is long because the worker
    // rightly stops a handler whose heartbeats stall for `lease - guard`
    // (2.1 s here): a 900 ms lease (600 ms of stall) lost its task to a
    // loaded MariaDB on a 2-core CI machine, which is the worker working
    // as designed, not the failure this test looks for.
    let cfg = fast_config("default", 1).lease(Duration::from_millis(2_400));
    let mut w = Worker::new(ts.store.clone(), cfg).unwrap();
    w.handle("long", |_| async move {
        tokio::time::sleep(Duration::from_millis(6_000)).await;
        Ok(())
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    // Another instance rescues aggressively meanwhile.
    let other = ts.open().await;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(5_600) {
        assert_eq!(
            other.backend().task_rescue_many().await.unwrap().requeued,
            0,
            "a live worker's task is never rescued"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let info = wait_state(&q, id, TaskState::Succeeded, 10).await;
    assert_eq!(info.attempt, 1);
    stop.cancel();
    run.await.unwrap().unwrap();
}

pub async fn timeout_fails_the_attempt(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let id = q
        .enqueue(
            task("hang")
                .timeout(Duration::from_millis(100))
                .max_attempts(1),
        )
        .await
        .unwrap()
        .id;
    // A lease far longer than the timeout: under a loaded machine a 600 ms
    // lease can lapse first, and the test is of the timeout.
    let cfg = fast_config("default", 1).lease(Duration::from_secs(5));
    let mut w = Worker::new(ts.store.clone(), cfg).unwrap();
    w.handle("hang", |_| async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(())
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    let info = wait_state(&q, id, TaskState::Failed, 5).await;
    let error = info.last_error.unwrap_or_default();
    assert!(error.contains("timed out"), "last_error: {error:?}");
    stop.cancel();
    run.await.unwrap().unwrap();
}

/// A handler runs inside its attempt (no task of its own): a panic is
/// caught as a failed attempt (the worker goes on), and a handler that
/// ignores its stop is dropped after the grace (its future, and whatever
/// it owns, with it).
pub async fn panicking_and_stuck_handlers_fail_and_are_dropped(ts: TestStore) {
    struct OnDrop(Arc<AtomicUsize>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let q = Queue::new(ts.store.clone());
    let boom = q.enqueue(task("boom").max_attempts(1)).await.unwrap().id;
    let stuck = q
        .enqueue(
            task("stuck")
                .timeout(Duration::from_millis(100))
                .max_attempts(1),
        )
        .await
        .unwrap()
        .id;
    let after = q.enqueue(task("ok")).await.unwrap().id;
    let cfg = fast_config("default", 1).lease(Duration::from_secs(5));
    let mut w = Worker::new(ts.store.clone(), cfg).unwrap();
    w.handle("boom", |ctx| async move {
        assert!(ctx.task().id < 0, "boom");
        Ok(())
    });
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    w.handle("stuck", move |_| {
        let guard = OnDrop(d.clone());
        async move {
            let _guard = guard;
            // Ignores its stop: only dropping it ends it.
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(())
        }
    });
    w.handle("ok", |_| async move { Ok(()) });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    let info = wait_state(&q, boom, TaskState::Failed, 5).await;
    let error = info.last_error.unwrap_or_default();
    assert!(
        error.contains("handler panicked: boom"),
        "last_error: {error:?}"
    );
    let info = wait_state(&q, stuck, TaskState::Failed, 5).await;
    let error = info.last_error.unwrap_or_default();
    assert!(error.contains("timed out"), "last_error: {error:?}");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the stuck handler was dropped when its grace ran out"
    );
    wait_state(&q, after, TaskState::Succeeded, 5).await;
    stop.cancel();
    run.await.unwrap().unwrap();
}

pub async fn wake_up_without_waiting_for_a_poll(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let cfg = fast_config("default", 1).poll_interval(Duration::from_secs(30));
    let started = Arc::new(std::sync::Mutex::new(None));
    let mut w = Worker::new(ts.store.clone(), cfg).unwrap();
    let s2 = started.clone();
    w.handle("ping", move |_| {
        let s = s2.clone();
        async move {
            *s.lock().unwrap() = Some(Instant::now());
            Ok(())
        }
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await; // let it go idle (the first tick has passed)
    let t0 = Instant::now();
    let id = q.enqueue(task("ping")).await.unwrap().id;
    wait_state(&q, id, TaskState::Succeeded, 5).await;
    let latency = started.lock().unwrap().unwrap() - t0;
    assert!(
        latency < Duration::from_secs(2),
        "woken in {latency:?}, not at the 30 s poll"
    );
    stop.cancel();
    run.await.unwrap().unwrap();
}

/// A wake-up sent right after `wake_subscribe` returns is heard, or the
/// channel says it missed it: PostgreSQL's `LISTEN` session starts after
/// the call returns and sends a resync once it listens (without it, a
/// definitions write made just after a scheduler started waited for its
/// 30 s timer; seen in CI). Redis waits for its subscription; SQLite's and
/// MySQL's channel is this process's.
pub async fn a_wake_up_sent_right_after_subscribing_is_heard(ts: TestStore) {
    let fresh = ts.open().await;
    let mut rx = fresh.backend().wake_subscribe().await.unwrap();
    let q = Queue::new(ts.store.clone());
    q.enqueue(task("ping").queue("heard")).await.unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match rx.recv().await {
                Ok(w) if w.queue == "heard" || w.is_resync() => return true,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return false,
            }
        }
    })
    .await;
    assert_eq!(
        heard,
        Ok(true),
        "neither the enqueue's wake-up nor a resync was heard"
    );
}

/// Four workers, 5,000 tasks: each runs once, all succeed (T1). A
/// property check, not a load run: the 50,000-task run it was is
/// `baton-bench queue-throughput`'s to measure.
pub async fn many_tasks_four_workers_all_succeed(ts: TestStore) {
    many_tasks_four_workers(ts, 5_000, false).await
}

/// The worker pipeline (slots freed when handlers return, two result
/// batches in flight, a prefetch buffer): still each task once, all
/// succeeded.
pub async fn pipelined_workers_run_each_task_once(ts: TestStore) {
    many_tasks_four_workers(ts, 5_000, true).await
}

async fn many_tasks_four_workers(ts: TestStore, n: usize, pipeline: bool) {
    let q = Queue::new(ts.store.clone());
    let batch: Vec<_> = (0..n).map(|i| TaskBuilder::new("n", json!(i))).collect();
    let ids = q.enqueue_many(batch).await.unwrap();
    assert_eq!(ids.len(), n);
    let done = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let stop = CancellationToken::new();
    let mut runs = Vec::new();
    for _ in 0..4 {
        let cfg = fast_config("default", 16)
            .lease(Duration::from_secs(30))
            .free_slot_on_return(pipeline)
            .result_batches_in_flight(if pipeline { 2 } else { 1 })
            .prefetch(if pipeline { 16 } else { 0 });
        let mut w = Worker::new(ts.open().await, cfg).unwrap();
        let (d, s) = (done.clone(), seen.clone());
        w.handle("n", move |ctx| {
            let (d, s) = (d.clone(), s.clone());
            async move {
                if s.lock().unwrap().insert(ctx.task().id) {
                    d.fetch_add(1, Ordering::SeqCst);
                } else {
                    d.fetch_add(n * 10, Ordering::SeqCst); // ran twice: make the count wrong
                }
                Ok(())
            }
        });
        runs.push(tokio::spawn(w.run(stop.clone())));
    }
    let t0 = Instant::now();
    loop {
        let st = q.stats().await.unwrap();
        if st[0].succeeded as usize == n {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "stuck: {st:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.cancel();
    for r in runs {
        r.await.unwrap().unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), n, "each task ran exactly once");
    let st = &q.stats().await.unwrap()[0];
    assert_eq!((st.pending, st.running, st.failed), (0, 0, 0));
    eprintln!(
        "{:?}: {n} tasks by 4 workers in {:?}",
        ts.kind,
        t0.elapsed()
    );
}

/// The prefetch buffer: a worker of concurrency 1 claims six tasks at once
/// and runs them one after another, so the last ones wait in its buffer for
/// longer than their lease. While they wait they are heartbeated: rescue
/// passes (every 50 ms) find nothing to requeue. On shutdown the tasks
/// still buffered are handed back unstarted (pending, attempt not
/// counted); a second worker runs them; every task runs exactly once, in
/// its first attempt.
pub async fn prefetched_tasks_heartbeated_handed_back_run_once(ts: TestStore) {
    const N: usize = 6;
    let q = Queue::new(ts.store.clone());
    let batch: Vec<_> = (0..N)
        .map(|i| TaskBuilder::new("pf", json!(i)).queue("pf"))
        .collect();
    let ids: Vec<i64> = q
        .enqueue_many(batch)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let runs = Arc::new(std::sync::Mutex::new(Vec::<i64>::new()));
    let worker = |runs: Arc<std::sync::Mutex<Vec<i64>>>, store: Store, prefetch: usize| {
        // A 1.5 s lease; each handler takes 1 s, so the fifth and sixth
        // tasks wait two leases and more in the buffer. (A 600 ms lease
        // lost a finish to a store slowed by a loaded 2-core machine: the
        // property is the buffer's heartbeats, not a fast store.)
        let cfg = fast_config("pf", 1)
            .lease(Duration::from_millis(1_500))
            .prefetch(prefetch)
            .rescue(false)
            .shutdown_grace(Duration::from_secs(3));
        let mut w = Worker::new(store, cfg).unwrap();
        w.handle("pf", move |ctx| {
            let runs = runs.clone();
            async move {
                runs.lock().unwrap().push(ctx.task().id);
                tokio::time::sleep(Duration::from_millis(1_000)).await;
                Ok(())
            }
        });
        w
    };
    // Rescue passes, as other workers would run them, all along.
    let rescuing = CancellationToken::new();
    let rescuer = {
        let (store, stop) = (ts.store.clone(), rescuing.clone());
        tokio::spawn(async move {
            let mut requeued = 0;
            while !stop.is_cancelled() {
                let r = store.backend().task_rescue_many().await.unwrap();
                requeued += r.requeued + r.failed + r.cancelled;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            requeued
        })
    };
    let stop = CancellationToken::new();
    let run = tokio::spawn(worker(runs.clone(), ts.open().await, N).run(stop.clone()));
    // Four handlers have started by about 3 s (0, 1, 2, 3 s): the last
    // buffered tasks have waited two leases by then.
    baton_testkit::wait::until_true(Duration::from_secs(20), "four handlers started", || async {
        runs.lock().unwrap().len() >= 4
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
    rescuing.cancel();
    let requeued = rescuer.await.unwrap();
    assert_eq!(
        requeued, 0,
        "a buffered task's lease ran out and it was rescued"
    );
    let started = runs.lock().unwrap().clone();
    assert!(
        started.len() < N,
        "shutdown came before the buffer was empty: {started:?}"
    );
    for id in &ids {
        let t = q.task(*id).await.unwrap().expect("task exists");
        if started.contains(id) {
            assert_eq!((t.state, t.attempt), (TaskState::Succeeded, 1), "task {id}");
        } else {
            assert_eq!(
                t.state,
                TaskState::Pending,
                "task {id} was handed back on shutdown"
            );
            assert_eq!(
                t.attempt, 0,
                "task {id}: a hand-back does not count the attempt"
            );
        }
    }
    // Another worker (no prefetch) runs what was handed back.
    let stop = CancellationToken::new();
    let run = tokio::spawn(worker(runs.clone(), ts.open().await, 0).run(stop.clone()));
    for id in &ids {
        let t = wait_state(&q, *id, TaskState::Succeeded, 20).await;
        assert_eq!(t.attempt, 1, "task {id} ran in its first attempt");
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    let mut all = runs.lock().unwrap().clone();
    all.sort_unstable();
    let mut want = ids.clone();
    want.sort_unstable();
    assert_eq!(all, want, "each task ran exactly once");
}

/// A worker's prefetch buffer never holds a task on its last attempt: were
/// the worker to crash, the rescue would count the attempt it never ran and
/// fail the task. With one slot and a buffer of eight, tasks allowed one
/// attempt are held (running in the store) only while they run, one at a
/// time; tasks with attempts to spare are buffered as before; each task
/// runs once, in its first attempt.
pub async fn prefetch_never_holds_a_last_attempt(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let mut ids = Vec::new();
    for i in 0..8 {
        let max = if i % 2 == 0 { 1 } else { 3 };
        let t = TaskBuilder::new("pl", json!(i))
            .queue("pl")
            .max_attempts(max);
        ids.push(q.enqueue(t).await.unwrap().id);
    }
    let runs = Arc::new(std::sync::Mutex::new(Vec::<i64>::new()));
    // At each handler's start: the store's running tasks of this queue,
    // (all, those with one attempt allowed).
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(usize, usize)>::new()));
    // Tasks whose handler returned: a result may wait a moment to ride
    // with the next claim (still `running` in the store meanwhile), so
    // under load a finished task can show beside the next one. Held
    // unstarted is what the property forbids; finished is not that.
    let done = Arc::new(std::sync::Mutex::new(
        std::collections::HashSet::<i64>::new(),
    ));
    // A 2 s lease: the property is the claim's, not the heartbeat's (a
    // 600 ms lease lost prefetched tasks' heartbeats under load).
    let cfg = fast_config("pl", 1)
        .prefetch(8)
        .lease(Duration::from_secs(2))
        .shutdown_grace(Duration::from_secs(3));
    let mut w = Worker::new(ts.open().await, cfg).unwrap();
    {
        let (runs, seen, done, store) =
            (runs.clone(), seen.clone(), done.clone(), ts.store.clone());
        w.handle("pl", move |ctx| {
            let (runs, seen, done, q) = (
                runs.clone(),
                seen.clone(),
                done.clone(),
                Queue::new(store.clone()),
            );
            async move {
                runs.lock().unwrap().push(ctx.task().id);
                let running = q
                    .tasks(&TaskFilter {
                        queue: Some("pl".into()),
                        state: Some(TaskState::Running),
                        limit: 100,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                let last = {
                    let done = done.lock().unwrap();
                    running
                        .iter()
                        .filter(|t| t.max_attempts == 1 && !done.contains(&t.id))
                        .count()
                };
                seen.lock().unwrap().push((running.len(), last));
                tokio::time::sleep(Duration::from_millis(50)).await;
                done.lock().unwrap().insert(ctx.task().id);
                Ok(())
            }
        });
    }
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    for id in &ids {
        let t = wait_state(&q, *id, TaskState::Succeeded, 20).await;
        assert_eq!(t.attempt, 1, "task {id} ran in its first attempt");
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|&(_, last)| last <= 1),
        "a task allowed one attempt was held unstarted beside a running one: {seen:?}"
    );
    assert!(
        seen.iter().any(|&(all, _)| all > 1),
        "tasks with attempts to spare were buffered: {seen:?}"
    );
    let mut all = runs.lock().unwrap().clone();
    all.sort_unstable();
    assert_eq!(all, ids, "each task ran exactly once");
}

pub async fn inspect_list_stats_prune(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let b = ts.store.backend();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            q.enqueue(task("i").queue(if i < 3 { "qa" } else { "qb" }))
                .await
                .unwrap()
                .id,
        );
    }
    let c = claim(&ts.store, "qa", 2, 10_000).await;
    b.task_finish_many(&[(c[0].claim(), Finish::Succeeded)])
        .await
        .map(|r| r == [true])
        .unwrap();
    b.task_finish_many(&[(
        c[1].claim(),
        Finish::Failed {
            error: "e".into(),
            retry_in: None,
        },
    )])
    .await
    .map(|r| r == [true])
    .unwrap();
    clock::advance(&ts, Duration::from_millis(30)).await;
    let st = q.stats().await.unwrap();
    assert_eq!(st.len(), 2);
    assert_eq!(
        (
            st[0].queue.as_str(),
            st[0].pending,
            st[0].succeeded,
            st[0].failed
        ),
        ("qa", 1, 1, 1)
    );
    assert_eq!((st[1].queue.as_str(), st[1].pending), ("qb", 2));
    assert!(st[1].oldest_pending_ms.is_some_and(|ms| ms >= 20));
    let page1 = q
        .tasks(&TaskFilter {
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page1.iter().map(|t| t.id).collect::<Vec<_>>(),
        [ids[4], ids[3]]
    );
    let page2 = q
        .tasks(&TaskFilter {
            limit: 2,
            before_id: Some(ids[3]),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page2.iter().map(|t| t.id).collect::<Vec<_>>(),
        [ids[2], ids[1]]
    );
    let failed = q
        .tasks(&TaskFilter {
            state: Some(TaskState::Failed),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].last_error.as_deref(), Some("e"));
    let qb = q
        .tasks(&TaskFilter {
            queue: Some("qb".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(qb.len(), 2);
    assert_eq!(
        q.prune(Duration::from_secs(3600)).await.unwrap(),
        0,
        "recent tasks are kept"
    );
    assert_eq!(
        q.prune(Duration::ZERO).await.unwrap(),
        2,
        "finished tasks pruned"
    );
    assert_eq!(
        q.tasks(&TaskFilter::default()).await.unwrap().len(),
        3,
        "unfinished tasks kept"
    );
}

pub async fn finish_many_is_per_item_compare_and_set(ts: TestStore) {
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(q.enqueue(task("m").priority(i)).await.unwrap().id);
    }
    let c = claim(&ts.store, "default", 5, 10_000).await;
    assert_eq!(c.len(), 5);
    let cl = |t: &baton::store::Task| t.claim();
    let items = every_kind_batch(b, &c).await;
    assert_eq!(
        b.task_finish_many(&items).await.unwrap(),
        [true, true, true, false, false]
    );
    let q = &q;
    let state = |id| async move { q.task(id).await.unwrap().unwrap() };
    check_every_kind_batch(q, &c).await;
    assert!(b.task_finish_many(&[]).await.unwrap().is_empty());

    // Only successes (the batched fast path): still per item.
    let again = claim(&ts.store, "default", 5, 10_000).await;
    let fresh = again
        .iter()
        .find(|t| t.id != c[3].id)
        .expect("a re-claimed task");
    let items = vec![
        (cl(fresh), Finish::Succeeded),
        (
            Claim {
                token: FencingToken(c[3].token.0 + 1),
                ..c[3].claim()
            },
            Finish::Succeeded,
        ),
        (cl(&c[0]), Finish::Succeeded),
    ];
    assert_eq!(
        b.task_finish_many(&items).await.unwrap(),
        [true, false, false]
    );
    assert_eq!(state(fresh.id).await.state, TaskState::Succeeded);
    assert_eq!(state(c[3].id).await.state, TaskState::Running);
}

/// A batch of only successes, one of them stale (a rescued attempt's
/// claim, placed first, in the middle, and last): every other task
/// succeeds and is reported so, the stale one is refused and its task
/// left as it was. (SQLite writes an all-valid batch without a row per
/// task and falls back to telling them apart when one does not hold:
/// neither path may drop or half-write a batch.)
pub async fn finish_many_of_successes_refuses_only_the_stale(ts: TestStore) {
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    for at in [0, 20, 39] {
        let batch: Vec<_> = (0..40).map(|i| task("s").priority(i)).collect();
        let ids = q.enqueue_many(batch).await.unwrap();
        assert_eq!(ids.len(), 40);
        let c = claim(&ts.store, "default", 40, 10_000).await;
        assert_eq!(c.len(), 40);
        let mut items: Vec<(Claim, Finish)> =
            c.iter().map(|t| (t.claim(), Finish::Succeeded)).collect();
        items[at].0.token = FencingToken(c[at].token.0 + 1);
        let mut want = vec![true; 40];
        want[at] = false;
        assert_eq!(
            b.task_finish_many(&items).await.unwrap(),
            want,
            "stale at {at}"
        );
        for (i, t) in c.iter().enumerate() {
            let info = q.task(t.id).await.unwrap().unwrap();
            let state = if i == at {
                TaskState::Running
            } else {
                TaskState::Succeeded
            };
            assert_eq!(info.state, state, "task {i} of a batch stale at {at}");
        }
        // The stale task's real claim still finishes it, alone.
        assert_eq!(
            b.task_finish_many(&[(c[at].claim(), Finish::Succeeded)])
                .await
                .unwrap(),
            [true]
        );
    }
}

/// Five claimed tasks' finishes of every kind: `c[0]` succeeded, `c[1]`
/// failed with a retry in a minute, `c[2]` handed back, `c[3]` with a
/// stale token, `c[4]` already finished (here, first): the per-item
/// answer must be `[true, true, true, false, false]`.
pub(crate) async fn every_kind_batch(
    b: &dyn baton::store::Backend,
    c: &[baton::store::Task],
) -> Vec<(Claim, Finish)> {
    let cl = |t: &baton::store::Task| t.claim();
    assert_eq!(
        b.task_finish_many(&[(cl(&c[4]), Finish::Succeeded)])
            .await
            .unwrap(),
        [true]
    );
    let stale = Claim {
        token: FencingToken(c[3].token.0 - 1),
        ..c[3].claim()
    };
    vec![
        (cl(&c[0]), Finish::Succeeded),
        (
            cl(&c[1]),
            Finish::Failed {
                error: "boom".into(),
                retry_in: Some(Duration::from_secs(60)),
            },
        ),
        (cl(&c[2]), Finish::HandBack),
        (stale, Finish::Succeeded),
        (cl(&c[4]), Finish::Succeeded),
    ]
}

/// The end states [`every_kind_batch`] leaves: `c[3]`'s stale finish
/// changed nothing.
async fn check_every_kind_batch(q: &Queue, c: &[baton::store::Task]) {
    let state = |id| async move { q.task(id).await.unwrap().unwrap() };
    assert_eq!(state(c[0].id).await.state, TaskState::Succeeded);
    let failed = state(c[1].id).await;
    assert_eq!(
        (failed.state, failed.last_error.as_deref()),
        (TaskState::Pending, Some("boom"))
    );
    let back = state(c[2].id).await;
    assert_eq!((back.state, back.attempt), (TaskState::Pending, 0));
    assert_eq!(
        back.run_at, c[2].run_at,
        "a handed-back task keeps its place in line"
    );
    let kept = state(c[3].id).await;
    assert_eq!(
        (kept.state, kept.attempt),
        (TaskState::Running, 1),
        "a stale attempt changed nothing"
    );
}

/// `task_finish_and_claim`: each finish the same per-item compare-and-set
/// as `task_finish_many` (a stale token or a finished attempt refused and
/// nothing changed), every kind of finish ending as it does there, and the
/// claim as `task_claim` makes it (new fencing tokens, leases); under a
/// cap the claim sees the finishes sent with it.
pub async fn finish_and_claim_is_per_item_compare_and_set(ts: TestStore) {
    use baton::store::{FinishedAndClaimed, TaskFinishAndClaim};
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    for i in 0..5 {
        q.enqueue(task("held").queue("fc_held").priority(i))
            .await
            .unwrap();
    }
    // The claimed tasks differ in every column a claim returns, so a
    // column read from the wrong task (or the wrong column) shows.
    let mut next = Vec::new();
    let slot = chrono::DateTime::parse_from_rfc3339("2026-03-01T06:00:00Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    for i in 0..3 {
        let mut t = TaskBuilder::new(
            format!("next{i}"),
            json!({"n": i, "s": "x".repeat(i as usize)}),
        )
        .queue("fc_next")
        .priority(i)
        .max_attempts(3 + i as u32);
        if i == 1 {
            t = t
                .timeout(Duration::from_millis(1500))
                .slot("fc_job", slot)
                .traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        }
        next.push(q.enqueue(t).await.unwrap().id);
    }
    let c = claim(&ts.store, "fc_held", 5, 10_000).await;
    assert_eq!(c.len(), 5);
    let cl = |t: &baton::store::Task| t.claim();
    let items = every_kind_batch(b, &c).await;
    let req = TaskClaim {
        queue: "fc_next",
        worker: "fc-worker",
        limit: 10,
        lease: Duration::from_secs(10),
        max_running: None,
        per_key_max_running: None,
        buffered: 0,
        fair: false,
    };
    let FinishedAndClaimed { finished, tasks } = b
        .task_finish_and_claim(&TaskFinishAndClaim {
            finish: &items,
            claim: &req,
        })
        .await
        .unwrap();
    assert_eq!(finished, [true, true, true, false, false]);
    assert_eq!(tasks.iter().map(|t| t.id).collect::<Vec<_>>(), next);
    for t in &tasks {
        assert_eq!((t.attempt, t.queue.as_str()), (1, "fc_next"));
        assert!(t.token.0 > 0, "a fencing token: {t:?}");
    }
    let q = &q;
    let state = |id| async move { q.task(id).await.unwrap().unwrap() };
    check_every_kind_batch(q, &c).await;
    for t in &tasks {
        let info = state(t.id).await;
        assert_eq!(info.state, TaskState::Running);
        assert_eq!(info.lease_until, Some(t.lease_until), "task {}", t.id);
        let stored = (
            &info.kind,
            &info.payload,
            info.priority,
            info.max_attempts,
            info.timeout,
            info.run_at,
            &info.job,
            info.slot,
            &info.traceparent,
        );
        let claimed = (
            &t.kind,
            &t.payload,
            t.priority,
            t.max_attempts,
            t.timeout,
            t.run_at,
            &t.job,
            t.slot,
            &t.traceparent,
        );
        assert_eq!(claimed, stored, "task {} as claimed and as stored", t.id);
    }
    assert_eq!(tasks[1].job.as_deref(), Some("fc_job"));
    assert_eq!(tasks[1].timeout, Some(Duration::from_millis(1500)));

    // Successes only (the bare finish): still per item, and an empty
    // claim.
    let items = vec![
        (cl(&tasks[0]), Finish::Succeeded),
        (
            Claim {
                token: FencingToken(tasks[1].token.0 + 1),
                ..tasks[1].claim()
            },
            Finish::Succeeded,
        ),
        (cl(&c[3]), Finish::Succeeded),
    ];
    let r = b
        .task_finish_and_claim(&TaskFinishAndClaim {
            finish: &items,
            claim: &req,
        })
        .await
        .unwrap();
    assert_eq!((r.finished, r.tasks.len()), (vec![true, false, true], 0));
    assert_eq!(state(tasks[0].id).await.state, TaskState::Succeeded);
    assert_eq!(state(tasks[1].id).await.state, TaskState::Running);
    assert_eq!(state(c[3].id).await.state, TaskState::Succeeded);

    // No finishes: the claim alone.
    let more = q.enqueue(task("next").queue("fc_next")).await.unwrap().id;
    let r = b
        .task_finish_and_claim(&TaskFinishAndClaim {
            finish: &[],
            claim: &req,
        })
        .await
        .unwrap();
    assert!(r.finished.is_empty());
    assert_eq!(r.tasks.iter().map(|t| t.id).collect::<Vec<_>>(), [more]);

    // Under a cap of one running task, the claim counts the task finished
    // with it as no longer running.
    let capped = TaskClaim {
        max_running: Some(1),
        limit: 1,
        ..req.clone()
    };
    let r = b
        .task_finish_and_claim(&TaskFinishAndClaim {
            finish: &[
                (cl(&tasks[1]), Finish::Succeeded),
                (cl(&tasks[2]), Finish::Succeeded),
                (cl(&r.tasks[0]), Finish::Succeeded),
            ],
            claim: &TaskClaim {
                queue: "fc_capped",
                ..capped
            },
        })
        .await
        .unwrap();
    assert_eq!((r.finished, r.tasks.len()), (vec![true, true, true], 0));
    let one = q.enqueue(task("c").queue("fc_capped")).await.unwrap().id;
    let two = q.enqueue(task("c").queue("fc_capped")).await.unwrap().id;
    let first = claim(&ts.store, "fc_capped", 1, 10_000).await;
    assert_eq!(first.iter().map(|t| t.id).collect::<Vec<_>>(), [one]);
    let r = b
        .task_finish_and_claim(&TaskFinishAndClaim {
            finish: &[(cl(&first[0]), Finish::Succeeded)],
            claim: &TaskClaim {
                queue: "fc_capped",
                ..capped
            },
        })
        .await
        .unwrap();
    assert_eq!(r.finished, [true]);
    assert_eq!(
        r.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        [two],
        "the capped claim saw the finish sent with it"
    );

    // Under a cap of one running task per key, the same: a stale finish
    // refused, the key's place freed by the finish sent with the claim
    // and taken by its next task only (the cap still holds).
    let keyed = TaskClaim {
        queue: "fc_keyed",
        per_key_max_running: Some(1),
        limit: 3,
        ..req.clone()
    };
    let mut key_a = Vec::new();
    for _ in 0..3 {
        let t = task("k").queue("fc_keyed").concurrency_key("a");
        key_a.push(q.enqueue(t).await.unwrap().id);
    }
    let first = b.task_claim(&keyed).await.unwrap();
    assert_eq!(first.iter().map(|t| t.id).collect::<Vec<_>>(), [key_a[0]]);
    let stale = Claim {
        token: FencingToken(first[0].token.0 + 1),
        ..first[0].claim()
    };
    let r = b
        .task_finish_and_claim(&TaskFinishAndClaim {
            finish: &[
                (stale, Finish::Succeeded),
                (cl(&first[0]), Finish::Succeeded),
            ],
            claim: &keyed,
        })
        .await
        .unwrap();
    assert_eq!(r.finished, [false, true]);
    assert_eq!(
        r.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        [key_a[1]],
        "the key's place freed by the finish sent with the claim, once"
    );
    assert_eq!(state(key_a[0]).await.state, TaskState::Succeeded);
    assert_eq!(state(key_a[2]).await.state, TaskState::Pending);
}

/// A worker's own counters: attempts by queue and outcome, running now,
/// time spent; only recorded results count as succeeded or failed.
pub async fn worker_counters_count_outcomes(ts: TestStore) {
    use baton::queue::Outcome;
    let q = Queue::new(ts.store.clone());
    let ok = q.enqueue(task("ok")).await.unwrap().id;
    let bad = q.enqueue(task("bad").max_attempts(1)).await.unwrap().id;
    let mut w = Worker::new(ts.store.clone(), fast_config("default", 2)).unwrap();
    w.handle("ok", |_| async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(())
    });
    w.handle("bad", |_| async { Err(TaskError::permanent("no")) });
    let counters = w.counters();
    let before = counters.snapshot();
    assert_eq!(before.len(), 0, "nothing before the worker runs");
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    wait_state(&q, ok, TaskState::Succeeded, 10).await;
    wait_state(&q, bad, TaskState::Failed, 10).await;
    // The counter is bumped right after the result is recorded.
    let c = baton_testkit::wait::until(Duration::from_secs(5), "two outcomes counted", || async {
        let c = counters
            .snapshot()
            .remove("default")
            .expect("queue registered");
        (c.ended[&Outcome::Succeeded] + c.ended[&Outcome::Failed] == 2).then_some(c)
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(c.ended[&Outcome::Succeeded], 1, "{c:?}");
    assert_eq!(c.ended[&Outcome::Failed], 1, "{c:?}");
    assert_eq!(c.ended[&Outcome::Lost], 0, "{c:?}");
    assert_eq!(c.running, 0, "{c:?}");
    assert!(c.busy >= Duration::from_millis(50), "{c:?}");
}

/// `max_running`: three workers with room for 3 each, a cluster-wide cap
/// of 2 — never more than 2 handlers at once, and 2 do run together.
pub async fn max_running_caps_the_whole_cluster(ts: TestStore) {
    const N: usize = 12;
    let q = Queue::new(ts.store.clone());
    let batch: Vec<_> = (0..N).map(|i| TaskBuilder::new("cap", json!(i))).collect();
    let ids = q.enqueue_many(batch).await.unwrap();
    let now = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let mut runs = Vec::new();
    for _ in 0..3 {
        let cfg = fast_config("default", 3).max_running("default", 2);
        let mut w = Worker::new(ts.open().await, cfg).unwrap();
        let (now, peak, done) = (now.clone(), peak.clone(), done.clone());
        w.handle("cap", move |_| {
            let (now, peak, done) = (now.clone(), peak.clone(), done.clone());
            async move {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(120)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                done.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        });
        runs.push(tokio::spawn(w.run(stop.clone())));
    }
    for id in &ids {
        wait_state(&q, id.id, TaskState::Succeeded, 30).await;
    }
    stop.cancel();
    for r in runs {
        r.await.unwrap().unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), N);
    assert_eq!(
        peak.load(Ordering::SeqCst),
        2,
        "at most 2 at once across the cluster, and 2 in parallel"
    );
    // A cap of zero is refused with the field's name.
    let bad = fast_config("default", 1).max_running("default", 0);
    let e = Worker::new(ts.store.clone(), bad).err().unwrap();
    assert_eq!(e.field, "max_running", "{e}");
}

/// A claim handed back and claimed again carries a new, higher token: a
/// late heartbeat, progress report, result or resent hand-back of the first
/// claim is refused and changes nothing, although both claims have the
/// same attempt number (a hand-back does not count the attempt).
pub async fn stale_claim_after_hand_back_is_refused(ts: TestStore) {
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    let id = q.enqueue(task("hb").max_attempts(3)).await.unwrap().id;
    let first = claim(&ts.store, "default", 1, 10_000).await.remove(0);
    assert!(b
        .task_finish_many(&[(first.claim(), Finish::HandBack)])
        .await
        .map(|r| r == [true])
        .unwrap());
    let second = claim(&ts.store, "default", 1, 10_000).await.remove(0);
    assert_eq!((second.id, second.attempt), (id, first.attempt));
    assert!(second.token > first.token, "a new claim, a higher token");
    assert!(b
        .task_set_progress(&baton::store::TaskSetProgress {
            claim: second.claim(),
            progress: &json!({"at": 2})
        })
        .await
        .unwrap());
    let before = q.task(id).await.unwrap().unwrap();
    let stale = first.claim();
    assert_eq!(
        b.task_heartbeat_many(&baton::store::TaskHeartbeatMany {
            claims: &[stale],
            lease: Duration::from_secs(60)
        })
        .await
        .unwrap(),
        [Heartbeat::Lost]
    );
    assert!(!b
        .task_set_progress(&baton::store::TaskSetProgress {
            claim: stale,
            progress: &json!({"at": 1})
        })
        .await
        .unwrap());
    for f in [
        Finish::HandBack,
        Finish::Succeeded,
        Finish::Failed {
            error: "late".into(),
            retry_in: Some(Duration::ZERO),
        },
        Finish::Cancelled {
            reason: "late".into(),
        },
    ] {
        assert!(
            !b.task_finish_many(&[(stale, f.clone())])
                .await
                .map(|r| r == [true])
                .unwrap(),
            "stale {f:?} refused"
        );
        assert!(!b
            .task_finish_many(&[(stale, f.clone())])
            .await
            .unwrap()
            .contains(&true));
    }
    assert_eq!(
        q.task(id).await.unwrap().unwrap(),
        before,
        "stale calls changed nothing"
    );
    assert_eq!(
        b.task_heartbeat_many(&baton::store::TaskHeartbeatMany {
            claims: &[second.claim()],
            lease: Duration::from_secs(10)
        })
        .await
        .unwrap(),
        [Heartbeat::Extended]
    );
    assert!(b
        .task_finish_many(&[(second.claim(), Finish::Succeeded)])
        .await
        .map(|r| r == [true])
        .unwrap());
}

/// A `finish_many` batch sent twice (its reply was lost, or part of it
/// committed before an error and the whole batch was retried): the second
/// time every item is refused and nothing changes, even for tasks that
/// were claimed again in between.
pub async fn resent_finish_many_changes_nothing(ts: TestStore) {
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    for i in 0..4 {
        q.enqueue(task("rs").priority(i).max_attempts(3))
            .await
            .unwrap();
    }
    let c = claim(&ts.store, "default", 4, 10_000).await;
    assert_eq!(c.len(), 4);
    let items = vec![
        (c[0].claim(), Finish::Succeeded),
        (
            c[1].claim(),
            Finish::Failed {
                error: "boom".into(),
                retry_in: Some(Duration::ZERO),
            },
        ),
        (c[2].claim(), Finish::HandBack),
        (
            c[3].claim(),
            Finish::Failed {
                error: "fatal".into(),
                retry_in: None,
            },
        ),
    ];
    assert_eq!(b.task_finish_many(&items).await.unwrap(), [true; 4]);
    // The retried and the handed-back task are claimed again.
    let again = claim(&ts.store, "default", 4, 10_000).await;
    let mut again_ids: Vec<i64> = again.iter().map(|t| t.id).collect();
    again_ids.sort_unstable();
    assert_eq!(again_ids, [c[1].id, c[2].id]);
    let mut before = Vec::new();
    for t in &c {
        before.push(q.task(t.id).await.unwrap().unwrap());
    }
    assert_eq!(b.task_finish_many(&items).await.unwrap(), [false; 4]);
    for (t, was) in c.iter().zip(&before) {
        assert_eq!(
            &q.task(t.id).await.unwrap().unwrap(),
            was,
            "task {} changed by a resent batch",
            t.id
        );
    }
    // The current claims still work.
    let now: Vec<(Claim, Finish)> = again
        .iter()
        .map(|t| (t.claim(), Finish::Succeeded))
        .collect();
    assert_eq!(b.task_finish_many(&now).await.unwrap(), [true, true]);
}

/// A failure that would be retried, after a cancel was requested, cancels
/// the task: the error is kept, and no claim takes it again until an
/// explicit retry (which clears the request).
pub async fn cancel_requested_then_retryable_failure_cancels(ts: TestStore) {
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    let id = q
        .enqueue(task("cf").max_attempts(5).unique_key("cf-1"))
        .await
        .unwrap()
        .id;
    let t = claim(&ts.store, "default", 1, 10_000).await.remove(0);
    assert_eq!(q.cancel(id).await.unwrap(), CancelOutcome::Requested);
    assert!(b
        .task_finish_many(&[(
            t.claim(),
            Finish::Failed {
                error: "boom".into(),
                retry_in: Some(Duration::ZERO),
            }
        )])
        .await
        .map(|r| r == [true])
        .unwrap());
    let info = q.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Cancelled);
    assert_eq!(info.errors.len(), 1);
    assert_eq!(info.errors[0].error, "boom");
    assert_eq!(
        info.last_error.as_deref(),
        Some(format!("{CANCEL_REQUESTED}: boom").as_str())
    );
    assert!(info.finished_at.is_some() && info.lease_until.is_none());
    assert!(claim(&ts.store, "default", 5, 10_000).await.is_empty());
    // The key is free again.
    let other = q.enqueue(task("cf").unique_key("cf-1")).await.unwrap();
    assert!(other.inserted);
    q.cancel(other.id).await.unwrap();
    // An explicit retry runs it again, with a higher token.
    assert!(q.retry(id).await.unwrap());
    let info = q.task(id).await.unwrap().unwrap();
    assert!(!info.cancel_requested);
    let t2 = claim(&ts.store, "default", 1, 10_000).await.remove(0);
    assert_eq!(t2.id, id);
    assert!(t2.token > t.token);
}

/// A hand-back (shutdown) after a cancel was requested cancels the task
/// instead of putting it back in line.
pub async fn cancel_requested_then_hand_back_cancels(ts: TestStore) {
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    let id = q
        .enqueue(task("ch").max_attempts(3).unique_key("ch-1"))
        .await
        .unwrap()
        .id;
    let t = claim(&ts.store, "default", 1, 10_000).await.remove(0);
    assert_eq!(q.cancel(id).await.unwrap(), CancelOutcome::Requested);
    assert!(b
        .task_finish_many(&[(t.claim(), Finish::HandBack)])
        .await
        .map(|r| r == [true])
        .unwrap());
    let info = q.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Cancelled);
    assert_eq!(info.attempt, 0, "a handed-back attempt is not counted");
    assert_eq!(info.last_error.as_deref(), Some(CANCEL_REQUESTED));
    assert!(info.errors.is_empty());
    assert!(info.finished_at.is_some() && info.lease_until.is_none());
    assert!(claim(&ts.store, "default", 5, 10_000).await.is_empty());
    assert!(
        q.enqueue(task("ch").unique_key("ch-1"))
            .await
            .unwrap()
            .inserted,
        "the key is free again"
    );
    assert!(
        !b.task_finish_many(&[(t.claim(), Finish::HandBack)])
            .await
            .map(|r| r == [true])
            .unwrap(),
        "a resent hand-back is refused"
    );
}

/// Every claim's token is above every earlier claim's of the task and at
/// least the store's clock in µs when the claim was made: across a
/// hand-back, a rescue and an explicit retry.
pub async fn claim_tokens_rise_across_hand_back_rescue_and_retry(ts: TestStore) {
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    let id = q.enqueue(task("tok").max_attempts(2)).await.unwrap().id;
    let mut tokens: Vec<FencingToken> = Vec::new();
    let next = |lease_ms: u64| {
        let store = ts.store.clone();
        async move {
            let floor = store.now().await.unwrap().timestamp_micros();
            let t = claim(&store, "default", 1, lease_ms).await.remove(0);
            assert_eq!(t.id, id);
            assert!(
                i64::try_from(t.token.0).unwrap() >= floor,
                "token {} below the store clock {floor} µs",
                t.token
            );
            t
        }
    };
    // Hand-back.
    let t = next(10_000).await;
    tokens.push(t.token);
    assert!(b
        .task_finish_many(&[(t.claim(), Finish::HandBack)])
        .await
        .map(|r| r == [true])
        .unwrap());
    // Rescue.
    let t = next(60_000).await;
    tokens.push(t.token);
    clock::advance(&ts, Duration::from_secs(61)).await;
    assert_eq!(b.task_rescue_many().await.unwrap().requeued, 1);
    // Out of attempts, then an explicit retry.
    let t = next(10_000).await;
    tokens.push(t.token);
    assert!(b
        .task_finish_many(&[(
            t.claim(),
            Finish::Failed {
                error: "no".into(),
                retry_in: Some(Duration::ZERO),
            }
        )])
        .await
        .map(|r| r == [true])
        .unwrap());
    assert_eq!(q.task(id).await.unwrap().unwrap().state, TaskState::Failed);
    assert!(q.retry(id).await.unwrap());
    let t = next(10_000).await;
    tokens.push(t.token);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must rise: {tokens:?}"
    );
    assert!(b
        .task_finish_many(&[(t.claim(), Finish::Succeeded)])
        .await
        .map(|r| r == [true])
        .unwrap());
}

/// A task enqueued for a moment (`RunAt::At`) is due from that moment in
/// store time: in the past means now, in the future means not yet. And a
/// retry of a task whose unique key another unfinished task has taken since
/// is refused as a conflict (T4: one unfinished task per key).
/// Enqueue a keyed task with `enqueue`, cancel it, enqueue the same key
/// again (a new task: the cancel freed the key), and check that retrying
/// the first is a conflict that changes nothing. Returns both.
pub async fn retry_onto_a_taken_key<F, Fut>(
    b: &dyn baton::store::Backend,
    enqueue: F,
) -> (baton::store::Enqueued, baton::store::Enqueued)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = baton::store::Enqueued>,
{
    let first = enqueue().await;
    assert_eq!(
        b.task_cancel(first.id).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let second = enqueue().await;
    assert!(
        second.inserted && second.id != first.id,
        "the cancel freed the key"
    );
    let err = b.task_retry(first.id).await.unwrap_err();
    assert!(
        matches!(err, baton::StoreError::Conflict(_)),
        "retrying onto a taken key: {err:?}"
    );
    assert_eq!(
        b.task_get(first.id).await.unwrap().unwrap().state,
        TaskState::Cancelled,
        "a refused retry changes nothing"
    );
    (first, second)
}

pub async fn run_at_and_retry_onto_a_taken_key(ts: TestStore) {
    let b = ts.store.backend();
    let now = ts.store.now().await.unwrap();
    let at = |at| baton::store::NewTask {
        run_at: baton::store::RunAt::At(at),
        ..new_task("at")
    };
    let past = b
        .task_insert_many(&[at(now - chrono::Duration::seconds(5))])
        .await
        .unwrap()[0];
    let future = b
        .task_insert_many(&[at(now + chrono::Duration::seconds(3600))])
        .await
        .unwrap()[0];
    let got = claim(&ts.store, "at", 10, 10_000).await;
    assert_eq!(
        got.iter().map(|t| t.id).collect::<Vec<_>>(),
        [past.id],
        "the past moment is due, the future one is not"
    );
    let info = b.task_get(future.id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Pending);
    assert_eq!(
        info.run_at.timestamp_millis(),
        (now + chrono::Duration::seconds(3600)).timestamp_millis()
    );

    let keyed = || baton::store::NewTask {
        unique_key: Some("rk".into()),
        ..new_task("keys")
    };
    let (first, second) = retry_onto_a_taken_key(b, || async {
        b.task_insert_many(&[keyed()]).await.unwrap()[0]
    })
    .await;
    assert_eq!(
        b.task_cancel(second.id).await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert!(
        b.task_retry(first.id).await.unwrap(),
        "with the key free again"
    );
}

fn new_task(queue: &str) -> baton::store::NewTask {
    baton::store::NewTask {
        queue: queue.into(),
        kind: "k".into(),
        payload: json!({}),
        priority: 0,
        run_at: baton::store::RunAt::Now,
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

/// A payload of exactly `MAX_PAYLOAD_BYTES` of JSON is stored and read
/// back whole on every store; one byte more is refused naming `payload`,
/// alone or inside a batch, and nothing of the refused call is written.
pub async fn payload_limit_is_enforced(ts: TestStore) {
    use baton::queue::MAX_PAYLOAD_BYTES;
    let q = Queue::new(ts.store.clone());
    // A JSON string: its text is the characters plus two quotes.
    let at_limit = serde_json::Value::String("p".repeat(MAX_PAYLOAD_BYTES - 2));
    let over = serde_json::Value::String("p".repeat(MAX_PAYLOAD_BYTES - 1));
    let id = q
        .enqueue(TaskBuilder::new("big", at_limit.clone()))
        .await
        .expect("a payload at the limit is accepted")
        .id;
    let got = q.task(id).await.unwrap().expect("the task");
    assert_eq!(got.payload, at_limit, "stored and read back whole");
    match q.enqueue(TaskBuilder::new("big", over.clone())).await {
        Err(baton::Error::Invalid(e)) => {
            assert_eq!(e.field, "payload");
            assert!(e.problem.contains("8 MiB"), "{}", e.problem);
        }
        other => panic!("an oversized payload was not refused: {other:?}"),
    }
    let batch = vec![
        TaskBuilder::new("small", serde_json::json!({})),
        TaskBuilder::new("big", over),
    ];
    assert!(matches!(
        q.enqueue_many(batch).await,
        Err(baton::Error::Invalid(_))
    ));
    let all = q
        .tasks(&baton::store::TaskFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 1, "only the task at the limit exists");
}

/// A paused queue yields no claims, on this client or another one (the
/// flag lives in the store), while other queues claim as usual; enqueue
/// is still accepted; stats show the flag, also for a queue with no tasks.
pub async fn paused_queue_gives_no_claims_while_others_do(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    for queue in ["held", "free"] {
        for _ in 0..3 {
            q.enqueue(task("k").queue(queue)).await.unwrap();
        }
    }
    q.pause("held").await.unwrap();
    q.pause("held").await.unwrap(); // twice is fine
    q.pause("empty").await.unwrap();
    let other = ts.open().await;
    assert!(claim(&other, "held", 10, 30_000).await.is_empty(), "paused");
    assert!(
        claim(&ts.store, "held", 10, 30_000).await.is_empty(),
        "paused"
    );
    // A capped claim goes through the same check.
    let capped = other
        .backend()
        .task_claim(&TaskClaim {
            queue: "held",
            worker: "w",
            limit: 10,
            lease: Duration::from_secs(30),
            max_running: Some(5),
            per_key_max_running: None,
            buffered: 0,
            fair: false,
        })
        .await
        .unwrap();
    assert!(capped.is_empty(), "paused (capped claim)");
    assert_eq!(claim(&other, "free", 10, 30_000).await.len(), 3);
    // Enqueue is still accepted while paused.
    let late = q.enqueue(task("late").queue("held")).await.unwrap();
    assert!(late.inserted);
    let stats = q.stats().await.unwrap();
    let get = |name: &str| stats.iter().find(|s| s.queue == name).cloned();
    let held = get("held").expect("held listed");
    assert!(held.paused);
    assert_eq!((held.pending, held.running), (4, 0));
    assert!(!get("free").expect("free listed").paused);
    let empty = get("empty").expect("a paused queue without tasks is listed");
    assert!(empty.paused);
    assert_eq!(empty.pending, 0);
    // A worker of another client leaves the paused queue alone.
    let ran = Arc::new(AtomicUsize::new(0));
    let mut w = Worker::new(other.clone(), fast_config("held", 4)).unwrap();
    let r2 = ran.clone();
    w.handle_any(move |_| {
        let r = r2.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "a worker claimed from a paused queue"
    );
    stop.cancel();
    run.await.unwrap().unwrap();
    // Invalid names are refused with the field named.
    let err = q.pause("").await.unwrap_err().to_string();
    assert!(err.contains("queue"), "{err}");
}

/// Resume makes the queue's tasks claimable again, and wakes an idle
/// worker without waiting for its (long) poll.
pub async fn resume_makes_tasks_claimable_and_wakes_workers(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    q.pause("default").await.unwrap();
    let id = q.enqueue(task("ping")).await.unwrap().id;
    let cfg = fast_config("default", 1).poll_interval(Duration::from_secs(30));
    let mut w = Worker::new(ts.store.clone(), cfg).unwrap();
    w.handle("ping", |_| async { Ok(()) });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(400)).await; // past the first tick
    assert_eq!(
        q.task(id).await.unwrap().unwrap().state,
        TaskState::Pending,
        "paused: not claimed"
    );
    let t0 = Instant::now();
    q.resume("default").await.unwrap();
    wait_state(&q, id, TaskState::Succeeded, 5).await;
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "woken by the resume in {:?}, not at the 30 s poll",
        t0.elapsed()
    );
    stop.cancel();
    run.await.unwrap().unwrap();
    let stats = q.stats().await.unwrap();
    assert!(stats.iter().all(|s| !s.paused), "{stats:?}");
    q.resume("default").await.unwrap(); // resuming a running queue is fine
}

/// Pausing touches no running task: its claim heartbeats and finishes as
/// before; only new claims stop.
pub async fn pause_leaves_running_tasks_alone(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let a = q.enqueue(task("a")).await.unwrap().id;
    let b = q.enqueue(task("b")).await.unwrap().id;
    let got = claim(&ts.store, "default", 1, 30_000).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, a);
    q.pause("default").await.unwrap();
    let running = q.task(a).await.unwrap().unwrap();
    assert_eq!(running.state, TaskState::Running);
    let beat = ts
        .store
        .backend()
        .task_heartbeat_many(&baton::store::TaskHeartbeatMany {
            claims: &[got[0].claim()],
            lease: Duration::from_secs(30),
        })
        .await
        .unwrap();
    assert_eq!(beat, vec![Heartbeat::Extended]);
    assert!(claim(&ts.store, "default", 5, 30_000).await.is_empty());
    let done = ts
        .store
        .backend()
        .task_finish_many(&[(got[0].claim(), Finish::Succeeded)])
        .await
        .unwrap();
    assert_eq!(done, vec![true]);
    assert_eq!(
        q.task(a).await.unwrap().unwrap().state,
        TaskState::Succeeded
    );
    assert_eq!(q.task(b).await.unwrap().unwrap().state, TaskState::Pending);
    q.resume("default").await.unwrap();
    let next = claim(&ts.store, "default", 5, 30_000).await;
    assert_eq!(next.iter().map(|t| t.id).collect::<Vec<_>>(), vec![b]);
}

/// The enqueuer's trace context (`traceparent`) is kept on the task: read
/// back by `task_get` and `task_list`, handed to the worker with the claim
/// (one enqueue alone, and a batch with and without unique keys); a task
/// enqueued without one has none; a malformed one is refused naming the
/// field, and nothing is written.
/// A claim answers each task as the store holds it, every field, with
/// set and unset optional fields mixed in one claim (PostgreSQL reads its
/// claim's packed arrays itself, MySQL its text-protocol dates: a
/// misread field or a NULL read as a value shows here).
pub async fn claim_answers_every_field_as_stored(ts: TestStore) {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let q = Queue::new(ts.store.clone());
    let b = ts.store.backend();
    let past = b.now().await.unwrap() - chrono::Duration::microseconds(1_234_567);
    let ids = q
        .enqueue_many(vec![
            TaskBuilder::new("ünïcode", json!({"s": "é\u{1e}\"x\"", "n": [1, 2.5, null]}))
                .queue("fields")
                .priority(-3)
                .max_attempts(7)
                .timeout(Duration::from_millis(1500))
                .run_at(past)
                .traceparent(TP),
            TaskBuilder::new("plain", json!(null))
                .queue("fields")
                .run_at(past),
            TaskBuilder::new("big", json!({"big": i64::MAX, "neg": -1}))
                .queue("fields")
                .priority(100)
                .max_attempts(1)
                .run_at(past),
        ])
        .await
        .unwrap();
    let claimed = claim(&ts.store, "fields", 10, 30_000).await;
    assert_eq!(claimed.len(), 3, "every task claimed");
    for id in ids.iter().map(|t| t.id) {
        let t = claimed.iter().find(|t| t.id == id).unwrap();
        let info = b.task_get(id).await.unwrap().unwrap();
        assert_eq!(t.queue, "fields");
        assert_eq!(t.kind, info.kind, "kind of {id}");
        assert_eq!(t.payload, info.payload, "payload of {id}");
        assert_eq!(t.priority, info.priority, "priority of {id}");
        assert_eq!(t.attempt, info.attempt, "attempt of {id}");
        assert_eq!(t.attempt, 1, "attempt of {id}");
        assert_eq!(t.max_attempts, info.max_attempts, "max_attempts of {id}");
        assert_eq!(t.timeout, info.timeout, "timeout of {id}");
        assert_eq!(t.run_at, info.run_at, "run_at of {id}");
        assert_eq!(Some(t.lease_until), info.lease_until, "lease_until of {id}");
        assert_eq!(t.job, info.job, "job of {id}");
        assert_eq!(t.slot, info.slot, "slot of {id}");
        assert_eq!(t.traceparent, info.traceparent, "traceparent of {id}");
        // The fencing token is the stored one: a write under it holds.
        let progress = json!({"at": 1});
        let set = baton::store::TaskSetProgress {
            claim: t.claim(),
            progress: &progress,
        };
        assert!(b.task_set_progress(&set).await.unwrap(), "token of {id}");
    }
    let first = claimed.iter().find(|t| t.id == ids[0].id).unwrap();
    assert_eq!(
        (
            first.priority,
            first.max_attempts,
            first.timeout,
            first.traceparent.as_deref()
        ),
        (-3, 7, Some(Duration::from_millis(1500)), Some(TP))
    );
    assert_eq!(first.kind, "ünïcode");
    assert_eq!(
        first.payload,
        json!({"s": "é\u{1e}\"x\"", "n": [1, 2.5, null]})
    );
    let plain = claimed.iter().find(|t| t.id == ids[1].id).unwrap();
    assert_eq!((plain.timeout, plain.traceparent.as_deref()), (None, None));
    assert_eq!(plain.payload, json!(null));
}

pub async fn traceparent_round_trips(ts: TestStore) {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const TP2: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let q = Queue::new(ts.store.clone());
    let b = ts.store.backend();
    let one = q
        .enqueue(task("traced").queue("tp").traceparent(TP))
        .await
        .unwrap();
    let batch = q
        .enqueue_many(vec![
            task("plain").queue("tp"),
            task("keyed")
                .queue("tp")
                .unique_key("tp-key")
                .traceparent(TP2),
            task("bulk").queue("tp").traceparent(TP2),
        ])
        .await
        .unwrap();
    let want = [
        (one.id, Some(TP)),
        (batch[0].id, None),
        (batch[1].id, Some(TP2)),
        (batch[2].id, Some(TP2)),
    ];
    for (id, tp) in want {
        let info = b.task_get(id).await.unwrap().unwrap();
        assert_eq!(info.traceparent.as_deref(), tp, "task_get of {id}");
    }
    let listed = b
        .task_list(&TaskFilter {
            queue: Some("tp".into()),
            ..TaskFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 4);
    for (id, tp) in want {
        let t = listed.iter().find(|t| t.id == id).unwrap();
        assert_eq!(t.traceparent.as_deref(), tp, "task_list of {id}");
    }
    let claimed = claim(&ts.store, "tp", 10, 30_000).await;
    assert_eq!(claimed.len(), 4);
    for (id, tp) in want {
        let t = claimed.iter().find(|t| t.id == id).unwrap();
        assert_eq!(t.traceparent.as_deref(), tp, "claim of {id}");
    }

    for bad in [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "not a traceparent",
    ] {
        let err = q
            .enqueue(task("bad").queue("tp-bad").traceparent(bad))
            .await
            .unwrap_err();
        match err {
            baton::Error::Invalid(i) => {
                assert_eq!(i.field, "traceparent");
                assert!(i.problem.contains("W3C traceparent"), "{}", i.problem);
            }
            other => panic!("{bad:?}: {other}"),
        }
    }
    let none = b
        .task_list(&TaskFilter {
            queue: Some("tp-bad".into()),
            ..TaskFilter::default()
        })
        .await
        .unwrap();
    assert!(none.is_empty(), "nothing written for a bad traceparent");
}
