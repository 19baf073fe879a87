//! Tasks start on time: work due later (a delayed task, a retry after its
//! backoff) is announced with its due time, and workers claim it when the
//! store's clock reaches it — not at their next poll, which these tests put
//! 30 s away.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::queue::{Backoff, Queue, TaskBuilder, TaskError, Worker, WorkerConfig};
use baton::store::{Finish, TaskClaim, TaskInfo, TaskState};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::TestStore;

/// How late a task may start after its run_at on this loaded machine. The
/// poll is 30 s away, so anything under this proves the timer fired.
const LATE: Duration = Duration::from_millis(400);

fn slow_poll_config() -> WorkerConfig {
    WorkerConfig::default()
        .queue("default", 2)
        .poll_interval(Duration::from_secs(30))
        .backoff(Backoff {
            base: Duration::from_millis(1500),
            factor: 1.0,
            max: Duration::from_millis(1500),
            jitter: 0.0,
        })
}

/// A worker on its own store handle that records each attempt's start.
async fn start_worker(
    ts: &TestStore,
    fail_first: bool,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), baton::Error>>,
    Arc<Mutex<Vec<Instant>>>,
) {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let mut w = Worker::new(ts.open().await, slow_poll_config()).unwrap();
    let s2 = starts.clone();
    w.handle_any(move |ctx| {
        let s = s2.clone();
        async move {
            s.lock().unwrap().push(Instant::now());
            if fail_first && ctx.task().attempt == 1 {
                return Err(TaskError::retry("first attempt fails"));
            }
            Ok(())
        }
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    // Let it go idle: its first poll tick has passed, the next is 30 s away.
    tokio::time::sleep(Duration::from_millis(500)).await;
    (stop, run, starts)
}

async fn wait_done(q: &Queue, id: i64, secs: u64) -> TaskInfo {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let t = q.task(id).await.unwrap().unwrap();
        if t.state == TaskState::Succeeded {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "task {id} still {:?} after {secs}s (run_at {}, now {})",
            t.state,
            t.run_at,
            q.store().now().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `started_at - run_at` in store time, which must be small and not negative.
fn lateness(t: &TaskInfo) -> chrono::Duration {
    t.started_at.expect("started") - t.run_at
}

pub async fn delayed_task_starts_at_its_run_at(ts: TestStore) {
    let (stop, run, starts) = start_worker(&ts, false).await;
    // Enqueued through another handle, as another instance would.
    let q = Queue::new(ts.store.clone());
    let id = q
        .enqueue(TaskBuilder::new("later", json!({})).delay(Duration::from_millis(1500)))
        .await
        .unwrap()
        .id;
    let t = wait_done(&q, id, 10).await;
    let late = lateness(&t);
    assert!(
        late >= chrono::Duration::zero() && late.to_std().unwrap() < LATE,
        "started {late} after its run_at (poll is 30 s away)"
    );
    assert_eq!(starts.lock().unwrap().len(), 1);
    stop.cancel();
    run.await.unwrap().unwrap();
}

pub async fn retry_written_elsewhere_starts_when_its_backoff_ends(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    // Another instance claims the task and fails its first attempt: only
    // the store's announcement can tell our worker when the retry is due.
    let id = q
        .enqueue(TaskBuilder::new("retry", json!({})).max_attempts(3))
        .await
        .unwrap()
        .id;
    let got = ts
        .store
        .backend()
        .task_claim(&TaskClaim {
            queue: "default",
            worker: "elsewhere",
            limit: 1,
            lease: Duration::from_secs(30),
            max_running: None,
            per_key_max_running: None,
            buffered: 0,
            fair: false,
        })
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    let (stop, run, starts) = start_worker(&ts, false).await;
    let ok = ts
        .store
        .backend()
        .task_finish_many(&[(
            got[0].claim(),
            Finish::Failed {
                error: "boom".into(),
                retry_in: Some(Duration::from_millis(1500)),
            },
        )])
        .await
        .map(|r| r == [true])
        .unwrap();
    assert!(ok);
    let t = wait_done(&q, id, 10).await;
    assert_eq!(t.attempt, 2);
    let late = lateness(&t);
    assert!(
        late >= chrono::Duration::zero() && late.to_std().unwrap() < LATE,
        "retry started {late} after its run_at (poll is 30 s away)"
    );
    assert_eq!(starts.lock().unwrap().len(), 1);
    stop.cancel();
    run.await.unwrap().unwrap();
}

pub async fn own_retry_starts_when_its_backoff_ends(ts: TestStore) {
    let (stop, run, starts) = start_worker(&ts, true).await;
    let q = Queue::new(ts.store.clone());
    let id = q
        .enqueue(TaskBuilder::new("flaky", json!({})).max_attempts(3))
        .await
        .unwrap()
        .id;
    let t = wait_done(&q, id, 10).await;
    assert_eq!(t.attempt, 2);
    let late = lateness(&t);
    assert!(
        late >= chrono::Duration::zero() && late.to_std().unwrap() < LATE,
        "retry started {late} after its run_at (poll is 30 s away)"
    );
    let s = starts.lock().unwrap().clone();
    assert_eq!(s.len(), 2);
    let gap = s[1] - s[0];
    assert!(
        gap >= Duration::from_millis(1400) && gap < Duration::from_millis(1500) + LATE,
        "second attempt {gap:?} after the first (backoff 1.5 s)"
    );
    stop.cancel();
    run.await.unwrap().unwrap();
}
