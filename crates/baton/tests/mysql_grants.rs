//! MySQL-only: what a user needs. A user without `CREATE ROUTINE` migrates
//! and runs every claim but the fair one, which fails naming the grant;
//! once a user that may has made one fair claim (creating the procedure
//! `<prefix>fair_claim`), the first user's fair claims run too (`EXECUTE`).
//!
//! Runs on the server from `BATON_TEST_MYSQL` (default
//! `mysql://root@127.0.0.1:3306/test`), as root and as a user it creates
//! and drops; skipped when the server does not answer (a failure under
//! `BATON_REQUIRE_BACKENDS=1`).

#![cfg(feature = "mysql")]

use std::time::Duration;

use baton::store::{NewTask, RunAt, TaskClaim};
use baton::{Store, StoreOptions};
use sqlx::Executor;

fn root_url() -> String {
    std::env::var("BATON_TEST_MYSQL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

async fn open(url: &str, prefix: &str) -> Result<Store, baton::StoreError> {
    Store::connect_with(
        url,
        StoreOptions {
            prefix: Some(prefix.to_string()),
            max_connections: 2,
            ..StoreOptions::default()
        },
    )
    .await
}

fn task(key: &str) -> NewTask {
    NewTask {
        queue: "g".into(),
        kind: "k".into(),
        payload: serde_json::json!({}),
        priority: 0,
        run_at: RunAt::Now,
        max_attempts: 1,
        timeout: None,
        unique_key: None,
        unique_hold: baton::queue::UniqueHold::Unfinished,
        job: None,
        slot: None,
        traceparent: None,
        concurrency_key: Some(key.into()),
        key_policy: None,
    }
}

fn claim(fair: bool) -> TaskClaim<'static> {
    TaskClaim {
        queue: "g",
        worker: "w",
        limit: 1,
        lease: Duration::from_secs(30),
        max_running: None,
        per_key_max_running: None,
        buffered: 0,
        fair,
    }
}

#[tokio::test]
async fn a_user_without_create_routine_migrates_and_claims_fairly_once_the_procedure_exists() {
    let root = match sqlx::MySqlPool::connect(&root_url()).await {
        Ok(p) => p,
        Err(e) => {
            assert!(
                !baton_testkit::required(),
                "mysql required but unavailable: {e}"
            );
            baton_testkit::skipped(&format!("mysql grants: {e}"));
            return;
        }
    };
    let tag = format!("{:08x}", fastrand::u32(..));
    let (user, prefix) = (format!("bg{tag}"), format!("g{tag}_"));
    let db: String = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&root)
        .await
        .unwrap();
    // Every privilege baton's tables need, not CREATE ROUTINE.
    for host in ["%", "localhost", "127.0.0.1"] {
        root.execute(format!("CREATE USER '{user}'@'{host}'").as_str())
            .await
            .unwrap();
        root.execute(
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, \
                 CREATE TEMPORARY TABLES, EXECUTE ON `{db}`.* TO '{user}'@'{host}'"
            )
            .as_str(),
        )
        .await
        .unwrap();
    }
    let mut url = url::Url::parse(&root_url()).unwrap();
    url.set_username(&user).unwrap();
    url.set_password(None).unwrap();
    url.set_host(Some("127.0.0.1")).unwrap();

    let result = async {
        let limited = open(url.as_str(), &prefix)
            .await
            .expect("a user without CREATE ROUTINE migrates");
        let lb = limited.backend();
        lb.task_insert_many(&[task("a"), task("b"), task("c")])
            .await
            .unwrap();
        assert_eq!(lb.task_claim(&claim(false)).await.unwrap().len(), 1);
        let refused = lb.task_claim(&claim(true)).await.unwrap_err();
        let text = refused.to_string();
        assert!(
            text.contains("CREATE ROUTINE") && text.contains("fair_claim"),
            "{text}"
        );
        // A user that may makes one fair claim: the procedure exists.
        let privileged = open(&root_url(), &prefix).await.unwrap();
        assert_eq!(
            privileged
                .backend()
                .task_claim(&claim(true))
                .await
                .unwrap()
                .len(),
            1
        );
        assert_eq!(lb.task_claim(&claim(true)).await.unwrap().len(), 1);
        privileged.remove_schema().await.unwrap();
    }
    .await;
    for host in ["%", "localhost", "127.0.0.1"] {
        let _ = root
            .execute(format!("DROP USER IF EXISTS '{user}'@'{host}'").as_str())
            .await;
    }
    result
}
