//! An idle worker's store traffic: at most about one query per second
//! (claims in turn, a rescue every fifth tick), measured by wrapping the
//! real backend in a counting one — the seam makes that one small type.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use baton::queue::{Worker, WorkerConfig};
use baton::store::*;
use baton::{Store, StoreError};
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::TestStore;

/// Counts every call, then forwards it.
struct Counting {
    inner: Store,
    calls: Arc<AtomicUsize>,
}

impl Counting {
    fn b(&self) -> &dyn Backend {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.backend()
    }
}

#[async_trait]
impl Backend for Counting {
    fn kind(&self) -> &'static str {
        self.inner.backend().kind()
    }
    async fn migrate(&self) -> Result<(), StoreError> {
        self.b().migrate().await
    }
    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        self.b().now().await
    }
    async fn lock_acquire(&self, req: &LockRequest<'_>) -> Result<Acquire, StoreError> {
        self.b().lock_acquire(req).await
    }
    async fn lock_extend(
        &self,
        name: &str,
        token: FencingToken,
        at_most: Duration,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.b().lock_extend(name, token, at_most).await
    }
    async fn lock_release(
        &self,
        name: &str,
        token: FencingToken,
        at_least: Duration,
    ) -> Result<bool, StoreError> {
        self.b().lock_release(name, token, at_least).await
    }
    async fn lock_get(&self, name: &str) -> Result<Option<LockInfo>, StoreError> {
        self.b().lock_get(name).await
    }
    async fn lock_list(&self) -> Result<Vec<LockInfo>, StoreError> {
        self.b().lock_list().await
    }
    async fn enqueue(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>, StoreError> {
        self.b().enqueue(tasks).await
    }
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<Task>, StoreError> {
        self.b().claim(req).await
    }
    async fn heartbeat(
        &self,
        claims: &[Claim],
        lease: Duration,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        self.b().heartbeat(claims, lease).await
    }
    async fn finish(&self, claim: Claim, finish: &Finish) -> Result<bool, StoreError> {
        self.b().finish(claim, finish).await
    }
    async fn progress(
        &self,
        claim: Claim,
        progress: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        self.b().progress(claim, progress).await
    }
    async fn rescue(&self) -> Result<Rescued, StoreError> {
        self.b().rescue().await
    }
    async fn cancel(&self, id: i64) -> Result<CancelOutcome, StoreError> {
        self.b().cancel(id).await
    }
    async fn retry(&self, id: i64) -> Result<bool, StoreError> {
        self.b().retry(id).await
    }
    async fn task(&self, id: i64) -> Result<Option<TaskInfo>, StoreError> {
        self.b().task(id).await
    }
    async fn tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, StoreError> {
        self.b().tasks(filter).await
    }
    async fn stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        self.b().stats().await
    }
    async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.b().prune(older_than).await
    }
    async fn subscribe(&self) -> Result<tokio::sync::broadcast::Receiver<String>, StoreError> {
        // Setting up the wake-up channel is not a per-second query.
        self.inner.backend().subscribe().await
    }
    async fn job_register(&self, job: &str) -> Result<JobState, StoreError> {
        self.b().job_register(job).await
    }
    async fn job_advance(&self, adv: &SlotAdvance<'_>) -> Result<Advanced, StoreError> {
        self.b().job_advance(adv).await
    }
    async fn job_set_paused(&self, job: &str, paused: bool) -> Result<bool, StoreError> {
        self.b().job_set_paused(job, paused).await
    }
    async fn job_list(&self) -> Result<Vec<JobState>, StoreError> {
        self.b().job_list().await
    }
}

pub async fn idle_worker_makes_about_one_query_per_second(ts: TestStore) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Store::from_backend(
        Arc::new(Counting {
            inner: ts.store.clone(),
            calls: calls.clone(),
        }),
        &ts.url,
    );
    // Two queues, default 1 s poll: still one query per tick in all.
    let cfg = WorkerConfig::default().queue("a", 4).queue("b", 4);
    let mut w = Worker::new(counted, cfg);
    w.handle_any(|_| async { Ok(()) });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = calls.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let n = calls.load(Ordering::SeqCst) - start;
    stop.cancel();
    run.await.unwrap().unwrap();
    assert!(
        (4..=7).contains(&n),
        "{n} store calls in 6 idle seconds (expected about 6)"
    );
}
