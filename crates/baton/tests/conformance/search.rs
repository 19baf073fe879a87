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
    assert_eq!(
        ids(
            &q,
            TaskFilter {
                kind: Some("mail".into()),
                ..f()
            }
        )
        .await,
        [late, bob, alice]
    );
    assert_eq!(
        ids(
            &q,
            TaskFilter {
                kind: Some("sms".into()),
                ..f()
            }
        )
        .await,
        [sms]
    );
    // The caller's key inside a scoped composite, exactly: not a prefix.
    assert_eq!(
        ids(
            &q,
            TaskFilter {
                key: Some("order:7".into()),
                ..f()
            }
        )
        .await,
        [bob]
    );
    assert_eq!(
        ids(
            &q,
            TaskFilter {
                key: Some("order:77".into()),
                ..f()
            }
        )
        .await,
        [sms]
    );
    assert_eq!(
        ids(
            &q,
            TaskFilter {
                key: Some("order:".into()),
                ..f()
            }
        )
        .await,
        Vec::<i64>::new()
    );
    assert_eq!(
        ids(
            &q,
            TaskFilter {
                key: Some("der:7".into()),
                ..f()
            }
        )
        .await,
        Vec::<i64>::new()
    );
    assert_eq!(
        ids(
            &q,
            TaskFilter {
                key: Some("customer:42".into()),
                ..f()
            }
        )
        .await,
        [sms]
    );
    // Payload text, taken literally (no pattern characters).
    assert_eq!(
        ids(
            &q,
            TaskFilter {
                text: Some("alice@".into()),
                ..f()
            }
        )
        .await,
        [sms, alice]
    );
    assert_eq!(
        ids(
            &q,
            TaskFilter {
                text: Some("0%".into()),
                ..f()
            }
        )
        .await,
        [bob]
    );
    assert_eq!(
        ids(
            &q,
            TaskFilter {
                text: Some("%".into()),
                ..f()
            }
        )
        .await,
        [bob]
    );
    assert_eq!(
        ids(
            &q,
            TaskFilter {
                text: Some("_".into()),
                ..f()
            }
        )
        .await,
        Vec::<i64>::new()
    );
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
