//! Rates per concurrency key (`Backend::task_claim_key_rated`,
//! `WorkerConfig::per_key_rate_limit`): racing claimers never start more
//! than N tasks of one key in any window of the store's clock (judged by
//! the tasks' `started_at`), a used-up key's tasks stay pending with no
//! attempt counted while other keys' are claimed, the claim says when the
//! earliest held-back key may start again, and an idle key's start log is
//! pruned.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::queue::{Queue, TaskBuilder};
use baton::store::{Finish, KeyRate, QueueRateRef, TaskClaim, TaskClaimKeyRated, TaskState};
use baton::Store;
use chrono::{DateTime, Utc};
use serde_json::json;

use crate::harness::{exec_sql, Kind};
use crate::TestStore;

/// Enqueue `n` tasks of `key` (or none) on `queue`; their ids.
async fn fill(store: &Store, queue: &str, key: Option<&str>, n: usize) -> Vec<i64> {
    let batch = (0..n)
        .map(|i| {
            let b = TaskBuilder::new("keyed", json!({ "i": i })).queue(queue);
            match key {
                Some(k) => b.concurrency_key(k),
                None => b,
            }
        })
        .collect();
    let ids = Queue::new(store.clone()).enqueue_many(batch).await.unwrap();
    ids.iter().map(|e| e.id).collect()
}

/// A claim of up to `limit` tasks of `queue` under `max` starts per key
/// per `per`.
fn claim<'a>(
    queue: &'a str,
    worker: &'a str,
    limit: u32,
    max: u32,
    per: Duration,
) -> TaskClaimKeyRated<'a> {
    TaskClaimKeyRated {
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
        key_rate: KeyRate { max, per },
        rate: None,
        finish: &[],
    }
}

/// Each task's key and start, by the store's clock; each succeeded on its
/// first attempt (the rate never counted or failed one).
async fn starts_by_key(store: &Store, ids: &[i64]) -> BTreeMap<Option<String>, Vec<DateTime<Utc>>> {
    let q = Queue::new(store.clone());
    let mut out: BTreeMap<Option<String>, Vec<DateTime<Utc>>> = BTreeMap::new();
    for id in ids {
        let t = q.task(*id).await.unwrap().unwrap();
        assert_eq!(t.state, TaskState::Succeeded, "{t:?}");
        assert_eq!(t.attempt, 1, "the rate counted an attempt: {t:?}");
        out.entry(t.concurrency_key.clone())
            .or_default()
            .push(t.started_at.unwrap());
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// 16 claimers on their own connections race for 8 keys × 9 tasks and 8
/// tasks without a key under 3 starts per key per second (each key about
/// 3 s of starts): by the stores' `started_at`, no key ever has 4 starts
/// within one second, some key did reach 3, each task is claimed once on
/// its first attempt, and every `key_next` lies after the store's now and
/// within a window of it.
pub async fn key_rate_holds_in_every_window_under_16_racing_claimers(ts: TestStore) {
    const MAX: u32 = 3;
    const PER: Duration = Duration::from_secs(1);
    let mut ids = Vec::new();
    for k in 0..8 {
        ids.extend(fill(&ts.store, "kr", Some(&format!("tenant-{k}")), 9).await);
    }
    ids.extend(fill(&ts.store, "kr", None, 8).await);
    let total = ids.len();
    let claimed = Arc::new(Mutex::new(Vec::<i64>::new()));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut claimers = Vec::new();
    for c in 0..16u32 {
        let store = ts.open().await;
        let claimed = claimed.clone();
        claimers.push(tokio::spawn(async move {
            let worker = format!("claimer-{c}");
            loop {
                if claimed.lock().unwrap().len() >= total {
                    return;
                }
                assert!(Instant::now() < deadline, "not all claimed in 60 s");
                let r = store
                    .backend()
                    .task_claim_key_rated(&claim("kr", &worker, 1 + c % 4, MAX, PER))
                    .await
                    .unwrap();
                assert!(r.next_start.is_none(), "{r:?}");
                if let Some(next) = r.key_next {
                    assert!(next > r.now, "key_next {next} not after now {}", r.now);
                    assert!(
                        next <= r.now + chrono::Duration::from_std(PER).unwrap(),
                        "key_next {next} more than a window after now {}",
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
                    let wait = r
                        .key_next
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
    assert_eq!(claimed.len(), total, "a task was claimed twice");
    assert_eq!(claimed.iter().collect::<HashSet<_>>().len(), total);
    let per = chrono::Duration::from_std(PER).unwrap();
    let n = MAX as usize;
    let by_key = starts_by_key(&ts.store, &ids).await;
    let mut pressed = false;
    for (key, s) in &by_key {
        let Some(key) = key else { continue };
        for w in s.windows(n + 1) {
            assert!(
                w[n] - w[0] >= per,
                "key {key}: {} starts within {:?} (from {} to {}): over {MAX}/{PER:?}",
                n + 1,
                (w[n] - w[0]).to_std().unwrap_or_default(),
                w[0],
                w[n]
            );
        }
        pressed |= s.windows(n).any(|w| w[n - 1] - w[0] < per);
    }
    assert!(pressed, "no key ever reached its rate");
}

/// A key with a backlog at the head of the queue, used up by its rate (2
/// per 10 s), stays pending (no attempt counted) while the other keys' and
/// keyless tasks are claimed; once only it is left, the claim comes back
/// empty saying when it may start again (its first start + 10 s), and at
/// that instant of the store's clock it gets 2 more. With the queue's own
/// limit on top, both hold. A key idle past its window (and the grace) has
/// its log pruned.
pub async fn limited_key_does_not_hold_back_others_and_says_when(ts: TestStore) {
    const PER: Duration = Duration::from_secs(10);
    let q = Queue::new(ts.store.clone());
    let hot = fill(&ts.store, "kh", Some("hot"), 6).await;
    let mut cold = Vec::new();
    for k in 0..4 {
        cold.extend(fill(&ts.store, "kh", Some(&format!("cold-{k}")), 1).await);
    }
    cold.extend(fill(&ts.store, "kh", None, 2).await);
    let b = ts.store.backend();
    // The first claim takes hot's two and then the others, in claim order.
    let r = b
        .task_claim_key_rated(&claim("kh", "w", 4, 2, PER))
        .await
        .unwrap();
    let got: Vec<i64> = r.tasks.iter().map(|t| t.id).collect();
    assert_eq!(got, vec![hot[0], hot[1], cold[0], cold[1]], "{r:?}");
    assert_eq!(r.key_next, None, "a full claim says nothing of keys: {r:?}");
    let first_start = r.now;
    // Hot is used up: the next claim steps over its backlog.
    let r = b
        .task_claim_key_rated(&claim("kh", "w", 10, 2, PER))
        .await
        .unwrap();
    let got: HashSet<i64> = r.tasks.iter().map(|t| t.id).collect();
    assert_eq!(got, cold[2..].iter().copied().collect(), "{r:?}");
    let next = r.key_next.expect("a held-back key: when it may start");
    assert!(next > r.now, "{r:?}");
    let expect = first_start + chrono::Duration::from_std(PER).unwrap();
    assert!(
        (next - expect).num_milliseconds().abs() <= 1000,
        "key_next {next}, expected about {expect} (first start + {PER:?})"
    );
    // Nothing else: empty, with the same answer.
    let r = b
        .task_claim_key_rated(&claim("kh", "w", 10, 2, PER))
        .await
        .unwrap();
    assert!(r.tasks.is_empty(), "{r:?}");
    assert_eq!(r.key_next, Some(next));
    for id in &hot[2..] {
        let t = q.task(*id).await.unwrap().unwrap();
        assert_eq!((t.state, t.attempt), (TaskState::Pending, 0), "{t:?}");
    }
    // At `next` by the store's clock, hot gets two more — and under a
    // queue limit of 1 per window on top, only one.
    let now = ts.store.now().await.unwrap();
    let by = (next - now).to_std().unwrap_or_default() + Duration::from_millis(5);
    baton_testkit::clock::advance(&ts, by).await;
    let mut both = claim("kh", "w", 10, 2, PER);
    both.rate = Some(QueueRateRef {
        name: None,
        max: 1,
        per: PER,
    });
    let r = b.task_claim_key_rated(&both).await.unwrap();
    let got: Vec<i64> = r.tasks.iter().map(|t| t.id).collect();
    assert_eq!(got, vec![hot[2]], "{r:?}");
    assert!(r.next_start.is_some(), "the queue limit is used up: {r:?}");
    let r = b
        .task_claim_key_rated(&claim("kh", "w", 10, 2, PER))
        .await
        .unwrap();
    let got: Vec<i64> = r.tasks.iter().map(|t| t.id).collect();
    assert_eq!(got, vec![hot[3]], "{r:?}");
    assert!(r.key_next.is_some(), "{r:?}");
    // With a per-key cap of 1 too, the cap binds first: one task of `c`
    // runs, the next waits for it (not for the rate: no `key_next`).
    let capped = fill(&ts.store, "kc", Some("c"), 3).await;
    let mut both = claim("kc", "w", 10, 5, PER);
    both.claim.per_key_max_running = Some(1);
    let r = b.task_claim_key_rated(&both).await.unwrap();
    assert_eq!(
        r.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![capped[0]]
    );
    let again = b.task_claim_key_rated(&both).await.unwrap();
    assert!(
        again.tasks.is_empty() && again.key_next.is_none(),
        "{again:?}"
    );
    let ok = b
        .task_finish_many(&[(r.tasks[0].claim(), Finish::Succeeded)])
        .await
        .unwrap();
    assert_eq!(ok, vec![true]);
    let r = b.task_claim_key_rated(&both).await.unwrap();
    assert_eq!(
        r.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![capped[1]]
    );
    // Idle keys' logs are pruned: `cold-0` started long ago by now.
    match ts.kind {
        Kind::Redis => {
            let mut c = crate::upgrade::redis_conn(&ts).await;
            let log = format!("{}{{baton:q:kh}}:krate:cold-0", ts.prefix);
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&log)
                .query_async(&mut c)
                .await
                .unwrap();
            assert!(
                ttl == -2 || (0..=PER.as_millis() as i64).contains(&ttl),
                "the log of an idle key lives {ttl} ms"
            );
        }
        _ => {
            // Past the window and the grace, which `idle_at` rounds up to
            // a whole grace: two graces and a second.
            baton_testkit::clock::advance(&ts, PER + Duration::from_secs(121)).await;
            b.task_claim_key_rated(&claim("kh", "w", 1, 2, PER))
                .await
                .unwrap();
            // The row is gone: inserting it again does not conflict
            // (PostgreSQL keeps the log in `log int8[]`, defaulted).
            let cols = match ts.kind {
                Kind::Postgres => "(queue, ckey) VALUES ('kh', 'cold-0')",
                _ => "(queue, ckey, starts) VALUES ('kh', 'cold-0', '')",
            };
            exec_sql(
                &ts,
                &format!(
                    "INSERT INTO {p}key_rates {cols}; \
                     DELETE FROM {p}key_rates WHERE queue = 'kh' AND ckey = 'cold-0'",
                    p = ts.prefix
                ),
            )
            .await;
        }
    }
}

/// Issue 25 item 5: the key view shows each listed key's rate state — its
/// starts in the current window against the declared rate, and when its
/// next start is allowed — from the start logs the store reads for the
/// listed keys only; a window later the key is free again.
pub async fn key_view_shows_each_keys_rate_state(ts: TestStore) {
    const PER: Duration = Duration::from_secs(10);
    let q = Queue::new(ts.store.clone());
    let b = ts.store.backend();
    fill(&ts.store, "kv", Some("hot"), 3).await;
    fill(&ts.store, "kv", Some("cold"), 1).await;
    let limits = baton::store::QueueLimits {
        per_key_rate: Some("2/10s".into()),
        ..Default::default()
    };
    b.queue_declare(&baton::store::QueueDeclare {
        queue: "kv",
        limits: &limits,
        by: "w",
    })
    .await
    .unwrap();
    let r = b
        .task_claim_key_rated(&claim("kv", "w", 10, 2, PER))
        .await
        .unwrap();
    assert_eq!(r.tasks.len(), 3, "hot's two and cold's one: {r:?}");
    let view = q.keys("kv", 10).await.unwrap();
    assert_eq!(view.per_key_rate.as_deref(), Some("2/10s"));
    let state = |v: &baton::store::QueueKeys, key: &str| {
        let k = v.keys.iter().find(|k| k.key == key).unwrap();
        (k.recent_starts.len(), k.rate.unwrap())
    };
    let (logged, hot) = state(&view, "hot");
    assert_eq!(
        (logged, hot.started_in_window, hot.max, hot.per_ms),
        (2, 2, 2, 10_000)
    );
    let next = hot
        .next_start_at
        .expect("hot is used up: when it may start");
    let expect = r.now + chrono::Duration::from_std(PER).unwrap();
    assert!(
        (next - expect).num_milliseconds().abs() <= 1000,
        "next start {next}, expected about {expect}"
    );
    let (logged, cold) = state(&view, "cold");
    assert_eq!(
        (logged, cold.started_in_window, cold.next_start_at),
        (1, 1, None)
    );
    assert_eq!(view.keys_rate_held, 1, "{view:?}");
    // The store's own read carries the logs, for the listed keys only.
    let raw = b
        .queue_keys(&baton::store::QueueKeysQuery {
            queue: "kv",
            limit: 1,
        })
        .await
        .unwrap();
    assert_eq!(raw.keys.len(), 1);
    assert_eq!(
        (raw.keys[0].key.as_str(), raw.keys[0].recent_starts.len()),
        ("hot", 2)
    );
    // A window later by the store's clock: free again.
    baton_testkit::clock::advance(&ts, PER + Duration::from_millis(50)).await;
    let later = q.keys("kv", 10).await.unwrap();
    let (_, hot) = state(&later, "hot");
    assert_eq!((hot.started_in_window, hot.next_start_at), (0, None));
    assert_eq!(later.keys_rate_held, 0);
}

/// A task claimed into a worker's prefetch buffer under a rate per key
/// (`TaskClaim::buffered`) is logged as starting at the claim plus the
/// buffer's hold (250 ms: the latest its handler may start), not at the
/// claim: 100 ms past one window after the claim only the task started
/// at once has left the key's window (2 per 10 s: one more start, not
/// two), and past the hold's end the buffered one has left too.
pub async fn buffered_start_is_logged_at_its_holds_end(ts: TestStore) {
    const PER: Duration = Duration::from_secs(10);
    let b = ts.store.backend();
    fill(&ts.store, "kb", Some("k"), 5).await;
    let mut first = claim("kb", "w", 2, 2, PER);
    first.claim.buffered = 1;
    let r = b.task_claim_key_rated(&first).await.unwrap();
    assert_eq!(r.tasks.len(), 2, "one at once, one buffered: {r:?}");
    let at = r.now;
    // Used up: the key's 2nd latest start (the one at once) frees it.
    let r = b
        .task_claim_key_rated(&claim("kb", "w", 2, 2, PER))
        .await
        .unwrap();
    assert!(r.tasks.is_empty(), "{r:?}");
    let per = chrono::Duration::from_std(PER).unwrap();
    baton_testkit::clock::advance_to(&ts, at + per + chrono::Duration::milliseconds(100)).await;
    let r = b
        .task_claim_key_rated(&claim("kb", "w", 2, 2, PER))
        .await
        .unwrap();
    assert_eq!(
        r.tasks.len(),
        1,
        "the buffered start still counts until its hold's end + the window: {r:?}"
    );
    baton_testkit::clock::advance_to(&ts, at + per + chrono::Duration::milliseconds(300)).await;
    let r = b
        .task_claim_key_rated(&claim("kb", "w", 2, 2, PER))
        .await
        .unwrap();
    assert_eq!(
        r.tasks.len(),
        1,
        "the buffered start has left the window: {r:?}"
    );
}

/// A worker limited per key prefetches, and a buffered task whose
/// handler has not started within the hold (250 ms of its claim) goes
/// back unstarted: with one slot, handlers of 500 ms and a buffer of 8,
/// every handler starts within the hold of its claim by the store's
/// clock (slack: the store's clock is read from the handler), each task
/// succeeds once on its first counted attempt.
pub async fn buffered_task_starts_within_its_hold_or_goes_back(ts: TestStore) {
    use baton::queue::{RateLimit, Worker, WorkerConfig};
    use tokio_util::sync::CancellationToken;
    let lease = Duration::from_secs(5);
    let ids = fill(&ts.store, "kw", Some("k"), 4).await;
    let cfg = WorkerConfig::default()
        .queue("kw", 1)
        .prefetch(8)
        .lease(lease)
        .poll_interval(Duration::from_millis(100))
        .per_key_rate_limit("kw", RateLimit::new(1000, Duration::from_secs(10)).unwrap());
    let delays = Arc::new(Mutex::new(Vec::<(i64, Duration)>::new()));
    let mut w = Worker::new(ts.open().await, cfg).unwrap();
    {
        let (delays, store) = (delays.clone(), ts.store.clone());
        w.handle("keyed", move |ctx| {
            let (delays, store) = (delays.clone(), store.clone());
            async move {
                let now = store.now().await.unwrap();
                let t = ctx.task();
                let claimed = t.lease_until - chrono::Duration::from_std(lease).unwrap();
                let d = (now - claimed).to_std().unwrap_or_default();
                delays.lock().unwrap().push((t.id, d));
                tokio::time::sleep(Duration::from_millis(500)).await;
                Ok(())
            }
        });
    }
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    let q = Queue::new(ts.store.clone());
    for id in &ids {
        baton_testkit::wait::task_state(&q, *id, TaskState::Succeeded, Duration::from_secs(30))
            .await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    starts_by_key(&ts.store, &ids).await;
    let delays = delays.lock().unwrap().clone();
    assert_eq!(delays.len(), ids.len(), "each task ran once: {delays:?}");
    for (id, d) in &delays {
        assert!(
            *d < Duration::from_millis(350),
            "task {id} started {d:?} after its claim: past the 250 ms hold"
        );
    }
}

/// PostgreSQL's schema step 21 → 22 turns each key's start log from text
/// (`starts`) into the array the claim function reads (`log`): a key
/// used up by its converted log stays held back after the upgrade, and
/// its starts come back in the key view, latest first. Other stores keep
/// the text: nothing to upgrade.
pub async fn key_logs_survive_the_array_upgrade(ts: TestStore) {
    if ts.kind != Kind::Postgres {
        return;
    }
    const PER: Duration = Duration::from_secs(3600);
    let p = ts.prefix.clone();
    let kr = format!("\"{p}key_rates\"");
    let now = ts.store.backend().now().await.unwrap();
    let us = now.timestamp_micros();
    // Two starts of `a` within the hour, stored as schema 21 stored them
    // (text, unsorted); the claim functions of 22 gone with the version.
    let (older, newer) = (us - 2_000_000, us - 1_000_000);
    for sql in [
        format!("ALTER TABLE {kr} DROP COLUMN log"),
        format!("ALTER TABLE {kr} ADD COLUMN starts text NOT NULL DEFAULT ''"),
        format!(
            "INSERT INTO {kr} (queue, ckey, starts, free_at, idle_at) \
             VALUES ('ku', 'a', '{older} {newer}', {older} + 3600000000, \
                     {newer} + 3660000000)"
        ),
        format!("DROP FUNCTION \"{p}capped_claim\""),
        format!("DROP FUNCTION \"{p}key_rated_claim\""),
    ] {
        exec_sql(&ts, &sql).await;
    }
    crate::harness::set_schema_version(&ts, &p, Some(21)).await;
    let opts = baton::StoreOptions {
        prefix: Some(p.clone()),
        max_connections: 2,
        ..baton::StoreOptions::default()
    };
    let store = Store::connect_with(&ts.url, opts).await.unwrap();
    let expected = store.backend().schema_status().await.unwrap().expected;
    assert_eq!(
        store.backend().schema_status().await.unwrap().found,
        Some(expected)
    );
    fill(&store, "ku", Some("a"), 2).await;
    let b_ids = fill(&store, "ku", Some("b"), 1).await;
    let r = store
        .backend()
        .task_claim_key_rated(&claim("ku", "w", 10, 2, PER))
        .await
        .unwrap();
    let got: Vec<i64> = r.tasks.iter().map(|t| t.id).collect();
    assert_eq!(got, b_ids, "`a` used up by its converted log: {r:?}");
    let view = Queue::new(store.clone()).keys("ku", 10).await.unwrap();
    let a = view.keys.iter().find(|k| k.key == "a").unwrap();
    let starts: Vec<i64> = a
        .recent_starts
        .iter()
        .map(|t| t.timestamp_micros())
        .collect();
    assert_eq!(starts, vec![newer, older]);
}

/// A key's log keeps one period's starts on the SQL stores, however large
/// `max` is: a claim a period after a start drops it (each claim reads
/// its instant once it holds its turn, so no later claim counts from an
/// earlier one). Kept, a generous rate's log held `max` starts that every
/// claim of the key read and rewrote (PostgreSQL drained 185 tasks a
/// second). Redis keeps its sorted set's `max` latest (a read of its
/// window costs a range count there).
pub async fn key_log_keeps_one_period(ts: TestStore) {
    if ts.kind == Kind::Redis {
        return;
    }
    const PER: Duration = Duration::from_secs(10);
    let q = Queue::new(ts.store.clone());
    fill(&ts.store, "kp", Some("a"), 3).await;
    // Claim one task of `a` under 1,000 starts per 10 s; the starts its
    // log then holds.
    let claim_one = || async {
        let r = ts
            .store
            .backend()
            .task_claim_key_rated(&claim("kp", "w", 1, 1000, PER))
            .await
            .unwrap();
        assert_eq!(r.tasks.len(), 1, "{r:?}");
        let view = q.keys("kp", 10).await.unwrap();
        view.keys
            .iter()
            .find(|k| k.key == "a")
            .map_or(0, |k| k.recent_starts.len())
    };
    assert_eq!(claim_one().await, 1);
    baton_testkit::clock::advance(&ts, Duration::from_secs(4)).await;
    assert_eq!(claim_one().await, 2, "both in the window");
    // The first start a period old, the second not yet.
    baton_testkit::clock::advance(&ts, Duration::from_secs(7)).await;
    assert_eq!(
        claim_one().await,
        2,
        "the second and third starts, the first dropped"
    );
}

/// A rated claim writes the results it carries (`finish`), each the
/// compare-and-set `task_finish_many` makes and answered per item in
/// order (a stale token and an attempt already finished refused, their
/// tasks left alone), then claims: under a rate per key alone (PostgreSQL
/// sends both in one statement), with a queue limit on top, and under a
/// queue limit alone.
pub async fn rated_claims_carry_finishes(ts: TestStore) {
    const PER: Duration = Duration::from_secs(60);
    let q = Queue::new(ts.store.clone());
    let b = ts.store.backend();
    fill(&ts.store, "kf", Some("k"), 25).await;
    let limit = Some(QueueRateRef {
        name: None,
        max: 1_000,
        per: PER,
    });
    for form in ["key rate", "key rate and queue limit", "queue limit"] {
        let c = b
            .task_claim_key_rated(&claim("kf", "w", 5, 1_000, PER))
            .await
            .unwrap()
            .tasks;
        assert_eq!(c.len(), 5, "{form}");
        let items = crate::queue::every_kind_batch(b, &c).await;
        let mut req = claim("kf", "w", 2, 1_000, PER);
        req.finish = &items;
        let r = match form {
            "key rate" => b.task_claim_key_rated(&req).await.unwrap(),
            "key rate and queue limit" => {
                req.rate = limit;
                b.task_claim_key_rated(&req).await.unwrap()
            }
            _ => {
                req.rate = limit;
                let rated = req.rated().unwrap();
                assert_eq!(rated.finish.len(), 5);
                b.task_claim_rated(&rated).await.unwrap()
            }
        };
        assert_eq!(
            r.finished,
            [true, true, true, false, false],
            "{form}: each finish answered in order"
        );
        assert_eq!(r.tasks.len(), 2, "{form}: and the claim made: {r:?}");
        let state = |id| {
            let q = &q;
            async move { q.task(id).await.unwrap().unwrap() }
        };
        assert_eq!(state(c[0].id).await.state, TaskState::Succeeded, "{form}");
        let failed = state(c[1].id).await;
        assert_eq!(
            (failed.state, failed.last_error.as_deref()),
            (TaskState::Pending, Some("boom")),
            "{form}"
        );
        // The handed-back task is first in line again: this claim may take
        // it (it ran after the finish), but its first attempt never counted.
        let back = state(c[2].id).await;
        let expect = if r.tasks.iter().any(|t| t.id == c[2].id) {
            (TaskState::Running, 1)
        } else {
            (TaskState::Pending, 0)
        };
        assert_eq!((back.state, back.attempt), expect, "{form}");
        let kept = state(c[3].id).await;
        assert_eq!(
            (kept.state, kept.attempt),
            (TaskState::Running, 1),
            "{form}: a stale finish changed nothing"
        );
        assert_eq!(state(c[4].id).await.state, TaskState::Succeeded, "{form}");
        for t in &r.tasks {
            let now = state(t.id).await;
            assert_eq!(
                (now.state, now.attempt),
                (TaskState::Running, t.attempt),
                "{form}"
            );
        }
        // The kept attempt and the claimed ones, out of the next form's way.
        let done: Vec<_> = std::iter::once(c[3].claim())
            .chain(r.tasks.iter().map(|t| t.claim()))
            .map(|c| (c, Finish::Succeeded))
            .collect();
        assert!(b
            .task_finish_many(&done)
            .await
            .unwrap()
            .iter()
            .all(|ok| *ok));
    }
}
