//! A handler's say over its task: a snooze (`Finish::Snoozed`: pending
//! again later by the store's clock, the attempt not counted, fenced on the
//! claim token like every finish), a cancel, a retry after a delay of its
//! own, and a kind's own backoff.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton::queue::{Backoff, Queue, TaskBuilder, TaskError, Worker, WorkerConfig};
use baton::store::{Finish, TaskClaim, TaskState};
use baton::Store;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use baton_testkit::clock;

use crate::TestStore;

async fn claim(store: &Store, queue: &str) -> Vec<baton::store::Task> {
    store
        .backend()
        .task_claim(&TaskClaim {
            queue,
            worker: "test-worker",
            limit: 5,
            lease: Duration::from_secs(10),
            max_running: None,
            per_key_max_running: None,
            buffered: 0,
            fair: false,
        })
        .await
        .unwrap()
}

/// The store half: a snoozed task is pending, due `run_in` after the
/// store's now, its attempt not counted and its errors untouched; a resent
/// or stale snooze is refused; claimed again it carries a higher token.
pub async fn snoozed_task_is_pending_later_and_uncounted(ts: TestStore) {
    let (b, q) = (ts.store.backend(), Queue::new(ts.store.clone()));
    // One attempt only: a snooze that counted it would leave none.
    let id = q
        .enqueue(TaskBuilder::new("nap", json!({})).max_attempts(1))
        .await
        .unwrap()
        .id;
    let t = claim(&ts.store, "default").await.remove(0);
    assert_eq!((t.id, t.attempt), (id, 1));
    let run_in = Duration::from_millis(1_500);
    let before = ts.store.now().await.unwrap();
    let snooze = Finish::Snoozed { run_in };
    assert_eq!(
        b.task_finish_many(&[(t.claim(), snooze.clone())])
            .await
            .unwrap(),
        [true]
    );
    let after = ts.store.now().await.unwrap();
    let info = q.task(id).await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Pending);
    assert_eq!(info.attempt, 0, "a snooze does not count the attempt");
    assert!(
        info.errors.is_empty() && info.last_error.is_none(),
        "{info:?}"
    );
    assert!(info.lease_until.is_none() && info.finished_at.is_none());
    let run_in = chrono::Duration::from_std(run_in).unwrap();
    let slack = chrono::Duration::milliseconds(5);
    assert!(
        info.run_at >= before + run_in - slack && info.run_at <= after + run_in + slack,
        "run_at {} not {run_in} after the store's now ({before} .. {after})",
        info.run_at
    );
    // Fenced: the same claim again (a resent reply) changes nothing.
    assert_eq!(
        b.task_finish_many(&[(t.claim(), snooze.clone())])
            .await
            .unwrap(),
        [false],
        "a resent snooze is refused"
    );
    assert_eq!(q.task(id).await.unwrap().unwrap().run_at, info.run_at);
    assert!(claim(&ts.store, "default").await.is_empty(), "not due yet");
    // Due at its run_at by the store's clock: claimed as attempt 1 again.
    let wait = (info.run_at - ts.store.now().await.unwrap())
        .to_std()
        .unwrap_or_default();
    clock::advance(&ts, wait + Duration::from_millis(50)).await;
    let again = claim(&ts.store, "default").await;
    assert_eq!(again.len(), 1, "due after the snooze");
    assert_eq!((again[0].id, again[0].attempt), (id, 1));
    assert!(again[0].token.0 > t.token.0, "a new claim, a higher token");
    // The old claim cannot snooze (nor finish) the new attempt.
    assert_eq!(
        b.task_finish_many(&[(t.claim(), snooze)]).await.unwrap(),
        [false]
    );
    assert_eq!(q.task(id).await.unwrap().unwrap().state, TaskState::Running);
    assert_eq!(
        b.task_finish_many(&[(again[0].claim(), Finish::Succeeded)])
            .await
            .unwrap(),
        [true]
    );
}

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .queue("default", 2)
        .lease(Duration::from_secs(5))
        .poll_interval(Duration::from_millis(100))
        .shutdown_grace(Duration::from_millis(300))
        .backoff(Backoff {
            base: Duration::from_secs(3600),
            jitter: 0.0,
            ..Backoff::default()
        })
}

async fn wait_state(q: &Queue, id: i64, state: TaskState) -> baton::store::TaskInfo {
    baton_testkit::wait::task_state(q, id, state, Duration::from_secs(15)).await
}

/// The worker half: a handler that snoozes twice on a one-attempt task
/// still gets to succeed (neither snooze counted); `cancel` ends a task
/// for good with its reason; `retry_in` and a kind's own backoff win over
/// the worker's hour-long one.
pub async fn handler_snooze_cancel_and_retry_delays(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let nap = q
        .enqueue(TaskBuilder::new("nap", json!({})).max_attempts(1))
        .await
        .unwrap()
        .id;
    let stop_it = q
        .enqueue(TaskBuilder::new("doomed", json!({})).max_attempts(5))
        .await
        .unwrap()
        .id;
    let soon = q
        .enqueue(TaskBuilder::new("soon", json!({})).max_attempts(2))
        .await
        .unwrap()
        .id;
    let own = q
        .enqueue(TaskBuilder::new("own", json!({})).max_attempts(2))
        .await
        .unwrap()
        .id;
    let mut w = Worker::new(ts.store.clone(), config()).unwrap();
    let naps = Arc::new(AtomicU32::new(0));
    let n = naps.clone();
    w.handle("nap", move |ctx| {
        let n = n.clone();
        async move {
            assert_eq!(ctx.task().attempt, 1, "a snooze never counts");
            if n.fetch_add(1, Ordering::SeqCst) < 2 {
                return Err(TaskError::snooze(Duration::from_millis(200)));
            }
            Ok(())
        }
    });
    w.handle("doomed", |_| async {
        Err(TaskError::cancel("account closed"))
    });
    let retry_once = |ctx: baton::queue::TaskContext| async move {
        if ctx.task().attempt == 1 {
            return Err(TaskError::retry("flaky"));
        }
        Ok(())
    };
    w.handle("soon", move |ctx| async move {
        if ctx.task().attempt == 1 {
            return Err(TaskError::retry("rate limited").retry_in(Duration::from_millis(100)));
        }
        Ok(())
    });
    w.handle("own", retry_once);
    w.backoff_for(
        "own",
        Backoff {
            base: Duration::from_millis(100),
            jitter: 0.0,
            ..Backoff::default()
        },
    );
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    let napped = wait_state(&q, nap, TaskState::Succeeded).await;
    let doomed = wait_state(&q, stop_it, TaskState::Cancelled).await;
    let soon = wait_state(&q, soon, TaskState::Succeeded).await;
    let own = wait_state(&q, own, TaskState::Succeeded).await;
    stop.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(naps.load(Ordering::SeqCst), 3);
    assert_eq!(napped.attempt, 1);
    assert!(napped.errors.is_empty(), "{napped:?}");
    assert_eq!(
        doomed.attempt, 1,
        "cancelled on its first attempt, not retried"
    );
    assert_eq!(doomed.last_error.as_deref(), Some("account closed"));
    assert_eq!((soon.attempt, own.attempt), (2, 2));
    assert_eq!(soon.errors[0].error, "rate limited");
    assert_eq!(own.errors[0].error, "flaky");
}
