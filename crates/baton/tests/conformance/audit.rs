//! The audit log: records kept in the store, listed newest first and
//! paged, long fields cut, old records pruned by the store's clock.

use std::time::Duration;

use baton::audit;
use baton::store::{AuditAppend, AuditPage, MAX_AUDIT_FIELD};

use crate::TestStore;

fn entry<'a>(actor: &'a str, target: &'a str) -> AuditAppend<'a> {
    AuditAppend {
        actor,
        action: "POST /api/v1/queues/{name}/pause",
        target,
        source: "api",
        outcome: "200",
    }
}

pub async fn audit_records_list_page_and_prune(ts: TestStore) {
    let s = &ts.store;
    let before = s.backend().now().await.unwrap();
    audit::record(s, &entry("api:alice", "queue a"))
        .await
        .unwrap();
    audit::record(s, &entry("ana@ops-1", "queue b"))
        .await
        .unwrap();
    let long = "x".repeat(MAX_AUDIT_FIELD * 2);
    audit::record(s, &entry("api:bob", &long)).await.unwrap();

    let all = audit::list(s, &AuditPage::default()).await.unwrap();
    let who: Vec<&str> = all.iter().map(|r| r.actor.as_str()).collect();
    assert_eq!(who, ["api:bob", "ana@ops-1", "api:alice"], "newest first");
    assert!(all[0].id > all[1].id && all[1].id > all[2].id);
    let a = &all[2];
    assert_eq!(
        (
            a.action.as_str(),
            a.target.as_str(),
            a.source.as_str(),
            a.outcome.as_str()
        ),
        ("POST /api/v1/queues/{name}/pause", "queue a", "api", "200")
    );
    assert!(
        a.at >= before - chrono::Duration::seconds(1),
        "{a:?} vs {before}"
    );
    assert!(all[0].target.len() <= MAX_AUDIT_FIELD && all[0].target.ends_with('…'));

    let page = |before_id| AuditPage {
        before_id,
        limit: 2,
    };
    let p1 = audit::list(s, &page(None)).await.unwrap();
    assert_eq!(
        p1.iter().map(|r| r.id).collect::<Vec<_>>(),
        [all[0].id, all[1].id]
    );
    let p2 = audit::list(s, &page(Some(p1[1].id))).await.unwrap();
    assert_eq!(p2.iter().map(|r| r.id).collect::<Vec<_>>(), [all[2].id]);

    // Two hours later by the store's clock, one more; pruning what is
    // older than an hour leaves only it.
    baton_testkit::clock::advance(&ts, Duration::from_secs(7200)).await;
    audit::record(s, &entry("api:carol", "task 7"))
        .await
        .unwrap();
    let gone = s
        .backend()
        .audit_prune_many(Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(gone, 3);
    let left = audit::list(s, &AuditPage::default()).await.unwrap();
    assert_eq!(
        left.iter().map(|r| r.actor.as_str()).collect::<Vec<_>>(),
        ["api:carol"]
    );
}
