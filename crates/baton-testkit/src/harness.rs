//! Finding the servers and giving each test its own isolated store: the
//! conformance suite's harness, shared by every test crate.
//!
//! The servers come from `BATON_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`), `BATON_TEST_REDIS` (default
//! `redis://127.0.0.1:6379`) and `BATON_TEST_MYSQL` (default
//! `mysql://root@127.0.0.1:3306/test`); SQLite gets a file in a temporary
//! directory. A server that does not answer makes [`connect`] print one
//! `SKIPPED` line and return `None`, unless `BATON_REQUIRE_BACKENDS=1`.

use std::future::Future;

use baton::{Store, StoreOptions};

pub use crate::required;

/// The backends under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A SQLite file of the test's own.
    Sqlite,
    /// The PostgreSQL server of `BATON_TEST_POSTGRES`.
    Postgres,
    /// The Redis server (or cluster, sentinel) of `BATON_TEST_REDIS`.
    Redis,
    /// The MySQL/MariaDB server of `BATON_TEST_MYSQL`.
    Mysql,
}

/// An isolated store for one test: its own SQLite file, Postgres or MySQL
/// table prefix or Redis key prefix. `open()` makes another independent handle
/// (another "instance") on the same data.
pub struct TestStore {
    /// Which backend.
    pub kind: Kind,
    /// The store's URL (as `Store::connect` takes it).
    pub url: String,
    /// The test's own table or key prefix.
    pub prefix: String,
    /// The first handle on it.
    pub store: Store,
    _dir: Option<tempfile::TempDir>,
}

impl TestStore {
    /// Another client of the same store, with its own connections.
    pub async fn open(&self) -> Store {
        // Retry briefly: a shared server may be at its connection limit.
        let mut tries = 0;
        loop {
            match Store::connect_with(&self.url, options(&self.prefix)).await {
                Ok(s) => return s,
                Err(e) if e.is_retryable() && tries < 60 => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
                Err(e) => panic!("another handle on {}: {e}", self.url),
            }
        }
    }
}

fn options(prefix: &str) -> StoreOptions {
    StoreOptions {
        prefix: Some(prefix.to_string()),
        // Many tests run at once, each with several handles: stay well
        // under PostgreSQL's default 100 connections.
        max_connections: 5,
        ..StoreOptions::default()
    }
}

/// The PostgreSQL server's URL (`BATON_TEST_POSTGRES` or the default).
pub fn postgres_url() -> String {
    std::env::var("BATON_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// The MySQL/MariaDB server's URL (`BATON_TEST_MYSQL` or the default).
pub fn mysql_url() -> String {
    std::env::var("BATON_TEST_MYSQL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// The Redis server's URL (`BATON_TEST_REDIS` or the default).
pub fn redis_url() -> String {
    std::env::var("BATON_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// Connect an isolated store of `kind`, or `None` (after printing SKIPPED)
/// when its server is not running and backends are not required.
pub async fn connect(kind: Kind) -> Option<TestStore> {
    let tag = format!("t{}", &uuid_like()[..10]);
    let (url, prefix, dir) = match kind {
        Kind::Sqlite => {
            let dir = tempfile::tempdir().expect("tempdir");
            let url = format!("sqlite://{}", dir.path().join("baton.db").display());
            (url, format!("{tag}_"), Some(dir))
        }
        Kind::Postgres => (postgres_url(), format!("{tag}_"), None),
        Kind::Redis => (redis_url(), format!("{tag}:"), None),
        Kind::Mysql => (mysql_url(), format!("{tag}_"), None),
    };
    match Store::connect_with(&url, options(&prefix)).await {
        Ok(store) => Some(TestStore {
            kind,
            url,
            prefix,
            store,
            _dir: dir,
        }),
        Err(e) if !required() && e.is_retryable() => {
            eprintln!("SKIPPED {kind:?}: {url} does not answer ({e}); set BATON_REQUIRE_BACKENDS=1 to fail instead");
            None
        }
        Err(e) => panic!("{kind:?} store at {url}: {}", baton::error::chain(&e)),
    }
}

/// Run one test against one backend (the `run` of [`per_backend!`](crate::per_backend)
/// for tests that take a [`TestStore`]).
pub async fn run<F, Fut>(kind: Kind, test: F)
where
    F: FnOnce(TestStore) -> Fut,
    Fut: Future<Output = ()>,
{
    if let Some(ts) = connect(kind).await {
        test(ts).await;
    }
}

fn uuid_like() -> String {
    format!("{:016x}{:016x}", fastrand_u64(), fastrand_u64())
}

fn fastrand_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// Run `sql` (one or more statements, sent as text) on the SQL store
/// `ts` over a connection of its own, behind the store's back.
pub async fn exec_sql(ts: &TestStore, sql: &str) {
    macro_rules! on {
        ($options:ty) => {{
            let pool = <$options>::new()
                .max_connections(1)
                .connect(&ts.url)
                .await
                .unwrap();
            sqlx::raw_sql(sql).execute(&pool).await.unwrap();
            pool.close().await;
        }};
    }
    match ts.kind {
        Kind::Sqlite => on!(sqlx::sqlite::SqlitePoolOptions),
        Kind::Postgres if ts.url.contains("pool_mode=") => {
            // Behind a pooler: as baton connects (its own URL parameters
            // stripped, no startup parameter a pooler refuses).
            let opts = baton::store::postgres::connect_options(&ts.url).unwrap();
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect_with(opts)
                .await
                .unwrap();
            sqlx::raw_sql(sql).execute(&pool).await.unwrap();
            pool.close().await;
        }
        Kind::Postgres => on!(sqlx::postgres::PgPoolOptions),
        Kind::Mysql => on!(sqlx::mysql::MySqlPoolOptions),
        Kind::Redis => panic!("exec_sql: {} is not an SQL store", ts.url),
    }
}

/// A one-connection pool on the PostgreSQL store `ts`, connected as baton
/// connects (through a pooler too), and a transaction on it: statements
/// with parameters work behind a transaction pooler only inside one, and
/// only unnamed (`.persistent(false)`).
pub async fn pg_tx(ts: &TestStore) -> (sqlx::PgPool, sqlx::Transaction<'static, sqlx::Postgres>) {
    let opts = baton::store::postgres::connect_options(&ts.url).unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(opts)
        .await
        .unwrap();
    let tx = pool.begin().await.unwrap();
    (pool, tx)
}

/// Set the version the store records at prefix `p` behind the store's
/// back (`None`: remove the record), as an older or newer build would
/// have left it.
pub async fn set_schema_version(ts: &TestStore, p: &str, v: Option<i64>) {
    let (meta, key) = match ts.kind {
        Kind::Mysql => (format!("`{p}meta`"), "`key`"),
        _ => (format!("\"{p}meta\""), "key"),
    };
    let stmt = match v {
        Some(v) => format!("UPDATE {meta} SET value = '{v}' WHERE {key} = 'schema_version'"),
        None => format!("DELETE FROM {meta} WHERE {key} = 'schema_version'"),
    };
    match ts.kind {
        Kind::Sqlite | Kind::Postgres | Kind::Mysql => exec_sql(ts, &stmt).await,
        Kind::Redis => {
            let mut c = crate::cluster::connect(&ts.url).await;
            let key = format!("{p}{{baton}}:schema");
            let cmd = match v {
                Some(v) => {
                    let mut c = redis::cmd("SET");
                    c.arg(&key).arg(v);
                    c
                }
                None => {
                    let mut c = redis::cmd("DEL");
                    c.arg(&key);
                    c
                }
            };
            cmd.query_async::<()>(&mut c).await.unwrap();
        }
    }
}
