//! Waiting on a condition instead of sleeping for a fixed time.
//!
//! A test that needs something to have happened (a task to reach a state,
//! a worker to have claimed, a counter to reach a value) polls for it with
//! a deadline: it goes on as soon as the condition holds, and fails with
//! what it last saw when the deadline passes. A fixed sleep either wastes
//! time or, on a loaded machine, is too short.
//!
//! ```ignore
//! let task = baton_testkit::wait::until(Duration::from_secs(5), "task 7 succeeded", || async {
//!     let t = q.task(7).await.unwrap()?;
//!     (t.state == TaskState::Succeeded).then_some(t)
//! })
//! .await;
//! ```

use std::future::Future;
use std::time::{Duration, Instant};

use baton::queue::Queue;
use baton::store::{TaskInfo, TaskState};

/// How often a condition is checked.
pub const POLL: Duration = Duration::from_millis(10);

/// Check `check` every [`POLL`] until it answers `Some`, and return that;
/// panic naming `what` when `within` has passed first.
pub async fn until<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let t0 = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(t0.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// Check the boolean `check` every [`POLL`] until it holds; panic naming
/// `what` when `within` has passed first.
pub async fn until_true<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    until(within, what, || {
        let f = check();
        async move { f.await.then_some(()) }
    })
    .await
}

/// Call `call` every [`POLL`] until it succeeds, and return its value;
/// panic naming `what` and the last error when `within` has passed first
/// (a store coming back, a failover followed).
pub async fn until_ok<T, E, F, Fut>(within: Duration, what: &str, mut call: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let t0 = Instant::now();
    loop {
        match call().await {
            Ok(v) => return v,
            Err(e) => assert!(
                t0.elapsed() < within,
                "not within {within:?}: {what}: still failing: {e}"
            ),
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Wait until task `id` of `q` is in `state` (at most `within`), and
/// return it; the panic shows the task as last read.
pub async fn task_state(q: &Queue, id: i64, state: TaskState, within: Duration) -> TaskInfo {
    let t0 = Instant::now();
    loop {
        let t = q.task(id).await.unwrap().expect("task exists");
        if t.state == state {
            return t;
        }
        assert!(
            t0.elapsed() < within,
            "task {id} not {state:?} within {within:?}: {t:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}
