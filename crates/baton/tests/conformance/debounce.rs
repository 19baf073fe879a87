//! Debounce and throttle (issue 25 item 3): an enqueue with a unique key
//! and a policy is decided by the store with the insert
//! (`store::key_policy`), so racing enqueuers agree, on every store.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};

use baton::queue::{EnqueueOutcome, Queue, TaskBuilder, UniqueHold};
use baton::store::{Enqueued, Finish, TaskState};
use serde_json::json;

use crate::TestStore;

fn debounced(queue: &str, n: i64, d: Duration) -> TaskBuilder {
    TaskBuilder::new("reindex", json!({ "n": n }))
        .queue(queue)
        .unique_key("doc:7")
        .priority((n % 50) as i32)
        .debounce(d)
}

fn throttled(queue: &str, n: i64) -> TaskBuilder {
    TaskBuilder::new("digest", json!({ "n": n }))
        .queue(queue)
        .unique_key("user:1")
        .throttle(Duration::from_secs(3600))
}

/// The pending tasks of `queue`.
async fn pending(ts: &TestStore, queue: &str) -> Vec<baton::store::TaskInfo> {
    let all = ts
        .store
        .backend()
        .task_list(&baton::store::TaskFilter {
            queue: Some(queue.into()),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    all.into_iter()
        .filter(|t| t.state == TaskState::Pending)
        .collect()
}

/// N racing debouncers of one key leave exactly one pending task: one
/// enqueue inserts it, every other answers `Debounced` with its id; the
/// task has one racer's payload and priority together (never parts of
/// two) and a due time the debounce after a now within the race.
pub async fn debounce_racing_enqueuers_leave_one_pending_task(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let d = Duration::from_secs(5);
    let before = ts.store.now().await.unwrap();
    let mut racers = Vec::new();
    for n in 0..16 {
        let q = q.clone();
        racers.push(tokio::spawn(async move {
            q.enqueue(debounced("db-race", n, d)).await.unwrap()
        }));
    }
    let mut answers: Vec<Enqueued> = Vec::new();
    for r in racers {
        answers.push(r.await.unwrap());
    }
    let ids: BTreeSet<i64> = answers.iter().map(|e| e.id).collect();
    assert_eq!(ids.len(), 1, "one task for the key: {answers:?}");
    let inserted = answers.iter().filter(|e| e.inserted).count();
    assert_eq!(inserted, 1, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|e| e.inserted == (e.outcome == EnqueueOutcome::Inserted)
                && (e.inserted || e.outcome == EnqueueOutcome::Debounced)),
        "{answers:?}"
    );
    let p = pending(&ts, "db-race").await;
    assert_eq!(p.len(), 1, "exactly one pending task: {p:?}");
    let n = p[0].payload["n"].as_i64().unwrap();
    assert!((0..16).contains(&n));
    assert_eq!(
        i64::from(p[0].priority),
        n,
        "payload and priority come from one enqueue"
    );
    let after = ts.store.now().await.unwrap();
    assert!(
        p[0].run_at >= before + d && p[0].run_at <= after + d,
        "due the debounce after the last change: {:?} in [{before:?}, {after:?}] + 5 s",
        p[0].run_at
    );

    // In one batch, in order: the second debounces the first, a plain
    // task between them is inserted as usual.
    let got = q
        .enqueue_many(vec![
            debounced("db-batch", 1, d),
            TaskBuilder::new("plain", json!({})).queue("db-batch"),
            debounced("db-batch", 2, d),
        ])
        .await
        .unwrap();
    assert_eq!(
        got.iter().map(|e| e.outcome).collect::<Vec<_>>(),
        [
            EnqueueOutcome::Inserted,
            EnqueueOutcome::Inserted,
            EnqueueOutcome::Debounced
        ],
        "{got:?}"
    );
    assert_eq!(got[2].id, got[0].id);
    let t = q.task(got[0].id).await.unwrap().unwrap();
    assert_eq!(t.payload, json!({"n": 2}));
    assert_eq!(pending(&ts, "db-batch").await.len(), 2);
}

/// Sequential changes of a debounced key: the last payload and priority,
/// due the debounce after the last change (the store's clock, moved by
/// the test clock); not claimable before, claimed once after.
pub async fn debounce_pushes_the_due_time_to_the_last_change(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let d = Duration::from_secs(5);
    let first = q.enqueue(debounced("db-seq", 1, d)).await.unwrap();
    assert_eq!(first.outcome, EnqueueOutcome::Inserted);
    baton_testkit::clock::advance(&ts, Duration::from_secs(3)).await;
    let second = q.enqueue(debounced("db-seq", 2, d)).await.unwrap();
    assert_eq!(
        (second.id, second.outcome),
        (first.id, EnqueueOutcome::Debounced)
    );
    baton_testkit::clock::advance(&ts, Duration::from_secs(3)).await;
    let now = ts.store.now().await.unwrap();
    let third = q.enqueue(debounced("db-seq", 3, d)).await.unwrap();
    assert_eq!(
        (third.id, third.outcome),
        (first.id, EnqueueOutcome::Debounced)
    );
    let info = q.task(first.id).await.unwrap().unwrap();
    assert_eq!((info.payload.clone(), info.priority), (json!({"n": 3}), 3));
    let late = info.run_at - (now + d);
    assert!(
        // (Kept to the millisecond: up to 1 ms before a µs clock's now + d.)
        late > chrono::Duration::milliseconds(-1) && late < chrono::Duration::seconds(2),
        "due 5 s after the last change: {:?}, now {now:?}",
        info.run_at
    );
    // Not due yet: nothing to claim; due once the clock passes it.
    assert!(crate::queue::claim(&ts.store, "db-seq", 5, 30_000)
        .await
        .is_empty());
    baton_testkit::clock::advance(&ts, Duration::from_secs(6)).await;
    let got = crate::queue::claim(&ts.store, "db-seq", 5, 30_000).await;
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].id, got[0].payload.clone()),
        (first.id, json!({"n": 3}))
    );
}

/// A debounced task that is already running is never changed: the next
/// change makes a new pending task, which takes the key (later changes
/// debounce it), and the running task finishes with its own payload.
pub async fn debounce_leaves_a_running_task_alone(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let d = Duration::from_secs(2);
    let first = q.enqueue(debounced("db-run", 1, d)).await.unwrap();
    baton_testkit::clock::advance(&ts, Duration::from_secs(3)).await;
    let claimed = crate::queue::claim(&ts.store, "db-run", 1, 30_000).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, first.id);

    let next = q.enqueue(debounced("db-run", 2, d)).await.unwrap();
    assert_eq!(next.outcome, EnqueueOutcome::Inserted, "{next:?}");
    assert_ne!(next.id, first.id);
    let running = q.task(first.id).await.unwrap().unwrap();
    assert_eq!(
        (running.state, running.payload.clone()),
        (TaskState::Running, json!({"n": 1})),
        "the running task is left alone"
    );
    let more = q.enqueue(debounced("db-run", 3, d)).await.unwrap();
    assert_eq!(
        (more.id, more.outcome),
        (next.id, EnqueueOutcome::Debounced)
    );
    assert_eq!(pending(&ts, "db-run").await.len(), 1);
    // The running task finishes as it was; the pending one keeps the key.
    assert_eq!(
        ts.store
            .backend()
            .task_finish_many(&[(claimed[0].claim(), Finish::Succeeded)])
            .await
            .unwrap(),
        [true]
    );
    let after = q.enqueue(debounced("db-run", 4, d)).await.unwrap();
    assert_eq!(
        (after.id, after.outcome),
        (next.id, EnqueueOutcome::Debounced)
    );
    let info = q.task(next.id).await.unwrap().unwrap();
    assert_eq!(info.payload, json!({"n": 4}));
}

/// Run the key's first task (inserted, then `Existing` while pending) and
/// answer the `until` a throttle of 1 h gives after its start.
async fn throttle_first_run(ts: &TestStore, q: &Queue, queue: &str) -> (i64, DateTime<Utc>) {
    let first = q.enqueue(throttled(queue, 1)).await.unwrap();
    assert_eq!(first.outcome, EnqueueOutcome::Inserted);
    let dup = q.enqueue(throttled(queue, 2)).await.unwrap();
    assert_eq!((dup.id, dup.outcome), (first.id, EnqueueOutcome::Existing));
    let t = crate::unique::run_one(&ts.store, queue, Finish::Succeeded).await;
    assert_eq!(t.id, first.id);
    let started = q.task(first.id).await.unwrap().unwrap().started_at.unwrap();
    // Store times are kept to the millisecond on every store.
    let started = DateTime::from_timestamp_millis(started.timestamp_millis()).unwrap();
    (first.id, started + chrono::Duration::hours(1))
}

/// Throttle: within the period after the key's last start an enqueue
/// writes nothing and answers `Throttled { until }` (the start plus the
/// period, store time) with the task that started; a pending task holding
/// the key is answered as the unique key does (`Existing`), and a running
/// one that started within the period throttles too.
pub async fn throttle_refuses_within_the_period(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let (id, until) = throttle_first_run(&ts, &q, "th").await;
    let e = q.enqueue(throttled("th", 3)).await.unwrap();
    assert_eq!(
        e,
        Enqueued {
            id,
            inserted: false,
            outcome: EnqueueOutcome::Throttled { until },
        }
    );
    assert!(pending(&ts, "th").await.is_empty(), "nothing written");
    // Another key of the kind is not throttled; once running, it is.
    let other = || {
        TaskBuilder::new("digest", json!({}))
            .queue("th")
            .unique_key("user:2")
            .throttle(Duration::from_secs(3600))
    };
    let o = q.enqueue(other()).await.unwrap();
    assert_eq!(o.outcome, EnqueueOutcome::Inserted);
    assert_eq!(
        crate::queue::claim(&ts.store, "th", 1, 30_000).await.len(),
        1
    );
    let e = q.enqueue(other()).await.unwrap();
    assert!(
        matches!(e.outcome, EnqueueOutcome::Throttled { .. }) && e.id == o.id,
        "{e:?}"
    );
}

/// Throttle by the store's clock: still refused just before the period
/// ends, accepted after it — by exactly one of 16 racing enqueuers (the
/// others get that task, `Existing`).
pub async fn throttle_accepts_once_after_the_period(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let (id, until) = throttle_first_run(&ts, &q, "th2").await;
    baton_testkit::clock::advance(&ts, Duration::from_secs(59 * 60)).await;
    let e = q.enqueue(throttled("th2", 3)).await.unwrap();
    assert_eq!((e.id, e.outcome), (id, EnqueueOutcome::Throttled { until }));
    baton_testkit::clock::advance(&ts, Duration::from_secs(61)).await;
    let mut racers = Vec::new();
    for n in 0..16 {
        let q = q.clone();
        racers.push(tokio::spawn(async move {
            q.enqueue(throttled("th2", 10 + n)).await.unwrap()
        }));
    }
    let mut answers = Vec::new();
    for r in racers {
        answers.push(r.await.unwrap());
    }
    let new: Vec<_> = answers.iter().filter(|e| e.inserted).collect();
    assert_eq!(new.len(), 1, "{answers:?}");
    assert!(answers
        .iter()
        .all(|e| e.id == new[0].id && (e.inserted || e.outcome == EnqueueOutcome::Existing)));
    assert_eq!(pending(&ts, "th2").await.len(), 1);
}

/// Bad input is refused where it enters, naming the field: a debounce or
/// throttle of 0 or beyond its bound, without a unique key, with a hold
/// other than unfinished, and a debounce with its own due time.
pub async fn debounce_and_throttle_bad_input_is_refused(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let base = || {
        TaskBuilder::new("k", json!({}))
            .queue("bad")
            .unique_key("x")
    };
    let cases = [
        (base().debounce(Duration::ZERO), "debounce"),
        (
            base().debounce(Duration::from_secs(31 * 86_400)),
            "debounce",
        ),
        (base().throttle(Duration::ZERO), "throttle"),
        (base().throttle(Duration::from_millis(500)), "throttle"),
        (
            base().throttle(Duration::from_secs(400 * 86_400)),
            "throttle",
        ),
        (
            TaskBuilder::new("k", json!({})).debounce(Duration::from_secs(1)),
            "debounce",
        ),
        (
            TaskBuilder::new("k", json!({})).throttle(Duration::from_secs(1)),
            "throttle",
        ),
        (
            base()
                .unique_hold(UniqueHold::Forever)
                .throttle(Duration::from_secs(60)),
            "unique_hold",
        ),
        (
            base()
                .debounce(Duration::from_secs(1))
                .delay(Duration::from_secs(9)),
            "run_at",
        ),
    ];
    for (t, field) in cases {
        let err = q.enqueue(t).await.unwrap_err();
        let baton::Error::Invalid(e) = &err else {
            panic!("{field}: {err:?}");
        };
        assert_eq!(e.field, field, "{e}");
    }
    assert!(pending(&ts, "bad").await.is_empty());
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Reindex {
    doc: u64,
    rev: u64,
}

impl baton::queue::TaskArgs for Reindex {
    const KIND: &'static str = "reindex-doc";
    fn insert_opts() -> baton::queue::InsertOpts {
        baton::queue::InsertOpts {
            queue: Some("typed-db".into()),
            key_policy: Some(baton::queue::KeyPolicy::Debounce(Duration::from_secs(5))),
            ..Default::default()
        }
    }
    fn unique_key(&self) -> Option<String> {
        Some(format!("doc:{}", self.doc))
    }
}

/// A typed kind with a debounce in its insert options: `Queue::insert`
/// debounces by the key its arguments give (one pending task per document,
/// with the last revision), and other documents are other keys.
pub async fn typed_kind_debounces_its_key(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let a = q.insert(&Reindex { doc: 1, rev: 1 }).await.unwrap();
    let b = q.insert(&Reindex { doc: 1, rev: 2 }).await.unwrap();
    let c = q.insert(&Reindex { doc: 2, rev: 1 }).await.unwrap();
    assert_eq!(
        (a.outcome, c.outcome),
        (EnqueueOutcome::Inserted, EnqueueOutcome::Inserted)
    );
    assert_eq!((b.id, b.outcome), (a.id, EnqueueOutcome::Debounced));
    assert_ne!(c.id, a.id);
    let info = q.task(a.id).await.unwrap().unwrap();
    assert_eq!(info.payload, json!({"doc": 1, "rev": 2}));
    assert_eq!(pending(&ts, "typed-db").await.len(), 2);
}
