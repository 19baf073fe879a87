//! An idle worker's store traffic: one store call per poll interval — a
//! claim (queues in turn), or in place of one a rescue (every five polls)
//! or a reading of the store's clock (once a minute); measured by wrapping
//! the real backend in a counting one — the seam makes that one small type.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use baton::queue::{Worker, WorkerConfig};
use baton::store::*;
use baton::{Store, StoreError};
use tokio_util::sync::CancellationToken;

use crate::TestStore;

/// Store calls by method name, shared by the stores that count into it.
pub type Calls = Arc<Mutex<BTreeMap<&'static str, usize>>>;

/// Counts every call by method, then forwards it; with `results`, also
/// the results each finishing call carries, by method.
pub struct Counting {
    inner: Store,
    calls: Calls,
    results: Option<Calls>,
}

/// `store`, with every call counted into `calls`.
pub fn counted(store: &Store, calls: &Calls) -> Store {
    wrap(store, calls, None)
}

/// [`counted`], and the results the finishing calls carry counted into
/// `results` (by method: `task_finish_many`'s items, the finishes a
/// claim carries).
pub fn counted_with_results(store: &Store, calls: &Calls, results: &Calls) -> Store {
    wrap(store, calls, Some(results.clone()))
}

fn wrap(store: &Store, calls: &Calls, results: Option<Calls>) -> Store {
    Store::from_backend(
        Arc::new(Counting {
            inner: store.clone(),
            calls: calls.clone(),
            results,
        }),
        &store.url(),
    )
}

impl Counting {
    fn count(&self, method: &'static str, results: usize) -> &dyn Backend {
        *self.calls.lock().unwrap().entry(method).or_default() += 1;
        if let Some(r) = &self.results {
            *r.lock().unwrap().entry(method).or_default() += results;
        }
        self.inner.backend()
    }
}

/// The results a call carries: a finish's items, a claim's `finish`.
macro_rules! results_of {
    (task_finish_many, $items:ident) => {
        $items.len()
    };
    (task_finish_and_claim, $req:ident) => {
        $req.finish.len()
    };
    (task_claim_rated, $req:ident) => {
        $req.finish.len()
    };
    (task_claim_key_rated, $req:ident) => {
        $req.finish.len()
    };
    ($other:ident, $($arg:ident),*) => {
        0
    };
}

// Generated from the seam's one method list: each call is counted under
// the method's own name.
macro_rules! counting_backend {
    ($($(#[$m:meta])* fn $name:ident($($arg:ident : $ty:ty),*) -> $out:ty;)*) => {
        #[async_trait]
        impl Backend for Counting {
            fn kind(&self) -> &'static str {
                self.inner.backend().kind()
            }
            fn claims_carry_finishes(&self) -> bool {
                self.inner.backend().claims_carry_finishes()
            }
            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$out, StoreError> {
                    self.count(stringify!($name), results_of!($name, $($arg),*))
                        .$name($($arg),*)
                        .await
                }
            )*
        }
    };
}

baton::seam_methods!(counting_backend);

pub async fn idle_worker_makes_about_one_query_per_second(ts: TestStore) {
    let calls: Calls = Arc::default();
    let counted = counted(&ts.store, &calls);
    // Two queues, a 250 ms poll (a rescue every 1.25 s): still one store
    // call per tick in all, the rescue included.
    let tick = Duration::from_millis(250);
    let cfg = WorkerConfig::default()
        .queue("a", 4)
        .queue("b", 4)
        .poll_interval(tick);
    let mut w = Worker::new(counted, cfg).unwrap();
    w.handle_any(|_| async { Ok(()) });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    // Past the start (its clock readings are paid for by skipped polls).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let start = calls.lock().unwrap().clone();
    let window = tick * 30;
    tokio::time::sleep(window).await;
    let end = calls.lock().unwrap().clone();
    stop.cancel();
    run.await.unwrap().unwrap();
    let n = |m: &str| end.get(m).copied().unwrap_or(0) - start.get(m).copied().unwrap_or(0);
    let total: usize = end.values().sum::<usize>() - start.values().sum::<usize>();
    // Rescue on its own timer, every five poll intervals: six in the
    // window (a late timer on a busy host may make it five, or four).
    assert!(
        (4..=7).contains(&n("task_rescue_many")),
        "{} rescues in 30 idle ticks (expected 6): {end:?}",
        n("task_rescue_many")
    );
    // A tick after a rescue skips its poll (never two ticks in a row), so
    // the calls stay at one per tick: 30 in all, about 24 of them claims.
    // A rescue tick makes two calls (the rescue and the store identity
    // check), each paid for by a skipped poll; the window may hold 31
    // ticks, and at its two edges up to three of those skips may fall
    // outside it. Without the skips it would be 30 claims and 12 upkeep
    // calls, 42 in all.
    assert!(
        total <= 34,
        "{total} store calls in 30 idle ticks (expected at most one per tick): {start:?} -> {end:?}"
    );
    assert!(
        (15..=28).contains(&n("task_claim")),
        "{} claims in 30 idle ticks (expected about 24, at least every other tick): {end:?}",
        n("task_claim")
    );
    // Nothing else: no prune (every 300 ticks), no clock reading (once a
    // minute; the first ones happen at start, before the window).
    // Each rescue tick also reads the store's identity (a store that
    // forgot is noticed), paid for by a skipped poll as well; so is the
    // waiting-slot sweep's job listing every 15 ticks (two in the
    // window; no job, so no release).
    assert!(
        n("store_identity") <= n("task_rescue_many") + 1,
        "identity checks: {end:?}"
    );
    assert!(
        (1..=3).contains(&n("job_list")),
        "{} waiting-slot sweeps in 30 idle ticks (expected 2): {end:?}",
        n("job_list")
    );
    assert_eq!(
        total,
        n("task_claim") + n("task_rescue_many") + n("store_identity") + n("job_list"),
        "unexpected store calls: {start:?} -> {end:?}"
    );
}

/// A busy worker's results ride with its claims where the store finishes
/// with a claim in its own round trips (PostgreSQL, MySQL, SQLite): over
/// a backlog of 1,500 no-op tasks results are carried by claims, every
/// result sent and every task run once; on Redis no claim carries a
/// result.
pub async fn busy_worker_sends_its_results_with_its_claims(ts: TestStore) {
    const N: usize = 1500;
    let (calls, results): (Calls, Calls) = Default::default();
    let counted = counted_with_results(&ts.store, &calls, &results);
    let q = baton::queue::Queue::new(ts.store.clone());
    let batch: Vec<_> = (0..N)
        .map(|i| baton::queue::TaskBuilder::new("noop", serde_json::json!(i)).queue("ride"))
        .collect();
    q.enqueue_many(batch).await.unwrap();
    let cfg = WorkerConfig::default().queue("ride", 8);
    let mut w = Worker::new(counted, cfg).unwrap();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = runs.clone();
    w.handle("noop", move |_| {
        r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { Ok(()) }
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    baton_testkit::wait::until_true(Duration::from_secs(60), "every task succeeded", || async {
        let st = q.stats().await.unwrap();
        let done: u64 = st
            .iter()
            .filter(|s| s.queue == "ride")
            .map(|s| s.succeeded)
            .sum();
        done as usize == N
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
    let n = |m: &str| calls.lock().unwrap().get(m).copied().unwrap_or(0);
    let ridden = n("task_finish_and_claim");
    // PostgreSQL finishes with a claim in one statement, MySQL in the
    // claim's two batches, SQLite in the claim's write transaction; Redis
    // does not.
    let carries = matches!(ts.store.backend().kind(), "postgres" | "mysql" | "sqlite");
    assert_eq!(ts.store.backend().claims_carry_finishes(), carries);
    if carries {
        assert!(
            ridden > 0,
            "no claim carried results: {:?}",
            calls.lock().unwrap()
        );
        // Results ride: without the ride every one goes alone. Counted in
        // results, not calls. How many ride is the machine's: a claim
        // carries at most half a queue's places, and a result waits at
        // most 20 ms for one, so about half ride on a quiet machine
        // (MySQL 537–712 of 1,500, PostgreSQL 1,158) and as few as 236
        // on a loaded one (the calls' count, asserted before, swung with
        // it). What does not depend on the load: results do ride. The
        // gain is measured in docs/BENCHMARKS.md (session 23).
        let results = results.lock().unwrap();
        let carried = results.get("task_finish_and_claim").copied().unwrap_or(0);
        let alone = results.get("task_finish_many").copied().unwrap_or(0);
        assert!(
            carried + alone >= N,
            "every result sent: {carried} + {alone}"
        );
        assert!(
            carried * 20 >= N,
            "results did not ride: {carried} carried, {alone} alone; calls {:?}",
            calls.lock().unwrap()
        );
    } else {
        assert_eq!(ridden, 0, "{:?}", calls.lock().unwrap());
    }
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        N,
        "every task once"
    );
}
