//! TLS to the networked stores, against private servers that accept TLS
//! only: PostgreSQL with `sslmode=verify-full` and `sslrootcert`, Redis with
//! `rediss://` and `sslrootcert`. Locks and the queue work over it, and a
//! certificate from a CA the client does not trust is refused.

use baton_testkit as support;

use std::time::Duration;

use baton::lock::{LockOptions, Locker};
use baton::queue::{Queue, TaskBuilder};
use baton::{Store, StoreOptions};
use support::{Kind, Private};

async fn connect(url: &str) -> Result<Store, baton::Error> {
    let opts = StoreOptions {
        prefix: Some("tls_".into()),
        max_connections: 4,
        ..Default::default()
    };
    Store::connect_with(url, opts).await.map_err(Into::into)
}

/// A lock and a task round trip over the store at `url`.
async fn works_over(url: &str) {
    let store = connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let locker = Locker::new(store.clone());
    let opts = LockOptions::new(Duration::from_secs(10));
    let lease = locker.try_lock("tls", &opts).await.unwrap().expect("free");
    assert!(locker.try_lock("tls", &opts).await.unwrap().is_none());
    lease.release().await.unwrap();
    let q = Queue::new(store.clone());
    let id = q
        .enqueue(TaskBuilder::new("t", serde_json::json!(1)))
        .await
        .unwrap()
        .id;
    assert!(q.task(id).await.unwrap().is_some());
}

/// Against a TLS-only private server: trusting its CA works, trusting
/// another CA is refused with a reason, and plain text gets no service (so
/// the working connection did speak TLS).
async fn tls_only(
    kind: Kind,
    url_trusting: impl Fn(&Private, &str) -> String,
    plain: impl Fn(&Private) -> String,
) {
    let Some(mut srv) = Private::with_tls(kind) else {
        return;
    };
    srv.start();
    works_over(&url_trusting(&srv, &srv.ca().display().to_string())).await;
    let other = url_trusting(&srv, &srv.other_ca().display().to_string());
    let e = connect(&other)
        .await
        .expect_err("an untrusted server certificate must be refused");
    let reason = baton::error::chain(&e);
    assert!(reason.contains("certificate"), "a clear reason: {reason}");
    assert!(
        connect(&plain(&srv)).await.is_err(),
        "plain text reached a TLS-only server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_verify_full_with_own_ca() {
    tls_only(
        Kind::Postgres,
        |s, ca| format!("{}?sslmode=verify-full&sslrootcert={ca}", s.url()),
        |s| format!("{}?sslmode=disable", s.url()),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rediss_with_own_ca() {
    tls_only(
        Kind::Redis,
        |s, ca| format!("{}/?sslrootcert={ca}", s.url()),
        |s| format!("redis://127.0.0.1:{}", s.port),
    )
    .await
}

#[tokio::test]
async fn tls_parameters_need_rediss_and_readable_files() {
    let e = connect("redis://127.0.0.1:6379/?sslrootcert=/nonexistent.pem")
        .await
        .expect_err("sslrootcert on redis:// is an error");
    assert!(e.to_string().contains("rediss://"), "{e}");
    let e = connect("rediss://127.0.0.1:6379/?sslrootcert=/nonexistent/ca.pem")
        .await
        .expect_err("a missing CA file is an error");
    assert!(
        e.to_string().contains("sslrootcert=/nonexistent/ca.pem"),
        "{e}"
    );
    let e = connect("rediss://127.0.0.1:6379/?sslcert=/etc/hostname")
        .await
        .expect_err("sslcert without sslkey is an error");
    assert!(e.to_string().contains("sslkey"), "{e}");
}
