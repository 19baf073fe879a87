//! A hand-back that fails with a retryable error (the store briefly
//! unavailable, a MySQL deadlock victim) is sent again, so the tasks go
//! back unstarted with their attempt uncounted instead of waiting for
//! their lease to lapse and the rescue to count it. The worker's buffered
//! tasks under a rate per key are handed back when they cannot start
//! within their hold; the store below fails the first hand-back.
//! On SQLite, in a temporary file.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use baton::queue::{Queue, RateLimit, TaskBuilder, Worker, WorkerConfig};
use baton::store::*;
use baton::{Store, StoreError};
use tokio_util::sync::CancellationToken;

/// Forwards every call; the first `task_finish_many` that hands a task
/// back fails as a store that was briefly unavailable would.
struct FailsOneHandBack {
    inner: Store,
    failed: AtomicUsize,
}

impl FailsOneHandBack {
    fn fwd(&self) -> &dyn Backend {
        self.inner.backend()
    }
}

macro_rules! failing_backend {
    ($($(#[$m:meta])* fn $name:ident($($arg:ident : $ty:ty),*) -> $out:ty;)*) => {
        #[async_trait]
        impl Backend for FailsOneHandBack {
            fn kind(&self) -> &'static str {
                self.inner.backend().kind()
            }
            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$out, StoreError> {
                    failing_backend!(@check self $name $($arg)*);
                    self.fwd().$name($($arg),*).await
                }
            )*
        }
    };
    (@check $s:ident task_finish_many $items:ident) => {
        if $items.iter().any(|(_, f)| matches!(f, Finish::HandBack))
            && $s.failed.fetch_add(1, Ordering::SeqCst) == 0
        {
            return Err(StoreError::Unavailable("test: the first hand-back fails".into()));
        }
    };
    (@check $s:ident $other:ident $($arg:ident)*) => {};
}

baton::seam_methods!(failing_backend);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_back_that_failed_is_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let store = Store::connect(&url).await.unwrap();
    let q = Queue::new(store.clone());
    let batch = (0..4)
        .map(|i| {
            TaskBuilder::new("keyed", serde_json::json!({ "i": i }))
                .queue("kw")
                .concurrency_key("k")
        })
        .collect();
    let ids: Vec<i64> = q
        .enqueue_many(batch)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let flaky = Arc::new(FailsOneHandBack {
        inner: store.clone(),
        failed: AtomicUsize::new(0),
    });
    let through = Store::from_backend(flaky.clone(), &url);
    // One slot, a buffer of eight, handlers of 500 ms: the buffered tasks
    // cannot start within their 250 ms hold and go back. A lease of 3 s:
    // a task left running lapses and is rescued within the test.
    let cfg = WorkerConfig::default()
        .queue("kw", 1)
        .prefetch(8)
        .lease(Duration::from_secs(3))
        .poll_interval(Duration::from_millis(100))
        .per_key_rate_limit("kw", RateLimit::new(1000, Duration::from_secs(10)).unwrap());
    let mut w = Worker::new(through, cfg).unwrap();
    w.handle("keyed", |_ctx| async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok::<_, baton::queue::TaskError>(())
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    for id in &ids {
        baton_testkit::wait::task_state(&q, *id, TaskState::Succeeded, Duration::from_secs(30))
            .await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    assert!(
        flaky.failed.load(Ordering::SeqCst) >= 1,
        "no hand-back was tried: the test proves nothing"
    );
    for id in &ids {
        let t = q.task(*id).await.unwrap().unwrap();
        assert_eq!(
            (t.attempt, t.errors.len()),
            (1, 0),
            "a task was left to the rescue: {t:?}"
        );
    }
}
