//! An idle worker's store traffic: about one claim per second (queues in
//! turn), plus a rescue every five seconds and a reading of the store's
//! clock once a minute, each on a timer of its own; measured by wrapping the
//! real backend in a counting one — the seam makes that one small type.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use baton::queue::{Worker, WorkerConfig};
use baton::store::*;
use baton::{Store, StoreError};
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::TestStore;

/// Counts every call by method, then forwards it.
struct Counting {
    inner: Store,
    calls: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

impl Counting {
    fn count(&self, method: &'static str) -> &dyn Backend {
        *self.calls.lock().unwrap().entry(method).or_default() += 1;
        self.inner.backend()
    }
}

#[async_trait]
impl Backend for Counting {
    fn kind(&self) -> &'static str {
        self.inner.backend().kind()
    }
    async fn migrate(&self) -> Result<(), StoreError> {
        self.count("migrate").migrate().await
    }
    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        self.count("now").now().await
    }
    async fn schema_status(&self) -> Result<baton::store::SchemaStatus, StoreError> {
        self.count("schema_status").schema_status().await
    }
    async fn lock_acquire(&self, req: &LockRequest<'_>) -> Result<Acquire, StoreError> {
        self.count("lock_acquire").lock_acquire(req).await
    }
    async fn lock_extend(
        &self,
        params: &baton::store::LockExtend<'_>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.count("lock_extend").lock_extend(params).await
    }
    async fn lock_release(
        &self,
        params: &baton::store::LockRelease<'_>,
    ) -> Result<bool, StoreError> {
        self.count("lock_release").lock_release(params).await
    }
    async fn lock_get(&self, name: &str) -> Result<Option<LockInfo>, StoreError> {
        self.count("lock_get").lock_get(name).await
    }
    async fn lock_list(&self) -> Result<Vec<LockInfo>, StoreError> {
        self.count("lock_list").lock_list().await
    }
    async fn task_insert_many(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>, StoreError> {
        self.count("enqueue").task_insert_many(tasks).await
    }
    async fn task_claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<Task>, StoreError> {
        self.count("claim").task_claim(req).await
    }
    async fn task_heartbeat_many(
        &self,
        params: &baton::store::TaskHeartbeatMany<'_>,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        self.count("heartbeat").task_heartbeat_many(params).await
    }
    async fn task_finish_many(&self, items: &[(Claim, Finish)]) -> Result<Vec<bool>, StoreError> {
        self.count("finish").task_finish_many(items).await
    }
    async fn task_set_progress(
        &self,
        params: &baton::store::TaskSetProgress<'_>,
    ) -> Result<bool, StoreError> {
        self.count("progress").task_set_progress(params).await
    }
    async fn task_rescue_many(&self) -> Result<Rescued, StoreError> {
        self.count("rescue").task_rescue_many().await
    }
    async fn task_cancel(&self, id: i64) -> Result<CancelOutcome, StoreError> {
        self.count("cancel").task_cancel(id).await
    }
    async fn task_retry(&self, id: i64) -> Result<bool, StoreError> {
        self.count("retry").task_retry(id).await
    }
    async fn task_get(&self, id: i64) -> Result<Option<TaskInfo>, StoreError> {
        self.count("task").task_get(id).await
    }
    async fn task_list(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, StoreError> {
        self.count("tasks").task_list(filter).await
    }
    async fn queue_set_paused(
        &self,
        params: &baton::store::QueueSetPaused<'_>,
    ) -> Result<(), StoreError> {
        self.count("queue_set_paused")
            .queue_set_paused(params)
            .await
    }
    async fn queue_stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        self.count("stats").queue_stats().await
    }
    async fn task_prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.count("prune").task_prune(older_than).await
    }
    async fn wake_subscribe(&self) -> Result<tokio::sync::broadcast::Receiver<Wake>, StoreError> {
        // Setting up the wake-up channel is not a per-second query.
        self.inner.backend().wake_subscribe().await
    }
    async fn job_register(&self, job: &str) -> Result<JobState, StoreError> {
        self.count("job_register").job_register(job).await
    }
    async fn job_advance(&self, adv: &SlotAdvance<'_>) -> Result<Advanced, StoreError> {
        self.count("job_advance").job_advance(adv).await
    }
    async fn job_set_paused(
        &self,
        params: &baton::store::JobSetPaused<'_>,
    ) -> Result<bool, StoreError> {
        self.count("job_set_paused").job_set_paused(params).await
    }
    async fn job_list(&self) -> Result<Vec<JobState>, StoreError> {
        self.count("job_list").job_list().await
    }
}

pub async fn idle_worker_makes_about_one_query_per_second(ts: TestStore) {
    let calls = Arc::new(Mutex::new(BTreeMap::new()));
    let counted = Store::from_backend(
        Arc::new(Counting {
            inner: ts.store.clone(),
            calls: calls.clone(),
        }),
        &ts.url,
    );
    // Two queues, default 1 s poll: still one claim per tick in all.
    let cfg = WorkerConfig::default().queue("a", 4).queue("b", 4);
    let mut w = Worker::new(counted, cfg);
    w.handle_any(|_| async { Ok(()) });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = calls.lock().unwrap().clone();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let end = calls.lock().unwrap().clone();
    stop.cancel();
    run.await.unwrap().unwrap();
    let n = |m: &str| end.get(m).copied().unwrap_or(0) - start.get(m).copied().unwrap_or(0);
    let total: usize = end.values().sum::<usize>() - start.values().sum::<usize>();
    // One claim per tick, however many queues: 6 ticks in the window.
    assert!(
        (4..=7).contains(&n("claim")),
        "{} claims in 6 idle seconds (expected about 6): {end:?}",
        n("claim")
    );
    // Rescue on its own timer, every five poll intervals: once (at 5 s).
    assert!(
        (1..=2).contains(&n("rescue")),
        "{} rescues in 6 idle seconds (expected 1): {end:?}",
        n("rescue")
    );
    // Nothing else: no prune (every 5 min), no clock reading (once a
    // minute; the first ones happen at start, before the window).
    assert_eq!(
        total,
        n("claim") + n("rescue"),
        "unexpected store calls: {start:?} -> {end:?}"
    );
}
