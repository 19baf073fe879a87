//! Rate limits (`Backend::task_claim_rated`, `WorkerConfig::rate_limit`,
//! `WorkerConfig::shared_rate_limit`): racing claimers never start more
//! than N tasks in any window of the store's clock (judged by the tasks'
//! `started_at`, written by the store), a limit shared by two queues
//! holds across both, a task over the limit stays pending with no attempt
//! counted, and the claim says when the next start is allowed, which a
//! worker waits for instead of its poll.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::queue::{Queue, RateLimit, TaskBuilder, Worker, WorkerConfig};
use baton::store::{Finish, TaskClaim, TaskClaimRated, TaskState};
use baton::Store;
use chrono::{DateTime, Utc};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::TestStore;

const MAX: u32 = 10;
const PER: Duration = Duration::from_secs(1);

/// Enqueue `n` tasks on `queue`; their ids.
async fn fill(store: &Store, queue: &str, n: usize) -> Vec<i64> {
    let batch = (0..n)
        .map(|i| TaskBuilder::new("rated", json!({ "i": i })).queue(queue))
        .collect();
    let ids = Queue::new(store.clone()).enqueue_many(batch).await.unwrap();
    ids.iter().map(|e| e.id).collect()
}

/// A rated claim of up to `limit` tasks of `queue` under `name`'s limit
/// (`None`: the queue's own) at `MAX/PER`.
fn rated<'a>(
    queue: &'a str,
    worker: &'a str,
    limit: u32,
    name: Option<&'a str>,
) -> TaskClaimRated<'a> {
    TaskClaimRated {
        claim: TaskClaim {
            queue,
            worker,
            limit,
            lease: Duration::from_secs(30),
            max_running: None,
            per_key_max_running: None,
            buffered: 0,
            fair: false,
        },
        name,
        max: MAX,
        per: PER,
        finish: &[],
    }
}

/// Claimers racing on their own connections over `queues` (claimer `c`
/// takes `queues[c % len]`) under one limit (`name`, `MAX/PER`) until
/// `total` tasks are claimed; each finishes its tasks at once. Checks
/// each answer: `next_start` is set exactly when the limit is used up
/// and then lies after the store's `now`, and a claim never comes back
/// empty while the limit allows a start and tasks wait.
async fn race(ts: &TestStore, queues: &[&'static str], name: Option<&'static str>, total: usize) {
    let claimed = Arc::new(Mutex::new(Vec::<i64>::new()));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut claimers = Vec::new();
    for c in 0..6usize {
        let store = ts.open().await;
        let claimed = claimed.clone();
        let queue = queues[c % queues.len()];
        claimers.push(tokio::spawn(async move {
            let worker = format!("claimer-{c}");
            loop {
                if claimed.lock().unwrap().len() >= total {
                    return;
                }
                assert!(Instant::now() < deadline, "not all claimed in 60 s");
                let r = store
                    .backend()
                    .task_claim_rated(&rated(queue, &worker, 1 + (c as u32) % 3, name))
                    .await
                    .unwrap();
                if let Some(next) = r.next_start {
                    assert!(next > r.now, "next start {next} not after now {}", r.now);
                    assert!(
                        next <= r.now + chrono::Duration::from_std(PER).unwrap(),
                        "next start {next} more than a window after now {}",
                        r.now
                    );
                }
                for t in &r.tasks {
                    claimed.lock().unwrap().push(t.id);
                    let ok = store
                        .backend()
                        .task_finish_many(&[(t.claim(), Finish::Succeeded)])
                        .await
                        .unwrap();
                    assert_eq!(ok, vec![true]);
                }
                if r.tasks.is_empty() {
                    // Used up (or this queue is drained): wait as a
                    // worker would, a little short of the next start.
                    let wait = r
                        .next_start
                        .map(|n| (n - r.now).to_std().unwrap_or_default())
                        .unwrap_or(Duration::from_millis(20));
                    tokio::time::sleep(wait.min(Duration::from_millis(200))).await;
                }
            }
        }));
    }
    for c in claimers {
        c.await.unwrap();
    }
    let claimed = claimed.lock().unwrap().clone();
    let distinct: HashSet<i64> = claimed.iter().copied().collect();
    assert_eq!(claimed.len(), total, "a task was claimed twice");
    assert_eq!(distinct.len(), total);
}

/// The start instants of `ids`, by the store's clock, sorted; each task
/// succeeded on its first attempt (the limit never counted or failed
/// one).
async fn starts(store: &Store, ids: &[i64]) -> Vec<DateTime<Utc>> {
    let q = Queue::new(store.clone());
    let mut out = Vec::new();
    for id in ids {
        let t = q.task(*id).await.unwrap().unwrap();
        assert_eq!(t.state, TaskState::Succeeded, "{t:?}");
        assert_eq!(t.attempt, 1, "the limit counted an attempt: {t:?}");
        out.push(t.started_at.unwrap());
    }
    out.sort();
    out
}

/// Never more than `MAX` starts in any window of length `PER`: any
/// `MAX + 1` consecutive starts span at least `PER`. And the limit was
/// reached (some `MAX` consecutive starts within one window), so the test
/// did press on it.
fn assert_windows(starts: &[DateTime<Utc>]) {
    let per = chrono::Duration::from_std(PER).unwrap();
    let n = MAX as usize;
    for w in starts.windows(n + 1) {
        assert!(
            w[n] - w[0] >= per,
            "{} starts within {:?} (from {} to {}): over {MAX}/{PER:?}",
            n + 1,
            (w[n] - w[0]).to_std().unwrap_or_default(),
            w[0],
            w[n]
        );
    }
    assert!(
        starts.windows(n).any(|w| w[n - 1] - w[0] < per),
        "the limit was never reached"
    );
}

/// 6 claimers on their own connections race for 35 tasks under 10/1s
/// (about 3.5 s of starts): by the stores' `started_at`, never more than
/// 10 starts in any 1-second window, each task claimed once, on its first
/// attempt.
pub async fn rate_limit_holds_in_every_window_under_racing_claimers(ts: TestStore) {
    let ids = fill(&ts.store, "rated", 35).await;
    race(&ts, &["rated"], None, ids.len()).await;
    assert_windows(&starts(&ts.store, &ids).await);
}

/// A named limit shared by queues `a` and `b` (10/1s): the starts of both
/// queues together obey it; every task of both is claimed once.
pub async fn shared_rate_limit_holds_across_two_queues(ts: TestStore) {
    if ts.url.contains("+cluster://") {
        // Refused on a cluster, with a message saying so.
        let e = ts
            .store
            .backend()
            .task_claim_rated(&rated("a", "w", 1, Some("partner-api")))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("Redis Cluster"), "{e}");
        return;
    }
    // A paused queue answers a rated claim with nothing, and no next
    // start (the limit is not what holds it).
    let q = Queue::new(ts.store.clone());
    q.pause("a").await.unwrap();
    let r = ts
        .store
        .backend()
        .task_claim_rated(&rated("a", "w", 1, Some("partner-api")))
        .await
        .unwrap();
    assert!(r.tasks.is_empty() && r.next_start.is_none(), "{r:?}");
    q.resume("a").await.unwrap();
    let mut ids = fill(&ts.store, "a", 16).await;
    ids.extend(fill(&ts.store, "b", 16).await);
    race(&ts, &["a", "b"], Some("partner-api"), ids.len()).await;
    assert_windows(&starts(&ts.store, &ids).await);
}

/// Workers with a rate limit and a poll 60 s away run 25 tasks at 10/1s
/// in about 1.5–3 s: each waits for the start the claim announced, not
/// for its poll; the windows hold by the store's clock. Bad limits are
/// refused naming the field.
pub async fn workers_wait_for_the_next_allowed_start(ts: TestStore) {
    let ids = fill(&ts.store, "paced", 25).await;
    let limit: RateLimit = format!("{MAX}/1s").parse().unwrap();
    let stop = CancellationToken::new();
    let mut runs = Vec::new();
    let started = Instant::now();
    for _ in 0..2 {
        let cfg = WorkerConfig::default()
            .queue("paced", 4)
            .rate_limit("paced", limit)
            .lease(Duration::from_secs(5))
            .poll_interval(Duration::from_secs(60))
            .shutdown_grace(Duration::from_millis(300))
            .stop_grace(Duration::from_millis(300));
        let mut w = Worker::new(ts.open().await, cfg).unwrap();
        w.handle("rated", |_ctx| async { Ok(()) });
        runs.push(tokio::spawn(w.run(stop.clone())));
    }
    let q = Queue::new(ts.store.clone());
    for id in &ids {
        baton_testkit::wait::task_state(&q, *id, TaskState::Succeeded, Duration::from_secs(20))
            .await;
    }
    let took = started.elapsed();
    stop.cancel();
    for r in runs {
        r.await.unwrap().unwrap();
    }
    assert_windows(&starts(&ts.store, &ids).await);
    assert!(
        took < Duration::from_secs(10),
        "the workers waited for their poll, not for the next start: {took:?}"
    );
    for (bad, field) in [("0/1m", "rate"), ("10/0s", "rate"), ("ten/1s", "rate")] {
        let e = bad.parse::<RateLimit>().unwrap_err();
        assert_eq!(e.field, field, "{bad}: {e}");
        assert!(e.problem.contains("STARTS/PERIOD"), "{bad}: {e}");
    }
    let e = Worker::new(
        ts.store.clone(),
        WorkerConfig::default().queue("x", 1).rate_limit("y", limit),
    )
    .err()
    .unwrap();
    assert_eq!(e.field, "rate", "{e}");
    let e = Worker::new(
        ts.store.clone(),
        WorkerConfig::default()
            .queue("x", 1)
            .queue("y", 1)
            .shared_rate_limit("x", "api", limit)
            .shared_rate_limit("y", "api", "5/1s".parse().unwrap()),
    )
    .err()
    .unwrap();
    assert_eq!(e.field, "rate", "{e}");
}

/// The finishes a rated claim carries (`TaskClaimRated::finish`,
/// `TaskClaimKeyRated::finish`) are each the compare-and-set
/// `task_finish_many` makes, answered per item: a stale token's success
/// is refused and changes nothing, the current one's is written, in the
/// same call as the claim, for successes alone and for a batch with
/// other outcomes.
pub async fn rated_claims_answer_each_finish_they_carry(ts: TestStore) {
    use baton::store::{Claim, FencingToken, KeyRate, TaskClaimKeyRated};
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    fill(&ts.store, "rf_held", 4).await;
    fill(&ts.store, "rf_next", 6).await;
    let held = b
        .task_claim(&rated("rf_held", "w", 4, None).claim)
        .await
        .unwrap();
    assert_eq!(held.len(), 4);
    let stale = |t: &baton::store::Task| Claim {
        token: FencingToken(t.token.0 + 1),
        ..t.claim()
    };
    // Successes alone, under the queue's own rate (a rate shared by
    // queues is refused on a Redis Cluster).
    let finish = [
        (stale(&held[0]), Finish::Succeeded),
        (held[1].claim(), Finish::Succeeded),
    ];
    let r = b
        .task_claim_rated(&TaskClaimRated {
            finish: &finish,
            ..rated("rf_next", "w", 2, None)
        })
        .await
        .unwrap();
    assert_eq!((r.finished, r.tasks.len()), (vec![false, true], 2));
    let state = |id| {
        let q = &q;
        async move { q.task(id).await.unwrap().unwrap().state }
    };
    assert_eq!(state(held[0].id).await, TaskState::Running);
    assert_eq!(state(held[1].id).await, TaskState::Succeeded);
    // With a rate per key: successes alone, then a mixed batch.
    let key_rated = |finish| TaskClaimKeyRated {
        claim: rated("rf_next", "w", 2, None).claim,
        key_rate: KeyRate {
            max: 100,
            per: Duration::from_secs(1),
        },
        rate: None,
        finish,
    };
    let finish = [
        (held[0].claim(), Finish::Succeeded),
        (stale(&held[2]), Finish::Succeeded),
    ];
    let r = b.task_claim_key_rated(&key_rated(&finish)).await.unwrap();
    assert_eq!((r.finished, r.tasks.len()), (vec![true, false], 2));
    assert_eq!(state(held[0].id).await, TaskState::Succeeded);
    assert_eq!(state(held[2].id).await, TaskState::Running);
    let finish = [
        (held[2].claim(), Finish::Succeeded),
        (
            held[3].claim(),
            Finish::Failed {
                error: "boom".into(),
                retry_in: None,
            },
        ),
        (stale(&held[3]), Finish::Succeeded),
    ];
    let r = b.task_claim_key_rated(&key_rated(&finish)).await.unwrap();
    assert_eq!((r.finished, r.tasks.len()), (vec![true, true, false], 2));
    assert_eq!(state(held[2].id).await, TaskState::Succeeded);
    assert_ne!(state(held[3].id).await, TaskState::Running);
}
