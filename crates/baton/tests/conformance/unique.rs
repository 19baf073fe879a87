//! T4 with scopes (issue 29): a unique key is compared with the tasks its
//! scope names — by default the same kind in the same queue — and wider
//! scopes are explicit (`Kind` and `Global` only on the SQL stores: Redis
//! keeps unique keys per queue and refuses them, naming the field).

use std::time::Duration;

use baton::queue::{Queue, TaskBuilder, UniqueHold, UniqueKey, UniqueScope};
use baton::store::{CancelOutcome, Enqueued, Finish, Task, TaskState};
use serde_json::json;

use baton_testkit::clock;

use crate::harness::Kind;
use crate::TestStore;

fn keyed(kind: &str, queue: &str, key: &str) -> TaskBuilder {
    TaskBuilder::new(kind, json!({"k": kind}))
        .queue(queue)
        .unique_key(key)
}

async fn put(q: &Queue, t: TaskBuilder) -> Enqueued {
    q.enqueue(t).await.unwrap()
}

/// Each scope dedupes exactly the tasks it names: kind-in-queue (the
/// default) not across kinds nor queues, queue across kinds in one queue,
/// kind and global across queues (SQL stores; Redis refuses them with an
/// error naming `unique_scope` and saying why, and writes nothing).
pub async fn scopes_compare_what_they_name(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    // Default: two kinds sharing a key string are two tasks.
    let email = put(&q, keyed("email", "mail", "42")).await;
    let report = put(&q, keyed("report", "mail", "42")).await;
    assert!(email.inserted && report.inserted, "{email:?} {report:?}");
    assert_ne!(email.id, report.id);
    // The same kind in the same queue is deduped...
    let again = put(&q, keyed("report", "mail", "42")).await;
    assert_eq!((again.id, again.inserted), (report.id, false));
    // ...and the same kind in another queue is not.
    let other_queue = put(&q, keyed("report", "other", "42")).await;
    assert!(other_queue.inserted);
    let info = q.task(report.id).await.unwrap().unwrap();
    let u = info.unique().unwrap();
    assert_eq!(
        (u.scope, u.key.as_deref(), u.kind.as_deref()),
        (UniqueScope::KindInQueue, Some("42"), Some("report"))
    );

    // Queue scope: across kinds within one queue, not across queues.
    let s = UniqueScope::Queue;
    let a = put(&q, keyed("a", "qs", "7").unique_scope(s)).await;
    let b = put(&q, keyed("b", "qs", "7").unique_scope(s)).await;
    assert_eq!((b.id, b.inserted), (a.id, false), "queue scope spans kinds");
    let c = put(&q, keyed("a", "qs2", "7").unique_scope(s)).await;
    assert!(c.inserted, "queue scope stays in its queue");
    // A queue-scoped key and a kind-in-queue key are different keys.
    let d = put(&q, keyed("a", "qs", "7")).await;
    assert!(d.inserted);

    for scope in [UniqueScope::Kind, UniqueScope::Global] {
        let key = format!("wide-{scope}");
        let first = q.enqueue(keyed("w", "wq1", &key).unique_scope(scope)).await;
        if let Kind::Redis = ts.kind {
            let err = first.unwrap_err();
            let baton::Error::Invalid(e) = &err else {
                panic!("{scope}: {err:?}");
            };
            assert_eq!(e.field, "unique_scope", "{e}");
            for word in [scope.as_str(), "Redis", "per queue", "kind-in-queue"] {
                assert!(e.problem.contains(word), "{word:?} in {e}");
            }
            continue;
        }
        let first = first.unwrap();
        assert!(first.inserted);
        // Another queue, the same kind: one task in both wide scopes.
        let second = put(&q, keyed("w", "wq2", &key).unique_scope(scope)).await;
        assert_eq!((second.id, second.inserted), (first.id, false), "{scope}");
        // Another kind in another queue: only global dedupes it.
        let third = put(&q, keyed("x", "wq3", &key).unique_scope(scope)).await;
        match scope {
            UniqueScope::Global => assert_eq!((third.id, third.inserted), (first.id, false)),
            _ => assert!(third.inserted, "kind scope keeps kinds apart"),
        }
    }
    if let Kind::Redis = ts.kind {
        let listed = q
            .tasks(&baton::store::TaskFilter {
                queue: Some("wq1".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(listed.is_empty(), "a refused enqueue writes nothing");
    }
}

/// By args: payloads equal as JSON share a key whatever their field order;
/// different payloads do not; the explicit key combines with it.
pub async fn by_args_dedupes_equal_payloads_in_any_order(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let by_args = |payload: serde_json::Value| {
        TaskBuilder::new("resize", payload)
            .queue("args")
            .unique_by_args(true)
    };
    let a = put(
        &q,
        by_args(json!({"image": 7, "size": {"w": 640, "h": 480}})),
    )
    .await;
    let reordered: serde_json::Value =
        serde_json::from_str(r#"{"size": {"h": 480, "w": 640}, "image": 7}"#).unwrap();
    let b = put(&q, by_args(reordered)).await;
    assert_eq!(
        (b.id, b.inserted),
        (a.id, false),
        "same payload, other order"
    );
    let c = put(
        &q,
        by_args(json!({"image": 8, "size": {"w": 640, "h": 480}})),
    )
    .await;
    assert!(c.inserted, "another payload is another key");
    let d = put(
        &q,
        by_args(json!({"image": 7, "size": {"w": 640, "h": 480}})).unique_key("x"),
    )
    .await;
    assert!(d.inserted, "an explicit key narrows the args key");
    let e = put(
        &q,
        by_args(json!({"size": {"w": 640, "h": 480}, "image": 7})).unique_key("x"),
    )
    .await;
    assert_eq!((e.id, e.inserted), (d.id, false));
    let u = q.task(a.id).await.unwrap().unwrap().unique().unwrap();
    assert_eq!((u.key, u.args.map(|h| h.len())), (None, Some(32)));
}

/// By period: one key per time bucket of this host's clock — two tasks in
/// one bucket share it, the next bucket's is a new task.
pub async fn period_keys_differ_across_buckets(ts: TestStore) {
    let b = ts.store.backend();
    let period = Duration::from_secs(1);
    let build = || {
        TaskBuilder::new("tick", json!({}))
            .queue("period")
            .unique_key("t")
            .unique_period(period)
            .build()
            .unwrap()
    };
    let start = |t: &baton::store::NewTask| {
        UniqueKey::parse(t.unique_key.as_deref().unwrap())
            .period
            .unwrap()
            .start
    };
    // Two tasks built in one bucket (built again if a bucket edge fell
    // between them).
    let (first, second) = loop {
        let (x, y) = (build(), build());
        if start(&x) == start(&y) {
            break (x, y);
        }
    };
    let e1 = b
        .task_insert_many(std::slice::from_ref(&first))
        .await
        .unwrap()[0];
    let e2 = b.task_insert_many(&[second]).await.unwrap()[0];
    assert!(e1.inserted);
    assert_eq!((e2.id, e2.inserted), (e1.id, false), "one bucket, one task");
    // The next bucket's key is another key.
    let next = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = build();
        if start(&t) > start(&first) {
            break t;
        }
    };
    assert_ne!(next.unique_key, first.unique_key);
    let e3 = b.task_insert_many(&[next]).await.unwrap()[0];
    assert!(
        e3.inserted && e3.id != e1.id,
        "the next bucket is a new task"
    );
}

/// `task_retry` still refuses when the task's scoped key is taken by
/// another unfinished task of its scope, and a task of another kind
/// holding the same key string does not take it.
pub async fn retry_refuses_a_taken_scoped_key(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let b = ts.store.backend();
    let (first, second) =
        crate::queue::retry_onto_a_taken_key(b, || put(&q, keyed("job", "rq", "r1"))).await;
    assert_eq!(
        b.task_cancel(second.id).await.unwrap(),
        CancelOutcome::Cancelled
    );
    // Another kind with the same key string holds another key.
    let other = put(&q, keyed("other", "rq", "r1")).await;
    assert!(other.inserted);
    assert!(
        b.task_retry(first.id).await.unwrap(),
        "the key is free in its scope"
    );
}

/// Claim the one due task of `queue` and finish it as `how`.
pub(crate) async fn run_one(store: &baton::Store, queue: &str, how: Finish) -> Task {
    let b = store.backend();
    let claimed = crate::queue::claim(store, queue, 1, 30_000).await;
    let [t] = &claimed[..] else {
        panic!("{queue}: claimed {claimed:?}");
    };
    assert_eq!(
        b.task_finish_many(&[(t.claim(), how)]).await.unwrap(),
        [true]
    );
    t.clone()
}

/// `UniqueHold::UntilFailed` (River's default): the key is taken while
/// the task is pending, running or succeeded; a task that failed for good
/// or was cancelled (pending or running) frees it, and so does a prune. A
/// retry of a failed task is refused while a succeeded task holds its key,
/// as while an unfinished one does.
pub async fn until_failed_holds_through_success_only(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let b = ts.store.backend();
    let hold = |queue: &str, key: &str| {
        keyed("job", queue, key)
            .max_attempts(1)
            .unique_hold(UniqueHold::UntilFailed)
    };
    let failed = || Finish::Failed {
        error: "boom".into(),
        retry_in: None,
    };

    // Succeeded: the key stays taken, for every hold of the new enqueue.
    let done = put(&q, hold("uf-ok", "k")).await;
    assert!(done.inserted);
    let again = put(&q, hold("uf-ok", "k")).await;
    assert_eq!(
        (again.id, again.inserted),
        (done.id, false),
        "pending holds"
    );
    run_one(&ts.store, "uf-ok", Finish::Succeeded).await;
    let info = b.task_get(done.id).await.unwrap().unwrap();
    assert_eq!(
        (info.state, info.unique_hold),
        (TaskState::Succeeded, UniqueHold::UntilFailed),
        "the hold is read back"
    );
    for h in UniqueHold::ALL {
        let again = put(&q, keyed("job", "uf-ok", "k").unique_hold(h)).await;
        assert_eq!(
            (again.id, again.inserted),
            (done.id, false),
            "a succeeded task holds its key ({h} enqueue)"
        );
    }
    // The same key string of another kind is another key.
    assert!(put(&q, keyed("other", "uf-ok", "k")).await.inserted);
    // An unfinished hold's succeeded task frees its key (unchanged).
    let plain = put(&q, keyed("job", "uf-plain", "k").max_attempts(1)).await;
    run_one(&ts.store, "uf-plain", Finish::Succeeded).await;
    let next = put(&q, keyed("job", "uf-plain", "k")).await;
    assert!(next.inserted && next.id != plain.id, "unfinished: freed");

    // Failed for good: the key is free.
    let dead = put(&q, hold("uf-fail", "k")).await;
    run_one(&ts.store, "uf-fail", failed()).await;
    assert_eq!(
        b.task_get(dead.id).await.unwrap().unwrap().state,
        TaskState::Failed
    );
    let redo = put(&q, hold("uf-fail", "k")).await;
    assert!(
        redo.inserted && redo.id != dead.id,
        "a failed task frees it"
    );
    // Retry onto the key: refused while the new task is pending, and
    // still refused once it succeeded (it holds the key then).
    let refused = |r: Result<bool, baton::StoreError>, when: &str| {
        assert!(
            matches!(r, Err(baton::StoreError::Conflict(_))),
            "retry {when}: {r:?}"
        );
    };
    refused(b.task_retry(dead.id).await, "while pending");
    run_one(&ts.store, "uf-fail", Finish::Succeeded).await;
    refused(b.task_retry(dead.id).await, "after success");
    assert_eq!(
        b.task_get(dead.id).await.unwrap().unwrap().state,
        TaskState::Failed,
        "a refused retry changes nothing"
    );

    // Cancelled while pending, and while running: the key is free.
    let pending = put(&q, hold("uf-cancel", "p")).await;
    assert_eq!(
        b.task_cancel(pending.id).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let after = put(&q, hold("uf-cancel", "p")).await;
    assert!(after.inserted && after.id != pending.id, "cancel frees it");
    b.task_cancel(after.id).await.unwrap();
    let running = put(&q, hold("uf-cancel", "r")).await;
    run_one(
        &ts.store,
        "uf-cancel",
        Finish::Cancelled {
            reason: "stop".into(),
        },
    )
    .await;
    let after = put(&q, hold("uf-cancel", "r")).await;
    assert!(
        after.inserted && after.id != running.id,
        "a cancelled run frees it"
    );
    // A retry of the cancelled run takes the key back once it is free.
    b.task_cancel(after.id).await.unwrap();
    assert!(b.task_retry(running.id).await.unwrap());
    let dup = put(&q, hold("uf-cancel", "r")).await;
    assert_eq!((dup.id, dup.inserted), (running.id, false), "retried: held");

    // A prune frees the succeeded task's key (finished before now).
    clock::advance(&ts, Duration::from_millis(20)).await;
    assert!(q.prune(Duration::ZERO).await.unwrap() > 0);
    assert!(b.task_get(done.id).await.unwrap().is_none());
    let fresh = put(&q, hold("uf-ok", "k")).await;
    assert!(fresh.inserted && fresh.id != done.id, "pruned: freed");
}
