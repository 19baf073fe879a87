//! Finding tasks (`Queue::tasks` with a [`TaskFilter`]'s search terms):
//! by kind, by key (a unique key whatever its scope, or a concurrency
//! key), by payload text taken literally, by enqueue time, combined with
//! queue and state and paged newest first; bad terms refused by name.

use std::time::Duration;

use baton::queue::{Queue, TaskBuilder};
use baton::store::{TaskFilter, TaskState};
use baton::Error;
use serde_json::json;

use crate::TestStore;

async fn ids(q: &Queue, f: TaskFilter) -> Vec<i64> {
    q.tasks(&f).await.unwrap().iter().map(|t| t.id).collect()
}

pub async fn search_by_kind_key_text_and_time(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let add = |b: TaskBuilder| {
        let q = q.clone();
        async move { q.enqueue(b).await.unwrap().id }
    };
    let alice = add(TaskBuilder::new("mail", json!({"to": "alice@example.com"})).queue("sa")).await;
    let bob = add(
        TaskBuilder::new("mail", json!({"to": "bob@example.com", "note": "100%"}))
            .queue("sa")
            .unique_key("order:7"),
    )
    .await;
    let sms = add(TaskBuilder::new("sms", json!({"to": "alice@example.com"}))
        .queue("sb")
        .unique_key("order:77")
        .concurrency_key("customer:42"))
    .await;
    // Enqueued an hour later by the store's clock.
    baton_testkit::clock::advance(&ts, Duration::from_secs(3600)).await;
    let late = add(TaskBuilder::new("mail", json!({"to": "carol@example.com"})).queue("sb")).await;

    let f = TaskFilter::default;
    let kind = |k: &str| TaskFilter {
        kind: Some(k.into()),
        ..f()
    };
    let key = |k: &str| TaskFilter {
        key: Some(k.into()),
        ..f()
    };
    let text = |t: &str| TaskFilter {
        text: Some(t.into()),
        ..f()
    };
    let none: &[i64] = &[];
    for (what, filter, want) in [
        ("kind mail", kind("mail"), &[late, bob, alice][..]),
        ("kind sms", kind("sms"), &[sms]),
        // The caller's key inside a scoped composite, exactly: not a
        // prefix, not a tail of it.
        ("key order:7", key("order:7"), &[bob]),
        ("key order:77", key("order:77"), &[sms]),
        ("key order:", key("order:"), none),
        ("key der:7", key("der:7"), none),
        ("concurrency key", key("customer:42"), &[sms]),
        // Payload text, taken literally (no pattern characters).
        ("text alice@", text("alice@"), &[sms, alice]),
        ("text 0%", text("0%"), &[bob]),
        ("text %", text("%"), &[bob]),
        ("text _", text("_"), none),
        // Case-sensitive, on every store.
        ("text ALICE", text("ALICE"), none),
    ] {
        assert_eq!(ids(&q, filter).await, want, "{what}");
    }
    // Combined with queue, and with state.
    let in_sa = TaskFilter {
        text: Some("alice".into()),
        queue: Some("sa".into()),
        ..f()
    };
    assert_eq!(ids(&q, in_sa).await, [alice]);
    let failed = TaskFilter {
        kind: Some("mail".into()),
        state: Some(TaskState::Failed),
        ..f()
    };
    assert_eq!(ids(&q, failed).await, Vec::<i64>::new());
    // Enqueue time: [from, to).
    let late_at = q.task(late).await.unwrap().unwrap().created_at;
    let since = TaskFilter {
        created_from: Some(late_at),
        ..f()
    };
    assert_eq!(ids(&q, since).await, [late]);
    let before = TaskFilter {
        created_to: Some(late_at),
        kind: Some("mail".into()),
        ..f()
    };
    assert_eq!(ids(&q, before).await, [bob, alice]);
    // Paged, newest first.
    let page = |before_id| TaskFilter {
        kind: Some("mail".into()),
        limit: 2,
        before_id,
        ..f()
    };
    assert_eq!(ids(&q, page(None)).await, [late, bob]);
    assert_eq!(ids(&q, page(Some(bob))).await, [alice]);
}

pub async fn bad_search_terms_are_refused_by_name(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let now = chrono::Utc::now();
    for (f, field) in [
        (
            TaskFilter {
                text: Some(String::new()),
                ..TaskFilter::default()
            },
            "text",
        ),
        (
            TaskFilter {
                text: Some("x".repeat(257)),
                ..TaskFilter::default()
            },
            "text",
        ),
        (
            TaskFilter {
                key: Some("a\u{1f}b".into()),
                ..TaskFilter::default()
            },
            "key",
        ),
        (
            TaskFilter {
                created_from: Some(now),
                created_to: Some(now),
                ..TaskFilter::default()
            },
            "created_from",
        ),
    ] {
        match q.tasks(&f).await {
            Err(Error::Invalid(e)) => assert_eq!(e.field, field),
            other => panic!("{field}: expected a refusal, got {other:?}"),
        }
    }
}
