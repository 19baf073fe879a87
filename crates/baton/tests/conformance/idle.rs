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

/// Counts every call by method, then forwards it.
pub struct Counting {
    inner: Store,
    calls: Calls,
}

/// `store`, with every call counted into `calls`.
pub fn counted(store: &Store, calls: &Calls) -> Store {
    Store::from_backend(
        Arc::new(Counting {
            inner: store.clone(),
            calls: calls.clone(),
        }),
        &store.url(),
    )
}

impl Counting {
    fn count(&self, method: &'static str) -> &dyn Backend {
        *self.calls.lock().unwrap().entry(method).or_default() += 1;
        self.inner.backend()
    }
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
            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$out, StoreError> {
                    self.count(stringify!($name)).$name($($arg),*).await
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
    // forgot is noticed), paid for by a skipped poll as well.
    assert!(
        n("store_identity") <= n("task_rescue_many") + 1,
        "identity checks: {end:?}"
    );
    assert_eq!(
        total,
        n("task_claim") + n("task_rescue_many") + n("store_identity"),
        "unexpected store calls: {start:?} -> {end:?}"
    );
}
